"""The matrix report: one page over the machine kinds a CI run measured, linking each
kind's own session report (:mod:`.session`, one per kind's folder).

A row per test, worst outcome on any machine first; per machine its outcome, timing change
and, for a test a reviewer must read, the culprit headline its own report leads with
(:func:`~perfguard.compare.listing.headline`), linked to that test in the kind's report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfguard.compare.listing import headline
from perfguard.compare.merged import Matrix
from perfguard.report.html.render import badge_class, render, write_text
from perfguard.report.markdown import ICON
from perfguard.report.matrix import change_text, matrix_badge, matrix_rows

__all__ = ["MatrixCell", "MatrixMachine", "MatrixPage", "matrix_page", "write_matrix_html"]


@dataclass(frozen=True)
class MatrixMachine:
    label: str
    badge: str
    badge_class: str
    reason: str
    baseline: str | None
    href: str  # the kind's session report, relative to the matrix page


@dataclass(frozen=True)
class MatrixCell:
    outcome: str | None  # None: this machine did not report the test
    change: str
    headline: str  # the culprit headline, for an outcome a reviewer must read; else ""
    href: str
    severity: int


@dataclass(frozen=True)
class MatrixRowView:
    nodeid: str
    severity: int
    cells: list[MatrixCell]


@dataclass(frozen=True)
class MatrixPage:
    title: str
    badge: str
    badge_class: str
    commit: str
    total: int
    machines: list[MatrixMachine]
    differences: list[str]
    problems: list[str]
    rows: list[MatrixRowView]


def matrix_page(matrix: Matrix, reports: list[str]) -> MatrixPage:
    """The page context; ``reports``: each machine's report, relative to the page, in the
    matrix's machine order."""
    badge = matrix_badge(matrix)
    machines = []
    anchors = []
    for m, href in zip(matrix.machines, reports, strict=True):
        doc = m.merged.results
        b = doc.badge()
        machines.append(
            MatrixMachine(
                m.label,
                b,
                badge_class(b),
                doc.badge_reason(),
                doc.baseline.commit if doc.baseline else None,
                href,
            )
        )
        # the session report's anchors follow its sorted order (session.session_page)
        anchors.append({t.nodeid: f"test-{i}" for i, t in enumerate(doc.sorted_tests())})
    rows = []
    for r in matrix_rows(matrix):
        cells = []
        for e, href, anchor in zip(r.entries, reports, anchors, strict=True):
            if e is None:
                cells.append(MatrixCell(None, "", "", "", 999))
                continue
            listed = e.outcome.value in ICON
            cells.append(
                MatrixCell(
                    e.outcome.value,
                    change_text(e),
                    headline(e) if listed and headline(e) != e.outcome.value else "",
                    f"{href}#{anchor[e.nodeid]}",
                    e.outcome.severity,
                )
            )
        rows.append(MatrixRowView(r.nodeid, r.severity, cells))
    commit = matrix.machines[0].merged.results.run.commit or "unknown"
    return MatrixPage(
        title=f"perfguard: {badge} ({len(rows)} tests on {len(machines)} machine kinds)",
        badge=badge,
        badge_class=badge_class(badge),
        commit=commit,
        total=len(rows),
        machines=machines,
        differences=matrix.differences(),
        problems=[f"{m.label}: {p}" for m in matrix.machines for p in m.merged.problems],
        rows=rows,
    )


def write_matrix_html(matrix: Matrix, path: str | Path, reports: list[str]) -> Path:
    """Render the matrix page to ``path``; returns the path."""
    return write_text(
        path, render("matrix.html.j2", page=matrix_page(matrix, reports)), "HTML report"
    )
