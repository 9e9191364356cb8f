"""The session report: one pytest run's verdicts against its baseline, as one HTML file.

Input is the typed document :class:`~perfguard.compare.results.SessionResults`
(a results.json dict is checked into one first). The page context is
:class:`SessionPage`; the template only formats what it is given, so what
a reviewer sees is decided (and tested) here. Tests are listed worst
outcome first; each shows its reason, the timing half and the gates half of
its verdict side by side, and its rounds (current vs baseline).

A model can have hundreds of ops and a session tens of tests, so each
test's op table lists the ``max_ops`` ops with the largest absolute change
in time (every op with a verdict other than ``unchanged`` first); the rest
are counted under the table and stay in ``results.json``. This keeps a
500-op, 20-test report well under 2 MB (``benchmarks/report_size.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

import msgspec

from perfguard.compare.culprits import dtype_change
from perfguard.compare.explanation import Scalar
from perfguard.compare.results import (
    OUTCOMES,
    Baseline,
    Machine,
    OpRow,
    Run,
    SessionResults,
    TestEntry,
)
from perfguard.compare.units import human
from perfguard.report.html.render import badge_class, render, write_text
from perfguard.report.profile import ProfileView, profile_view

#: op statuses listed before the rest, whatever their size
_NOTABLE = {"regressed", "improved", "new", "removed", "added"}
#: rounds listed in a test's round table (the figure shows them all)
MAX_ROUND_ROWS = 30


@dataclass
class GateRow:
    """One gate finding as the page shows it."""

    kind: str  # "regression" | "improvement"
    gate: str
    op_name: str
    kernel_name: str
    baseline: Scalar
    current: Scalar
    budget: str
    message: str

    @property
    def change(self) -> str:
        """The "baseline → current" cell: input dtypes as the culprit says them (``fp32 →
        fp64``), not torch's per-input type lists."""
        if self.gate == "dtypes":
            return dtype_change(self.baseline, self.current)
        b = "n/a" if self.baseline is None else self.baseline
        c = "n/a" if self.current is None else self.current
        return f"{b} → {c}"


@dataclass
class TestView:
    """One test's section of the page."""

    __test__ = False  # not a pytest class

    index: int
    anchor: str
    test: TestEntry
    rounds_svg: str | None  # rounds (or, for an older file, per-iteration samples)
    rounds_are_samples: bool
    rounds: list[tuple[int, float | None, float | None]]  # (round, baseline, current), ns
    rounds_hidden: int
    trend_svg: str | None
    gate_rows: list[GateRow]
    ops: list[dict[str, Any]]  # shown rows, each with ``delta_ns``
    ops_hidden: int  # ops not shown
    ops_hidden_max_abs_ns: float | None  # largest |delta_ns| among the hidden ones
    #: where the step's time goes, whatever the outcome (report.profile), collapsed
    profile: ProfileView | None = None
    #: whether any shown op has a Tensor Core or FLOP-efficiency figure: a CPU run has
    #: none, and its table was two columns of n/a (issue 54)
    device_columns: bool = True
    #: whether any shown op has an interval or p-value (store mode judges no per-op time)
    stat_columns: bool = True


@dataclass
class SessionPage:
    """Everything ``session.html.j2`` shows."""

    title: str
    badge: str  # PASS | FAIL | ADVISORY | INCOMPLETE | NOT JUDGED
    badge_class: str  # the CSS class of the badge: pass, fail, advisory, ...
    badge_reason: str
    #: what the session's timing could see (:meth:`SessionResults.resolution`), "" if none
    resolution: str
    run: Run
    baseline: Baseline | None
    baseline_status: str | None
    mode: str
    machine: list[tuple[str, str]]  # (label, value) pairs of the fingerprint
    settings: dict[str, Any]
    counts: list[tuple[str, int]]  # every outcome, worst first
    total: int
    tests: list[TestView] = field(default_factory=list)
    perfguard_version: str | None = None
    notes: list[str] = field(default_factory=list)  # the plugin's session notes (baseline lookup)
    #: whether any test's host instructions were counted (the table's column is shown then)
    counted: bool = False


def op_delta_ns(op: OpRow) -> float | None:
    """Current minus baseline time of an op; an op on one side only counts in full."""
    base, cur = op.baseline_ns, op.current_ns
    if base is not None and cur is not None:
        return cur - base
    if cur is not None:
        return cur
    if base is not None:
        return -base
    return None


def rank_ops(ops: list[OpRow], limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(shown, hidden)``: ops by |Δ time| (notable statuses first), split at ``limit``."""
    rows = [dict(msgspec.structs.asdict(op), delta_ns=op_delta_ns(op)) for op in ops]

    def key(op: dict[str, Any]) -> tuple[int, float, float]:
        d, pct = op["delta_ns"], op.get("delta_pct")
        return (
            0 if op.get("status") in _NOTABLE else 1,
            -abs(d) if d is not None else 0.0,
            -abs(pct) if pct is not None else 0.0,
        )

    rows.sort(key=key)
    return rows[:limit], rows[limit:]


def _machine(fp: Machine) -> list[tuple[str, str]]:
    gpu = fp.gpu_name or ""
    count = fp.gpu_count or 0
    items = [
        ("GPU", f"{gpu} × {count}" if gpu and count and count != 1 else (gpu or "none (CPU only)")),
        ("CPU", fp.cpu or ""),
        ("Driver", fp.driver or ""),
        ("CUDA", fp.cuda or ""),
        ("PyTorch", fp.torch or ""),
        ("Python", fp.python or ""),
        ("Host", fp.host or ""),
        ("perfguard", fp.perfguard or ""),
    ]
    return [(k, str(v)) for k, v in items if v]


def gate_rows(test: TestEntry) -> list[GateRow]:
    """The gates half's findings, regressions first, each op named as the explanation
    names it: a finding on an op nested in a culprit of the same kind is that culprit's
    (the dtypes of ``aten::add/aten::to/aten::_to_copy`` changed with ``aten::add``'s,
    which the culprit line names), so the panel and the culprit say one op one way."""
    g = test.gates
    if g is None:
        return []
    culprits = test.explanation.culprits if test.explanation is not None else ()
    rows: list[GateRow] = []
    for kind, found in (("regression", g.regressions), ("improvement", g.improvements)):
        for f in found:
            op = next(
                (
                    c.op
                    for c in culprits
                    if c.kind == f.gate and c.op and f.op_name.startswith(c.op + "/")
                ),
                f.op_name,
            )
            row = GateRow(
                kind,
                f.gate,
                op,
                f.kernel_name,
                human(f.baseline, f.gate),
                human(f.current, f.gate),
                f.budget,
                f.message,
            )
            if op == f.op_name or not any(
                (r.kind, r.gate, r.op_name) == (kind, f.gate, op) for r in rows
            ):
                rows.append(row)
    return rows


def _view(i: int, test: TestEntry, figures: Any, max_ops: int) -> TestView:
    shown, hidden = rank_ops(test.ops, max_ops)
    hidden_abs = [abs(op["delta_ns"]) for op in hidden if op["delta_ns"] is not None]
    name = test.nodeid
    have_rounds = bool(test.rounds_current or test.rounds_baseline)
    if have_rounds:
        svg = figures.distribution(
            test.rounds_baseline,
            test.rounds_current,
            f"rounds of {name}: baseline vs current",
            unit_label="per-round time",
        )
    else:
        svg = figures.distribution(
            test.samples_baseline,
            test.samples_current,
            f"per-iteration samples of {name}: baseline vs current",
        )
    rounds = [
        (k, b, c) for k, (b, c) in enumerate(zip_longest(test.rounds_baseline, test.rounds_current))
    ]
    return TestView(
        index=i,
        anchor=f"test-{i}",
        test=test,
        rounds_svg=svg,
        rounds_are_samples=not have_rounds,
        rounds=rounds[:MAX_ROUND_ROWS],
        rounds_hidden=max(len(rounds) - MAX_ROUND_ROWS, 0),
        trend_svg=figures.trend(test.history, f"median of {name} over commits"),
        gate_rows=gate_rows(test),
        ops=shown,
        ops_hidden=len(hidden),
        ops_hidden_max_abs_ns=max(hidden_abs) if hidden_abs else None,
        profile=profile_view(test, i),
        device_columns=_any_figure(
            shown, ("tc_util_baseline", "tc_util_current", "flop_eff_baseline", "flop_eff_current")
        ),
        stat_columns=_any_figure(shown, ("ci_low_pct", "p_value")),
    )


def _any_figure(ops: list[dict[str, Any]], keys: tuple[str, ...]) -> bool:
    """Whether any shown op has one of ``keys``: a column none has is left out."""
    return any(op.get(k) is not None for op in ops for k in keys)


def session_page(results: SessionResults | dict[str, Any], *, max_ops: int = 50) -> SessionPage:
    """The page context for ``results``; draws the figures."""
    from perfguard.report.figures import SessionFigures

    results = SessionResults.from_dict(results)
    figures = SessionFigures()
    counts = results.counts
    badge = results.badge()
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts[o]]
    title = f"perfguard: {badge}" + (f" ({', '.join(parts)})" if parts else "")
    page = SessionPage(
        title=title,
        badge=badge,
        badge_class=badge_class(badge),
        badge_reason=results.badge_reason(),
        resolution=results.resolution(),
        run=results.run,
        baseline=results.baseline,
        baseline_status=results.baseline_status,
        mode=results.mode,
        machine=_machine(results.run.fingerprint),
        settings=results.settings,
        counts=list(counts.items()),
        total=len(results.tests),
        perfguard_version=results.perfguard_version,
        notes=results.notes,
    )
    page.tests = [_view(i, t, figures, max_ops) for i, t in enumerate(results.sorted_tests())]
    page.counted = any(t.host_count is not None for t in results.tests)
    return page


def render_session_html(results: SessionResults | dict[str, Any], *, max_ops: int = 50) -> str:
    """The session report for ``results`` (typed, or a results.json dict) as one HTML document."""
    return render("session.html.j2", page=session_page(results, max_ops=max_ops))


def write_session_html(
    results: SessionResults | dict[str, Any], path: str | Path, *, max_ops: int = 50
) -> Path:
    """Render the session report for ``results`` and write it to ``path``; returns the path."""
    return write_text(path, render_session_html(results, max_ops=max_ops), "HTML report")
