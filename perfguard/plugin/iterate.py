"""What the ``gpuprofile`` fixture gives a test: :class:`GpuProfile` and its ``iterations()``.

``for step in gpuprofile.iterations(): train_step()`` runs ``warmup``
unrecorded steps (``step`` = -warmup .. -1), then ``iterations`` recorded
ones (``step`` = 0 .. iterations-1). Around the recorded ones the active
:class:`Capturer` runs: the capture starts before the first and stops after
the last; each recorded step is one ``perfguard.iteration`` range, its wall
time measured with ``perf_counter_ns`` between device synchronisations, so
the time includes the GPU work the step queued.

Without ``--perfguard`` there is no capturer: the steps just run.

Standard library only (a capturer imports torch/nvtx itself, when used).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from perfguard.plugin.marker import ProfileSpec


class Capturer(Protocol):
    """A capture around recorded iterations (see :mod:`perfguard.plugin.capture`).

    ``start``/``stop`` never raise: a failure is kept in ``error`` and the
    test goes on uncaptured; the plugin reports it when the test ends.
    """

    error: str | None

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def sync(self) -> None: ...

    def iteration(self) -> AbstractContextManager[object]: ...


class GpuProfile:
    """The ``gpuprofile`` fixture's value: the marker's settings and the iteration loop."""

    def __init__(self, spec: ProfileSpec, capturer: Capturer | None = None) -> None:
        self.spec = spec
        self.capturer = capturer
        #: per recorded iteration, ns (empty without ``--perfguard``)
        self.wall_times_ns: list[int] = []
        #: CPU time of the test's thread per recorded iteration, ns: unlike the wall
        #: time it does not grow while other processes hold the CPU (kept in the
        #: record's meta for a CPU-only machine; the verdict uses the wall time)
        self.cpu_times_ns: list[int] = []
        self.started = False
        self.completed = False
        self._loops: list[Generator[int, None, None]] = []

    @property
    def capturing(self) -> bool:
        """Whether this test is being captured (``--perfguard`` is on)."""
        return self.capturer is not None

    def iterations(self) -> Iterator[int]:
        """Warm-up steps (negative), then the recorded steps 0..iterations-1. Once per test."""
        if self.started:
            raise RuntimeError("gpuprofile.iterations() may be used once per test")
        self.started = True
        loop = self._run() if self.capturer is not None else self._plain()
        self._loops.append(loop)
        return loop

    def _plain(self) -> Generator[int, None, None]:
        yield from range(-self.spec.warmup, self.spec.iterations)
        self.completed = True

    def _run(self) -> Generator[int, None, None]:
        cap = self.capturer
        assert cap is not None
        for step in range(-self.spec.warmup, 0):
            yield step
        cap.sync()
        cap.start()
        try:
            clock, cpu = time.perf_counter_ns, time.thread_time_ns
            for step in range(self.spec.iterations):
                cap.sync()
                t0, c0 = clock(), cpu()
                with cap.iteration():
                    yield step
                    cap.sync()  # inside the range: the step's GPU work belongs to it
                self.wall_times_ns.append(clock() - t0)
                self.cpu_times_ns.append(cpu() - c0)
            self.completed = True
        finally:
            cap.stop()

    def close(self) -> None:
        """Stop a loop the test left early (an exception or ``break``): the capture ends."""
        for loop in self._loops:
            loop.close()
        self._loops.clear()
