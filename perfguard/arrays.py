"""Small numpy helpers shared by the layers (no knowledge of any of them).

``np.unique`` on numpy 2.3+ may take a hash-table path that, on millions of
int64 values, measured 100x slower here than sorting (3.5 s against 0.03 s
for 4M values on the 2-core development machine): these helpers sort.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

#: ``None`` as a 0-d object array: numpy takes a bare ``None`` as the object it is
#: (``np.where(c, x, None)``), but its type stubs accept no ``None`` where values are meant
NONE = np.array(None, dtype=object)


def not_none(values: np.ndarray) -> np.ndarray:
    """``v is not None`` per element of an object array (NaN is a value here)."""
    return np.not_equal(values, NONE)


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values``, ascending (``np.unique`` by sorting)."""
    s = np.sort(np.asarray(values), kind="quicksort")
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def stable_order(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")``; a radix sort (linear) when the values are
    integers spanning fewer than 2**16, as depths and thread codes do."""
    values = np.asarray(values)
    if values.dtype.kind in "iu" and len(values):
        lo = int(values.min())
        if int(values.max()) - lo < 2**16:
            return np.argsort((values - lo).astype(np.uint16), kind="stable")
    return np.argsort(values, kind="stable")


def levels(depth: np.ndarray) -> list[np.ndarray]:
    """The rows at each depth 0, 1, ..., max, ascending within a level: a tree walked
    a level at a time, parents before children (one radix sort, no sorted copy of
    the depths). A negative depth (a range that ends before it starts, from a
    reader that repairs after finalizing) is in no level."""
    depth = np.asarray(depth)
    if not len(depth) or int(depth.max()) < 0:
        return []
    by_depth = stable_order(depth)
    low = min(int(depth.min()), 0)
    counts = np.bincount(depth - low if low else depth)
    ends = np.cumsum(counts)
    starts = ends - counts
    return [by_depth[starts[i] : ends[i]] for i in range(-low, len(ends))]


def index_dtype(bound: int) -> type[np.signedinteger]:
    """int32 for row numbers, ids or codes whose magnitude stays below ``bound`` (half
    the bytes of a per-row array), else int64."""
    return np.int32 if bound < 2**31 else np.int64


def narrow(values: np.ndarray) -> np.ndarray:
    """Integers as int32 when every value fits (half the bytes of a per-row array),
    else int64; not copied when already so."""
    values = np.asarray(values)
    if len(values) and values.min() >= -(2**31) and values.max() < 2**31:
        return values.astype(np.int32, copy=False)
    return values.astype(np.int64, copy=False)


def unique_first(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_index=True)``: distinct values ascending, and the
    position of the first occurrence of each."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")  # ties keep input order: first comes first
    s = values[order]
    keep = np.empty(len(s), dtype=bool)
    if len(s):
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep], order[keep]


def first_rows(codes: np.ndarray) -> np.ndarray:
    """Row of the first occurrence of each code, for codes numbered in order of first
    appearance (as ``pd.factorize`` numbers them): a row is a code's first exactly
    when the code exceeds every code before it. One pass, no sort."""
    codes = np.asarray(codes)
    if not len(codes):
        return np.zeros(0, dtype=np.int64)
    top = np.maximum.accumulate(codes)
    new = np.empty(len(codes), dtype=bool)
    new[0] = True
    np.greater(top[1:], top[:-1], out=new[1:])
    return np.flatnonzero(new)


class Groups:
    """Rows grouped by codes ``0..k-1`` (every code present, as ``pd.factorize``
    numbers them), reduced per group with numpy.

    One stable sort (a radix sort while codes fit 16 bits), then one
    ``ufunc.reduceat`` per statistic: a pandas named aggregation of 18
    columns over a million rows spends most of its 50 ms outside the
    arithmetic. Integer sums are exact; floating-point sums are left to
    pandas, whose compensated summation the reports rely on.
    """

    def __init__(self, codes: np.ndarray) -> None:
        codes = np.asarray(codes, dtype=np.int64)
        n_groups = int(codes.max()) + 1 if len(codes) else 0
        self.order = stable_order(codes)
        ordered = codes[self.order]
        self.heads = np.flatnonzero(np.concatenate([[len(codes) > 0], ordered[1:] != ordered[:-1]]))
        if len(self.heads) != n_groups or (len(codes) and ordered[0] != 0):
            raise ValueError("codes must number groups 0..k-1 with every code present")
        self.size = np.diff(np.append(self.heads, len(codes)))

    def sum(self, values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.asarray(values)[self.order], self.heads)

    def min(self, values: np.ndarray) -> np.ndarray:
        return np.minimum.reduceat(np.asarray(values)[self.order], self.heads)

    def max(self, values: np.ndarray) -> np.ndarray:
        return np.maximum.reduceat(np.asarray(values)[self.order], self.heads)

    def any(self, values: np.ndarray) -> np.ndarray:
        return np.logical_or.reduceat(np.asarray(values, dtype=bool)[self.order], self.heads)

    def mean(self, values: np.ndarray) -> np.ndarray:
        """Mean of integers as pandas gives it (exact sum, then one division)."""
        return self.sum(np.asarray(values, dtype=np.int64)) / self.size


def first_valid(
    values: pd.Series, codes: np.ndarray, rows: np.ndarray, through: np.ndarray | None = None
) -> pd.Series:
    """``values.groupby(codes).first()`` (the first non-NA value of each group, NA
    when a group has none) for codes ``0..k-1`` whose first rows are ``rows``;
    rows coded -1 belong to no group. With ``through``, grouped row ``i`` is
    ``values[through[i]]`` (a column of another table, not copied out of it).

    A group's first row answers unless it is NA, so only groups whose first
    row is NA are searched: one ``take`` instead of a groupby, which costs
    10-15 ms per text column of a million rows. Returns a Series indexed
    ``0..k-1`` with the column's dtype (coded text: plain, :func:`plain_text`).
    """
    rows = np.asarray(rows)
    out = values.array.take(rows if through is None else through[rows])
    missing = np.flatnonzero(pd.isna(out))
    if not len(missing):
        return plain_text(pd.Series(out, dtype=values.dtype))
    if through is not None:
        values = pd.Series(values.array.take(through), dtype=values.dtype)
    valid = np.flatnonzero(values.notna().to_numpy(dtype=bool))
    found, at = unique_first(np.asarray(codes)[valid])  # each group's first non-NA row
    pick = rows.copy()
    hit = np.isin(found, missing)
    pick[found[hit]] = valid[at[hit]]
    # a group with no value at all keeps its first (NA) row
    return plain_text(pd.Series(values.array.take(pick), dtype=values.dtype))


def plain_text(s: pd.Series) -> pd.Series:
    """Coded text as the plain text column it codes (per-event tables keep text
    coded; an aggregate of a few rows per op or kernel holds it plain); any other
    column as it is."""
    if not isinstance(s.dtype, pd.CategoricalDtype):
        return s
    return s.astype(text_dtype(s.dtype))


def text_dtype(dtype: pd.CategoricalDtype) -> Any:
    """The type pandas gives the plain text of coded text ``dtype``: what a column
    of those values built from Python objects would have (``str`` for text, object
    for no value or mixed values)."""
    return pd.Series(np.asarray(dtype.categories, dtype=object)).dtype


def per_distinct(values: pd.Series, rule: Callable[[pd.Series], pd.Series]) -> pd.Series:
    """``rule(values)`` computed once per distinct value (names repeat millions of
    times): ``rule`` gets the distinct values (NA among them) as a Series ``0..k-1``."""
    values = pd.Series(values, copy=False)
    codes, uniques = factorize(values, use_na_sentinel=False)
    answer = rule(pd.Series(uniques, dtype=object))
    return pd.Series(answer.array.take(codes), index=values.index, dtype=answer.dtype)


def factorize(values: Any, use_na_sentinel: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of a text column, the same codes and uniques, 3-5x faster
    when values repeat.

    Trace columns hold few distinct strings repeated millions of times, and
    a repeat is usually the very same Python object: rows are grouped by
    object identity first (integers hash fast), then only one row per
    object is factorized by value, so equal strings that are distinct
    objects still get one code.
    """
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        return _factorize_coded(pd.Categorical(values), use_na_sentinel)
    arr = values.to_numpy(dtype=object) if isinstance(values, pd.Series) else values
    arr = np.asarray(arr, dtype=object)
    if len(arr) < 4096:
        codes, uniques = pd.factorize(arr, use_na_sentinel=use_na_sentinel)
        return codes.astype(np.int64), np.asarray(uniques, dtype=object)
    id_codes, _ = pd.factorize(_object_ids(arr))
    rep_codes, uniques = pd.factorize(arr[first_rows(id_codes)], use_na_sentinel=use_na_sentinel)
    return rep_codes[id_codes].astype(np.int64), np.asarray(uniques, dtype=object)


def _factorize_coded(cat: pd.Categorical, use_na_sentinel: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`factorize` of coded text from its codes (small integers, hashed fast),
    in order of first appearance: no Python object per row."""
    codes = cat.codes
    order: np.ndarray
    present: np.ndarray | pd.api.extensions.ExtensionArray
    if use_na_sentinel:  # a missing value (-1) stays -1
        order, present = pd.arrays.IntegerArray(codes.astype(np.int64), codes < 0).factorize()
    else:
        order, present = pd.factorize(codes)  # without the sentinel -1 is a value like any other
    categories = np.append(np.asarray(cat.categories, dtype=object), np.nan)  # -1: missing
    return order.astype(np.int64), categories[np.asarray(present, dtype=np.int64)]


def _object_ids(arr: np.ndarray) -> np.ndarray:
    """``id()`` of every element of an object array, as int64.

    In CPython an object array's buffer holds the elements' addresses, which
    are their ids: read as integers they come at memory speed instead of a
    Python call per element (a million calls cost 40-70 ms). Elsewhere,
    ``map(id, ...)``.
    """
    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return np.fromiter(map(id, arr), dtype=np.int64, count=len(arr))  # pragma: no cover
    arr = np.ascontiguousarray(arr, dtype=object)
    view = np.ctypeslib.as_array((ctypes.c_int64 * len(arr)).from_address(arr.ctypes.data))
    return view.copy()  # a copy: the view does not keep ``arr`` (and its objects) alive
