"""Apply a torch capture's sidecar (``<trace>.perfguard``) to the Kineto ranges.

The capture wrote it from the profiler's in-memory results
(:mod:`perfguard.capture.torch_results`): the exact name of each op torch's JSON
writer damaged (``unknown`` for a non-ASCII ``record_function`` name) and the
user's ``file:line`` around each op. Entries are matched to ranges by start and
end (ns on the JSON's clock, within a nanosecond: the JSON's µs decimals are
read back through float64); a range the sidecar does not name keeps what the
JSON said. A sidecar that cannot be read is a note, never an error: the JSON is
the capture.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from perfguard.arrays import not_none

SIDECAR_SUFFIX = ".perfguard"
#: ns: the JSON's µs with three decimals, read through float64, may be off by one
_TOLERANCE = 1


def apply_sidecar(path: Path, ranges: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """``ranges`` (the reader's, before :func:`finalize_ranges`) with the sidecar's
    names and call sites where it has them; unchanged when there is no sidecar."""
    side = path.with_name(path.name + SIDECAR_SUFFIX)
    if not side.is_file() or ranges.empty:
        return ranges
    try:
        doc = json.loads(side.read_text(encoding="utf-8"))
        start = np.asarray(doc["start"], dtype=np.int64)
        end = np.asarray(doc["end"], dtype=np.int64)
        names = np.asarray(doc["name"], dtype=object)
        site = np.asarray(doc["site"], dtype=np.int64)
        sites = np.asarray([*doc["sites"], None], dtype=object)
        if not (len(start) == len(end) == len(names) == len(site)):
            raise ValueError("columns of different lengths")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        notes.append(f"{side.name}: not read ({type(exc).__name__}: {exc}); names as the JSON has")
        return ranges
    r_start = ranges["start"].to_numpy(np.int64)
    r_end = ranges["end"].to_numpy(np.int64)
    row = _match(r_start, r_end, start, end)
    hit = row >= 0
    if not hit.any():
        notes.append(f"{side.name}: no op matched the trace (a sidecar of another capture?)")
        return ranges
    out = ranges.copy()
    named = hit & not_none(names)
    if named.any():
        name = out["name"].to_numpy(dtype=object).copy()
        name[row[named]] = names[named]
        out["name"] = name
        notes.append(
            f"{int(named.sum())} op name(s) taken from the profiler's in-memory results "
            "(torch's JSON writer damages non-ASCII and quoted names)"
        )
    placed = hit & (site >= 0)
    if placed.any():
        cs = out["call_site"].to_numpy(dtype=object).copy()
        empty = pd.isna(cs[row[placed]])
        cs[row[placed][empty]] = sites[site[placed]][empty]
        out["call_site"] = cs
    return out


def _match(
    r_start: np.ndarray, r_end: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """For each sidecar entry, the range row with its start and end (±1 ns), or -1."""
    order = np.lexsort((r_end, r_start))
    s_sorted = r_start[order]
    lo = np.searchsorted(s_sorted, start - _TOLERANCE, side="left")
    hi = np.searchsorted(s_sorted, start + _TOLERANCE, side="right")
    row = np.full(len(start), -1, dtype=np.int64)
    # a few ranges start within a ns of each other at most: look at each candidate
    for k in range(int((hi - lo).max(initial=0))):
        pos = lo + k
        live = (row < 0) & (pos < hi)
        cand = order[np.minimum(pos, len(order) - 1)]
        ok = live & (np.abs(r_end[cand] - end) <= _TOLERANCE)
        row[ok] = cand[ok]
    return row
