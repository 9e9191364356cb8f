"""The one judge: a test's current record against what it is compared with.

The plugin (store and A/B mode), ``perfguard report`` and ``perfguard
compare`` all call :func:`judge`; nothing else decides an outcome. The
verdict has two halves, judged separately and reported side by side:

* **timing** (:mod:`perfguard.compare.timing`): rounds, history noise or
  A/B pairs;
* **gates** (:mod:`perfguard.compare.gates`): deterministic counters.

The test's outcome combines them: a regression of either is a regression
(each with its own reason); else an improvement of either, but only when
neither half shows a significant slowdown (a counter that fell while the
time rose says both, and the outcome follows the time); else the
timing's ``noisy``; else ``unchanged`` when the timing was judged, and
``not-judged`` when it was not (the gates' figures are still shown): a
test whose timing nobody could judge is never shown as passing.

Two rules decide the store-mode timing before it is combined: a comparison of the
same clean commit with an unchanged environment is an A/A by construction, so its
timing reads at most ``noisy`` (:func:`same_code`); and a timing the same machine
measured again A/B (:mod:`perfguard.compare.confirm`) is that measurement's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from perfguard.baseline.record import METRICS, TestRecord, run_level
from perfguard.compare.comparison import (
    TestComparison,
    compare_ops,
    kernel_changes,
    with_empty_capture,
)
from perfguard.compare.confirm import Confirmation, confirmed
from perfguard.compare.culprits import Evidence, explain
from perfguard.compare.explanation import Explanation
from perfguard.compare.gates import Budget, judge_gates, parse_gates
from perfguard.compare.halves import GateVerdict, TimingVerdict
from perfguard.compare.outcomes import Outcome
from perfguard.compare.timing import (
    judge_ab,
    judge_store,
    not_judged,
)
from perfguard.compare.tolerance import ALPHA, TOLERANCE
from perfguard.compare.units import format_ns
from perfguard.environment import EnvironmentChange
from perfguard.errors import CompareError


@dataclass
class Against:
    """What one test is judged against.

    ``records``: the baseline's record(s) of this test (store mode: the
    baseline commit's runs, pooled; A/B: the base tree's rounds, one record),
    empty when the baseline run lacks the test. ``run_found``: a baseline run
    exists at all (so an empty ``records`` means ``new``). ``history``: the
    test's run levels on this machine, oldest first (store mode).
    ``incompatibility``: why the machines cannot be compared, if they cannot.
    ``environment``: what differs in the environment since the baseline (the blocking
    fields are in ``incompatibility`` already); every view lists it with the verdict.
    What the machine was doing while the baseline was measured (its wait for a CPU, its
    reference workload's time) is read from the records' ``meta`` by :func:`judge`
    itself (:func:`machine_evidence`), so no caller can judge a stored run without it.
    """

    records: list[TestRecord] = field(default_factory=list)
    mode: str = "store"  # "store" | "ab"
    commit: str | None = None
    run_found: bool = False
    incompatibility: str | None = None
    #: why the timing alone cannot be compared (another -n); the gates still are
    timing_incompatibility: str | None = None
    history: np.ndarray = field(default_factory=lambda: np.zeros(0))
    environment: tuple[EnvironmentChange, ...] = ()
    #: the test's stored levels as the reports list them (store mode, when asked for:
    #: read with ``history``, :func:`perfguard.compare.against.against_from_store`)
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: the commit measured now and whether its tree, or any baseline run pooled, was dirty
    #: (unknown: dirty): the same clean commit is an A/A by construction (:func:`same_code`)
    current_commit: str | None = None
    current_dirty: bool = True
    baseline_dirty: bool = True
    #: the same machine's A/B measurement of this test against ``commit`` (store mode),
    #: which decides the timing half (:mod:`perfguard.compare.confirm`)
    confirmation: Confirmation | None = None


def same_code(against: Against) -> bool:
    """The baseline measured this very code: the same commit, both trees clean, the
    environment unchanged. Its timing can then only differ by the machine's doing."""
    return (
        against.mode == "store"
        and against.commit is not None
        and against.commit == against.current_commit
        and not against.current_dirty
        and not against.baseline_dirty
        and not against.environment
    )


#: the reason an A/A comparison's timing reads at most noisy
SAME_CODE = (
    "same code as the baseline (the same clean commit, environment unchanged): a change "
    "in its timing can only be the machine's, never a regression or an improvement"
)


@dataclass(frozen=True)
class JudgeSettings:
    """The thresholds of one test (marker over session options over the defaults)."""

    tolerance: float = TOLERANCE
    alpha: float = ALPHA
    gates: dict[str, Budget | bool] = field(default_factory=lambda: parse_gates(None))

    def __post_init__(self) -> None:
        if not (self.tolerance >= 0 and math.isfinite(self.tolerance)):
            raise CompareError(f"tolerance must be a finite fraction >= 0, got {self.tolerance!r}")
        if not 0.0 < self.alpha < 1.0:
            raise CompareError(f"alpha must be in (0, 1), got {self.alpha!r}")


def slower(timing: TimingVerdict) -> bool:
    """The timing shows a significant slowdown, whatever its outcome (its interval lies
    above zero)."""
    return timing.ci_low_pct is not None and timing.ci_low_pct > 0


def combine(timing: TimingVerdict, gates: GateVerdict | None) -> Outcome:
    """The test's outcome from its two halves (module docstring)."""
    halves = [timing.outcome] + ([gates.outcome] if gates is not None else [])
    if Outcome.REGRESSED in halves:
        return Outcome.REGRESSED
    if Outcome.IMPROVED in halves and not slower(timing):
        return Outcome.IMPROVED
    if timing.outcome is Outcome.NOISY:
        return Outcome.NOISY
    if timing.outcome is Outcome.UNCHANGED:
        return Outcome.UNCHANGED
    return Outcome.NOT_JUDGED


def machine_evidence(records: list[TestRecord]) -> tuple[float, float]:
    """(wait, speed_ns) of the machine while ``records`` were measured, the median over
    them (NaN when none kept it): the share of round time the test's thread waited for a
    CPU, and the reference workload's time (:mod:`perfguard.capture.speed`), as the
    session stored them in each record's ``meta``."""
    waits = [w for r in records if math.isfinite(w := _num(r.meta.get("wait")))]
    speeds = [s for r in records if (s := _num(r.meta.get("speed_ns"))) > 0]
    return (
        float(np.median(waits)) if waits else math.nan,
        float(np.median(speeds)) if speeds else math.nan,
    )


def _pooled(records: list[TestRecord], metric: str) -> np.ndarray:
    return np.concatenate([r.round_values(metric) for r in records]) if records else np.zeros(0)


def _iterations(record: TestRecord) -> int:
    rounds = record.rounds()
    return int(np.bincount(rounds - rounds.min()).max()) if len(rounds) else 0


def judge(current: TestRecord, against: Against, settings: JudgeSettings) -> TestComparison:
    """The verdict on ``current``. A record whose capture saw no op (its ``meta``'s
    ``empty_capture``: why, said when it was analysed) is never judged silently
    (:func:`with_empty_capture`): the same rule live and for a stored run compared later."""
    comparison = _judge(current, against, settings)
    reason = current.meta.get("empty_capture")
    return with_empty_capture(comparison, str(reason)) if reason else comparison


def _judge(current: TestRecord, against: Against, settings: JudgeSettings) -> TestComparison:
    if current.metric not in METRICS:
        raise CompareError(f"{current.nodeid}: unknown metric {current.metric!r}")
    tol, alpha = settings.tolerance, settings.alpha
    cur_rounds = current.round_values()
    load = _num(current.meta.get("load"))
    wait = _num(current.meta.get("wait"))
    base_rec = against.records[0] if against.records else None
    common: dict[str, Any] = dict(
        nodeid=current.nodeid,
        alpha=alpha,
        baseline_commit=against.commit,
        samples_current=_ints(current.values()),
        rounds_current=_ints(cur_rounds),
        mode=against.mode,
    )
    at = f" at {against.commit[:12]}" if against.commit else ""
    # this session's own figures, where its timing is not compared with anything
    alone: dict[str, Any] = dict(
        median_current_ns=float(np.median(cur_rounds)) if len(cur_rounds) else math.nan,
        level_current_ns=run_level(cur_rounds),  # what this run's history will print for it
        n_current=len(cur_rounds),
        load=load,
    )

    reason = against.incompatibility
    if reason is None and base_rec is not None and base_rec.metric != current.metric:
        reason = (
            f"metrics differ: baseline measured {base_rec.metric}, current {current.metric} "
            "(a GPU capture is never compared with a CPU-only one)"
        )
    if base_rec is None or reason is not None:
        if reason is not None:
            outcome, text = Outcome.INCOMPARABLE, f"incomparable: {reason}"
        elif against.run_found:
            outcome, text = Outcome.NEW, f"new test: not in the baseline run{at}"
        else:
            outcome, text = Outcome.NO_BASELINE, "no baseline to compare with"
        timing = not_judged(current.metric, text, tol, **alone)
        level = format_ns(alone["level_current_ns"])
        msg = f"{text}; {current.metric} level {level} over {len(cur_rounds)} round(s)"
        plain = Explanation.plain(outcome.value, msg).with_environment(against.environment)
        return TestComparison(
            outcome=outcome,
            message=msg,
            timing=timing,
            gates=None,
            explanation=plain,
            **common,
        )

    metric = current.metric
    if against.timing_incompatibility is not None:
        timing = not_judged(
            metric,
            f"timing not compared: {against.timing_incompatibility}",
            tol,
            **alone,
        )
    elif metric != "gpu_time" and any(
        r.timed_apart != current.timed_apart for r in against.records
    ):
        # a CPU timing under the profiler is slower and noisier than one without it
        which = "the baseline" if current.timed_apart else "this session"
        timing = not_judged(
            metric,
            f"{which} timed its rounds under the profiler (a perfguard before timing "
            "rounds ran unprofiled): timing not comparable; save a new baseline",
            tol,
            **alone,
        )
    elif against.mode == "ab":
        base_rounds = base_rec.round_values(metric)
        n = min(len(base_rounds), len(cur_rounds))
        timing = judge_ab(
            base_rounds[:n],
            cur_rounds[:n],
            metric=metric,
            tolerance=tol,
            alpha=alpha,
            load=load,
            wait=wait,
            iterations=_iterations(current),
            in_turn=current.meta.get("ab_children") == "pair",
        )
    else:
        base_wait, base_speed = machine_evidence(against.records)
        timing = judge_store(
            cur_rounds,
            _pooled(against.records, metric),
            against.history,
            metric=metric,
            tolerance=tol,
            alpha=alpha,
            baseline_runs=len(against.records),
            load=load,
            wait=wait,
            baseline_wait=base_wait,
            iterations=_iterations(current),
            speed_ns=_num(current.meta.get("speed_ns")),
            baseline_speed_ns=base_speed,
        )
        if against.confirmation is not None:
            timing = confirmed(
                timing,
                against.confirmation,
                tolerance=tol,
                alpha=alpha,
                iterations=_iterations(current),
            )
        if same_code(against) and timing.outcome in (Outcome.REGRESSED, Outcome.IMPROVED):
            timing = msgspec.structs.replace(
                timing, outcome=Outcome.NOISY, message=f"{SAME_CODE}: {timing.message}"
            )
    changes = kernel_changes(current, base_rec)  # once: the gates and the report share it
    gates = judge_gates(current, base_rec, settings.gates, changes, tol)
    outcome = combine(timing, gates)
    if outcome is Outcome.NOT_JUDGED and against.timing_incompatibility is not None:
        outcome = Outcome.INCOMPARABLE  # the timing could not be compared; the gates held
    ops = compare_ops(current, base_rec, tolerance=tol, alpha=alpha)
    why = explain(Evidence(outcome, timing, gates, ops, current, base_rec, settings.gates))
    why = why.with_environment(against.environment)
    return TestComparison(
        outcome=outcome,
        message=why.headline,
        timing=timing,
        gates=gates,
        ops=ops,
        kernel_changes=changes,
        samples_baseline=_ints(base_rec.values()),
        rounds_baseline=_ints(base_rec.round_values(metric)),
        explanation=why,
        **common,
    )


def compare_records(
    current: TestRecord,
    baseline: TestRecord | None,
    *,
    tolerance: float = TOLERANCE,
    alpha: float = ALPHA,
    incompatibility: str | None = None,
    baseline_commit: str | None = None,
    baseline_run_exists: bool = False,
    history: np.ndarray | None = None,
    mode: str = "store",
    gates: dict[str, Any] | None = None,
    timing_incompatibility: str | None = None,
    environment: tuple[EnvironmentChange, ...] = (),
) -> TestComparison:
    """Compare ``current`` with one ``baseline`` record: :func:`perfguard.compare.judge`
    with that record as the baseline (kept for notebooks and the CLI's two-capture case).

    ``baseline=None`` gives ``no-baseline``, or ``new`` with
    ``baseline_run_exists``; ``incompatibility`` gives ``incomparable``.
    """
    against = Against(
        records=[baseline] if baseline is not None else [],
        mode=mode,
        commit=baseline_commit,
        run_found=baseline_run_exists or baseline is not None,
        incompatibility=incompatibility,
        timing_incompatibility=timing_incompatibility,
        environment=tuple(environment),
        history=np.zeros(0) if history is None else np.asarray(history, dtype=np.float64),
    )
    settings = JudgeSettings(tolerance=tolerance, alpha=alpha, gates=parse_gates(gates))
    return judge(current, against, settings)


def _num(value: Any) -> float:
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def _ints(values: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(values, dtype=np.float64) if math.isfinite(v)]
