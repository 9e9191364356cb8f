"""Finishing touches every reader applies to its ranges table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.trace.model import NO_PARENT
from perfguard.trace.nesting import Nesting, group_codes


def finalize_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """Number the ranges and derive their tree and direction.

    Input columns: ``start, end, rank, pid, tid, kind`` and a boolean
    ``bprop`` (the range itself is known to be backward work).
    Adds ``range_id`` (row number), ``depth`` and ``parent_id`` (time
    containment per thread; ``async`` ranges stay roots), and ``direction``:
    ``bprop`` for a backward range and everything nested in it, else
    ``fprop``. Drops ``bprop``.
    """
    ranges = ranges.reset_index(drop=True)
    n = len(ranges)
    if "rank" not in ranges:
        ranges["rank"] = 0
    ranges["range_id"] = np.arange(n, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    parent = np.full(n, NO_PARENT, dtype=np.int64)
    if n:
        nestable = (ranges["kind"] != "async").to_numpy()
        idx = np.flatnonzero(nestable)
        sub = ranges.iloc[idx]
        (codes,) = group_codes(sub[["rank", "pid", "tid"]])
        nest = Nesting(sub["start"].to_numpy(), sub["end"].to_numpy(), codes)
        depth[idx] = nest.unsorted_depth()
        p = nest.unsorted_parent()
        parent[idx] = np.where(p >= 0, idx[np.clip(p, 0, None)], NO_PARENT)
    ranges["depth"] = depth
    ranges["parent_id"] = parent
    bprop = ranges["bprop"].to_numpy(dtype=bool).copy() if "bprop" in ranges else np.zeros(n, bool)
    # inherit backward-ness down the tree, one depth level at a time
    for level in range(1, int(depth.max()) + 1 if n else 0):
        at = np.flatnonzero(depth == level)
        bprop[at] |= bprop[parent[at]]
    ranges["direction"] = np.where(bprop, "bprop", "fprop")
    return ranges.drop(columns=["bprop"], errors="ignore")
