"""Repairs every reader (and the analysis, for any Trace) applies to hostile timestamps.

A damaged or hand-edited capture can hold an end before its start, or a
timestamp near the int64 limits. Summed as they are, the first gives
negative times in the reports; the second overflows the int64 arithmetic
of the analysis (spans, packed sort keys) and gives nonsense silently. So:

* an interval whose end is before its start is clamped to zero length (its
  end set to its start) and counted in a note: it still exists (a kernel
  was launched), it is never summed as negative time;
* a capture whose timestamps span more than :data:`MAX_SPAN_NS` (about 13
  days), or lie beyond +-2^62 ns, is rejected with a :class:`TraceError`:
  no real capture does, and every later int64 computation would risk
  overflow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfguard.errors import TraceError

#: the longest time span a capture may cover (2^50 ns: 13 days)
MAX_SPAN_NS = 1 << 50
#: no timestamp may lie beyond this (differences of two must fit in int64)
MAX_ABS_NS = 1 << 62
#: the event tables with ``start``/``end`` and how a note names their rows
TIMED_TABLES = {
    "ranges": "ranges",
    "api_calls": "API calls",
    "kernels": "kernels",
    "memops": "memory operations",
}


def clamp_inverted(df: pd.DataFrame, what: str) -> tuple[pd.DataFrame, str | None]:
    """``df`` with ``end`` raised to ``start`` where it was before it, and a note
    saying how many (None when none were). Missing ends are left as they are."""
    if not len(df) or "end" not in df or "start" not in df:
        return df, None
    end = df["end"]
    bad = (end < df["start"]).fillna(False).to_numpy(dtype=bool)
    n = int(bad.sum())
    if not n:
        return df, None
    df = df.copy(deep=False)
    start = df["start"].to_numpy(np.int64)
    # numpy, not a pandas masked assignment: that goes through float64 and rounds ns
    if isinstance(end.dtype, np.dtype):
        df["end"] = np.where(bad, start, end.to_numpy(np.int64))
    else:  # nullable: keep the missing ends missing
        missing = end.isna().to_numpy(dtype=bool)
        values = np.where(bad, start, end.to_numpy(np.int64, na_value=0))
        df["end"] = pd.arrays.IntegerArray(values, missing)
    return df, f"{n:,} {what} ended before they started: clamped to zero duration"


def check_time_span(tables: dict[str, pd.DataFrame], path: str | Path) -> None:
    """Raise :class:`TraceError` naming ``path`` when the timestamps of ``tables``
    (frames with ``start``/``end``) are beyond what int64 arithmetic can hold."""
    lo, hi = None, None
    for df in tables.values():
        for col in ("start", "end"):
            if col not in df or not len(df):
                continue
            values = df[col].dropna()
            if not len(values):
                continue
            a, b = int(values.min()), int(values.max())
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    if lo is None or hi is None:
        return
    if max(abs(lo), abs(hi)) >= MAX_ABS_NS:
        raise TraceError(
            path,
            f"timestamp {hi if abs(hi) >= abs(lo) else lo:,} ns is out of range (beyond "
            "+-2^62 ns): a damaged capture",
        )
    if hi - lo > MAX_SPAN_NS:
        days = (hi - lo) / 86_400e9
        raise TraceError(
            path,
            f"timestamps span {days:,.0f} days ({lo:,} to {hi:,} ns): a damaged capture "
            "(no real capture covers more than a few days)",
        )


def repair_times(
    tables: dict[str, pd.DataFrame], path: str | Path
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """:func:`check_time_span`, then :func:`clamp_inverted` on each of ``tables``
    (keyed as :data:`TIMED_TABLES`): the repaired tables and the notes."""
    check_time_span(tables, path)
    notes = []
    out = {}
    for name, df in tables.items():
        out[name], note = clamp_inverted(df, TIMED_TABLES.get(name, name))
        if note:
            notes.append(note)
    return out, notes


def last_timestamp(*tables: pd.DataFrame) -> int | None:
    """The latest ``start`` or ``end`` over ``tables``: the capture's last timestamp."""
    best = None
    for df in tables:
        for col in ("start", "end"):
            if col in df and len(df):
                v = df[col].max()
                if pd.notna(v):
                    best = int(v) if best is None else max(best, int(v))
    return best
