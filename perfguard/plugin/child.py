"""The plugin inside the child pytest that the nsys backend runs for one test.

The parent (:mod:`perfguard.plugin.session`) runs ``nsys profile
--capture-range=cudaProfilerApi ... python -m pytest FILE::TEST`` with
``PERFGUARD_CHILD=<result.json>``. Here the recorded iterations are bracketed
by ``cudaProfilerStart``/``Stop`` (so nsys records exactly them) and each is
an NVTX ``perfguard.iteration`` range; the test's outcome, its failure text
and the per-iteration wall times go to ``result.json`` for the parent.

Light on purpose: no pandas, no analysis, torch only if the test loaded it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from perfguard.capture.capturers import ChildCapturer, whole_call, write_child_result
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import ProfileSpec


class ChildPlugin:
    """Registered by ``pytest_configure`` when ``PERFGUARD_CHILD`` is set."""

    def __init__(self, result_path: str) -> None:
        self.result_path = result_path
        self.profiles: dict[str, GpuProfile] = {}
        self.whole: dict[str, tuple[ChildCapturer, list[int]]] = {}
        self.written = False

    def close(self) -> None:
        """Nothing to release (the result file is written per test)."""

    def profile_for(self, item: pytest.Item, spec: ProfileSpec) -> GpuProfile:
        profile = GpuProfile(spec, ChildCapturer())
        self.profiles[item.nodeid] = profile
        return profile

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        from perfguard.plugin.items import profiled, uses_loop

        if not profiled(item) or uses_loop(item):
            return (yield)
        capturer = ChildCapturer()
        with whole_call(capturer) as walls:
            self.whole[item.nodeid] = (capturer, walls)
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        final = report.when == "call" or (report.when == "setup" and not report.passed)
        if final and not self.written:
            self._write(item, report)
        return report

    def _write(self, item: pytest.Item, report: pytest.TestReport) -> None:
        profile = self.profiles.get(item.nodeid)
        if profile is not None:
            walls, error = list(profile.wall_times_ns), profile.capturer.error  # type: ignore[union-attr]
            cpus = list(profile.cpu_times_ns)
            fixture, completed = True, profile.completed
        elif item.nodeid in self.whole:
            capturer, walls = self.whole[item.nodeid]
            error, fixture, completed, cpus = capturer.error, False, bool(walls), []
        else:
            walls, error, fixture, completed, cpus = [], None, False, False, []
        skip_reason = None
        if report.skipped and isinstance(report.longrepr, tuple):
            skip_reason = str(report.longrepr[2])
        write_child_result(
            self.result_path,
            {
                "nodeid": item.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "longrepr": None if report.passed else str(report.longrepr),
                "crash": getattr(getattr(report.longrepr, "reprcrash", None), "message", None),
                "skip_reason": skip_reason,
                "wall_times_ns": [int(w) for w in walls],
                "cpu_times_ns": [int(c) for c in cpus],
                "rounds": list(profile.round_of) if profile is not None else [],
                "fixture": fixture,
                "completed": completed,
                "error": error,
            },
        )
        self.written = True
