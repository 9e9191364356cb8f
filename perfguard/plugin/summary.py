"""The ``perfguard`` section of pytest's terminal summary: the badge, one row per test.

Columns: test, outcome, change (the judge's change of the level: the ratio of
the rounds' geometric means, A/B the paired estimate; never the ratio of two
medians), its interval (``1 - alpha``), the gates half's outcome, the host
instructions per iteration with their change when Callgrind counted any test
(:class:`~perfguard.compare.results.HostCount`), and why:
the judge's explanation (:class:`~perfguard.compare.explanation.Explanation`)
in one line, its first culprit for a regression or improvement, the reason
for every other outcome, shortened between words to fit the column. The
regressed and improved tests' explanation lines follow the table, then the whole
"why" of every other test whose cell was shortened. Text only, from the typed session document.
"""

from __future__ import annotations

from typing import Any

from perfguard.compare.explanation import shorten
from perfguard.compare.listing import detail_lines, headline, shared_environment
from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import OUTCOMES, SessionResults, TestEntry
from perfguard.compare.units import interval, percent, seconds
from perfguard.plugin.phases import OWN_PHASES

HEADER = ("test", "outcome", "change", "interval", "gates", "why")
MAX_TEST = 60
MAX_WHY = 70


def _pct(value: Any) -> str:
    return "-" if value is None else percent(value, signed=True)


def _interval(entry: TestEntry) -> str:
    lo, hi = entry.ci_low_pct, entry.ci_high_pct
    return "-" if lo is None or hi is None else interval(lo, hi)


def why(entry: TestEntry) -> str:
    """The explanation in one line (after the acceptance it was judged under, if any)."""
    text = entry.explained.short() or "-"
    return f"{entry.accepted_text}; {text}" if entry.accepted else text


def _clip(text: str, width: int, keep_end: bool = False) -> str:
    """A cell: a test id keeps its end (the test's name); any other text is shortened
    between words (:func:`shorten`), its full line said below the table."""
    text = _printable(text)
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1) :] if keep_end else shorten(text, width)


def _printable(text: str) -> str:
    """One line any terminal prints (a lone surrogate from a test's output becomes ``?``)."""
    return " ".join(text.split()).encode("utf-8", "replace").decode("utf-8")


def _counted(entries: list[TestEntry]) -> bool:
    """Whether any test's host instructions were counted (the column is shown then)."""
    return any(e.host_count is not None for e in entries)


def header(entries: list[TestEntry]) -> tuple[str, ...]:
    return (*HEADER[:-1], "instructions", HEADER[-1]) if _counted(entries) else HEADER


def table_rows(entries: list[TestEntry]) -> list[tuple[str, ...]]:
    counted = _counted(entries)
    rows = []
    for e in entries:
        row = [
            _clip(e.nodeid, MAX_TEST, keep_end=True),
            e.outcome.value,
            _pct(e.delta_pct),
            _interval(e),
            e.gates.outcome.value if e.gates is not None else "-",
        ]
        if counted:
            host = e.host_count
            row.append(host.short() if host is not None else "-")
        rows.append((*row, _clip(why(e), MAX_WHY)))
    return rows


def format_table(rows: list[tuple[str, ...]], head: tuple[str, ...] = HEADER) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*head).rstrip(), line.format(*("-" * w for w in widths)).rstrip()]
    out += [line.format(*r).rstrip() for r in rows]
    return out


def results_lines(results: SessionResults) -> list[str]:
    """The badge, the table (worst first) and the counts of a session document."""
    tests = results.sorted_tests()
    lines = [f"perfguard: {results.badge()} ({results.badge_reason()})"]
    seen = results.resolution()
    if seen:
        lines.append(seen[0].upper() + seen[1:])
    if tests:
        lines += format_table(table_rows(tests), header(tests))
        counts = results.counts
        lines.append(", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o]))
        rest = []
        for e in tests:  # what changed, in the judge's words (the failure message's)
            if e.outcome in (Outcome.REGRESSED, Outcome.IMPROVED) and e.explanation is not None:
                lines.append(f"{e.outcome.value} {e.nodeid}: {headline(e)}")
                lines += [f"  - {line}" for line in detail_lines(e)]
            else:
                rest.append(e)
                full = _printable(why(e))
                if len(full) > MAX_WHY:  # its cell was shortened: the whole line here
                    lines.append(_printable(f"{e.outcome.value} {e.nodeid}: {full}"))
        for line, nodeids in shared_environment(rest).items():  # once for the tests sharing it
            who = nodeids[0] if len(nodeids) == 1 else f"{len(nodeids)} tests"
            lines.append(f"{line} ({who})")
    else:
        lines.append("no test was measured (mark benchmarks with @pytest.mark.gpuprofile)")
    return lines


def cost_line(entries: list[TestEntry], session_s: dict[str, float]) -> str:
    """perfguard's own wall time: per test measured in this process, beyond its warm-up and
    timed rounds (the profiled round, the analysis, the comparison, ...), and the session's
    parts (in A/B mode the rounds of both trees, run in child processes, are one part)."""
    measured = [e.phase_s for e in entries if "profiled" in e.phase_s]
    parts: dict[str, float] = {}
    for phases in measured:
        for name, spent in phases.items():
            if name not in OWN_PHASES:
                parts[name] = parts.get(name, 0.0) + spent
    texts = []
    if measured:
        n = len(measured)
        detail = _largest_first({k: v / n for k, v in parts.items()})
        texts.append(f"{seconds(sum(parts.values()) / n)} per test beyond its rounds ({detail})")
    if session_s:
        texts.append(f"session {seconds(sum(session_s.values()))} ({_largest_first(session_s)})")
    return "perfguard's own time: " + "; ".join(texts) if texts else ""


def _largest_first(parts: dict[str, float]) -> str:
    return ", ".join(
        f"{k} {seconds(v, unit=False)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
    )
