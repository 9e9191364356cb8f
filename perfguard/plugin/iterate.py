"""What the ``gpuprofile`` fixture gives a test: :class:`GpuProfile` and its ``iterations()``.

``for step in gpuprofile.iterations(): train_step()`` runs ``warmup``
unrecorded steps (``step`` = -warmup .. -1), then ``rounds`` rounds of
``iterations`` recorded ones (``step`` = 0 .. rounds*iterations-1). Rounds
are the verdict's replicates: between two rounds the loop pauses briefly
and collects garbage, so a round starts from a settled state, and each
round records how busy the machine was (:mod:`perfguard.capture.load`).
Around the recorded ones the active
:class:`Capturer` runs: the capture starts before the first and stops after
the last; each recorded step is one ``perfguard.iteration`` range, its wall
time measured with ``perf_counter_ns`` between device synchronisations, so
the time includes the GPU work the step queued.

Without ``--perfguard`` there is no capturer: the steps just run.

Standard library only (a capturer imports torch/nvtx itself, when used).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from perfguard.capture.load import LoadProbe, load_of
from perfguard.plugin.marker import ProfileSpec

#: pause between rounds, seconds: lets a collector, a frequency governor or a
#: neighbour's burst settle, so rounds are less correlated than back-to-back steps
ROUND_GAP_S = 0.05


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


def _cuda() -> object | None:
    """``torch.cuda`` when the test already uses CUDA (never initialises it)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda
    except Exception:  # a broken CUDA install must not fail the test
        return None
    return None


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
        #: the round of each recorded iteration
        self.round_of: list[int] = []
        #: (others' ticks, all ticks) of the machine's CPU during each round
        self.load_ticks: list[tuple[int, int]] = []
        #: (ns the test's thread waited for a CPU, ns of wall time) of each round
        self.wait_ns: list[tuple[int, int]] = []
        #: the CUDA allocator's peak over the recorded rounds, bytes (None without CUDA)
        self.peak_memory: int | None = None
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

    @property
    def rounds(self) -> int:
        return self.spec.rounds

    @property
    def load(self) -> float:
        """Other processes' share of the machine's CPU during the recorded rounds."""
        return load_of(self.load_ticks)

    @property
    def wait(self) -> float:
        """Share of the rounds' wall time the test's thread waited for a CPU."""
        return load_of(self.wait_ns)

    def _plain(self) -> Generator[int, None, None]:
        yield from range(-self.spec.warmup, self.spec.iterations * self.spec.rounds)
        self.completed = True

    def _run(self) -> Generator[int, None, None]:
        cap = self.capturer
        assert cap is not None
        for step in range(-self.spec.warmup, 0):
            yield step
        cap.sync()
        cuda = _cuda()
        if cuda is not None:
            cuda.reset_peak_memory_stats()
        cap.start()
        probe = LoadProbe()
        try:
            clock, cpu = time.perf_counter_ns, time.thread_time_ns
            step = 0
            for r in range(self.spec.rounds):
                if r:
                    gc.collect()
                    time.sleep(ROUND_GAP_S)
                probe.start()
                for _ in range(self.spec.iterations):
                    cap.sync()
                    t0, c0 = clock(), cpu()
                    with cap.iteration():
                        yield step
                        cap.sync()  # inside the range: the step's GPU work belongs to it
                    self.wall_times_ns.append(clock() - t0)
                    self.cpu_times_ns.append(cpu() - c0)
                    self.round_of.append(r)
                    step += 1
                waited = probe.waited()
                if waited is not None:
                    self.wait_ns.append(waited)
                ticks = probe.stop()
                if ticks is not None:
                    self.load_ticks.append(ticks)
            self.completed = True
            if cuda is not None:
                self.peak_memory = int(cuda.max_memory_allocated())
        finally:
            cap.stop()

    def close(self) -> None:
        """Stop a loop the test left early (an exception or ``break``): the capture ends."""
        for loop in self._loops:
            loop.close()
        self._loops.clear()
