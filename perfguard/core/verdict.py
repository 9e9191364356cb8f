"""A test's verdict: its record judged against what it is compared with, as its entry.

:func:`verdict` is the one call from a record to a
:class:`~perfguard.compare.results.TestEntry`: the judge's outcome and figures
(:func:`perfguard.compare.judge.judge`), a capture that saw no op never silently passing,
a regressed test's capture written as a Perfetto timeline, and beside the verdict what
the entry shows of how the record was made (:class:`~perfguard.core.record.Measured`) and
the test's stored history (``Against.rows``: read once with its noise levels,
:func:`perfguard.compare.against.against_from_store`). Every mode of the plugin (store,
A/B, isolation) makes its entries here; no pytest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from perfguard.analysis import Analysis
from perfguard.baseline.accept import Acceptance as Accepted
from perfguard.baseline.record import TestRecord, instruction_counts
from perfguard.capture.capturers import capture_name
from perfguard.compare.against import StoreBaseline, settings_for
from perfguard.compare.comparison import TestComparison
from perfguard.compare.confirm import Confirmation
from perfguard.compare.judge import Against, JudgeSettings, judge
from perfguard.compare.outcomes import Outcome
from perfguard.compare.profile import profile_of
from perfguard.compare.results import Acceptance, Finding, HistoryRow, TestEntry
from perfguard.core.phases import timed
from perfguard.core.record import Measured
from perfguard.errors import PerfguardError
from perfguard.report.perfetto import write_perfetto


class Confirmer(Protocol):
    """Measures a judged test's timing again on this machine
    (:class:`perfguard.plugin.confirm.Confirmer`): at once, or later with other tests."""

    def now(self, comparison: TestComparison) -> Confirmation | None:
        """The confirmation to judge with now, or None (not needed, or kept for later)."""

    def later(
        self, comparison: TestComparison, rejudge: Callable[[Confirmation], TestEntry]
    ) -> None:
        """Keep ``rejudge`` (the same verdict with a confirmation) if this test's timing is
        to be confirmed with the session's others, at its end."""


def verdict(
    record: TestRecord,
    against: Against,
    settings: JudgeSettings,
    measured: Measured | None = None,
    *,
    accepted: Accepted | None = None,
    worker: str | None = None,
    output: Path | None = None,
    confirm: Confirmer | None = None,
) -> TestEntry:
    """The entry of ``record`` judged against ``against`` with ``settings``.

    ``measured``: how the record was made (its analysis, findings, capture, notes and
    phases; None: the record alone). ``accepted``: the acceptance the test was judged
    under (store mode); ``worker``: the xdist worker that measured it; ``output``: the
    folder a regressed test's timeline is written under (None: none written).
    ``confirm``: measures a verdict's timing again on this machine when it asks for it
    (:mod:`perfguard.compare.confirm`; None for a comparison, or when it need not), and
    the test is judged again with that measurement: the same one judge."""
    m = measured if measured is not None else Measured(record)
    phases = dict(m.phase_s)
    with timed(phases, "compare"):
        comparison = judge(record, against, settings)  # an empty capture said there too
    if confirm is not None:
        t0 = time.perf_counter()
        confirmation = confirm.now(comparison)
        if confirmation is not None:  # a part of its own only where it measured
            phases["confirm"] = phases.get("confirm", 0.0) + time.perf_counter() - t0
            against = replace(against, confirmation=confirmation)
            with timed(phases, "compare"):
                comparison = judge(record, against, settings)
        else:
            confirm.later(
                comparison,
                lambda c: verdict(
                    record,
                    replace(against, confirmation=c),
                    settings,
                    measured,
                    accepted=accepted,
                    worker=worker,
                    output=output,
                ),
            )
    timeline = None
    if comparison.outcome is Outcome.REGRESSED and m.analysis is not None and m.capture:
        with timed(phases, "timeline"):
            timeline = _timeline(m.analysis, Path(m.capture), record.nodeid, output)
    return _entry(record, comparison, against.rows, m, phases, accepted, worker, timeline)


def verdict_in_store(
    record: TestRecord,
    measured: Measured,
    baseline: StoreBaseline | None,
    *,
    worker: str | None = None,
    output: Path | None = None,
    confirm: Confirmer | None = None,
) -> TestEntry:
    """Store mode: ``record`` judged against what ``baseline`` (the session's store; None:
    no store, git or baseline ref) holds for it, one lookup whose time is the record's
    ``history`` phase, with the settings the record carries (:func:`settings_for`)."""
    with timed(measured.phase_s, "history"):  # the store's reads
        against, accepted = (Against(), None) if baseline is None else baseline.against(record)
    return verdict(
        record,
        against,
        settings_for(record),
        measured,
        accepted=accepted,
        worker=worker,
        output=output,
        confirm=confirm,
    )


def _entry(
    record: TestRecord,
    comparison: TestComparison,
    history: list[dict[str, Any]],
    m: Measured,
    phases: dict[str, float],
    accepted: Accepted | None,
    worker: str | None,
    timeline: str | None,
) -> TestEntry:
    """The verdict, typed as it is kept and written, with what the entry shows beside it."""
    accepted = accepted if comparison.mode == "store" else None
    return comparison.entry(
        accepted=Acceptance(**accepted.to_dict()) if accepted is not None else None,
        timeline=timeline,
        findings=[Finding.of(f) for f in m.findings],
        history=[HistoryRow(**h) for h in history],
        capture=str(m.capture) if m.capture else None,
        backend=m.backend,
        notes=m.notes,
        worker=worker,
        phase_s=phases,
        counted=instruction_counts(record),
        profile=profile_of(record),
    )


def _timeline(analysis: Analysis, capture: Path, nodeid: str, output: Path | None) -> str | None:
    """A regressed test's capture as a Perfetto trace beside it (the report links it):
    the reviewer opens the evidence in ui.perfetto.dev, op to kernel. Named after the
    test (one file per test: a name cut from the capture's would be its module's); its
    path relative to ``output``, the folder the reports are written in."""
    if output is None:
        return None
    name = capture_name(nodeid) + ".perfetto.json.gz"
    try:
        path = write_perfetto(analysis, capture.with_name(name))
        return str(Path(path).resolve().relative_to(output.resolve()))
    except (OSError, ValueError, PerfguardError):
        return None  # the verdict stands without its timeline
