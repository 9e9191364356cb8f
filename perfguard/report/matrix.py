"""A CI run measured on several machine kinds, as one comment: a column per machine.

:func:`~perfguard.compare.merged.merge_matrix` merges each kind's shards apart; this module
says the result the way a reviewer reads a build matrix: one badge (the worst kind's), one
table with a row per test and, per machine, its outcome and change, then what changed
(the culprit headline and its lines, once when the machines agree and per machine where
they differ), then how the machines differ (said, never judged: each kind was compared
with its own kind's baseline). The words of a cell and a culprit are the ones each
machine's own ``summary.md`` uses (:func:`~perfguard.compare.listing.headline`), so the
matrix and the per-machine reports say one thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfguard.compare.listing import detail_lines, headline
from perfguard.compare.merged import MachineRun, Matrix
from perfguard.compare.results import TestEntry
from perfguard.compare.units import percent
from perfguard.report.markdown import BADGE_ICON, ICON, code, plain, report_link

__all__ = [
    "BADGE_ORDER",
    "MatrixRow",
    "cell_text",
    "change_text",
    "matrix_badge",
    "matrix_rows",
    "render_matrix",
]

#: badges, worst first: the matrix's badge is the worst of its machines'
BADGE_ORDER = ("FAIL", "INCOMPLETE", "ADVISORY", "NOT JUDGED", "PASS")
_MAX_ROWS = 150


def matrix_badge(matrix: Matrix) -> str:
    """The worst of the machines' badges (:data:`BADGE_ORDER`)."""
    badges = [m.merged.results.badge() for m in matrix.machines]
    return min(badges, key=BADGE_ORDER.index)


def change_text(t: TestEntry) -> str:
    """A test's timing change in a matrix cell (``+12.3%``), "" where none was judged."""
    return percent(t.delta_pct, True) if t.delta_pct is not None else ""


def cell_text(t: TestEntry | None) -> str:
    """A machine's cell for one test: its outcome and timing change (``regressed +12.3%``);
    ``not run here`` when that machine did not report the test."""
    if t is None:
        return "not run here"
    return f"{t.outcome.value} {change_text(t)}".strip()


@dataclass(frozen=True)
class MatrixRow:
    """One test across the machines, in the matrix's machine order."""

    nodeid: str
    entries: list[TestEntry | None]

    @property
    def severity(self) -> int:
        """The worst outcome's severity (lower is worse); a machine without it counts as new."""
        return min(
            (e.outcome.severity for e in self.entries if e is not None), default=len(ICON) + 99
        )

    @property
    def listed(self) -> bool:
        """Whether any machine gives it an outcome a reviewer must read (not pass)."""
        return any(e is not None and e.outcome.value in ICON for e in self.entries)


def matrix_rows(matrix: Matrix) -> list[MatrixRow]:
    """Every test's row, worst outcome on any machine first, then by node id."""
    rows = [MatrixRow(n, [matrix.entry(m, n) for m in matrix.machines]) for n in matrix.nodeids]
    return sorted(rows, key=lambda r: (r.severity, r.nodeid))


def _culprit_lines(row: MatrixRow, machines: list[MachineRun]) -> list[str]:
    """What changed in a listed test: once when every machine that lists it says the same
    headline, else per machine."""
    said = [
        (m, e)
        for m, e in zip(machines, row.entries, strict=True)
        if e is not None and e.outcome.value in ICON
    ]
    heads = {headline(e) for _, e in said}
    if len(heads) == 1 and len(said) == len(machines):
        e = said[0][1]
        out = [
            f"- {ICON[e.outcome.value]} {code(row.nodeid)} on every machine: {plain(headline(e))}"
        ]
        return out + [f"  - {plain(line)}" for line in detail_lines(e)]
    out = [f"- {code(row.nodeid)}:"]
    for m, e in said:
        out.append(f"  - {ICON[e.outcome.value]} **{plain(m.label)}**: {plain(headline(e))}")
        out += [f"    - {plain(line)}" for line in detail_lines(e)]
    return out


def render_matrix(matrix: Matrix, report_url: str | None = None) -> str:
    """``summary.md`` of a run measured on several machine kinds (module docstring)."""
    machines = matrix.machines
    badge = matrix_badge(matrix)
    rows = matrix_rows(matrix)
    out = [
        f"## perfguard {BADGE_ICON[badge]} {badge}: {len(rows)} tests on {len(machines)} "
        "machine kinds",
        "",
    ]
    first = machines[0].merged.results.run
    out.append(
        f"current commit {code((first.commit or 'unknown')[:12])}; each machine kind judged "
        "against its own kind's baseline, never against the others:"
    )
    out.append("")
    for m in machines:
        doc = m.merged.results
        base = doc.baseline
        against = f"vs {code((base.commit or 'unknown')[:12])}" if base else "no baseline"
        out.append(
            f"- **{plain(m.label)}** ({against}): {BADGE_ICON[doc.badge()]} {doc.badge()}, "
            f"{plain(doc.badge_reason())}"
        )
    out.append("")
    head = " | ".join(plain(m.label) for m in machines)
    out += [f"| Test | {head} |", "|---|" + "---|" * len(machines)]
    listed = [r for r in rows if r.listed]
    rest = [r for r in rows if not r.listed]

    def line(r: MatrixRow) -> str:
        cells = " | ".join(
            (f"{ICON[e.outcome.value]} " if e is not None and e.outcome.value in ICON else "")
            + cell_text(e)
            for e in r.entries
        )
        return f"| {code(r.nodeid, table=True)} | {cells} |"

    out += [line(r) for r in listed[:_MAX_ROWS]]
    if not listed:
        out.append(f"| every test | {' | '.join('passed' for _ in machines)} |")
    out.append("")
    if rest:
        out += [f"<details><summary>{len(rest)} tests that passed on every machine</summary>", ""]
        out += [f"| Test | {head} |", "|---|" + "---|" * len(machines)]
        out += [line(r) for r in rest[:_MAX_ROWS]]
        if len(rest) > _MAX_ROWS:
            out.append(f"\n… and {len(rest) - _MAX_ROWS} more (see the reports)")
        out += ["", "</details>", ""]
    if listed:
        out += ["### What changed", ""]
        for r in listed[:_MAX_ROWS]:
            out += _culprit_lines(r, machines)
        out.append("")
    differ = matrix.differences()
    if differ:
        out.append(
            "> The machines differ in "
            + plain("; ".join(differ))
            + ": said, not judged (no test is compared across machines)."
        )
    for m in machines:
        for problem in m.merged.problems:
            out.append(f"> {plain(m.label)}: {plain(problem)}")
    out += ["", report_link(report_url)]
    return "\n".join(out) + "\n"
