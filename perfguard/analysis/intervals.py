"""Interval arithmetic on whole columns: union length per group.

Flattened figures (GPU busy time, an op's GPU idle time) must never count
overlapping work twice, so they take the union of intervals. Done with one
sort and a grouped running maximum, not a loop over intervals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def union_length(start: np.ndarray, end: np.ndarray, group: np.ndarray | None = None) -> pd.Series:
    """Length of the union of ``[start, end)`` intervals per group.

    Returns a Series indexed by group value (a single entry ``0`` when
    ``group`` is None). Empty input gives an empty Series.
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    g = np.zeros(len(start), dtype=np.int64) if group is None else np.asarray(group)
    if len(start) == 0:
        return pd.Series(dtype=np.int64)
    if g.dtype.kind in "iu":
        fast = _union_length_int(start, end, g)
        if fast is not None:
            return fast
    df = pd.DataFrame({"g": g, "s": start, "e": end}, copy=False).sort_values(
        ["g", "s"], kind="stable"
    )
    # the furthest end reached by earlier intervals of the same group (int64 throughout:
    # ns timestamps exceed float64's exact range)
    reach = df.groupby("g", sort=False)["e"].cummax().to_numpy(np.int64)
    gs = df["g"].to_numpy()
    first = np.ones(len(gs), dtype=bool)
    first[1:] = gs[1:] != gs[:-1]
    prev = np.empty_like(reach)
    prev[1:] = reach[:-1]
    prev[first] = np.iinfo(np.int64).min
    lo = np.maximum(df["s"].to_numpy(), prev)
    contrib = np.clip(df["e"].to_numpy() - lo, 0, None)
    return pd.Series(contrib).groupby(gs).sum()


def _union_length_int(start: np.ndarray, end: np.ndarray, g: np.ndarray) -> pd.Series | None:
    """:func:`union_length` for integer groups, in numpy (see :func:`sorted_union_length`).
    None when the shifted ends would not fit in int64."""
    order = sort_by_group_then(g, start)
    gs, s, e = g[order], start[order], end[order]
    first = np.ones(len(gs), dtype=bool)
    first[1:] = gs[1:] != gs[:-1]
    heads = np.flatnonzero(first)
    lengths = sorted_union_length(s, e, heads)
    return None if lengths is None else pd.Series(lengths, index=gs[heads])


def sort_by_group_then(group: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The order that sorts by ``group`` then ``t`` (``np.lexsort((t, group))``, ties
    in input order): one argsort of a packed int64 key when it fits, 2-3x faster."""
    group = np.asarray(group, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    if not len(t):
        return np.zeros(0, dtype=np.int64)
    g0, t0 = int(group.min()), int(t.min())
    span = int(t.max()) - t0 + 1
    if (int(group.max()) - g0 + 1) * span >= 2**62:
        return np.lexsort((t, group))
    return np.argsort((group - g0) * span + (t - t0), kind="stable")


def sorted_union_length(s: np.ndarray, e: np.ndarray, heads: np.ndarray) -> np.ndarray | None:
    """Union length of each segment of intervals sorted by (segment, start); ``heads``
    are the segments' first positions. A running maximum over all segments at once
    (each shifted above the previous one), sums by ``reduceat``. None when the shifted
    ends would not fit in int64 (int64 throughout: ns timestamps exceed float64)."""
    n = len(s)
    if not n:
        return np.zeros(0, dtype=np.int64)
    t0 = int(e.min())
    span = int(e.max()) - t0 + 1
    if len(heads) * span >= 2**62:
        return None
    first = np.zeros(n, dtype=bool)
    first[heads] = True
    # in place where it can be: three arrays of n alive at most, not eight
    offset = np.cumsum(first, dtype=np.int64)
    offset -= 1
    offset *= span  # each segment shifted above the previous one
    reach = e.astype(np.int64)
    reach -= t0
    reach += offset
    np.maximum.accumulate(reach, out=reach)
    reach -= offset
    reach += t0
    del offset
    lo = np.empty_like(reach)  # the furthest end before each interval, in its segment
    lo[1:] = reach[:-1]
    del reach
    lo[first] = np.iinfo(np.int64).min
    np.maximum(lo, s, out=lo)
    np.subtract(e, lo, out=lo)  # what each interval adds to the union
    np.clip(lo, 0, None, out=lo)
    return np.add.reduceat(lo, heads)


def segment_figures(
    group: np.ndarray, at: np.ndarray, start: np.ndarray, end: np.ndarray, kernel: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """GPU figures of each group of activities: ``(groups, figures)``.

    Pair ``i`` puts activity ``at[i]`` (a row of the per-activity arrays
    ``start``, ``end``, ``kernel``) in group ``group[i]``; an activity may sit
    in several groups. ``groups`` are the distinct group values ascending, and
    ``figures`` holds, per group in that order, ``time`` (summed durations,
    overlap counted per activity), ``count``, ``kernels`` (how many are
    kernels), ``span`` (last end minus first start) and ``busy`` (the union
    of the intervals). One sort by group then start, then segment reductions.
    """
    group = np.asarray(group, dtype=np.int64)
    if not len(group):
        empty = np.zeros(0, dtype=np.int64)
        return empty, {c: empty for c in ("time", "count", "kernels", "span", "busy")}
    order = sort_by_group_then(group, start[at])
    group, at = group[order], at[order]
    del order
    s, e, k = start[at], end[at], kernel[at]
    del at
    heads = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
    busy = sorted_union_length(s, e, heads)
    if busy is None:  # pragma: no cover - needs > 2**62 ns of spread
        busy = union_length(s, e, group).to_numpy(np.int64)  # ascending groups, as heads
    group = group[heads]
    figures = {
        "time": np.add.reduceat(e - s, heads),
        "count": np.diff(np.append(heads, len(s))),
        "kernels": np.add.reduceat(k.astype(np.int64), heads),
        "span": np.maximum.reduceat(e, heads) - np.minimum.reduceat(s, heads),
        "busy": busy,
    }
    return group, figures


def covered_within(
    start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Length of the union of the ``[start, end)`` intervals inside each window
    ``[lo[i], hi[i])``.

    The intervals are merged into disjoint blocks once (one sort, a running
    maximum); the covered length up to any time is then a prefix sum found by
    binary search, so each window costs O(log n) whatever it overlaps.
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.maximum(np.asarray(end, dtype=np.int64), start)
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.maximum(np.asarray(hi, dtype=np.int64), lo)
    if not len(start):
        return np.zeros(len(lo), dtype=np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    block_start = s[heads]
    block_end = reach[np.append(heads[1:] - 1, len(s) - 1)]
    length = block_end - block_start
    before = np.concatenate([[0], np.cumsum(length)])  # covered by blocks 0..k-1

    def covered_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(block_start, t, side="right")  # blocks starting at or before t
        last = np.clip(k - 1, 0, None)
        partial = np.clip(t - block_start[last], 0, length[last])
        return np.where(k > 0, before[last] + partial, 0)

    return covered_until(hi) - covered_until(lo)
