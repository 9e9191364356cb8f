"""Per-kernel aggregation (the kernel report): one row per (kernel, op)."""

from __future__ import annotations

import pandas as pd

from perfguard.arrays import factorize

GEOMETRY = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers",
            "shared_mem"]  # fmt: skip


def aggregate_kernels(acts: pd.DataFrame) -> pd.DataFrame:
    """Kernels grouped by ``(name, op_id)``, sorted by total GPU time.

    Input: attributed activities with ``op_id, op_name, direction``.
    Output: ``name, short_name, op_id, op_name, direction, calls,
    gpu_time_{total,avg,min,max}``, the launch geometry of the first
    launch, and ``uses_tc, tc_reason`` when the activities carry them. Memops are not
    kernels and are left out.
    """
    is_kernel = (acts["activity"] == "kernel").to_numpy()
    keep = ["name", "short_name", "op_id", "op_name", "direction", "start", "end", *GEOMETRY]
    keep += [c for c in ("uses_tc", "tc_reason") if c in acts.columns]
    k = acts.loc[is_kernel, keep]  # only what the report needs: a filter copies every column
    k = k.assign(dur=k["end"] - k["start"])
    cols = ["name", "short_name", "op_id", "op_name", "direction", "calls", "gpu_time_total",
            "gpu_time_avg", "gpu_time_min", "gpu_time_max", *GEOMETRY]  # fmt: skip
    if "uses_tc" in k.columns:
        cols += ["uses_tc", "tc_reason"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    # one int64 key per (name, op): grouping a million rows by two text columns
    # hashes every string; names repeat, so they are coded once (same groups, same order)
    name_code, _ = factorize(k["name"], use_na_sentinel=False)
    op_code, n_ops = factorize(k["op_id"], use_na_sentinel=False)
    k = k.assign(_key=name_code * max(len(n_ops), 1) + op_code)
    g = k.groupby("_key", sort=False)
    out = g.agg(
        name=("name", "first"),
        op_id=("op_id", "first"),
        short_name=("short_name", "first"),
        op_name=("op_name", "first"),
        direction=("direction", "first"),
        calls=("dur", "size"),
        gpu_time_total=("dur", "sum"),
        gpu_time_avg=("dur", "mean"),
        gpu_time_min=("dur", "min"),
        gpu_time_max=("dur", "max"),
        **{c: (c, "first") for c in GEOMETRY},
        **(
            {"uses_tc": ("uses_tc", "first"), "tc_reason": ("tc_reason", "first")}
            if "uses_tc" in k.columns
            else {}
        ),
    ).reset_index(drop=True)
    out = out.sort_values(["gpu_time_total", "name"], ascending=[False, True])
    return out.reset_index(drop=True)[cols]
