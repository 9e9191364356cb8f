"""Per-kernel aggregation (the kernel report): one row per (kernel, op)."""

from __future__ import annotations

import pandas as pd

from perfguard.arrays import factorize, first_rows, first_valid

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
    codes, _ = pd.factorize(name_code * max(len(n_ops), 1) + op_code)  # groups as first seen
    rows = first_rows(codes)
    # the per-group "first" columns by one take at each group's first row (a groupby
    # "first" costs 10-15 ms per text column of a million rows), the statistics by groupby
    firsts = ["name", "op_id", "short_name", "op_name", "direction", *GEOMETRY]
    firsts += [c for c in ("uses_tc", "tc_reason") if c in k.columns]
    out = pd.DataFrame({c: first_valid(k[c], codes, rows) for c in firsts}, copy=False)
    stats = k["dur"].groupby(codes, sort=True).agg(["size", "sum", "mean", "min", "max"])
    for col, stat in zip(cols[5:10], stats.columns, strict=True):
        out[col] = stats[stat].to_numpy()
    out = out.sort_values(["gpu_time_total", "name"], ascending=[False, True])
    return out.reset_index(drop=True)[cols]
