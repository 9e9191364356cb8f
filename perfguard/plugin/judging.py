"""A test's verdict in the session: compared, kept, and a regression raised as its failure.

Store mode: the capture becomes a record (:func:`perfguard.core.record.analyse`, with the
session's Callgrind counts), judged by :func:`perfguard.core.verdict.verdict` against what
:func:`perfguard.compare.against.against_from_store` builds from the session's store (the
nearest run at or before the baseline ref that measured the test, on a compatible machine,
since its acceptance when one applies; the test's history read once, for its noise and its
rows), as ``perfguard report``, ``compare`` and ``bisect`` do. A/B mode makes its entry
with its own :class:`~perfguard.compare.judge.Against`. Either way :meth:`Verdicts.finish`
keeps the entry with the session's outputs, adds the JUnit properties, and fails a
regressed test with the explanation's words; :meth:`Verdicts.error` records a test
nothing could be judged on.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguard.baseline.record import TestRecord
from perfguard.compare.against import StoreBaseline
from perfguard.compare.outcomes import fails
from perfguard.compare.results import TestEntry
from perfguard.core.record import Measured, TestCapture, analyse, timing_record
from perfguard.core.spec import ProfileSpec
from perfguard.core.verdict import verdict_in_store
from perfguard.errors import DamagedStoreError, PerfguardError
from perfguard.plugin.confirm import Confirmer
from perfguard.plugin.context import SessionContext
from perfguard.plugin.outputs import SessionOutputs
from perfguard.plugin.valgrind_child import InstructionSession

#: a capture failure, raised as the test's teardown error
_error_key = pytest.StashKey[str]()


class Verdicts:
    """Judges and records the session's tests (module docstring)."""

    def __init__(self, context: SessionContext, outputs: SessionOutputs) -> None:
        self.context = context
        self.outputs = outputs
        self._baseline: StoreBaseline | None = None  # made for the first judged test
        #: the session's Callgrind counts (:mod:`perfguard.plugin.valgrind_child`), if any
        self.instructions: InstructionSession | None = None
        #: measures a suspect timing again on this machine (store mode in the session's own
        #: process; None in a round child and in A/B mode)
        self.confirmer: Confirmer | None = None

    # ------------------------------------------------------------------ store mode
    def judge_capture(self, item: pytest.Item, spec: ProfileSpec, capture: TestCapture) -> None:
        """Analyse the capture, judge its record, keep the entry; raise a regression as a
        failure."""
        if capture.error:
            self.error(item, capture.error, capture.backend, capture.path)
            return
        if capture.timing_only:  # an A/B pair child's timing rounds: the parent judges
            self.outputs.records[item.nodeid] = timing_record(spec, capture, item.nodeid)
            return
        try:
            measured = analyse(spec, capture, item.nodeid)
            record = measured.record
            if self.instructions is not None:  # the loop's Callgrind counts, when made
                record = self.instructions.counted(record, spec.iterations, measured.notes)
        except (PerfguardError, ValueError, KeyError) as exc:
            msg = " ".join(str(exc).split()) or type(exc).__name__
            self.error(item, msg, capture.backend, capture.path)
            return
        self.judge_record(item, record, measured)

    def judge_record(self, item: pytest.Item, record: TestRecord, measured: Measured) -> None:
        """Store mode: ``record`` judged against the session's store (its baseline and its
        history, read once), the entry kept; a regression raised as the test's failure."""
        ctx = self.context
        if ctx.damaged is not None:
            self.not_judged_damaged(item, record, measured.capture, str(measured.backend))
            return
        try:
            entry = verdict_in_store(
                record,
                measured,
                self._store_baseline(),
                worker=ctx.worker_id,
                output=ctx.settings.output,
                confirm=self.confirmer,
            )
        except DamagedStoreError as exc:
            ctx.store_damaged(exc)
            self.not_judged_damaged(item, record, measured.capture, str(measured.backend))
            return
        except (PerfguardError, ValueError, KeyError) as exc:
            msg = " ".join(str(exc).split()) or type(exc).__name__
            self.error(item, msg, str(measured.backend), measured.capture)
            return
        self.finish(item, record, entry)

    def _store_baseline(self) -> StoreBaseline | None:
        """The session's store as every store-mode test's baseline (made for the first one);
        None without a store, git or a baseline ref."""
        ctx = self.context
        if ctx.store is None or ctx.git is None or not ctx.baseline_ref:
            return None
        if self._baseline is None:
            self._baseline = StoreBaseline(
                ctx.store,
                ctx.git.root,
                ctx.baseline_ref,
                ctx.git.commit,
                ctx.fingerprint,
                ctx.environment,
                ctx.settings.compare_across,
                ctx.git.dirty,
            )
        return self._baseline

    # ------------------------------------------------------------------ every mode
    def finish(self, item: pytest.Item, record: TestRecord, entry: TestEntry) -> None:
        """Keep the record and its entry (:func:`perfguard.core.verdict.verdict`'s); a
        regression fails the test here (the one fail rule, :func:`fails`)."""
        self.outputs.add(entry, record)
        _add_properties(item, entry)
        if fails(entry.outcome, self.context.settings.fail_on):
            commit = entry.baseline_commit or ""
            what = "the base tree" if entry.mode == "ab" else "the baseline"
            pytest.fail(
                f"perfguard: {item.nodeid} regressed against {what} at {commit[:12]}: "
                f"{entry.explained.text()}",
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
        self.outputs.add(
            TestEntry.not_judged(
                item.nodeid,
                outcome,
                error,
                capture=str(path) if path else None,
                backend=backend,
                worker=self.context.worker_id,
            )
        )
        item.user_properties.append(("perfguard_outcome", outcome))

    def not_judged_damaged(
        self, item: pytest.Item, record: TestRecord, capture: Any, backend: str
    ) -> None:
        """The test ran and was measured, but the store it would be judged against is
        damaged: ``not-judged`` with the store's one line (the record is kept: the session's
        reports show it; the save refuses the store)."""
        reason = f"not judged: {self.context.damaged}"
        self.outputs.add(
            TestEntry.not_judged(
                item.nodeid,
                "not-judged",
                reason,
                capture=str(capture) if capture else None,
                backend=backend,
                worker=self.context.worker_id,
            ),
            record,
        )
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
    timing = entry.timing  # the figures' one home
    for key in (
        "delta_pct",
        "ci_low_pct",
        "ci_high_pct",
        "p_value",
        "level_baseline_ns",
        "level_current_ns",
    ):
        value = None if timing is None else getattr(timing, key)
        item.user_properties.append((f"perfguard_{key}", "" if value is None else value))
    why = entry.explanation
    item.user_properties.append(("perfguard_explanation", why.headline if why else ""))
    for k, culprit in enumerate(why.culprits[:3] if why else (), 1):
        item.user_properties.append((f"perfguard_culprit_{k}", culprit.text))
    if why is not None and why.environment:  # the environment since the baseline, its words
        item.user_properties.append(("perfguard_environment", why.environment_line))
