"""Where a session's wall seconds go: one clock for every part the session reports.

Each part of a test's measurement (warm-up, timed rounds, profiled round, analysis, ...)
and of the session (start-up, results, reports, save, ...) is timed by :func:`timed` into
a ``{part: seconds}`` map: a test's goes into its entry's ``phase_s``, the session's into
the document's (:mod:`perfguard.plugin.outputs`). Standard library only: the iteration
loop uses it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

#: a test's own parts: the loop the test runs without perfguard too (its warm-up, its
#: kept timed steps); every other part is perfguard's cost
OWN_PHASES = ("warmup", "timing")


@contextmanager
def timed(into: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall seconds of the ``with`` body to ``into[name]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[name] = into.get(name, 0.0) + time.perf_counter() - t0
