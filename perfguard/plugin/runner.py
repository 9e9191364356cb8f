"""Capturing one test in the session's process, and turning the capture into a record.

The dispatcher (:mod:`perfguard.plugin.session`) calls the runner at each step of a test's
life: the fixture's loop (:meth:`CaptureRunner.profile_for`: a profiled loop with the torch
backends, a plain one for nsys), set-up (nsys only: the test re-run alone in a child pytest
under nsys, :func:`perfguard.capture.capturers.run_nsys_child`), the call (a marked test
that does not use the fixture is captured whole, as one iteration), and after it
(:meth:`CaptureRunner.result`: what was captured, typed, whichever way it was made). Then
:meth:`CaptureRunner.analyse` loads the capture, analyses it and builds the
:class:`~perfguard.baseline.record.TestRecord` the verdict compares.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfguard.baseline.record import TestRecord
from perfguard.capture.capturers import TorchCapturer, capture_name, run_nsys_child, whole_call
from perfguard.capture.torch_profiler import TRACE_SUFFIX
from perfguard.errors import PerfguardError
from perfguard.plugin.ab import AB_TIMING_ONLY_ENV
from perfguard.plugin.context import ResolvedBackend, SessionContext
from perfguard.plugin.interleave import ab_env
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import ProfileSpec
from perfguard.plugin.options import plugin_args
from perfguard.plugin.phases import timed
from perfguard.plugin.valgrind_child import METRIC, InstructionSession

#: how an item was captured: the capture's path and backend, and the nsys child's report
#: or the whole-call capturer with its wall times
_capture_key = pytest.StashKey[dict[str, Any]]()

NOT_FIXTURE = "test does not use the gpuprofile fixture: captured as one iteration"


@dataclass
class CaptureResult:
    """What one test's capture produced, whichever way it was made."""

    path: Path
    backend: str
    walls: list[int] = field(default_factory=list)
    cpu_times: list[int] = field(default_factory=list)
    #: each timed iteration's round
    rounds: list[int] = field(default_factory=list)
    #: what the loop saw of the machine: load, wait, peak_memory, profiled, speed_ns, slow_rounds
    env: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: why nothing can be judged from this capture
    error: str | None = None
    #: wall seconds of each part of the test's measurement (:attr:`GpuProfile.phase_s`,
    #: then ``analysis`` and ``findings``, then the verdict's parts)
    phase_s: dict[str, float] = field(default_factory=dict)
    #: whose profiler captured it ("torch", "tf", "jax"; None: nsys), decided when the loop
    #: started (:class:`perfguard.capture.frameworks.DeferredCapturer`)
    framework: str | None = None
    #: the loop timed its rounds and skipped the profiled round (an A/B pair child)
    timing_only: bool = False


@dataclass(frozen=True)
class Analysed:
    """A capture analysed: the record to compare, the expert findings, the analysis."""

    record: TestRecord
    findings: list[dict[str, Any]]
    analysis: Any


class CaptureRunner:
    """Captures the session's tests in this process (module docstring)."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        #: the session's Callgrind counts (:mod:`perfguard.plugin.valgrind_child`), if any
        self.instructions: InstructionSession | None = None
        if context.backend.label != "nsys":
            from perfguard.capture.torch_profiler import record_compiled_kernels

            # before any test compiles: torch.compile's C++ kernels get a profiler range
            # each, so a compiled CPU model's fused ops can be named (trace/compiled.py)
            record_compiled_kernels()

    # ------------------------------------------------------------------ what to capture
    def captures(self, item: pytest.Item) -> tuple[ProfileSpec, ResolvedBackend] | None:
        """The item's effective marker and backend; None for a test perfguard does not
        measure; :class:`PerfguardError` when the marker's backend cannot run here."""
        from perfguard.plugin.items import profiled, spec_of

        if not profiled(item):
            return None
        spec = self.effective(spec_of(item))  # validated in setup already
        backend = self.context.backend_for(spec.backend) if spec.backend else None
        return spec, backend or self.context.backend

    def effective(self, spec: ProfileSpec) -> ProfileSpec:
        """The marker's settings with the session's: ``--perfguard-rounds`` fills in the
        rounds a marker did not set; in an A/B round child it is the parent's word (one
        round per child, whatever the marker says)."""
        rounds = self.context.settings.rounds
        if rounds is not None and (self.context.round_child or not spec.rounds_given):
            return replace(spec, rounds=rounds)
        return spec

    def _captures_folder(self) -> Path:
        folder = self.context.settings.output / "captures"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _capture_path(self, item: pytest.Item) -> Path:
        return self._captures_folder() / (capture_name(item.nodeid) + TRACE_SUFFIX)

    # ------------------------------------------------------------------ the test's life
    def profile_for(self, item: pytest.Item, spec: ProfileSpec) -> GpuProfile:
        """The fixture's value: a profiled loop with the torch backends, a plain one for nsys."""
        try:
            what = self.captures(item)
        except PerfguardError:
            return GpuProfile(spec)  # the marker's backend cannot run: setup reports it next
        if what is None or what[1].label == "nsys":
            return GpuProfile(self.effective(spec))  # nsys: the child runs the body
        from perfguard.capture.frameworks import DeferredCapturer

        # the framework is decided when the loop starts (the marker's framework=, else what
        # the test holds and the process has imported by then): importorskip in the body
        where = self._capture_path(item).with_name(capture_name(item.nodeid))
        capturer = DeferredCapturer(spec.framework, getattr(item, "module", None), where,
                                    what[1].device or "cpu", TRACE_SUFFIX)  # fmt: skip
        item.stash[_capture_key] = {"path": where, "backend": what[1].label}
        profile = GpuProfile(what[0], capturer)
        if self.context.round_child and ab_env(AB_TIMING_ONLY_ENV) == "1":
            profile.timing_only = True
        return profile

    def run_nsys(self, item: pytest.Item) -> None:
        """nsys: the test alone in a child pytest under nsys, at set-up;
        :class:`PerfguardError` when the child or the profiler fails."""
        config = self.context.config
        path, child = run_nsys_child(
            item.nodeid, rootdir=config.rootpath, inifile=config.inipath,
            output_dir=self._captures_folder(), timeout=self.context.settings.timeout,
            xdist=config.pluginmanager.hasplugin("xdist"), plugin_args=plugin_args(config),
        )  # fmt: skip
        item.stash[_capture_key] = {"path": path, "backend": "nsys", "child": child}

    def nsys_child(self, item: pytest.Item) -> dict[str, Any] | None:
        """The nsys child's report of the test (its outcome, times), if it ran in one."""
        child: dict[str, Any] | None = item.stash.get(_capture_key, {}).get("child")
        return child

    @contextmanager
    def whole_call(self, item: pytest.Item, backend: ResolvedBackend) -> Iterator[None]:
        """A marked test without the fixture: its whole call captured as one iteration."""
        path = self._capture_path(item)
        capturer = TorchCapturer(path, backend.device or "cpu")
        with whole_call(capturer) as walls:
            yield
        item.stash[_capture_key] = {"path": path, "backend": backend.label,
                                    "capturer": capturer, "walls": walls}  # fmt: skip

    def result(self, item: pytest.Item, spec: ProfileSpec) -> CaptureResult | None:
        """What the test's capture produced (None when it made none)."""
        from perfguard.plugin.items import profile_key

        info = item.stash.get(_capture_key, None)
        if info is None:
            return None
        out = CaptureResult(path=Path(info["path"]), backend=info["backend"])
        if info["backend"] != "nsys":
            out.framework = "torch"  # the whole call's capturer; a loop's says below
        profile = item.stash.get(profile_key, None)
        if "child" in info:
            child = info["child"]
            out.walls, out.error = child.get("wall_times_ns") or [], child.get("error")
            out.cpu_times = child.get("cpu_times_ns") or []
            out.rounds = list(child.get("rounds") or [])
            if not child.get("fixture"):
                out.notes.append(NOT_FIXTURE)
            if child.get("fixture") and not child.get("completed"):
                out.notes.append("the iteration loop ended early")
        elif profile is not None:
            self._from_loop(profile, spec, out)
        else:
            out.walls, out.error = info.get("walls", []), info["capturer"].error
            out.notes.append(NOT_FIXTURE)
        return out

    @staticmethod
    def _from_loop(profile: GpuProfile, spec: ProfileSpec, out: CaptureResult) -> None:
        profile.close()  # a loop left early still ends its capture here
        capturer = profile.capturer
        if getattr(capturer, "inner", None) is not None:  # decided when the loop started
            out.path = Path(capturer.path)  # type: ignore[union-attr]
            out.framework = capturer.framework  # type: ignore[union-attr]
        walls = out.walls = list(profile.wall_times_ns)
        out.error = getattr(profile.capturer, "error", None)
        out.cpu_times = list(profile.cpu_times_ns)
        out.rounds = list(profile.round_of)
        out.phase_s = dict(profile.phase_s)
        out.notes.extend(profile.notes)
        out.env = {
            "load": profile.load,
            "wait": profile.wait,
            "peak_memory": profile.peak_memory,
            "profiled": list(profile.profiled),
            "speed_ns": float(np.median(profile.speed_ns)) if profile.speed_ns else None,
            "slow_rounds": profile.slow_rounds,
            "model_facts": profile.model_facts,
        }
        site_run = getattr(capturer, "site_run", None)
        if site_run is not None and site_run.error:
            out.notes.append(f"{site_run.error}; call sites from the capture alone")
        if not profile.started:
            fixture = profile.loop_call.split(".", 1)[0].split("(", 1)[0]  # gpuprofile, benchmark
            out.error = out.error or (
                f"the test requests the {fixture} fixture but never runs {profile.loop_call}: "
                "nothing was measured"
            )
        elif not profile.captured and profile.timing_only and profile.completed:
            out.timing_only = True
        elif not profile.captured:
            out.error = out.error or (
                f"the iteration loop ended after {len(walls)} timed iterations, before "
                "the profiled round: nothing was captured"
            )
        elif not profile.completed:
            out.notes.append(
                f"the iteration loop ended early: {len(walls)} of {spec.iterations} recorded"
            )

    # ------------------------------------------------------------------ the record
    def analyse(self, spec: ProfileSpec, capture: CaptureResult, nodeid: str) -> Analysed:
        """Load and analyse the capture and build the test's record; notes on how it was
        measured are added to ``capture.notes``."""
        from perfguard.analysis import analyze
        from perfguard.trace import load_trace

        with timed(capture.phase_s, "analysis"):
            analysis = analyze(load_trace(capture.path), key_node=spec.key_node)
            record = self._record(spec, capture, analysis, nodeid)
        with timed(capture.phase_s, "findings"):
            findings = _findings(analysis)
        return Analysed(record, findings, analysis)

    def _record(
        self, spec: ProfileSpec, capture: CaptureResult, analysis: Any, nodeid: str
    ) -> TestRecord:
        """The test's record from its analysed capture (with its instruction counts)."""
        from perfguard.baseline.record import record_from_analysis

        path, walls, notes = capture.path, capture.walls, capture.notes
        cpu_times, rounds, env = capture.cpu_times, capture.rounds, capture.env
        has_gpu = len(analysis.activities) > 0
        available = {"gpu_time": has_gpu, "wall_time": True, "cpu_time": bool(cpu_times)}
        # the first timing the marker names that this capture has; wall time otherwise
        # (instructions are counted beside the timing, never instead of it)
        timings = [m for m in spec.metrics if m != METRIC]
        metric = next((m for m in timings if available[m]), "wall_time")
        if metric not in spec.metrics and timings:
            notes.append(
                f"no {' or '.join(spec.metrics)} measured here"
                f"{'' if has_gpu else ' (no GPU activity captured)'}: "
                "judged on per-iteration wall time"
            )
        n_ranges = int((analysis.iterations["rank"] == analysis.iterations["rank"].min()).sum())
        if n_ranges == 0:
            raise PerfguardError(f"{path}: the capture holds no iteration")
        profiled = np.asarray(env.get("profiled") or [], dtype=bool)
        if len(profiled) != len(walls):
            profiled = np.ones(len(walls), dtype=bool)
        if not profiled.all():
            notes.append(
                f"timed in {len(set(np.asarray(rounds)[~profiled]))} rounds with the profiler "
                f"off; ops, kernels and gates from 1 profiled round of {int(profiled.sum())} "
                "iterations"
            )
        if walls and int(profiled.sum()) != n_ranges:
            notes.append(
                f"{len(walls)} timed iterations but {n_ranges} in the capture: "
                "iteration durations from the capture are used"
            )
        meta = self._meta(spec, capture)
        peak = env.get("peak_memory")
        record = record_from_analysis(
            nodeid,
            analysis,
            wall_times_ns=np.asarray(walls, dtype=np.int64) if walls else None,
            cpu_times_ns=np.asarray(cpu_times, dtype=np.int64) if cpu_times else None,
            metric=metric,
            meta=meta,
            rounds=np.asarray(rounds, dtype=np.int64) if rounds else None,
            extra_counters={"peak_memory": float(peak)} if peak else None,
            profiled=profiled if walls and int(profiled.sum()) == n_ranges else None,
        )
        from perfguard.compare.profile import run_figures

        record.meta["profile"] = run_figures(analysis)  # kept with the run: its profile's
        return self._with_instructions(record, spec, notes)

    def _meta(self, spec: ProfileSpec, capture: CaptureResult) -> dict[str, Any]:
        """A record's ``meta``: the marker's settings and how the loop ran."""
        env = capture.env
        load, wait = env.get("load"), env.get("wait")
        settings = self.context.settings
        return {
            "marker": spec.to_dict(),
            "tolerance": settings.tolerance if spec.tolerance is None else spec.tolerance,
            "capture": str(capture.path),
            "backend": capture.backend,
            "note": "; ".join(capture.notes) or None,
            "cpu_times_ns": capture.cpu_times or None,
            "load": load if load is not None and np.isfinite(load) else None,
            "wait": wait if wait is not None and np.isfinite(wait) else None,
            "speed_ns": env.get("speed_ns"),
            "slow_rounds": env.get("slow_rounds") or 0,
            "autotuned": _autotuned(),
            **(env.get("model_facts") or {}),
        }

    def timing_record(self, spec: ProfileSpec, capture: CaptureResult, nodeid: str) -> TestRecord:
        """The record of a loop that only timed its rounds (``capture.timing_only``)."""
        from perfguard.baseline.record import record_from_timings

        return record_from_timings(
            nodeid, wall_times_ns=np.asarray(capture.walls, dtype=np.int64),
            cpu_times_ns=np.asarray(capture.cpu_times, dtype=np.int64)
            if capture.cpu_times else None,
            rounds=np.asarray(capture.rounds, dtype=np.int64) if capture.rounds else None,
            metric=next((m for m in spec.metrics if m == "wall_time"
                          or (m == "cpu_time" and capture.cpu_times)), "wall_time"),
            meta=self._meta(spec, capture),
        )  # fmt: skip

    def _with_instructions(
        self, record: TestRecord, spec: ProfileSpec, notes: list[str]
    ) -> TestRecord:
        """The record with its loop's Callgrind counts, when the session's child made them."""
        if self.instructions is None:
            return record
        return self.instructions.counted(record, spec.iterations, notes)


def _autotuned() -> list[str]:
    """The libraries that chose kernels by timing them in this process (their kernel
    choice is not a gate: :mod:`perfguard.compare.gates`)."""
    torch = sys.modules.get("torch")
    try:
        on = bool(torch is not None and torch.backends.cudnn.benchmark)
    except AttributeError:
        on = False
    return ["cudnn.benchmark"] if on else []


def _findings(analysis: Any) -> list[dict[str, Any]]:
    """The expert system's findings on this capture (``[]`` when it cannot run on it)."""
    try:
        from perfguard.analysis.expert import run_detectors

        table = run_detectors(analysis)
    except Exception:  # findings are advice; they must never cost the verdict
        return []
    result: list[dict[str, Any]] = json.loads(table.to_json(orient="records", default_handler=str))
    return result
