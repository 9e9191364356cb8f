"""Capturing one test in the session's process: which capture, where, and what it made.

The dispatcher (:mod:`perfguard.plugin.session`) calls the runner at each step of a test's
life: what the item asks for (:meth:`CaptureRunner.captures`, once per test, kept in its
stash), the fixture's loop (:meth:`CaptureRunner.profile_for`: a profiled loop with the
torch backends, a plain one for nsys), set-up (nsys only: the test re-run alone in a child
pytest under nsys, :func:`perfguard.capture.capturers.run_nsys_child`), the call (a marked
test that does not use the fixture is captured whole, as one iteration), and after it
(:meth:`CaptureRunner.result`: what was captured, a typed
:class:`~perfguard.core.record.TestCapture`, whichever way it was made). The record and
the verdict are the core's (:mod:`perfguard.core`), made by
:class:`~perfguard.plugin.judging.Verdicts` without the runner.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from perfguard.capture.capturers import TorchCapturer, capture_name, run_nsys_child, whole_call
from perfguard.capture.frameworks import DeferredCapturer
from perfguard.capture.torch_profiler import TRACE_SUFFIX, record_compiled_kernels
from perfguard.core.record import TestCapture, loop_result
from perfguard.core.spec import ProfileSpec
from perfguard.errors import PerfguardError
from perfguard.plugin.ab import AB_TIMING_ONLY_ENV
from perfguard.plugin.context import ResolvedBackend, SessionContext
from perfguard.plugin.interleave import ab_env
from perfguard.plugin.items import profile_key, profiled, spec_of
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.options import plugin_args

#: how an item was captured: the capture's path and backend, and the nsys child's report
#: or the whole-call capturer with its wall times
_capture_key = pytest.StashKey[dict[str, Any]]()
#: what the item asks for (:meth:`CaptureRunner.captures`), worked out once per test
_what_key = pytest.StashKey[tuple[ProfileSpec, ResolvedBackend] | None]()

NOT_FIXTURE = "test does not use the gpuprofile fixture: captured as one iteration"


class CaptureRunner:
    """Captures the session's tests in this process (module docstring)."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        if context.backend.label != "nsys":
            # before any test compiles: torch.compile's C++ kernels get a profiler range
            # each, so a compiled CPU model's fused ops can be named (trace/compiled.py)
            record_compiled_kernels()

    # ------------------------------------------------------------------ what to capture
    def captures(self, item: pytest.Item) -> tuple[ProfileSpec, ResolvedBackend] | None:
        """The item's effective marker and backend; None for a test perfguard does not
        measure; :class:`PerfguardError` when the marker's backend cannot run here (and
        ValueError for a bad marker: set-up reports both). Worked out once per test."""
        if _what_key in item.stash:
            return item.stash[_what_key]
        what = None
        if profiled(item):
            spec = self.effective(spec_of(item))
            backend = self.context.backend_for(spec.backend) if spec.backend else None
            what = spec, backend or self.context.backend
        item.stash[_what_key] = what
        return what

    def effective(self, spec: ProfileSpec) -> ProfileSpec:
        """The marker's settings with the session's: ``--perfguard-rounds`` fills in the
        rounds a marker did not set; in an A/B round child it is the parent's word (one
        round per child, whatever the marker says); ``--perfguard-tolerance`` is the
        tolerance of a marker that sets none (:attr:`ProfileSpec.judged_tolerance`)."""
        settings = self.context.settings
        spec = replace(spec, session_tolerance=settings.tolerance)
        if settings.rounds is not None and (self.context.round_child or not spec.rounds_given):
            return replace(spec, rounds=settings.rounds)
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
        # the framework is decided when the loop starts (the marker's framework=, else what
        # the test holds and the process has imported by then): importorskip in the body
        where = self._capture_path(item).with_name(capture_name(item.nodeid))
        capturer = DeferredCapturer(
            spec.framework,
            getattr(item, "module", None),
            where,
            what[1].device or "cpu",
            TRACE_SUFFIX,
        )
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
            item.nodeid,
            rootdir=config.rootpath,
            inifile=config.inipath,
            output_dir=self._captures_folder(),
            timeout=self.context.settings.timeout,
            xdist=config.pluginmanager.hasplugin("xdist"),
            plugin_args=plugin_args(config),
        )
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
        item.stash[_capture_key] = {
            "path": path,
            "backend": backend.label,
            "capturer": capturer,
            "walls": walls,
        }

    def result(self, item: pytest.Item, spec: ProfileSpec) -> TestCapture | None:
        """What the test's capture produced (None when it made none)."""
        info = item.stash.get(_capture_key, None)
        if info is None:
            return None
        out = TestCapture(path=Path(info["path"]), backend=info["backend"])
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
            loop_result(profile, spec, out)
        else:
            out.walls, out.error = info.get("walls", []), info["capturer"].error
            out.notes.append(NOT_FIXTURE)
        return out
