"""A test's capture turned into its record: the loop's figures read off, the capture
analysed, the metric and the profiled round chosen, and the notes on how it was measured.

:class:`TestCapture` is what one test's capture produced, whichever way it was made
(the core's loop: :func:`loop_result`; the plugin's nsys child or whole-call capture);
:func:`analyse` loads and analyses it and builds the
:class:`~perfguard.baseline.record.TestRecord` the verdict compares, as :class:`Measured`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from perfguard.analysis import Analysis, analyze
from perfguard.baseline.record import (
    TestRecord,
    record_from_analysis,
    record_from_timings,
)
from perfguard.capture.frameworks import empty_capture_reason
from perfguard.compare.profile import run_figures
from perfguard.core.loop import Loop
from perfguard.core.phases import timed
from perfguard.core.spec import INSTRUCTIONS, ProfileSpec
from perfguard.errors import PerfguardError
from perfguard.trace import load_trace


@dataclass
class TestCapture:
    """What one test's capture produced, whichever way it was made (named apart from
    :class:`perfguard.capture.CaptureResult`, what a backend's capture wrote)."""

    __test__ = False  # not a pytest class

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
    #: wall seconds of each part of the test's measurement (:attr:`Loop.phase_s`,
    #: then ``analysis`` and ``findings``, then the verdict's parts)
    phase_s: dict[str, float] = field(default_factory=dict)
    #: whose profiler captured it ("torch", "tf", "jax"; None: nsys), decided when the loop
    #: started (:class:`perfguard.capture.frameworks.DeferredCapturer`)
    framework: str | None = None
    #: the loop timed its rounds and skipped the profiled round (an A/B pair child)
    timing_only: bool = False


@dataclass
class Measured:
    """A test's record and how it was made, as its entry shows it beside the verdict: the
    analysis and the expert findings, the capture and its backend, notes and phases.
    Only ``record`` is known for a record made elsewhere (an A/B or isolation child)."""

    record: TestRecord
    analysis: Analysis | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    capture: str | Path | None = None
    backend: str | None = None
    notes: list[str] = field(default_factory=list)
    phase_s: dict[str, float] = field(default_factory=dict)


def loop_result(loop: Loop, spec: ProfileSpec, out: TestCapture) -> TestCapture:
    """``out`` filled from the loop that ran the test's steps (it is closed here: a loop
    left early still ends its capture); ``out.error`` when nothing can be judged."""
    loop.close()
    capturer = loop.capturer
    if getattr(capturer, "inner", None) is not None:  # decided when the loop started
        out.path = Path(capturer.path)  # type: ignore[union-attr]
        out.framework = capturer.framework  # type: ignore[union-attr]
    walls = out.walls = list(loop.wall_times_ns)
    out.error = getattr(loop.capturer, "error", None)
    out.cpu_times = list(loop.cpu_times_ns)
    out.rounds = list(loop.round_of)
    out.phase_s = dict(loop.phase_s)
    out.notes.extend(loop.notes)
    out.env = {
        "load": loop.load,
        "wait": loop.wait,
        "peak_memory": loop.peak_memory,
        "profiled": list(loop.profiled),
        "speed_ns": float(np.median(loop.speed_ns)) if loop.speed_ns else None,
        "slow_rounds": loop.slow_rounds,
        "model_facts": loop.model_facts,
    }
    site_run = getattr(capturer, "site_run", None)
    if site_run is not None and site_run.error:
        out.notes.append(f"{site_run.error}; call sites from the capture alone")
    if not loop.started:
        fixture = loop.loop_call.split(".", 1)[0].split("(", 1)[0]  # gpuprofile, benchmark
        out.error = out.error or (
            f"the test requests the {fixture} fixture but never runs {loop.loop_call}: "
            "nothing was measured"
        )
    elif not loop.captured and loop.timing_only and loop.completed:
        out.timing_only = True
    elif not loop.captured:
        out.error = out.error or (
            f"the iteration loop ended after {len(walls)} timed iterations, before "
            "the profiled round: nothing was captured"
        )
    elif not loop.completed:
        out.notes.append(
            f"the iteration loop ended early: {len(walls)} of {spec.iterations} recorded"
        )
    return out


def analyse(spec: ProfileSpec, capture: TestCapture, nodeid: str) -> Measured:
    """Load and analyse the capture and build the test's record; notes on how it was
    measured are added to ``capture.notes``."""
    with timed(capture.phase_s, "analysis"):
        analysis = analyze(load_trace(capture.path), key_node=spec.key_node)
        record = _record(spec, capture, analysis, nodeid)
    with timed(capture.phase_s, "findings"):
        findings = _findings(analysis)
    return Measured(
        record,
        analysis,
        findings,
        capture=capture.path,
        backend=capture.backend,
        notes=capture.notes,
        phase_s=capture.phase_s,
    )


def _record(spec: ProfileSpec, capture: TestCapture, analysis: Analysis, nodeid: str) -> TestRecord:
    """The test's record from its analysed capture."""
    path, walls, notes = capture.path, capture.walls, capture.notes
    cpu_times, rounds, env = capture.cpu_times, capture.rounds, capture.env
    has_gpu = len(analysis.activities) > 0
    available = {"gpu_time": has_gpu, "wall_time": True, "cpu_time": bool(cpu_times)}
    # the first timing the marker names that this capture has; wall time otherwise
    # (instructions are counted beside the timing, never instead of it)
    timings = [m for m in spec.metrics if m != INSTRUCTIONS]
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
    meta = _meta(spec, capture)
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
    record.meta["profile"] = run_figures(analysis)  # kept with the run: its profile's
    if analysis.ops.empty:  # nothing to attribute or gate: why, kept for every later verdict
        record.meta["empty_capture"] = empty_capture_reason(capture.framework)
    return record


def _meta(spec: ProfileSpec, capture: TestCapture) -> dict[str, Any]:
    """A record's ``meta``: the marker's settings, the test's tolerance (resolved here,
    once: :attr:`ProfileSpec.judged_tolerance`) and how the loop ran."""
    env = capture.env
    load, wait = env.get("load"), env.get("wait")
    return {
        "marker": spec.to_dict(),
        "tolerance": spec.judged_tolerance,
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


def timing_record(spec: ProfileSpec, capture: TestCapture, nodeid: str) -> TestRecord:
    """The record of a loop that only timed its rounds (``capture.timing_only``)."""
    return record_from_timings(
        nodeid,
        wall_times_ns=np.asarray(capture.walls, dtype=np.int64),
        cpu_times_ns=np.asarray(capture.cpu_times, dtype=np.int64) if capture.cpu_times else None,
        rounds=np.asarray(capture.rounds, dtype=np.int64) if capture.rounds else None,
        metric=next(
            (
                m
                for m in spec.metrics
                if m == "wall_time" or (m == "cpu_time" and capture.cpu_times)
            ),
            "wall_time",
        ),
        meta=_meta(spec, capture),
    )


def _autotuned() -> list[str]:
    """The libraries that chose kernels by timing them in this process (their kernel
    choice is not a gate: :mod:`perfguard.compare.gates`)."""
    torch = sys.modules.get("torch")
    try:
        on = bool(torch is not None and torch.backends.cudnn.benchmark)
    except AttributeError:
        on = False
    return ["cudnn.benchmark"] if on else []


def _findings(analysis: Analysis) -> list[dict[str, Any]]:
    """The expert system's findings on this capture (``[]`` when it cannot run on it)."""
    try:
        from perfguard.analysis.expert import run_detectors

        table = run_detectors(analysis)
    except Exception:  # findings are advice; they must never cost the verdict
        return []
    result: list[dict[str, Any]] = json.loads(table.to_json(orient="records", default_handler=str))
    return result
