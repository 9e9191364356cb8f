"""The ``perfguard`` section of pytest's terminal summary: one row per measured test.

Columns: test, outcome, Δ median, interval (the ``1 - alpha`` confidence
interval of the change), top changed op (the op whose per-iteration median
moved most). Then which baseline was used, what was saved and where
``results.json`` is. Text only, from the ``results.json`` entries.
"""

from __future__ import annotations

import math
from typing import Any

HEADER = ("test", "outcome", "Δ median", "interval", "top changed op")
MAX_TEST = 60
MAX_OP = 40


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.1f}%"


def _interval(entry: dict[str, Any]) -> str:
    lo, hi = entry.get("ci_low_pct"), entry.get("ci_high_pct")
    if lo is None or hi is None:
        return "-"
    return f"{lo:+.1f}..{hi:+.1f}%"


def top_op(entry: dict[str, Any]) -> str:
    """The op that moved most (ops come largest change first), with its change."""
    for op in entry.get("ops") or []:
        base, cur = op.get("baseline_ns"), op.get("current_ns")
        if (base or 0) == (cur or 0):
            return "-"
        name = str(op.get("op_name"))
        if op.get("status") in ("added", "removed"):
            return _clip(f"{name} ({op['status']})", MAX_OP)
        return _clip(f"{name} {_pct(op.get('delta_pct'))}", MAX_OP)
    return "-"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def table_rows(entries: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            _clip(e["nodeid"], MAX_TEST),
            str(e["outcome"]),
            _pct(e.get("delta_pct")),
            _interval(e),
            top_op(e) if e["outcome"] != "error" else _clip(str(e.get("error")), MAX_OP),
        )
        for e in entries
    ]


def format_table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*HEADER).rstrip(), line.format(*("-" * w for w in widths)).rstrip()]
    out += [line.format(*r).rstrip() for r in rows]
    return out


def summary_lines(session: Any) -> list[str]:
    """The section's lines for a :class:`~perfguard.plugin.session.PerfguardSession`."""
    entries = [session.entries[k] for k in sorted(session.entries)]
    lines = [f"backend: {session.backend.label} ({session.backend.why})"]
    lines.append(f"baseline: {session.baseline_status()}")
    if entries:
        lines += format_table(table_rows(entries))
        counts: dict[str, int] = {}
        for e in entries:
            counts[e["outcome"]] = counts.get(e["outcome"], 0) + 1
        lines.append(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    else:
        lines.append("no test was measured (mark benchmarks with @pytest.mark.gpuprofile)")
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
