"""Vectorised interval nesting on threads: depth, parent, innermost enclosing.

Ranges on one thread nest (NVTX push/pop, framework ops), so their tree
follows from times alone. Everything here is numpy sorting and binary
search, O(n log n), with Python loops only over tree depth.

Conventions: a range ``[start, end]`` is *open* at time ``t`` when
``start <= t < end``; a range that ends exactly when another starts is its
sibling, not its parent. Ties sort by start ascending, end descending, so of
two ranges starting together the longer one is the parent. Ranges that
overlap without nesting (possible only with start/end ranges) get the
nearest open range as parent; :func:`innermost_enclosing` checks enclosure
explicitly, so attribution stays correct for them.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from perfguard.arrays import levels, narrow, stable_order, unique_sorted

_LIMIT = 2**62


def group_codes(*keys: pd.DataFrame) -> list[np.ndarray]:
    """Map the rows of several key frames (same columns) to shared int codes.

    Codes number the distinct key tuples in sorted order.
    """
    sizes = [len(k) for k in keys]
    fast = _int_group_codes(keys)
    if fast is not None:
        return list(np.split(fast, np.cumsum(sizes)[:-1]))
    both = pd.concat(keys, ignore_index=True)
    if both.empty:
        return [np.zeros(0, dtype=np.int64) for _ in keys]
    codes = both.groupby(list(both.columns), sort=True, dropna=False).ngroup().to_numpy(np.int64)
    return list(np.split(codes, np.cumsum(sizes)[:-1]))


def _int_group_codes(keys: tuple[pd.DataFrame, ...]) -> np.ndarray | None:
    """:func:`group_codes` for plain integer columns: sorted codes per column, combined.

    The same numbering as a sorted groupby, without hashing row tuples.
    None when a column is not a plain numpy integer (nullable, text) or the
    combined code would not fit.
    """
    if not keys or not sum(len(k) for k in keys):
        return None
    packed = _packed_key(keys)
    if packed is not None:
        return _sorted_codes(packed)[0]
    combined: np.ndarray | None = None
    size = 1
    for col in keys[0].columns:
        parts = [k[col] for k in keys]
        if not all(isinstance(p.dtype, np.dtype) and p.dtype.kind in "iu" for p in parts):
            return None
        codes, count = _sorted_codes(np.concatenate([p.to_numpy() for p in parts]))
        size *= count
        if size >= _LIMIT:  # pragma: no cover - needs billions of distinct keys
            return None
        combined = codes if combined is None else combined * count + codes
    assert combined is not None
    return _sorted_codes(combined)[0]


def _packed_key(keys: tuple[pd.DataFrame, ...]) -> np.ndarray | None:
    """The key columns packed into one int64 whose order is the rows' sorted order,
    when every column is a non-negative numpy integer and the widths fit in 62
    bits (rank, pid, tid do); None otherwise."""
    columns = []
    bits = 0
    for col in keys[0].columns:
        parts = [k[col] for k in keys]
        if not all(isinstance(p.dtype, np.dtype) and p.dtype.kind in "iu" for p in parts):
            return None
        values = np.concatenate([p.to_numpy() for p in parts]).astype(np.int64, copy=False)
        if values.min() < 0:
            return None
        width = int(values.max()).bit_length()
        bits += width
        columns.append((values, width))
    if bits > 62:
        return None
    packed = np.zeros(len(columns[0][0]), dtype=np.int64)
    for values, width in columns:
        packed <<= width
        packed |= values
    return packed


def _sorted_codes(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense rank of each value among the distinct values: ``(codes, number distinct)``.

    A lookup table when the values span a small range (ids, small codes), else
    a hash factorization.
    """
    if values.dtype.kind == "i" and len(values):
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < max(4 * len(values), 1 << 16):
            offset = values.astype(np.int64) - lo
            present = np.zeros(hi - lo + 1, dtype=bool)
            present[offset] = True
            rank = np.cumsum(present, dtype=np.int64) - 1
            return rank[offset], int(rank[-1]) + 1
    if values.dtype.kind in "iu":  # a sort and a binary search: faster than hashing
        uniques = unique_sorted(values)
        return np.searchsorted(uniques, values).astype(np.int64), len(uniques)
    codes, uniques = pd.factorize(values, sort=True)
    return codes.astype(np.int64), len(uniques)


def _composite(group: np.ndarray, t: np.ndarray, t0: int, span: int) -> np.ndarray:
    ngroups = int(group.max()) + 1 if len(group) else 1
    if ngroups * span >= _LIMIT:  # pragma: no cover - needs > 2**62 ns of spread
        raise OverflowError("time span too large for composite keys")
    return group.astype(np.int64) * span + (t.astype(np.int64) - t0)


def _nesting_order(
    key: np.ndarray, end: np.ndarray, group: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The order of ``np.lexsort((-end, key))`` (by group and start, then end
    descending) and ``key`` in that order.

    Exports list ranges by start time (nsys, Kineto): then one radix sort of the
    few thread codes (:func:`stable_order`) gives the order, checked in one pass;
    otherwise two stable sorts of single int64 keys (end descending, then group
    and start packed), 2x faster than ``lexsort``.
    """
    n = len(key)
    if n and int(group.max()) - int(group.min()) < 2**16:
        order = stable_order(group)  # a radix sort: O(n)
        k = key[order]
        if bool(np.greater_equal(k[1:], k[:-1]).all()):
            tie = np.flatnonzero(k[1:] == k[:-1])
            if (end[order[tie]] >= end[order[tie + 1]]).all():  # ties already longest first
                return order, k
        del k
    by_end = np.argsort(-end, kind="stable")
    order = by_end[np.argsort(key[by_end], kind="stable")]
    del by_end
    return order, key[order]


def _later_zero_length(key: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """For each sorted range, the zero-length ranges (sorted positions ``zero``) of its
    thread that start when it starts and sort at or after it, which the depth's
    binary search counted as ended before it: the k-th of them counts itself and
    the ones after it, any other range of that key all of them (they sort after
    the longer ones: ends descending). Only the rows sharing a key with one are
    touched, not every row."""
    out = np.zeros(len(key), dtype=np.int64)
    keys, first, count = np.unique(key[zero], return_index=True, return_counts=True)
    lo = np.searchsorted(key, keys, side="left")
    size = np.searchsorted(key, keys, side="right") - lo
    rows = np.repeat(lo - np.cumsum(size) + size, size) + np.arange(int(size.sum()))
    out[rows] = np.repeat(count, size)
    out[zero] -= np.arange(len(zero)) - np.repeat(first, count)
    return out


def _parent(depth: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Sorted position of each range's parent (-1 for roots), from the sorted depths.

    Sorted order is a preorder walk of each thread's forest: the parent of a range
    at depth d is the last range at depth d - 1 before it, if that one is on the
    same thread (threads are contiguous). One binary search per depth level, so
    O(n log n) whatever the depth.
    """
    parent = np.full(len(depth), -1, dtype=np.int64)
    for above, at in itertools.pairwise(levels(depth)):
        hit = np.searchsorted(above, at) - 1
        cand = above[np.clip(hit, 0, None)] if len(above) else at
        ok = (hit >= 0) & (group[cand] == group[at])
        parent[at[ok]] = cand[ok]
    return parent


class Nesting:
    """The forest of ranges grouped by thread.

    Attributes are aligned with the *sorted* order ``order`` (group, start
    ascending, end descending): ``parent`` (sorted position of the parent, -1
    for roots), ``start``, ``end``, ``group``, ``key`` (group and start packed)
    and ``depth`` (derived on first use when the tree was given).

    Built for millions of ranges: it keeps four int64 arrays and the thread
    codes, and computes the tree with a few more alive at once (finalizing
    4.8M ``emit_nvtx`` ranges is the reader's memory peak).
    """

    def __init__(
        self,
        start: np.ndarray,
        end: np.ndarray,
        group: np.ndarray,
        tree: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """``tree``: ``(depth, parent)`` in input order (parent an input row, -1 for
        roots), when :class:`Nesting` already computed them on exactly these ranges
        (see :meth:`from_tree`); otherwise they are derived from the times."""
        start = np.asarray(start, dtype=np.int64)
        end = np.asarray(end, dtype=np.int64)
        group = narrow(group)  # thread codes: int32, half the bytes of an array it keeps
        n = len(start)
        self._depth: np.ndarray | None = None
        if n == 0:
            self.order = np.zeros(0, dtype=np.int64)
            self.start, self.end, self.group = start, end, group
            self.t0, self.span = 0, 1
            self.key = np.zeros(0, dtype=np.int64)
            self._depth = np.zeros(0, dtype=np.int64)
            self.parent = np.zeros(0, dtype=np.int64)
            return
        self.t0 = int(min(start.min(), end.min()))
        self.span = int(max(start.max(), end.max())) - self.t0 + 1
        self.order, self.key = _nesting_order(
            _composite(group, start, self.t0, self.span), end, group
        )
        self.start = start[self.order]
        self.end = end[self.order]
        self.group = group[self.order]
        if tree is None:
            self._depth = self._sorted_depth()
            self.parent = _parent(self._depth, self.group)
            return
        depth, parent = tree
        p = np.asarray(parent, dtype=np.int64)[self.order]
        has = p >= 0
        position = np.empty(n, dtype=np.int64)
        position[self.order] = np.arange(n, dtype=np.int64)
        p[has] = position[p[has]]
        self.parent = p

    @classmethod
    def from_tree(
        cls,
        start: np.ndarray,
        end: np.ndarray,
        group: np.ndarray,
        depth: np.ndarray,
        parent: np.ndarray,
    ) -> Nesting:
        """The same forest, from a depth and parent (input row, -1 for roots) already
        computed by :class:`Nesting` on exactly these ranges (a finalized ranges
        table): only the sort is done again."""
        return cls(start, end, group, tree=(depth, parent))

    @property
    def depth(self) -> np.ndarray:
        """Depth in sorted order (derived from the times when the tree was given:
        nothing that reuses a tree asks for it)."""
        if self._depth is None:
            self._depth = self._sorted_depth()
        return self._depth

    def _sorted_depth(self) -> np.ndarray:
        """Depth of each range in sorted order: the ranges of its thread sorted before
        it that are still open at its start (``end > start``).

        Counted as (ranges sorted before it) - (ranges of any earlier thread, and of
        its own that ended by its start): one binary search of its start among the
        sorted ends. Zero-length ranges starting when it starts count as ended but
        sort after it; they are added back.
        """
        n = len(self.start)
        end_key = _composite(self.group, self.end, self.t0, self.span)
        end_key.sort(kind="stable")  # nearly sorted already (ends follow starts): runs
        closed = np.searchsorted(end_key, self.key, side="right")
        del end_key
        depth = np.arange(n, dtype=np.int64)
        depth -= closed
        del closed
        zero = np.flatnonzero(self.start == self.end)
        if len(zero):
            depth += _later_zero_length(self.key, zero)
        return depth

    def innermost_enclosing(self, group: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Sorted position of the innermost range of the same group open at ``t``.

        Returns -1 where no range encloses. Finds the latest-starting range
        that started at or before ``t`` and walks up parents until one
        encloses ``t`` (``start <= t <= end``).
        """
        t = np.asarray(t, dtype=np.int64)
        group = np.asarray(group, dtype=np.int64)
        out = np.full(len(t), -1, dtype=np.int64)
        if len(self.start) == 0 or len(t) == 0:
            return out
        inside = (t >= self.t0) & (t < self.t0 + self.span)
        tq = np.clip(t, self.t0, self.t0 + self.span - 1)
        gq = np.clip(group, 0, None)
        key = _composite(gq, tq, self.t0, self.span)
        cand = np.searchsorted(self.key, key, side="right") - 1
        valid = inside & (group >= 0) & (cand >= 0)
        cand = np.where(valid, cand, 0)
        valid &= self.group[cand] == group
        while True:
            encloses = valid & (self.start[cand] <= t) & (t <= self.end[cand])
            out[encloses] = cand[encloses]
            valid &= ~encloses
            if not valid.any():
                return out
            cand = np.where(valid, self.parent[cand], 0)
            valid &= cand >= 0
            cand = np.where(valid, cand, 0)

    def unsorted_parent(self) -> np.ndarray:
        """Parent as an index into the *input* order (-1 for roots)."""
        return _unsorted_parent(self.order, self.parent)

    def unsorted_depth(self) -> np.ndarray:
        """Depth in the input order."""
        return _in_input_order(self.order, self.depth)


def _in_input_order(order: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per-range ``values`` in sorted order, put back in input order."""
    out = np.empty(len(order), dtype=values.dtype)
    out[order] = values
    return out


def _unsorted_parent(order: np.ndarray, parent: np.ndarray) -> np.ndarray:
    mapped = order[parent]  # a root's -1 picks the last row: replaced next
    mapped[parent < 0] = -1
    return _in_input_order(order, mapped)


def range_tree(
    start: np.ndarray, end: np.ndarray, group: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(depth, parent)`` of each range in input order (parent an input row, -1 for
    roots): :class:`Nesting`'s tree without keeping its sorted times, which
    :func:`perfguard.trace.ranges.finalize_ranges` does not need (they are a third
    of the memory finalizing millions of ranges takes)."""
    nest = Nesting(start, end, group)
    order, depth_sorted, parent_sorted = nest.order, nest.depth, nest.parent
    del nest  # its sorted start, end, key and thread codes
    depth = _in_input_order(order, depth_sorted)
    del depth_sorted
    return depth, _unsorted_parent(order, parent_sorted)
