"""Keep only the NVTX ranges that enclose GPU work (opt-in, ``--gpu-ranges-only``).

PyTorch's ``emit_nvtx`` writes a range per aten op, 4.8 per kernel; most
launch nothing (``aten::view``, ``aten::empty``). At a million kernels
those ranges are most of the run's memory: the ranges table and the op
instances built from it. A range *encloses GPU work* when a call that
launched a kernel or memory operation (its correlation id is a kernel's or
memop's in the same process) starts inside it on its own thread
(``start <= t <= end``). That keeps every range that owns a kernel and all
of its ancestors, so attribution is unchanged. Kept besides: every range
that is not an op (iteration markers, cross-thread start/end ranges), an
unterminated range (it is closed later), and ranges named as asked (the key
node of ``--key-node``).

The nsys reader tests this on the columns it read, before it builds the
ranges table, and builds the table and its tree from the kept rows only.
With PyProf/DLProf markers (whose wrappers name bprop ops after their fprop
op) it filters after the markers are folded in instead.

What changes in the reports (why this is not the default): the CPU-only op
instances are gone, so the detail, op_type, group_node and iteration
reports lose their calls and CPU time (an op that never launches GPU work
disappears), and the summary's op counts fall. GPU time and its
attribution to ops are unchanged: every kernel keeps its owner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfguard.trace.nesting import group_codes
from perfguard.trace.ranges import finalize_ranges


@dataclass(frozen=True)
class RangeFilter:
    """Ask a reader to keep only the ranges that enclose GPU work, and these names."""

    #: range names kept whether or not they enclose GPU work (``--key-node``'s)
    keep_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launches:
    """The start times of the calls that launched GPU work, by thread."""

    pid: np.ndarray
    tid: np.ndarray
    t: np.ndarray

    @classmethod
    def of(cls, api: pd.DataFrame, activities: list[pd.DataFrame]) -> Launches:
        """The rows of ``api`` whose (pid, correlation id) is a GPU activity's."""
        empty = np.zeros(0, dtype=np.int64)
        key = ["pid", "correlation_id"]
        acts = [a[key] for a in activities if len(a) and "correlation_id" in a]
        if not len(api) or "correlation_id" not in api or not acts:
            return cls(empty, empty, empty)
        codes = group_codes(
            api[key].reset_index(drop=True),
            *(a.reset_index(drop=True) for a in acts),
        )
        rows = np.flatnonzero(np.isin(codes[0], np.concatenate(codes[1:])))
        return cls(*(api[c].to_numpy(np.int64)[rows] for c in ("pid", "tid", "start")))

    def inside(
        self, pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray
    ) -> np.ndarray:
        """Whether a launch on thread ``(pid, tid)`` starts in ``[start, end]``, per range."""
        n = len(start)
        if not len(self.t) or not n:
            return np.zeros(n, dtype=bool)
        frames = [
            pd.DataFrame({"pid": p, "tid": t}, copy=False)
            for p, t in ((self.pid, self.tid), (pid, tid))
        ]
        launch_thread, range_thread = group_codes(*frames)
        # one sorted key per (thread, time): thread code * span + time from the origin
        t0 = min(int(self.t.min()), int(start.min()))
        span = max(int(self.t.max()), int(end.max())) - t0 + 1
        if (int(range_thread.max()) + 1) * span >= 2**62:  # no room in int64: by thread
            return self._inside_by_thread(launch_thread, range_thread, start, end)
        keys = np.sort(launch_thread * span + (self.t - t0))
        lo = np.searchsorted(keys, range_thread * span + (start - t0), side="left")
        hi = np.searchsorted(keys, range_thread * span + (end - t0), side="right")
        return hi > lo

    def _inside_by_thread(
        self,
        launch_thread: np.ndarray,
        range_thread: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
    ) -> np.ndarray:
        out = np.zeros(len(start), dtype=bool)
        for code in np.intersect1d(launch_thread, range_thread):
            t = np.sort(self.t[launch_thread == code])
            rows = np.flatnonzero(range_thread == code)
            hi = np.searchsorted(t, end[rows], side="right")
            out[rows] = hi > np.searchsorted(t, start[rows], side="left")
        return out


def keep_mask(
    launches: Launches, ranges: dict[str, np.ndarray], named: np.ndarray | None = None
) -> np.ndarray:
    """Which ranges to keep. ``ranges``: ``pid, tid, start, end`` (int64), ``is_op`` and
    ``open`` (unterminated) as booleans; ``named``: whether each is named as asked."""
    keep = ~ranges["is_op"] | ranges["open"]
    keep |= launches.inside(ranges["pid"], ranges["tid"], ranges["start"], ranges["end"])
    return keep | named if named is not None else keep


def filter_finalized(
    ranges: pd.DataFrame, launches: Launches, keep_names: tuple[str, ...] = ()
) -> pd.DataFrame:
    """The kept rows of a finalized ranges table, its tree rebuilt from them (a range
    keeps the backward direction it inherited)."""
    if not len(ranges):  # no NVTX (the table may lack columns then)
        return ranges
    cols = {c: ranges[c].to_numpy(np.int64) for c in ("pid", "tid", "start", "end")}
    cols["is_op"] = (ranges["kind"] == "op").to_numpy(dtype=bool)
    cols["open"] = np.zeros(len(ranges), dtype=bool)
    named = ranges["name"].isin(keep_names).to_numpy(dtype=bool) if keep_names else None
    keep = keep_mask(launches, cols, named)
    if keep.all():
        return ranges
    out = ranges[keep].reset_index(drop=True)
    out["bprop"] = (out["direction"] == "bprop").to_numpy(dtype=bool)
    return finalize_ranges(out.drop(columns=["range_id", "depth", "parent_id", "direction"]))
