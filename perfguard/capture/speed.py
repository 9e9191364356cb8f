"""How fast the machine runs right now: a fixed reference workload, timed.

Why: on a virtual or shared machine the whole CPU slows down now and then,
by a third for a second or so (measured on the 2-core CI VM with the
calibration's MLP step and this reference timed side by side for 150 s: 8
episodes of +24 % to +40 % that moved both together, each 0.3-1 s long;
benchmarks/README.md, "Machine speed"). The test's thread is not waiting
for a CPU then (``capture/load.py`` sees nothing) and every step of a round
is slow, so the round's fastest step is too: a whole round, or a whole short
session, reads a third slower with tight rounds, which no statistic can tell
from a regression. Timing a workload that never changes just before and just
after each timing round shows it: the plugin re-runs a round whose
reference ran :data:`SLOW_FACTOR` slower than the test's typical reference
taken at the same point (:mod:`perfguard.plugin.iterate`), and store mode does not compare a
session whose reference level differs from the baseline's
(:mod:`perfguard.compare.timing`).

The workload is interpreter arithmetic (what a Python-heavy step is made of)
plus a copy of a few MiB (memory bandwidth, what a tensor-heavy CPU step
leans on); its value is the fastest of :data:`REPEATS` runs, about a
millisecond in all. Standard library only: the plugin loads light.
"""

from __future__ import annotations

import time

#: a round whose reference ran this much slower than the test's fastest is re-run
SLOW_FACTOR = 1.15
#: runs of the reference per measurement; its value is the fastest
REPEATS = 3
_LOOP = 5000
_BUFFER = bytearray(4 << 20)


def _once() -> int:
    clock = time.perf_counter_ns
    t0 = clock()
    acc = 0
    for i in range(_LOOP):
        acc += i * i
    bytes(_BUFFER)  # a 4 MiB copy
    return clock() - t0


def reference_ns() -> int:
    """The reference workload's time now, ns (the fastest of :data:`REPEATS` runs)."""
    return min(_once() for _ in range(REPEATS))
