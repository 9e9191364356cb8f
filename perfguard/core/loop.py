"""The measurement loop: :class:`Loop` and its ``iterations()``, pytest-free (the plugin's
``gpuprofile`` fixture gives a test one: :class:`perfguard.plugin.iterate.GpuProfile`).

``for step in gpuprofile.iterations(): train_step()`` runs ``warmup``
unrecorded steps (``step`` = -warmup .. -1), then ``rounds`` rounds of
``iterations`` recorded ones (``step`` = 0, 1, ...). Rounds
are the verdict's replicates: between two rounds the loop pauses briefly
and collects garbage, so a round starts from a settled state, and each
round records how busy the machine was (:mod:`perfguard.capture.load`).
Each recorded step's wall time is measured with ``perf_counter_ns``
between device synchronisations, so it includes the GPU work the step
queued.

**Timing is not taken under an in-process profiler on the CPU.** A
framework profiler (torch's Kineto, TensorFlow's, JAX's) records every op
from the test's own thread: on a CPU-only run it costs about as much as a
small op and its cost varies from round to round (measured: rounds of a
3.6 ms MLP step spread 3.8-7.2 ms profiled against 3.5-4.0 ms plain, in
the same minutes). So where the capturer says so (``separate_timing``)
and no GPU is in use, the ``rounds`` are timed with the profiler off and
one more round, the *profiled round*, runs under the capture for the
attribution, the counters and the gates. On a GPU every round is
profiled: GPU time, the verdict's metric there, only exists in the
capture, and a profiler's host cost does not change a kernel's duration.
The profiled round's iterations are each one ``perfguard.iteration``
range of the capture.

Without ``--perfguard`` there is no capturer: the steps just run.

The loop knows nothing of pytest or of perfguard's child processes: an A/B pair child
hands it its turn (:attr:`Loop.handoff`), the Callgrind child its counted plain loop
(:mod:`perfguard.plugin.iterate`). Standard library only (a capturer imports torch/nvtx
itself, when used).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from perfguard.capture.capturers import Capturer
from perfguard.capture.model_facts import model_facts
from perfguard.core.phases import timed
from perfguard.core.spec import ProfileSpec

if TYPE_CHECKING:
    from perfguard.capture.load import LoadProbe

#: pause between rounds, seconds: lets a collector, a frequency governor or a
#: neighbour's burst settle, so rounds are less correlated than back-to-back steps
ROUND_GAP_S = 0.05
#: pause before a timing round that ran while the machine was slow is run again, s:
#: the slow spells seen on shared VMs last a fraction of a second to a second
RETRY_PAUSE_S = 0.3
#: the checks between rounds (pauses, rounds run again) may cost this share of the rounds'
#: own time, or :data:`CHECKS_FLOOR_S` where that is more: a pause is never longer than
#: the round it follows, and re-runs stop when the budget is spent (a small test's 5
#: rounds of 10 ms spent 1.1-2.2 s in 0.3 s pauses and re-runs, issue 53)
CHECKS_SHARE = 0.5
CHECKS_FLOOR_S = 0.15


def _cuda() -> Any:
    """``torch.cuda`` when the test already uses CUDA (never initialises it)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda
    except Exception:  # a broken CUDA install must not fail the test
        return None
    return None


_NO_RANGE = contextlib.nullcontext()


class Loop:
    """A test's iteration loop under its spec: warm-up, timed rounds, the profiled round."""

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
        #: per recorded iteration: whether the capture was on (False: a timing round)
        self.profiled: list[bool] = []
        #: (others' ticks, all ticks) of the machine's CPU during each round
        self.load_ticks: list[tuple[int, int]] = []
        #: (ns the test's thread waited for a CPU, ns of wall time) of each round
        self.wait_ns: list[tuple[int, int]] = []
        #: the CUDA allocator's peak over the recorded rounds, bytes (None without CUDA)
        self.peak_memory: int | None = None
        #: the reference workload's time around each kept timing round, ns (the slower
        #: of before and after; :mod:`perfguard.capture.speed`); empty on a GPU
        self.speed_ns: list[int] = []
        #: timing rounds run again because the machine ran slow during them
        self.slow_rounds = 0
        self._last_round_s = ROUND_GAP_S
        self.started = False
        #: time the rounds, skip the profiled round (an A/B pair child after the first;
        #: only where timing rounds run apart from the profiler)
        self.timing_only = False
        #: the capture was started (with separate timing rounds: after all of them)
        self.captured = False
        self.completed = False
        #: wall seconds of the loop's parts: ``warmup``, ``timing`` (the kept unprofiled
        #: rounds' steps), ``round_checks`` (the rest of those rounds' time: pauses, garbage
        #: collections, speed checks, rounds run again), ``profiled`` (the capture's round,
        #: from the profiler's start to its stop, the trace written)
        self.phase_s: dict[str, float] = {}
        #: what the test wrote to run the loop, for messages (``benchmark(...)`` when
        #: pytest-benchmark's fixture drives it: :mod:`perfguard.plugin.benchmark_fixture`)
        self.loop_call = "gpuprofile.iterations()"
        #: how the loop was driven, for the record's note (the runner adds them)
        self.notes: list[str] = []
        #: what the test holds when its loop starts: its models' parameter tensors and its
        #: optimizers' settings (:mod:`perfguard.capture.model_facts`), which explain the
        #: optimizer's work when they change
        self.model_facts: dict[str, Any] = {}
        #: an A/B pair child's turn: the other tree takes one step before each of this
        #: one's timed steps (None: not in a pair; :mod:`perfguard.plugin.interleave`)
        self.handoff: Callable[[], None] | None = None
        self._loops: list[Generator[int, None, None]] = []
        self._setup: Callable[[], object] | None = None
        self._teardown: Callable[[], object] | None = None

    @property
    def capturing(self) -> bool:
        """Whether this test is being captured (``--perfguard`` is on)."""
        return self.capturer is not None

    def iterations(
        self,
        *,
        setup: Callable[[], object] | None = None,
        teardown: Callable[[], object] | None = None,
        scope: Iterable[object] | None = None,
    ) -> Iterator[int]:
        """Warm-up steps (negative), then the recorded steps 0..iterations-1. Once per test.

        ``setup``/``teardown`` run before/after every step, outside its timing, its
        iteration range and its instruction count (pytest-benchmark's ``pedantic``);
        ``scope``: the values the framework is decided from, by default the caller's
        local variables."""
        return self._start(sys._getframe(1), setup, teardown, scope)

    def _start(
        self,
        frame: Any,
        setup: Callable[[], object] | None = None,
        teardown: Callable[[], object] | None = None,
        scope: Iterable[object] | None = None,
    ) -> Iterator[int]:
        """The loop's generator, once per test; ``frame``: the test's, whose locals say
        the framework and the model."""
        if self.started:
            raise RuntimeError(f"{self.loop_call} may be used once per test")
        self.started = True
        self._setup, self._teardown = setup, teardown
        decide = getattr(self.capturer, "decide", None)
        if self.capturer is not None:
            values = list(frame.f_locals.values() if scope is None else scope)
            if decide is not None:  # the framework the test runs: what it holds by now
                decide(values)
            self.model_facts = model_facts(values, frame)
        loop = self._run() if self.capturer is not None else self._plain()
        self._loops.append(loop)
        return loop

    @property
    def max_steps(self) -> int:
        """The most steps the loop can ask for: warm-up, every timing round run twice (a
        slow spell's rounds are run again, at most ``rounds`` times), the call-site pass
        and the profiled round. What a Keras ``fit`` driving it must allow."""
        s = self.spec
        return s.warmup + s.iterations * (2 * s.rounds + 1) + 1

    def keras_callback(self, phase: str = "fit") -> Any:
        """A Keras callback through which ``model.fit`` (``predict``, ``evaluate``) runs
        this loop, one batch a step (:class:`perfguard.capture.keras.LoopCallback`)::

            cb = gpuprofile.keras_callback()
            model.fit(data.repeat(), epochs=1, steps_per_epoch=cb.max_steps, callbacks=[cb])
        """
        from perfguard.capture.keras import LoopCallback

        return LoopCallback(self._start(sys._getframe(1)), phase, self.max_steps)

    @property
    def rounds(self) -> int:
        return self.spec.rounds

    @property
    def load(self) -> float:
        """Other processes' share of the machine's CPU during the recorded rounds."""
        from perfguard.capture.load import load_of

        return load_of(self.load_ticks)

    @property
    def wait(self) -> float:
        """Share of the rounds' wall time the test's thread waited for a CPU."""
        from perfguard.capture.load import load_of

        return load_of(self.wait_ns)

    def _plain(self) -> Generator[int, None, None]:
        # an ordinary test run: one round (rounds are replicates for a verdict)
        yield from self._steps(range(-self.spec.warmup, self.spec.iterations))
        self.completed = True

    def _steps(
        self,
        steps: range,
        apart: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> Generator[int, None, None]:
        """Untimed steps, each between the test's ``setup`` and ``teardown`` (run in
        ``apart``: outside a Callgrind count)."""
        for step in steps:
            if self._setup is not None:
                with apart():
                    self._setup()
            yield step
            if self._teardown is not None:
                with apart():
                    self._teardown()

    def _run(self) -> Generator[int, None, None]:
        cap = self.capturer
        assert cap is not None
        with timed(self.phase_s, "warmup"):
            yield from self._steps(range(-self.spec.warmup, 0))
            cap.sync()
        # what the test built so far (its model, torch's modules) is frozen out of the
        # collector: the collection before each round then scans only the objects made
        # since: under 1 ms instead of 0.5 s for torch and pandas (2-core VM, load 13).
        # The young generations are collected first (the warm-up's short-lived cycles:
        # 0.15 ms); a full collection here cost 80-150 ms a test with torch loaded, and
        # what it would free is only kept until the rounds end (unfreeze)
        with timed(self.phase_s, "collect"):
            gc.collect(1)
            gc.freeze()
        try:
            yield from self._measured(cap)
        finally:
            # the collector is the process's: in a pair child the other side may still be
            # timing, and unfreezing would put both sides' objects back in its scans for
            # that side alone (the process ends with the pair)
            if self.handoff is None:
                gc.unfreeze()

    def _measured(self, cap: Capturer) -> Generator[int, None, None]:
        """The timing rounds (with the profiler off, where the capturer asks for it) and
        the profiled round(s)."""
        cuda = _cuda()
        if cuda is not None:
            cuda.reset_peak_memory_stats()
        from perfguard.capture.load import LoadProbe  # not at import: the plugin loads light

        probe = LoadProbe()
        separate = bool(getattr(cap, "separate_timing", False)) and cuda is None
        rounds = self.spec.rounds
        step = 0
        if separate:
            t0 = time.perf_counter()
            yield from self._timing_rounds(rounds, probe, cap)
            spent = time.perf_counter() - t0
            # the kept rounds' steps are the test's own work; the rest of the rounds' time
            # (pauses, collections, the speed checks, rounds run again after a slow spell)
            # is perfguard's
            steps = sum(self.wall_times_ns) / 1e9
            self.phase_s["timing"] = steps
            self.phase_s["round_checks"] = max(spent - steps, 0.0)
            step += rounds * self.spec.iterations
            if self.timing_only:  # an A/B pair child after the first (perfguard.plugin.ab)
                self.completed = True
                return
        yield from self._site_pass(cap)
        with timed(self.phase_s, "profiled"):
            cap.start()
            self.captured = True
            try:
                first = rounds if separate else 0
                for r in range(first, first + (1 if separate else rounds)):
                    yield from self._round(r, step, probe, cap, profiled=True, timing=not separate)
                    step += self.spec.iterations
                self.completed = True
                if cuda is not None:
                    self.peak_memory = int(cuda.max_memory_allocated())
            finally:
                cap.stop()

    def _site_pass(self, cap: Capturer) -> Generator[int, None, None]:
        """One step under the capturer's call-site pass (where it has one: torch), before
        the profiled round, outside every timing and range; its step number is the last
        warm-up's (-1), as it is recorded nowhere."""
        site_pass = getattr(cap, "site_pass", None)
        if site_pass is None:
            return
        with timed(self.phase_s, "sites"):
            if self._setup is not None:
                self._setup()
            cap.sync()
            with site_pass():
                yield -1
                cap.sync()
            if self._teardown is not None:
                self._teardown()

    def _timing_rounds(
        self, rounds: int, probe: LoadProbe, cap: Capturer
    ) -> Generator[int, None, None]:
        """The unprofiled timing rounds, each between two timings of the reference
        workload: a round during which the machine ran :data:`SLOW_FACTOR` slower than
        it typically does in this test is dropped and run again, up to ``rounds`` times
        per test (then kept, and the verdict's spread and speed checks see it).

        "Typically" is the median of the reference timings so far taken at the same point
        (before a round, after a round), not the fastest: on the 2-core VM, idle, the
        reference timed after a round of torch steps ran 5-25 % slower than before it
        (caches and predictors the round left behind), and a test's fastest reference
        was an outlier, so nearly every round was "slow" and each test spent all its
        re-runs (1.9 s of pauses for rounds of 1 ms steps). A slow spell of the VM
        (+24-40 %, 0.3-1 s) stands out from the typical level as it did from the fastest."""
        from statistics import median

        from perfguard.capture.speed import SLOW_FACTOR, reference_ns

        if self.handoff is not None:
            # an A/B pair child: both sides step in turn through the same spells; a side
            # that ran a round again alone would pair its steps with other moments
            for r in range(rounds):
                yield from self._round(r, r * self.spec.iterations, probe, cap, profiled=False)
            return
        befores: list[int] = [reference_ns()]
        afters: list[int] = []
        retries = rounds
        step = 0
        kept_s = spent_s = 0.0  # the kept rounds' own time; what re-runs and pauses cost
        for r in range(rounds):
            while True:
                marks = self._marks()
                before = reference_ns()
                t0 = time.perf_counter()
                yield from self._round(r, step, probe, cap, profiled=False)
                took = time.perf_counter() - t0
                after = reference_ns()
                speed = max(before, after)
                slow = before > SLOW_FACTOR * median(befores) or (
                    bool(afters) and after > SLOW_FACTOR * median(afters)
                )
                befores.append(before)
                afters.append(after)
                pause = min(RETRY_PAUSE_S, max(took, 0.02))
                budget = max(CHECKS_SHARE * (kept_s + took), CHECKS_FLOOR_S)
                if not slow or retries == 0 or spent_s + took + pause > budget:
                    break
                retries -= 1
                self.slow_rounds += 1
                self._truncate(marks)
                spent_s += took + pause
                time.sleep(pause)
            kept_s += took
            self.speed_ns.append(speed)
            step += self.spec.iterations

    def _marks(self) -> tuple[int, ...]:
        return tuple(len(x) for x in self._per_round_lists())

    def _truncate(self, marks: tuple[int, ...]) -> None:
        for values, n in zip(self._per_round_lists(), marks, strict=True):
            del values[n:]

    def _per_round_lists(self) -> tuple[list[Any], ...]:
        return (
            self.wall_times_ns,
            self.cpu_times_ns,
            self.round_of,
            self.profiled,
            self.wait_ns,
            self.load_ticks,
        )

    def _round(
        self,
        r: int,
        step: int,
        probe: LoadProbe,
        cap: Capturer,
        *,
        profiled: bool,
        timing: bool = True,
    ) -> Generator[int, None, None]:
        """One round of recorded steps (each in an iteration range when ``profiled``); its
        load figures count for the verdict only when its times do (``timing``)."""
        if r:
            gc.collect()
            # no longer than the round before it: a check costs what the round does
            time.sleep(min(ROUND_GAP_S, self._last_round_s))
        started = time.perf_counter()
        clock, cpu = time.perf_counter_ns, time.thread_time_ns
        probe.start()
        setup, teardown = self._setup, self._teardown
        # an A/B pair child: the other tree takes a step before each of this one's timed
        # steps (perfguard.plugin.interleave); never inside a profiled round
        turn = None if profiled else self.handoff
        for i in range(self.spec.iterations):
            if turn is not None:
                turn()
            if setup is not None:
                setup()  # before the sync: the set-up's GPU work is not the step's
            cap.sync()
            t0, c0 = clock(), cpu()
            with cap.iteration() if profiled else _NO_RANGE:
                yield step + i
                cap.sync()  # inside the range: the step's GPU work belongs to it
            self.wall_times_ns.append(clock() - t0)
            self.cpu_times_ns.append(cpu() - c0)
            self.round_of.append(r)
            self.profiled.append(profiled)
            if teardown is not None:
                teardown()
        self._last_round_s = time.perf_counter() - started
        waited = probe.waited()
        ticks = probe.stop()
        if timing and waited is not None:
            self.wait_ns.append(waited)
        if timing and ticks is not None:
            self.load_ticks.append(ticks)

    def close(self) -> None:
        """Stop a loop the test left early (an exception or ``break``): the capture ends."""
        for loop in self._loops:
            loop.close()
        self._loops.clear()
