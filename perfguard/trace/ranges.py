"""Finishing touches every reader applies to its ranges table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.arrays import levels
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
    depth, parent = _tree(ranges) if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    ranges["depth"] = depth
    ranges["parent_id"] = parent
    bprop = ranges["bprop"].to_numpy(dtype=bool).copy() if "bprop" in ranges else np.zeros(n, bool)
    # inherit backward-ness down the tree, one depth level at a time (parents first)
    for at in levels(depth)[1:]:
        bprop[at] |= bprop[parent[at]]
    # coded once on the two values (lexical order, as text would sort)
    ranges["direction"] = pd.Categorical.from_codes(
        np.where(bprop, 0, 1).astype(np.int8), dtype=DIRECTIONS
    )
    if "bprop" in ranges:
        del ranges["bprop"]
    return ranges


def _tree(ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``depth`` and ``parent_id`` of every range: time containment per thread, the
    ``async`` ranges roots (they cannot nest)."""
    n = len(ranges)
    idx = np.flatnonzero((ranges["kind"] != "async").to_numpy())
    keys = ranges[["rank", "pid", "tid"]]
    start, end = ranges["start"].to_numpy(), ranges["end"].to_numpy()
    if len(idx) < n:  # only the columns the nesting needs, not the whole table
        keys, start, end = keys.iloc[idx], start[idx], end[idx]
    (codes,) = group_codes(keys)
    del keys
    depth, parent = range_tree(start, end, codes)
    if len(idx) == n:  # every range nests (the usual case): no copies
        return depth, parent
    all_depth = np.zeros(n, dtype=np.int64)
    all_parent = np.full(n, NO_PARENT, dtype=np.int64)
    all_depth[idx] = depth
    all_parent[idx] = np.where(parent >= 0, idx[np.clip(parent, 0, None)], NO_PARENT)
    return all_depth, all_parent


def ids_are_rows(ranges: pd.DataFrame) -> bool:
    """Whether ``range_id`` is each range's row number, as :func:`finalize_ranges`
    numbers them (a hand-built table may not): per-range arrays can then be indexed
    by id."""
    ids = ranges["range_id"].to_numpy()
    return bool(np.array_equal(ids, np.arange(len(ids), dtype=ids.dtype)))
