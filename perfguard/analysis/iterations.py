"""Iterations: where they come from, and which iteration an event belongs to.

Sources, in order of precedence:

* ``--key-node NAME``: DLProf's rule (user guide ch. 7). For N instances of
  the key node k1..kN on a rank, there are N+1 intervals
  ``[t0, k1.end), [k1.end, k2.end), ..., [kN.end, t_last]`` numbered 0..N,
  where t0/t_last are the first/last timestamps of that rank.
* explicit iteration ranges: ``ProfilerStep#N`` (numbered N, as the
  profiler numbered them) or ``perfguard.iteration`` (numbered 0, 1, ...).
* none: the trace has no iterations; every aggregate covers the whole run.

An op instance belongs to the iteration holding its start; a GPU activity to
the iteration holding its launching call (its own start when it has none),
because the CPU decides which iteration issued the work.
"""

from __future__ import annotations

import difflib

import numpy as np
import pandas as pd

from perfguard.errors import AnalysisError
from perfguard.trace.model import Trace
from perfguard.trace.names import ITERATION_NAMES, iteration_number

COLUMNS = ["rank", "iteration", "start", "end", "source"]


def rank_spans(trace: Trace) -> pd.DataFrame:
    """First and last timestamp per rank over every event table (``rank, t0, t1``)."""
    parts = [
        getattr(trace, t)
        for t in ("ranges", "api_calls", "kernels", "memops")
        if len(getattr(trace, t))
    ]
    if not parts:
        return pd.DataFrame({"rank": [], "t0": [], "t1": []}, dtype=np.int64)
    # per table, then over the tables: no concatenated copy of every event
    per = pd.concat([_span_per_rank(p) for p in parts])
    g = per.groupby(level="rank")
    return pd.DataFrame({"t0": g["t0"].min(), "t1": g["t1"].max()}).reset_index()


def _span_per_rank(table: pd.DataFrame) -> pd.DataFrame:
    """``t0``, ``t1`` of one event table, indexed by rank. A table of one rank (the
    usual case) takes two reductions, not a groupby (+90 MiB at 4.8M ranges)."""
    rank = table["rank"]
    lo, hi = rank.min(), rank.max()
    if lo == hi:
        index = pd.Index([lo], dtype=rank.dtype, name="rank")
        start, end = table["start"], table["end"]
        return pd.DataFrame(
            {
                "t0": pd.Series([start.min()], index=index, dtype=start.dtype),
                "t1": pd.Series([end.max()], index=index, dtype=end.dtype),
            },
        )
    cols = table[["rank", "start", "end"]]
    return cols.groupby("rank").agg(t0=("start", "min"), t1=("end", "max"))


def iteration_intervals(trace: Trace, key_node: str | None = None) -> pd.DataFrame:
    """The iteration intervals of ``trace`` (columns :data:`COLUMNS`)."""
    if key_node is not None:
        return _key_node_intervals(trace, key_node)
    r = trace.ranges[trace.ranges["kind"] == "iteration"]
    if r.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in COLUMNS}).astype(
            {"source": object}
        )
    number = iteration_number(r["name"])
    ordinal = r.groupby("rank").cumcount()
    own = r["name"].isin(ITERATION_NAMES)
    it = pd.DataFrame(
        {
            "rank": r["rank"],
            "iteration": number.where(~own, ordinal).fillna(ordinal).astype(np.int64),
            "start": r["start"],
            "end": r["end"],
            "source": np.where(own, "perfguard.iteration", "ProfilerStep"),
        }
    )
    it = it.sort_values(["rank", "start"]).drop_duplicates(["rank", "iteration"])
    return it.reset_index(drop=True)[COLUMNS]


def _key_node_intervals(trace: Trace, key_node: str) -> pd.DataFrame:
    r = trace.ranges
    hits = r[(r["name"] == key_node) & (r["kind"] != "async")]
    if hits.empty:
        raise AnalysisError(
            f"key node {key_node!r} not found in the trace's ranges{_suggest(r, key_node)}"
        )
    spans = rank_spans(trace).set_index("rank")
    parts = []
    for rank, h in hits.groupby("rank"):
        ends = np.sort(h["end"].to_numpy(np.int64))
        t0, t1 = int(spans["t0"][rank]), int(spans["t1"][rank])
        starts = np.concatenate([[t0], ends])
        stops = np.concatenate([ends, [max(t1, int(ends[-1]))]])
        parts.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "iteration": np.arange(len(starts), dtype=np.int64),
                    "start": starts,
                    "end": stops,
                    "source": f"key node {key_node}",
                }
            )
        )
    return pd.concat(parts, ignore_index=True)[COLUMNS]


def _suggest(ranges: pd.DataFrame, key_node: str) -> str:
    names = ranges["name"].dropna().unique().tolist()
    close = difflib.get_close_matches(key_node, names, n=3)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def assign_iteration(rank: np.ndarray, t: np.ndarray, intervals: pd.DataFrame) -> pd.Series:
    """Iteration of each ``(rank, t)``: NA outside every interval.

    Intervals are half-open ``[start, end)`` except the last of each rank,
    which includes its end.
    """
    s = pd.Series(iteration_numbers(rank, t, intervals), dtype="Int64")
    return s.mask(s < 0)


def iteration_numbers(rank: np.ndarray, t: np.ndarray, intervals: pd.DataFrame) -> np.ndarray:
    """:func:`assign_iteration` as an int64 array, -1 outside every interval. Lean
    for millions of times (the folded instances' starts): a capture of one rank
    is not copied per rank, and the search works in place."""
    rank = np.asarray(rank)
    t = np.asarray(t, dtype=np.int64)
    out = np.full(len(t), -1, dtype=np.int64)
    one = len(t) > 0 and int(rank.min()) == int(rank.max())
    for r, iv in intervals.groupby("rank"):
        if one:
            if r != rank[0]:
                continue
            at, tt = None, t
        else:
            at = np.flatnonzero(rank == r)
            if not len(at):
                continue
            tt = t[at]
        iv = iv.sort_values("start")
        starts = iv["start"].to_numpy(np.int64)
        ends = iv["end"].to_numpy(np.int64)
        its = iv["iteration"].to_numpy(np.int64)
        pos = np.searchsorted(starts, tt, side="right")
        pos -= 1
        inside = pos >= 0
        np.clip(pos, 0, None, out=pos)
        end = ends[pos]
        closed = pos == len(starts) - 1  # the last interval includes its end
        closed &= tt == end
        inside &= (tt < end) | closed
        del end, closed
        if at is None:
            out[inside] = its[pos[inside]]
        else:
            out[at[inside]] = its[pos[inside]]
    return out


def select_window(
    intervals: pd.DataFrame, iter_start: int | None, iter_stop: int | None
) -> pd.DataFrame:
    """The intervals with ``iter_start <= iteration <= iter_stop`` (inclusive, as DLProf).

    Raises :class:`AnalysisError` when the bounds select nothing.
    """
    if iter_start is None and iter_stop is None:
        return intervals
    if intervals.empty:
        raise AnalysisError(
            "--iter-start/--iter-stop need iterations, but the trace has none: "
            "pass --key-node NAME or profile with ProfilerStep / perfguard.iteration ranges"
        )
    lo = iter_start if iter_start is not None else int(intervals["iteration"].min())
    hi = iter_stop if iter_stop is not None else int(intervals["iteration"].max())
    if iter_start is not None and iter_stop is not None and iter_start > iter_stop:
        raise AnalysisError(f"--iter-start {lo} is after --iter-stop {hi}")
    chosen = intervals[intervals["iteration"].between(lo, hi)]
    if chosen.empty:
        have = f"{int(intervals['iteration'].min())}..{int(intervals['iteration'].max())}"
        raise AnalysisError(f"iteration range {lo}..{hi} is empty: the trace has iterations {have}")
    return chosen
