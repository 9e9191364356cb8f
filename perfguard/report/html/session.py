"""The session report: one pytest run's verdicts against its baseline, as one HTML file.

Input is a checked ``results.json`` (:func:`~perfguard.report.html.results.validate_results`).
The page context is :class:`SessionPage`; the template only formats what
it is given, so what a reviewer sees is decided (and tested) here.

A model can have hundreds of ops and a session tens of tests, so each
test's op table lists the ``max_ops`` ops with the largest absolute change
in time (every op with a verdict other than ``unchanged`` first); the rest
are counted under the table and stay in ``results.json``. This keeps a
500-op, 20-test report well under 2 MB (``benchmarks/report_size.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfguard.report.html.render import render, write_text
from perfguard.report.html.results import OUTCOMES, validate_results

#: op statuses listed before the rest, whatever their size
_NOTABLE = {"regressed", "improved", "new", "removed", "added"}


@dataclass
class TestView:
    """One test's section of the page."""

    __test__ = False  # not a pytest class

    index: int
    anchor: str
    test: dict[str, Any]  # the checked results entry (numbers, message, findings, ...)
    distribution_svg: str | None
    trend_svg: str | None
    ops: list[dict[str, Any]]  # shown rows, each with ``delta_ns``
    ops_hidden: int  # ops not shown
    ops_hidden_max_abs_ns: float | None  # largest |delta_ns| among the hidden ones


@dataclass
class SessionPage:
    """Everything ``session.html.j2`` shows."""

    title: str
    verdict: str  # "pass" | "fail"
    run: dict[str, Any]
    baseline: dict[str, Any] | None
    machine: list[tuple[str, str]]  # (label, value) pairs of the fingerprint
    settings: dict[str, Any]
    counts: list[tuple[str, int]]  # every outcome, in OUTCOMES order
    total: int
    tests: list[TestView] = field(default_factory=list)
    perfguard_version: str | None = None
    notes: list[str] = field(default_factory=list)  # the plugin's session notes (baseline lookup)


def op_delta_ns(op: dict[str, Any]) -> float | None:
    """Current minus baseline time of an op; an op on one side only counts in full."""
    base, cur = op.get("baseline_ns"), op.get("current_ns")
    if base is not None and cur is not None:
        return cur - base
    if cur is not None:
        return cur
    if base is not None:
        return -base
    return None


def rank_ops(ops: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], list[dict]]:
    """``(shown, hidden)``: ops by |Δ time| (notable statuses first), split at ``limit``."""
    rows = [dict(op, delta_ns=op_delta_ns(op)) for op in ops]

    def key(op: dict[str, Any]) -> tuple[int, float, float]:
        d, pct = op["delta_ns"], op.get("delta_pct")
        return (
            0 if op.get("status") in _NOTABLE else 1,
            -abs(d) if d is not None else 0.0,
            -abs(pct) if pct is not None else 0.0,
        )

    rows.sort(key=key)
    return rows[:limit], rows[limit:]


def _machine(fp: dict[str, Any]) -> list[tuple[str, str]]:
    gpu = fp.get("gpu_name") or ""
    count = fp.get("gpu_count") or 0
    items = [
        ("GPU", f"{gpu} × {count}" if gpu and count and count != 1 else (gpu or "none (CPU only)")),
        ("CPU", fp.get("cpu") or ""),
        ("Driver", fp.get("driver") or ""),
        ("CUDA", fp.get("cuda") or ""),
        ("PyTorch", fp.get("torch") or ""),
        ("Python", fp.get("python") or ""),
        ("Host", fp.get("host") or ""),
        ("perfguard", fp.get("perfguard") or ""),
    ]
    return [(k, str(v)) for k, v in items if v]


def session_page(results: dict[str, Any], *, max_ops: int = 50) -> SessionPage:
    """The page context for checked ``results``; draws the figures."""
    from perfguard.report.figures import SessionFigures

    figures = SessionFigures()
    counts = results["counts"]
    regressed = counts.get("regressed", 0)
    verdict = "fail" if regressed else "pass"
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts.get(o)]
    title = f"perfguard: {verdict.upper()}" + (f" ({', '.join(parts)})" if parts else "")
    page = SessionPage(
        title=title,
        verdict=verdict,
        run=results["run"],
        baseline=results["baseline"],
        machine=_machine(results["run"].get("fingerprint") or {}),
        settings=results["settings"],
        counts=[(o, int(counts.get(o, 0))) for o in OUTCOMES],
        total=len(results["tests"]),
        perfguard_version=results.get("perfguard_version"),
        notes=results["notes"],
    )
    for i, test in enumerate(results["tests"]):
        shown, hidden = rank_ops(test["ops"], max_ops)
        hidden_abs = [abs(op["delta_ns"]) for op in hidden if op["delta_ns"] is not None]
        name = test["nodeid"]
        page.tests.append(
            TestView(
                index=i,
                anchor=f"test-{i}",
                test=test,
                distribution_svg=figures.distribution(
                    test["samples_baseline"],
                    test["samples_current"],
                    f"per-iteration samples of {name}: baseline vs current",
                ),
                trend_svg=figures.trend(test["history"], f"median of {name} over commits"),
                ops=shown,
                ops_hidden=len(hidden),
                ops_hidden_max_abs_ns=max(hidden_abs) if hidden_abs else None,
            )
        )
    return page


def render_session_html(results: dict[str, Any], *, max_ops: int = 50) -> str:
    """The session report for ``results`` (a results.json dict) as one HTML document."""
    results = validate_results(results)
    return render("session.html.j2", page=session_page(results, max_ops=max_ops))


def write_session_html(results: dict[str, Any], path: str | Path, *, max_ops: int = 50) -> Path:
    """Render the session report for ``results`` and write it to ``path``; returns the path."""
    return write_text(path, render_session_html(results, max_ops=max_ops), "HTML report")
