"""How busy the machine was while a round ran: other processes' share of the CPU.

A CPU-time or wall-time measurement taken while other processes held the
cores is not the code's speed (another test, a build, a neighbour on a
shared runner), and no statistic on the rounds can tell that apart from a
regression. So every round records the share of the machine's CPU time
that went to *other* processes during it: ``/proc/stat`` counts every
core's busy time, ``/proc/self/stat`` this process's own (all its threads);
the difference over the round, divided by the cores' total time, is the
load of the others (0 on an idle machine, about 1 with one busy process per
core). The verdict uses it to refuse comparing a busy round with a quiet
baseline (:mod:`perfguard.compare.timing`).

Beside it, the share of the round's wall time that a thread of this
process spent *runnable but waiting for a CPU* (``/proc/self/task/*/schedstat``,
the scheduler's run delay; the most any one thread waited): how much the
machine, not the code, stretched this round. A sleep-bound test on a busy
machine waits little; a CPU-bound one with a busy process per core waits
half the time. Every thread counts, not only the one that measures: when
torch splits a small op over its intra-op threads and a neighbour preempts
one of them, the measuring thread does not wait, it spins at the op's
barrier, and its CPU time grew 75-fold in a real session (a 64x64 matmul,
two busy processes on two cores) with no wait of its own to see. The
verdict raises its threshold by the difference from the baseline's wait.

Linux only; elsewhere (or when /proc cannot be read) both are NaN and
nothing is refused. Standard library only.
"""

from __future__ import annotations

import math
import os
import time


def _machine() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all cores since boot."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    # guest time is already counted in user time: the first 8 fields are the total
    total = sum(ticks[:8])
    return total - idle, total


def _own() -> int | None:
    """This process's user + system clock ticks (all threads)."""
    try:
        with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[-1].split()
    return int(rest[11]) + int(rest[12])  # utime, stime (fields 14 and 15)


def _run_delays() -> dict[str, int] | None:
    """Nanoseconds each thread of this process has waited on a run queue."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    out = {}
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as fh:
                out[tid] = int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return out or None


def load_of(ticks: list[tuple[int, int]]) -> float:
    """The others' share over several rounds (their ticks added: short rounds are coarse)."""
    total = sum(t for _, t in ticks)
    return max(0.0, min(1.0, sum(o for o, _ in ticks) / total)) if total > 0 else math.nan


class LoadProbe:
    """``start()`` then ``stop()`` around a round; ``stop`` gives (others', all) ticks."""

    def __init__(self) -> None:
        self._m: tuple[int, int] | None = None
        self._o: int | None = None
        self._d: dict[str, int] | None = None
        self._t = 0

    def start(self) -> None:
        self._m, self._o = _machine(), _own()
        self._d, self._t = _run_delays(), time.perf_counter_ns()

    def waited(self) -> tuple[int, int] | None:
        """(ns the most-delayed thread of this process waited for a CPU, ns of wall
        time) since :meth:`start`; a thread started since counts from zero."""
        d, t = _run_delays(), time.perf_counter_ns()
        if d is None or self._d is None or t <= self._t:
            return None
        before = self._d
        return max(max(0, v - before.get(tid, 0)) for tid, v in d.items()), t - self._t

    def stop(self) -> tuple[int, int] | None:
        m, o = _machine(), _own()
        if m is None or o is None or self._m is None or self._o is None:
            return None
        total = m[1] - self._m[1]
        others = max(0, (m[0] - self._m[0]) - (o - self._o))
        return (others, total) if total > 0 else None
