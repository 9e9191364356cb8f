"""A test's verdict in the session: compared, kept, and a regression raised as its failure.

Store mode compares a record with what :func:`perfguard.compare.against.against_from_store`
builds from the session's store (the nearest run at or before the baseline ref that
measured the test, on a compatible machine, since its acceptance when one applies) through
the one :func:`perfguard.compare.judge.judge`, as ``perfguard report``, ``compare`` and
``bisect`` do. A/B mode hands its own :class:`~perfguard.compare.judge.Against` to
:meth:`Verdicts.finish`. Either way :meth:`Verdicts.finish` keeps the entry with the
session's outputs, adds the JUnit properties, and fails a regressed test with the
explanation's words; :meth:`Verdicts.error` records a test nothing could be judged on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perfguard.baseline.record import TestRecord, instruction_counts
from perfguard.capture.capturers import capture_name
from perfguard.compare.outcomes import Outcome, fails
from perfguard.compare.results import TestEntry
from perfguard.errors import DamagedStoreError, PerfguardError
from perfguard.plugin.context import SessionContext
from perfguard.plugin.marker import ProfileSpec
from perfguard.plugin.outputs import SessionOutputs
from perfguard.plugin.phases import timed
from perfguard.plugin.runner import CaptureResult, CaptureRunner

if TYPE_CHECKING:
    from perfguard.compare.comparison import TestComparison

#: a capture failure, raised as the test's teardown error
_error_key = pytest.StashKey[str]()


class Verdicts:
    """Judges and records the session's tests (module docstring)."""

    def __init__(self, context: SessionContext, outputs: SessionOutputs) -> None:
        self.context = context
        self.outputs = outputs
        #: nodeid -> the acceptance (perfguard.baseline.accept) it was judged under
        self.accepted: dict[str, Any] = {}
        self._walk: Any = None  # the baseline ref's first-parent history, walked once

    # ------------------------------------------------------------------ store mode
    def judge_capture(
        self, item: pytest.Item, spec: ProfileSpec, capture: CaptureResult, runner: CaptureRunner
    ) -> None:
        """Analyse the capture, compare it, record the result; raise a regression as a failure."""
        if capture.error:
            self.error(item, capture.error, capture.backend, capture.path)
            return
        phases = capture.phase_s
        if capture.timing_only:  # an A/B pair child's timing rounds: the parent judges
            self.outputs.records[item.nodeid] = runner.timing_record(spec, capture, item.nodeid)
            return
        try:
            done = runner.analyse(spec, capture, item.nodeid)
            if self.context.damaged is not None:
                self.not_judged_damaged(item, done.record, capture.path, capture.backend)
                return
            with timed(phases, "compare"):
                comparison = self.compare(done.record)
                if done.analysis.ops.empty:  # nothing attributed or gated: never silently
                    from perfguard.capture.frameworks import empty_capture_reason
                    from perfguard.compare.comparison import with_empty_capture

                    why = empty_capture_reason(capture.framework)
                    comparison = with_empty_capture(comparison, why)
        except DamagedStoreError as exc:
            self.context.store_damaged(exc)
            self.not_judged_damaged(item, done.record, capture.path, capture.backend)
            return
        except (PerfguardError, ValueError, KeyError) as exc:
            msg = " ".join(str(exc).split()) or type(exc).__name__
            self.error(item, msg, capture.backend, capture.path)
            return
        timeline = None
        if comparison.outcome is Outcome.REGRESSED:
            with timed(phases, "timeline"):
                timeline = self._timeline(done.analysis, capture.path, item.nodeid)
        self.finish(item, done.record, comparison, done.findings, capture.path, capture.backend,
                    capture.notes, timeline, phases)  # fmt: skip

    def compare(self, record: TestRecord) -> TestComparison:
        """The verdict, from :func:`perfguard.compare.judge` (store mode) on the input
        :func:`perfguard.compare.against.against_from_store` builds, as every entry point."""
        from perfguard.compare.against import settings_for
        from perfguard.compare.judge import judge

        tolerance = self.context.settings.tolerance
        return judge(record, self._against(record), settings_for(record, tolerance))

    def _against(self, record: TestRecord) -> Any:
        """The nearest stored run at or before the baseline ref that measured this test on
        a compatible machine (pooled with that commit's other runs of it), and its history;
        since the test's acceptance, when one applies."""
        from perfguard.compare.against import History, against_from_store
        from perfguard.compare.judge import Against

        ctx = self.context
        if ctx.store is None or ctx.git is None or not ctx.baseline_ref:
            return Against()
        accepted = self._acceptance(record.nodeid)
        if self._walk is None:
            self._walk = History.of(ctx.git.root, ctx.baseline_ref)
        return against_from_store(
            ctx.store, self._walk, record, ctx.fingerprint,
            only=accepted.commits if accepted is not None else None,
            environment=ctx.environment, across=ctx.settings.compare_across,
        )  # fmt: skip

    def _acceptance(self, nodeid: str) -> Any:
        """The acceptance of ``nodeid`` that applies to HEAD (store mode), remembered for
        the test's entry; None when there is none (or no store or git to ask)."""
        from perfguard.baseline.accept import applicable

        ctx = self.context
        if ctx.store is None or ctx.git is None or not ctx.baseline_ref:
            return None
        try:
            found = applicable(ctx.store, ctx.git.root, nodeid, ctx.git.commit)
        except DamagedStoreError:
            raise  # the test is not judged against a damaged store, not judged without it
        except PerfguardError:
            return None
        if found is not None:
            self.accepted[nodeid] = found
        return found

    def _history(self, nodeid: str) -> list[dict[str, Any]]:
        from perfguard.compare.against import history_rows

        ctx = self.context
        if ctx.store is None:
            return []
        try:
            return history_rows(ctx.store, nodeid, ctx.fingerprint)
        except DamagedStoreError:
            raise  # never a verdict shown with part of its history
        except PerfguardError:
            return []

    def _timeline(self, analysis: Any, capture: Path, nodeid: str) -> str | None:
        """A regressed test's capture as a Perfetto trace beside it (the report links it):
        the reviewer opens the evidence in ui.perfetto.dev, op to kernel. Named after the
        test (one file per test: a name cut from the capture's would be its module's)."""
        from perfguard.report.perfetto import write_perfetto

        name = capture_name(nodeid) + ".perfetto.json.gz"
        output = self.context.settings.output
        try:
            path = write_perfetto(analysis, capture.with_name(name))
            return str(Path(path).resolve().relative_to(output.resolve()))
        except (OSError, ValueError, PerfguardError):
            return None  # the verdict stands without its timeline

    # ------------------------------------------------------------------ every mode
    def finish(
        self,
        item: pytest.Item,
        record: TestRecord,
        comparison: TestComparison,
        findings: list[dict[str, Any]],
        capture: Any,
        backend: str,
        notes: list[str],
        timeline: str | None = None,
        phases: dict[str, float] | None = None,
    ) -> None:
        """Keep the record and the verdict; a regression fails the test here. ``phases``:
        the wall seconds of the measurement's parts so far; the history's and the
        results' own are added here."""
        phases = dict(phases or {})
        try:
            with timed(phases, "history"):
                history = self._history(item.nodeid)
        except DamagedStoreError as exc:
            self.context.store_damaged(exc)
            self.not_judged_damaged(item, record, capture, backend)
            return
        from perfguard.compare.profile import profile_of
        from perfguard.compare.results import Acceptance, Finding, HistoryRow

        accepted = self.accepted.get(item.nodeid) if comparison.mode == "store" else None
        entry = comparison.entry(
            accepted=Acceptance(**accepted.to_dict()) if accepted is not None else None,
            timeline=timeline,
            findings=[Finding.of(f) for f in findings],
            history=[HistoryRow(**h) for h in history],
            capture=str(capture) if capture else None,
            backend=backend,
            notes=notes,
            worker=self.context.worker_id,
            phase_s=phases,
            counted=instruction_counts(record),
            profile=profile_of(record),
        )
        self.outputs.add(entry, record)
        _add_properties(item, entry)
        if fails(entry.outcome, self.context.settings.fail_on):
            commit = comparison.baseline_commit or ""
            what = "the base tree" if comparison.mode == "ab" else "the baseline"
            pytest.fail(
                f"perfguard: {item.nodeid} regressed against {what} at {commit[:12]}: "
                f"{comparison.explanation.text()}",
                pytrace=False,
            )

    def error(
        self,
        item: pytest.Item,
        error: str,
        backend: str,
        path: Any = None,
        at_teardown: bool = True,
        outcome: str = "error",
    ) -> None:
        """Record a test nothing could be judged on (capture failed, test raised, child
        crashed); teardown raises a capture failure as the test's error."""
        if at_teardown:
            item.stash[_error_key] = error
        self.outputs.add(TestEntry.not_judged(
            item.nodeid, outcome, error, capture=str(path) if path else None,
            backend=backend, worker=self.context.worker_id,
        ))  # fmt: skip
        item.user_properties.append(("perfguard_outcome", outcome))

    def not_judged_damaged(
        self, item: pytest.Item, record: TestRecord, capture: Any, backend: str
    ) -> None:
        """The test ran and was measured, but the store it would be judged against is
        damaged: ``not-judged`` with the store's one line (the record is kept: the session's
        reports show it; the save refuses the store)."""
        reason = f"not judged: {self.context.damaged}"
        self.outputs.add(TestEntry.not_judged(
            item.nodeid, "not-judged", reason, capture=str(capture) if capture else None,
            backend=backend, worker=self.context.worker_id,
        ), record)  # fmt: skip
        item.user_properties.append(("perfguard_outcome", "not-judged"))

    def judged(self, nodeid: str) -> bool:
        """Whether the test already has its entry (a verdict or an error)."""
        return nodeid in self.outputs.entries

    @staticmethod
    def raise_teardown_error(item: pytest.Item) -> None:
        error = item.stash.get(_error_key, None)
        if error is not None:
            pytest.fail(f"perfguard: capture of {item.nodeid} failed: {error}", pytrace=False)


def _add_properties(item: pytest.Item, entry: TestEntry) -> None:
    """JUnit properties (``--junitxml``): the figures and the explanation's own words."""
    item.user_properties.append(("perfguard_outcome", entry.outcome.value))
    for key in ("delta_pct", "ci_low_pct", "ci_high_pct", "p_value",
                "level_baseline_ns", "level_current_ns"):  # fmt: skip
        value = getattr(entry, key)
        item.user_properties.append((f"perfguard_{key}", "" if value is None else value))
    why = entry.explanation
    item.user_properties.append(("perfguard_explanation", why.headline if why else ""))
    for k, culprit in enumerate(why.culprits[:3] if why else (), 1):
        item.user_properties.append((f"perfguard_culprit_{k}", culprit.text))
    if why is not None and why.environment:  # the environment since the baseline, its words
        item.user_properties.append(("perfguard_environment", why.environment_line))
