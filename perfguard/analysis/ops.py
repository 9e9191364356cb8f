"""Ops: naming, per-instance metrics, and per-op aggregation.

An *op* is a unique ``(op_name, direction)``. ``op_name`` is the range's
hierarchical name: the names of its enclosing op ranges joined with ``/``
(iteration markers are transparent), as DLProf named PyTorch ops
(``/model/layer1/conv1``). ``op_id`` is a hash of name and direction, so it
is stable across runs and baselines can be matched on it.

Per op instance (one range, or one unassociated GPU activity):

* CPU time: the range's duration (0 for unassociated work);
* GPU time: the summed durations of the kernels *and* memops attributed to
  it (accumulating, overlap counted per activity). DESIGN.md says
  "kernels"; memops are included because they are GPU work the op issued
  and DLProf/nsys projections count them too; the kernel report lists
  kernels only;
* CPU overhead: CPU time minus the time of CUDA API calls on the range's
  thread that start inside it (clipped at 0);
* GPU idle: the span from first attributed activity start to last end,
  minus the union of those activities (flattened).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from perfguard.analysis.attribution import UNASSOCIATED_PREFIX
from perfguard.analysis.intervals import union_length
from perfguard.trace.model import Trace
from perfguard.trace.nesting import group_codes

STATS = ("total", "avg", "min", "max")


def op_paths(ranges: pd.DataFrame) -> pd.Series:
    """Hierarchical name of every range (Series aligned with ``ranges``).

    Computed on distinct paths, level by level, so a million ranges with a
    few thousand distinct paths build only those few thousand strings.
    """
    n = len(ranges)
    if n == 0:
        return pd.Series([], dtype="object")
    name_code, names = pd.factorize(ranges["name"].fillna(""))
    depth = ranges["depth"].to_numpy()
    parent = ranges["parent_id"].to_numpy()
    # range_id is the row number (finalize_ranges); map parent ids to rows
    row_of = pd.Series(np.arange(n), index=ranges["range_id"].to_numpy())
    parent_row = np.where(parent >= 0, row_of.reindex(parent).fillna(-1).to_numpy(np.int64), -1)
    transparent = (ranges["kind"] == "iteration").to_numpy()
    path_id = np.full(n, -1, dtype=np.int64)
    table_parent: list[np.ndarray] = []
    table_name: list[np.ndarray] = []
    next_id = 0
    for level in range(int(depth.max()) + 1):
        at = np.flatnonzero(depth == level)
        pp = np.where(parent_row[at] >= 0, path_id[np.clip(parent_row[at], 0, None)], -1)
        keep = ~transparent[at]
        path_id[at[~keep]] = pp[~keep]
        at, pp = at[keep], pp[keep]
        if not len(at):
            continue
        pairs = pd.DataFrame({"p": pp, "n": name_code[at]})
        codes, uniq = pd.factorize(pd.MultiIndex.from_frame(pairs))
        path_id[at] = codes + next_id
        table_parent.append(uniq.get_level_values(0).to_numpy(np.int64))
        table_name.append(uniq.get_level_values(1).to_numpy(np.int64))
        next_id += len(uniq)
    text = np.empty(next_id, dtype=object)
    first = 0
    # one vectorised concatenation per level: parents are built before children
    for tp, tn in zip(table_parent, table_name, strict=True):
        leaf = names.to_numpy(dtype=object)[tn]
        parent_text = np.where(tp >= 0, text[np.clip(tp, 0, None)], "")
        text[first : first + len(tp)] = np.where(tp < 0, leaf, parent_text + "/" + leaf)
        first += len(tp)
    out = np.where(path_id >= 0, text[np.clip(path_id, 0, None)] if len(text) else None, None)
    return pd.Series(out, index=ranges.index, dtype="object")


def op_id(op_name: pd.Series, direction: pd.Series) -> pd.Series:
    """Stable 16-hex-digit id of ``(op_name, direction)``, hashed once per distinct op."""
    key = op_name.fillna("") + "\x1f" + direction.fillna("")
    codes, uniques = pd.factorize(key)
    ids = np.array(
        [hashlib.blake2b(u.encode(), digest_size=8).hexdigest() for u in uniques], dtype=object
    )
    return pd.Series(ids[codes] if len(codes) else [], index=op_name.index, dtype="object")


def op_instances(trace: Trace, acts: pd.DataFrame) -> pd.DataFrame:
    """One row per op instance with its metrics.

    Input: ``trace`` and attributed activities (``range_id``, ``instance``
    from :func:`perfguard.analysis.attribution.attribute`). Output columns:
    ``instance``, ``rank, pid, tid, start, end,
    op_name, name, direction, op_type, input_shapes, dtypes, cpu_time,
    gpu_time, kernel_count, memop_count, api_time, cpu_overhead, gpu_span,
    gpu_busy, gpu_idle``.
    """
    r = trace.ranges
    paths = op_paths(r)
    ops = r[r["kind"] == "op"]
    inst = pd.DataFrame(
        {
            "instance": ops["range_id"].to_numpy(),
            "rank": ops["rank"].to_numpy(),
            "pid": ops["pid"].to_numpy(),
            "tid": ops["tid"].to_numpy(),
            "start": ops["start"].to_numpy(),
            "end": ops["end"].to_numpy(),
            "op_name": paths[ops.index].to_numpy(),
            "name": ops["name"].to_numpy(),
            "direction": ops["direction"].to_numpy(),
            "op_type": ops["op_type"].to_numpy(),
            "input_shapes": ops["input_shapes"].to_numpy(),
            "dtypes": ops["dtypes"].to_numpy(),
        }
    )
    inst["cpu_time"] = inst["end"] - inst["start"]
    inst["api_time"] = _api_time_inside(trace, inst)

    orphan = acts[acts["range_id"] < 0]
    orphan_name = UNASSOCIATED_PREFIX + orphan["short_name"].fillna(orphan["name"]).astype(str)
    un = pd.DataFrame(
        {
            "instance": orphan["instance"].to_numpy(),
            "rank": orphan["rank"].to_numpy(),
            "pid": orphan["pid"].to_numpy(),
            "tid": orphan["launch_tid"].fillna(-1).to_numpy(np.int64),
            "start": orphan["start"].to_numpy(),
            "end": orphan["start"].to_numpy(),
            "op_name": orphan_name.to_numpy(),
            "name": orphan_name.to_numpy(),
            "direction": "fprop",
            "op_type": "unassociated",
            "cpu_time": 0,
            "api_time": 0,
        }
    )
    owner = acts["instance"].to_numpy()
    inst = pd.concat([inst, un], ignore_index=True) if len(un) else inst
    inst["cpu_overhead"] = (inst["cpu_time"] - inst["api_time"]).clip(lower=0)

    dur = (acts["end"] - acts["start"]).to_numpy()
    is_kernel = (acts["activity"] == "kernel").to_numpy()
    g = pd.DataFrame(
        {"owner": owner, "dur": dur, "k": is_kernel, "m": ~is_kernel,
         "s": acts["start"].to_numpy(), "e": acts["end"].to_numpy()}
    ).groupby("owner")  # fmt: skip
    per = pd.DataFrame(
        {
            "gpu_time": g["dur"].sum(),
            "kernel_count": g["k"].sum(),
            "memop_count": g["m"].sum(),
            "gpu_span": g["e"].max() - g["s"].min(),
        }
    )
    per["gpu_busy"] = union_length(acts["start"].to_numpy(), acts["end"].to_numpy(), owner)
    per["gpu_idle"] = per["gpu_span"] - per["gpu_busy"]
    inst = inst.join(per, on="instance")
    fill = {c: 0 for c in ("gpu_time", "kernel_count", "memop_count", "gpu_span", "gpu_busy",
                            "gpu_idle")}  # fmt: skip
    return inst.fillna(fill).astype({c: np.int64 for c in fill})


def _api_time_inside(trace: Trace, inst: pd.DataFrame) -> np.ndarray:
    """Summed duration of API calls on each instance's thread starting inside it."""
    api = trace.api_calls
    if api.empty or inst.empty:
        return np.zeros(len(inst), dtype=np.int64)
    a_code, i_code = group_codes(api[["rank", "pid", "tid"]], inst[["rank", "pid", "tid"]])
    t0 = int(min(api["start"].min(), inst["start"].min()))
    span = int(max(api["end"].max(), inst["end"].max())) - t0 + 2
    a_key = a_code * span + (api["start"].to_numpy() - t0)
    order = np.argsort(a_key, kind="stable")
    a_key = a_key[order]
    cum = np.concatenate([[0], np.cumsum((api["end"] - api["start"]).to_numpy()[order])])
    lo = np.searchsorted(a_key, i_code * span + (inst["start"].to_numpy() - t0), side="left")
    hi = np.searchsorted(a_key, i_code * span + (inst["end"].to_numpy() - t0), side="right")
    return cum[hi] - cum[lo]


def aggregate_ops(inst: pd.DataFrame) -> pd.DataFrame:
    """Per-op totals: one row per ``(op_name, direction)``, sorted by GPU time.

    Output: ``op_id, op_name, direction, op_type, calls, kernel_count`` and
    ``{cpu_time,gpu_time,cpu_overhead,gpu_idle}_{total,avg,min,max}``.
    """
    metrics = ["cpu_time", "gpu_time", "cpu_overhead", "gpu_idle"]
    if inst.empty:
        cols = ["op_id", "op_name", "direction", "op_type", "calls", "kernel_count"]
        cols += [f"{m}_{s}" for m in metrics for s in STATS]
        return pd.DataFrame(columns=cols)
    g = inst.groupby(["op_name", "direction"], sort=False)
    out = g.agg(
        op_type=("op_type", "first"),
        calls=("instance", "size"),
        kernel_count=("kernel_count", "sum"),
        **{
            f"{m}_{s}": (m, fn)
            for m in metrics
            for s, fn in zip(STATS, ("sum", "mean", "min", "max"), strict=True)
        },
    ).reset_index()
    out.insert(0, "op_id", op_id(out["op_name"], out["direction"]))
    out = out.sort_values(["gpu_time_total", "cpu_time_total", "op_name"],
                          ascending=[False, False, True])  # fmt: skip
    return out.reset_index(drop=True)
