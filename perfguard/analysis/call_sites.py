"""Each op's call sites: the user's ``file:line`` behind it, the top ones by time.

The ranges carry ``call_site`` from whichever source the capture has (PyProf/DLProf
trace markers, ``instrument(ops=True)``, the PyTorch profiler's Python frames, the
capture's sidecar). An op called from several places lists the top ones by its
time there (GPU time where the op has any, else CPU time), with their shares:
``model.py:63 (72%); data.py:10 (28%)``. Folded CPU-only instances count by
their CPU time, as in every other per-op figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.analysis.cpu_only import CpuOnly
from perfguard.analysis.ops import op_id
from perfguard.trace.call_sites import top_sites_text

#: call sites listed per op
TOP_SITES = 3


def has_call_sites(ranges: pd.DataFrame) -> bool:
    """Whether any range of the capture says where in the user's code it was called."""
    return "call_site" in ranges and bool(ranges["call_site"].notna().any())


def op_call_sites(
    ranges: pd.DataFrame, inst: pd.DataFrame, cpu_only: CpuOnly | None
) -> pd.DataFrame:
    """``op_id, call_site`` (text of the top :data:`TOP_SITES`) for ops with a call site.

    ``inst``: the kept instances (``instance`` is the range's row, ``op_key``,
    ``op_name``, ``direction``, ``gpu_time``, ``cpu_time``); ``cpu_only``: the folded ones.
    """
    site = ranges["call_site"].to_numpy(dtype=object)
    n_ranges = len(site)
    row = inst["instance"].to_numpy(np.int64)
    ok = (row >= 0) & (row < n_ranges)
    parts = [pd.DataFrame({
        "op_name": inst["op_name"].astype(object).to_numpy()[ok],
        "direction": inst["direction"].astype(object).to_numpy()[ok],
        "site": site[row[ok]],
        "gpu": inst["gpu_time"].to_numpy(np.float64)[ok],
        "cpu": inst["cpu_time"].to_numpy(np.float64)[ok],
    })]  # fmt: skip
    if cpu_only is not None and len(cpu_only):
        names, direction = cpu_only.op_text(cpu_only.op_key)
        parts.append(pd.DataFrame({
            "op_name": names, "direction": direction, "site": site[cpu_only.range_row],
            "gpu": 0.0, "cpu": cpu_only.cpu_time.astype(np.float64),
        }))  # fmt: skip
    df = pd.concat(parts, ignore_index=True)
    df = df[df["site"].notna()]
    if df.empty:
        empty = pd.Series(dtype=object)
        return pd.DataFrame({"op_id": empty, "call_site": empty.copy()})
    g = df.groupby(["op_name", "direction", "site"], sort=False)[["gpu", "cpu"]].sum()
    g = g.reset_index()
    on_gpu = g.groupby(["op_name", "direction"], sort=False)["gpu"].transform("sum") > 0
    g["time"] = np.where(on_gpu, g["gpu"], g["cpu"])
    g = g.sort_values(["op_name", "direction", "time", "site"],
                      ascending=[True, True, False, True], kind="stable")  # fmt: skip
    rows = []
    for (name, direction), one in g.groupby(["op_name", "direction"], sort=False):
        sites = list(zip(one["site"].astype(str), one["time"].astype(float), strict=True))
        rows.append((name, direction, top_sites_text(sites, TOP_SITES)))  # one per op
    out = pd.DataFrame(rows, columns=["op_name", "direction", "call_site"])
    out.insert(0, "op_id", op_id(out["op_name"], out["direction"]))
    return out[["op_id", "call_site"]]


def with_call_sites(
    ops: pd.DataFrame, ranges: pd.DataFrame, inst: pd.DataFrame, cpu_only: CpuOnly | None
) -> pd.DataFrame:
    """``ops`` with a ``call_site`` column (None where the capture has none for an op)."""
    ops = ops.copy()
    if not has_call_sites(ranges) or ops.empty:
        ops["call_site"] = pd.Series([None] * len(ops), index=ops.index, dtype=object)
        return ops
    sites = op_call_sites(ranges, inst, cpu_only).set_index("op_id")["call_site"]
    ops["call_site"] = ops["op_id"].map(sites).astype(object)
    ops["call_site"] = ops["call_site"].where(ops["call_site"].notna(), None)
    return ops
