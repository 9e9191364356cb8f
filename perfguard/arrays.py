"""Small numpy helpers shared by the layers (no knowledge of any of them).

``np.unique`` on numpy 2.3+ may take a hash-table path that, on millions of
int64 values, measured 100x slower here than sorting (3.5 s against 0.03 s
for 4M values on the 2-core development machine): these helpers sort.
"""

from __future__ import annotations

import numpy as np


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values``, ascending (``np.unique`` by sorting)."""
    s = np.sort(np.asarray(values), kind="quicksort")
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


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
