"""The ``perfguard`` section of pytest's terminal summary: the badge, one row per test.

Columns: test, outcome, change (the judge's change of the level: the ratio of
the rounds' geometric means, A/B the paired estimate; never the ratio of two
medians), its interval (``1 - alpha``), the gates half's outcome, and why:
the judge's explanation (:class:`~perfguard.compare.explanation.Explanation`)
in one line, its first culprit for a regression or improvement, the reason
for every other outcome. The regressed tests' explanation lines follow the
table. Text only, from the typed session document.
"""

from __future__ import annotations

import math
from typing import Any

from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import OUTCOMES, SessionResults, TestEntry
from perfguard.errors import PerfguardError

HEADER = ("test", "outcome", "change", "interval", "gates", "why")
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


def why(entry: TestEntry) -> str:
    """The explanation in one line (after the acceptance it was judged under, if any)."""
    text = entry.explained.short() or "-"
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
        for e in tests:  # what changed, in the judge's words (the failure message's)
            if e.outcome in (Outcome.REGRESSED, Outcome.IMPROVED) and e.explanation is not None:
                lines.append(f"{e.outcome.value} {e.nodeid}: {e.explanation.headline}")
                lines += [f"  - {line}" for line in e.explanation.lines]
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
    written = session.outputs
    if written.results_path is not None:
        lines.append(f"results: {written.results_path}")
    if written.report_path is not None:
        lines.append(f"report: {written.report_path} (open it in a browser; summary.md beside it)")
    lines += [f"note: {n}" for n in session.notes if not n.startswith("no baseline")]
    return lines
