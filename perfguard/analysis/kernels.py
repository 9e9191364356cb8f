"""Per-kernel aggregation (the kernel report): one row per (kernel, op)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.arrays import Groups, factorize, first_rows, first_valid
from perfguard.trace.model import KERNEL_GEOMETRY


def aggregate_kernels(acts: pd.DataFrame, kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """Kernels grouped by ``(name, op_id)``, sorted by total GPU time.

    Input: attributed activities with ``op_id, op_name, direction``.
    Output: ``name, short_name, op_id, op_name, direction, calls,
    gpu_time_{total,avg,min,max}``, the launch geometry of the first
    launch, and ``uses_tc, tc_reason`` when the activities carry them. Memops are not
    kernels and are left out. The geometry is read from ``acts`` when it has
    the columns, else from ``kernels`` (the trace's) at ``acts["kernel_row"]``.
    """
    stats = ["calls", "gpu_time_total", "gpu_time_avg", "gpu_time_min", "gpu_time_max"]
    cols = ["name", "short_name", "op_id", "op_name", "direction", *stats, *KERNEL_GEOMETRY]
    if "uses_tc" in acts.columns:
        cols += ["uses_tc", "tc_reason"]
    kernel = np.flatnonzero((acts["activity"] == "kernel").to_numpy(bool))
    if not len(kernel):
        return pd.DataFrame(columns=cols)
    # the kernel rows are not copied out of ``acts`` (17 columns of a million rows):
    # only the two key columns and the durations are taken, the rest is read at
    # each group's first row
    # one int64 key per (name, op): grouping a million rows by two text columns
    # hashes every string; names repeat, so they are coded once (same groups, same order)
    # taken before converting: coded text is factorized from its codes
    name_code, _ = factorize(acts["name"].array[kernel], use_na_sentinel=False)
    op_code, n_ops = factorize(acts["op_id"].array[kernel], use_na_sentinel=False)
    codes, _ = pd.factorize(name_code * max(len(n_ops), 1) + op_code)  # groups as first seen
    rows = first_rows(codes)
    # the per-group "first" columns by one take at each group's first row (a groupby
    # "first" costs 10-15 ms per text column of a million rows)
    firsts = [c for c in cols if c in acts.columns and c not in stats]
    out = pd.DataFrame(
        {c: first_valid(acts[c], codes, rows, through=kernel) for c in firsts}, copy=False
    )
    if kernels is not None and "kernel_row" in acts.columns:
        krow = acts["kernel_row"].to_numpy(np.int64)[kernel]  # row of trace.kernels
        for c in KERNEL_GEOMETRY:
            if c not in out.columns and c in kernels.columns:
                out[c] = first_valid(kernels[c], codes, rows, through=krow)
    for c in KERNEL_GEOMETRY:  # activities without the geometry, and no kernels to read it in
        if c not in out.columns:
            out[c] = pd.array([pd.NA] * len(out), dtype="Int64")
    dur = (acts["end"].to_numpy(np.int64) - acts["start"].to_numpy(np.int64))[kernel]
    groups = Groups(codes)
    out["calls"] = groups.size
    for col, fn in zip(stats[1:], (groups.sum, groups.mean, groups.min, groups.max), strict=True):
        out[col] = fn(dur)
    out = out.sort_values(["gpu_time_total", "name"], ascending=[False, True])
    return out.reset_index(drop=True)[cols]


def tensor_core_ops(ops: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """The TC-eligible ops (rows of ``ops``, the tensor report) with their kernels'
    ``tc_kernels``, ``non_tc_kernels``, ``unknown_kernels`` (launch counts by
    ``uses_tc``: True, False, unknown), ``tc_names``, ``non_tc_names`` (short names,
    sorted, ``; ``-joined) and ``non_tc_time`` (kernel time off Tensor Cores); no rows
    when the analysis has no Tensor Core columns."""
    if "tc_eligible" not in ops.columns:
        return ops.iloc[0:0]
    ops = ops[ops["tc_eligible"].fillna(False).astype(bool)].copy()
    k = kernels
    flag = k["uses_tc"].astype("boolean")
    tc, unknown = flag.fillna(False).astype(bool), flag.isna()
    frame = pd.DataFrame(
        {
            "op_id": k["op_id"],
            "tc_kernels": k["calls"].where(tc, 0),
            "non_tc_kernels": k["calls"].where(~tc & ~unknown, 0),
            "unknown_kernels": k["calls"].where(unknown, 0),
        }
    )
    counts = frame.groupby("op_id").sum().astype("Int64")
    short = k["short_name"].fillna(k["name"])
    names = pd.DataFrame(
        {
            "tc_names": short.where(tc).groupby(k["op_id"]).agg(_names),
            "non_tc_names": short.where(~tc).groupby(k["op_id"]).agg(_names),
        }
    )
    ops = ops.join(counts, on="op_id").join(names, on="op_id")
    ops["non_tc_time"] = ops["kernel_time"] - ops["tc_kernel_time"]
    return ops


def _names(s: pd.Series) -> str:
    return "; ".join(sorted(set(s.dropna().astype(str))))
