"""The ``perfguard`` section of pytest's terminal summary: the badge, one row per test.

Columns: test, outcome, Δ median, interval (the ``1 - alpha`` confidence
interval of the change), the gates half's outcome, and why: the op that
moved most for a regression or improvement, the reason for every other
outcome (an error, a crash, too few rounds, a busy machine). Tests are
listed worst first. Then which baseline was used, what was saved and
where ``results.json`` and the reports are. Text only, from the typed
session document (:class:`~perfguard.compare.results.SessionResults`).
"""

from __future__ import annotations

import math
from typing import Any

from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import OUTCOMES, SessionResults, TestEntry
from perfguard.errors import PerfguardError

HEADER = ("test", "outcome", "Δ median", "interval", "gates", "why")
MAX_TEST = 60
MAX_WHY = 70


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.1f}%"


def _interval(entry: TestEntry) -> str:
    lo, hi = entry.ci_low_pct, entry.ci_high_pct
    if lo is None or hi is None:
        return "-"
    return f"{lo:+.1f}..{hi:+.1f}%"


def top_op(entry: TestEntry) -> str:
    """The op that moved most (ops come largest change first), with its change."""
    for op in entry.ops:
        base, cur = op.get("baseline_ns"), op.get("current_ns")
        if (base or 0) == (cur or 0):
            return ""
        name = str(op.get("op_name"))
        if op.get("status") in ("added", "removed"):
            return f"{name} ({op['status']})"
        return f"{name} {_pct(op.get('delta_pct'))}"
    return ""


def why(entry: TestEntry) -> str:
    """The op behind a regression or improvement; the reason for everything else
    (after the acceptance it was judged under, if any)."""
    text = entry.reason or "-"
    if entry.outcome in (Outcome.REGRESSED, Outcome.IMPROVED):
        op = top_op(entry)
        if op:
            text = f"top op {op}"
    return f"{entry.accepted_text}; {text}" if entry.accepted else text


def _clip(text: str, width: int, keep_end: bool = False) -> str:
    text = " ".join(text.split()).encode("utf-8", "replace").decode("utf-8")
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1) :] if keep_end else text[: width - 1] + "…"


def table_rows(entries: list[TestEntry]) -> list[tuple[str, ...]]:
    return [
        (
            _clip(e.nodeid, MAX_TEST, keep_end=True),
            e.outcome.value,
            _pct(e.delta_pct),
            _interval(e),
            e.gates.outcome.value if e.gates is not None else "-",
            _clip(why(e), MAX_WHY),
        )
        for e in entries
    ]


def format_table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*HEADER).rstrip(), line.format(*("-" * w for w in widths)).rstrip()]
    out += [line.format(*r).rstrip() for r in rows]
    return out


def results_lines(results: SessionResults) -> list[str]:
    """The badge, the table (worst first) and the counts of a session document."""
    tests = results.sorted_tests()
    lines = [f"perfguard: {results.badge()} ({results.badge_reason()})"]
    if tests:
        lines += format_table(table_rows(tests))
        counts = results.counts
        lines.append(", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o]))
    else:
        lines.append("no test was measured (mark benchmarks with @pytest.mark.gpuprofile)")
    return lines


def summary_lines(session: Any) -> list[str]:
    """The section's lines for a :class:`~perfguard.plugin.session.PerfguardSession`."""
    lines = [f"backend: {session.backend.label} ({session.backend.why})"]
    lines.append(f"baseline: {session.baseline_status()}")
    try:
        lines += results_lines(session.results())
    except PerfguardError as exc:  # a malformed entry must not cost the summary
        lines.append(f"perfguard: cannot tabulate the results: {exc}")
    if session.saved_run_id is not None:
        dirty = " (dirty tree)" if session.run.dirty else ""
        lines.append(
            f"saved run {session.saved_run_id} for {session.run.commit[:12]}{dirty} "
            f"in {session.settings.store}"
        )
    elif session.settings.save:
        lines.append(f"not saved: {session.save_error}")
    if session.results_path is not None:
        lines.append(f"results: {session.results_path}")
    if session.report_path is not None:
        lines.append(f"report: {session.report_path} (open it in a browser; summary.md beside it)")
    lines += [f"note: {n}" for n in session.notes if not n.startswith("no baseline")]
    return lines
