"""Finishing touches every reader applies to its ranges table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.arrays import stable_order
from perfguard.trace.model import DIRECTIONS, NO_PARENT
from perfguard.trace.nesting import group_codes, range_tree


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
    depth: np.ndarray | None = None
    parent: np.ndarray | None = None
    if n:
        nestable = (ranges["kind"] != "async").to_numpy()
        idx = np.flatnonzero(nestable)
        keys = ranges[["rank", "pid", "tid"]]
        start, end = ranges["start"].to_numpy(), ranges["end"].to_numpy()
        if len(idx) < n:  # only the columns the nesting needs, not the whole table
            keys, start, end = keys.iloc[idx], start[idx], end[idx]
        (codes,) = group_codes(keys)
        del keys
        d, p = range_tree(start, end, codes)
        del codes, start, end
        if len(idx) == n:  # every range nests (the usual case): no copies
            depth, parent = d, p
        else:  # async ranges stay roots
            depth = np.zeros(n, dtype=np.int64)
            parent = np.full(n, NO_PARENT, dtype=np.int64)
            depth[idx] = d
            parent[idx] = np.where(p >= 0, idx[np.clip(p, 0, None)], NO_PARENT)
        del d, p
    if depth is None or parent is None:  # no ranges
        depth, parent = np.zeros(n, dtype=np.int64), np.full(n, NO_PARENT, dtype=np.int64)
    ranges["depth"] = depth
    ranges["parent_id"] = parent
    bprop = ranges["bprop"].to_numpy(dtype=bool).copy() if "bprop" in ranges else np.zeros(n, bool)
    # inherit backward-ness down the tree, one depth level at a time (parents first)
    by_depth = stable_order(depth)
    bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2 if n else 0))
    for level in range(1, len(bounds) - 1):
        at = by_depth[bounds[level] : bounds[level + 1]]
        bprop[at] |= bprop[parent[at]]
    # coded once on the two values (lexical order, as text would sort)
    ranges["direction"] = pd.Categorical.from_codes(
        np.where(bprop, 0, 1).astype(np.int8), dtype=DIRECTIONS
    )
    if "bprop" in ranges:
        del ranges["bprop"]
    return ranges
