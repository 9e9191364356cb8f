"""The published site's HTML: the index of tests per machine, and one page per test.

Every page is one file that needs nothing else: CSS, the few lines of script
and the charts (:mod:`perfguard.publish.charts`) are inline, and a
Content-Security-Policy forbids any fetch, so the site reads the same from a
CI artifact, GitHub Pages or a laptop offline. Pages link each other with
relative links only. Text is escaped where it is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from perfguard.compare.explanation import shorten
from perfguard.compare.units import figure, format_ns, human, percent
from perfguard.publish.charts import COLOURS, Mark, chart, sparkline
from perfguard.publish.series import Analysed, CounterStepView, Series

__all__ = ["IndexRow", "front_page", "index_row", "machine_page", "test_page"]

#: counters charted on a test page, in this order, with their titles
COUNTER_TITLES = {
    "calls": "op calls / iteration",
    "kernels": "kernel launches / iteration",
    "flops": "FLOPs / iteration",
    "bytes": "bytes / iteration",
    "memcpy": "memcpy / iteration",
    "memcpy_bytes": "memcpy bytes / iteration",
    "syncs": "syncs / iteration",
    "host_reads": "host reads / iteration",
    "peak_memory": "peak memory",
    "instructions": "host instructions / iteration",
    "est_cycles": "estimated cycles / iteration",
    "tc_ops": "ops on Tensor Cores",
}
#: the most of an outcome's reason a machine's index shows (all of it on hover and the test's page)
WHY_CHARS = 140
#: regressed tests the front page lists (each a sparkline: the page stays small)
FRONT_MOST = 100
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1000px;padding:12px 18px;
color:#111}
h1{font-size:20px;margin:8px 0;word-break:break-all}h2{font-size:16px;margin:22px 0 6px}
table{border-collapse:collapse;width:100%;font-size:13px;display:block;overflow-x:auto}
body{overflow-wrap:break-word}
th,td{text-align:left;padding:3px 6px;border-bottom:1px solid #e5e7eb;vertical-align:top}
th{background:#f3f4f6;position:sticky;top:0}td.num{text-align:right;white-space:nowrap}
code,.sha{font-family:ui-monospace,monospace;font-size:12px}
.o{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;background:#6b7280;
font-size:12px;white-space:nowrap}
.o-regressed{background:#b91c1c}.o-improved{background:#15803d}.o-noisy{background:#9a6700}
.o-unchanged{background:#4b5563}.meta{color:#4b5563}.empty{color:#6b7280}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:4px 16px}
.why{color:#374151;font-size:12px}svg{display:block;max-width:100%;height:auto}
svg.spark{display:inline-block}input#q{width:280px;padding:3px 6px;margin:6px 0}
a{color:#1d4ed8;text-decoration:none}a:hover{text-decoration:underline}
"""
FILTER_JS = """
document.getElementById('q').addEventListener('input', function () {
  var q = this.value.toLowerCase();
  document.querySelectorAll('tr[data-test]').forEach(function (r) {
    r.style.display = r.getAttribute('data-test').indexOf(q) >= 0 ? '' : 'none';
  });
});
"""


def _page(title: str, body: str, script: str = "") -> str:
    tail = f"<script>{script}</script>" if script else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>{body}{tail}"
        "</body></html>\n"
    )


def _level_kind(metric: str) -> tuple[str, str]:
    """How a run level is named, and the kind of value it is (:func:`units.figure`): a
    time, or a count per iteration."""
    if metric in ("instructions", "est_cycles"):
        return metric, metric
    return metric.replace("_", " "), "ns"


def _outcome(outcome: str) -> str:
    return f'<span class="o o-{escape(outcome)}">{escape(outcome)}</span>'


def _pct(value: float) -> str:
    return percent(value, True) if math.isfinite(value) else ""


@dataclass
class IndexRow:
    """One test on one machine as the index lists it (kept in the manifest, so an unchanged
    page's row needs no re-analysis)."""

    machine: str
    machine_label: str
    nodeid: str
    href: str
    runs: int
    latest: str
    outcome: str
    reason: str
    change_pct: float | None
    change_points: int
    counter_steps: int
    last_change: str
    spark: str


def machine_page(
    rows: Sequence[IndexRow], *, label: str, store: str, ordered_by: str, when: str
) -> str:
    """One machine's index: every test with its trend and latest outcome, worst first."""
    order = {"regressed": 0, "improved": 1, "noisy": 2}
    mine = sorted(rows, key=lambda r: (order.get(r.outcome, 3), r.nodeid))
    parts = [
        f'<p><a href="../index.html">← all machines</a></p><h1>{escape(label)}: '
        f"{len(mine)} tests</h1>"
        f'<p class="meta">store {escape(store)}; runs {escape(ordered_by)}; '
        f"{escape(when)}</p>"
        '<input id="q" type="search" placeholder="filter tests" aria-label="filter tests">'
        "<table><thead><tr><th>test</th><th>runs</th><th>latest</th><th>change</th>"
        "<th>outcome</th><th>why</th><th>trend</th><th>change points</th><th>last change</th>"
        "</tr></thead><tbody>"
    ]
    for r in mine:
        change = _pct(r.change_pct) if r.change_pct is not None else ""
        href = r.href.split("/", 1)[1]
        parts.append(
            f'<tr data-test="{escape(r.nodeid.lower())}"><td><a href="{escape(href)}">'
            f"{escape(r.nodeid)}</a></td><td class=num>{r.runs}</td>"
            f"<td class=num>{escape(r.latest)}</td><td class=num>{change}</td>"
            f"<td>{_outcome(r.outcome)}</td>"
            # the reason beside the outcome: a red "regressed" next to "-6.5%" must say why
            f'<td class="why" title="{escape(r.reason)}">{escape(shorten(r.reason, WHY_CHARS))}'
            f"</td><td>{r.spark}</td>"
            f"<td class=num>{r.change_points} timing, {r.counter_steps} counter</td>"
            f"<td>{escape(r.last_change)}</td></tr>"
        )
    parts.append("</tbody></table>")
    return _page(f"perfguard: {label}", "".join(parts), FILTER_JS)


def front_page(rows: Sequence[IndexRow], *, store: str, ordered_by: str, when: str) -> str:
    """The site's front page: the machines, their outcome counts, and every test whose
    latest run regressed."""
    machines: dict[str, list[IndexRow]] = {}
    for r in rows:
        machines.setdefault(r.machine_label, []).append(r)
    parts = [
        f"<h1>perfguard: {len(rows)} test series on {len(machines)} machine(s)</h1>",
        f'<p class="meta">store {escape(store)}; runs {escape(ordered_by)}; '
        f"{escape(when)}</p><table><thead><tr><th>machine</th><th>tests</th>"
        "<th>latest outcomes</th><th>change points</th></tr></thead><tbody>",
    ]
    for label in sorted(machines):
        mine = machines[label]
        counts: dict[str, int] = {}
        for r in mine:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        shown = " ".join(f"{_outcome(o)} {n}" for o, n in sorted(counts.items()))
        folder = mine[0].href.split("/", 1)[0]
        parts.append(
            f'<tr><td><a href="{escape(folder)}/index.html">{escape(label)}</a></td>'
            f"<td class=num>{len(mine)}</td><td>{shown}</td><td class=num>"
            f"{sum(r.change_points for r in mine)} timing, "
            f"{sum(r.counter_steps for r in mine)} counter</td></tr>"
        )
    parts.append("</tbody></table>")
    bad = sorted(
        (r for r in rows if r.outcome == "regressed"), key=lambda r: (r.machine_label, r.nodeid)
    )
    parts.append(f"<h2>Regressed at the latest run: {len(bad)}</h2>")
    if len(bad) > FRONT_MOST:  # the machine pages list the rest, worst first
        parts.append(f'<p class="meta">the first {FRONT_MOST}; each machine\'s page lists all</p>')
        bad = bad[:FRONT_MOST]
    if bad:
        parts.append(
            "<table><thead><tr><th>test</th><th>machine</th><th>change</th>"
            "<th>why</th><th>trend</th></tr></thead><tbody>"
        )
        for r in bad:
            change = _pct(r.change_pct) if r.change_pct is not None else ""
            parts.append(
                f'<tr><td><a href="{escape(r.href)}">{escape(r.nodeid)}</a></td>'
                f"<td>{escape(r.machine_label)}</td><td class=num>{change}</td>"
                f'<td class="why">{escape(r.reason)}</td><td>{r.spark}</td>'
                "</tr>"
            )
        parts.append("</tbody></table>")
    return _page("perfguard: tests", "".join(parts))


def index_row(s: Series, a: Analysed, href: str) -> IndexRow:
    """The index's row of an analysed series."""
    _, kind = _level_kind(s.metric)
    levels = s.runs["level"].to_numpy(np.float64)
    marks = [cp.index for cp in a.change_points]
    last = [
        (cp.index, f"{cp.commit[:10]} {cp.what} {_pct(cp.change_pct)}")
        for cp in a.change_points
        if cp.kind != "variance"
    ]
    last += [(st.index, f"{st.commit[:10]} {st.counter}") for st in a.counter_steps]
    return IndexRow(
        machine=s.machine,
        machine_label=s.machine_label,
        nodeid=s.nodeid,
        href=href,
        runs=len(s.runs),
        latest=figure(float(levels[-1]), kind),
        outcome=a.outcome,
        reason=a.reason,
        change_pct=a.change_pct if math.isfinite(a.change_pct) else None,
        change_points=len(a.change_points),
        counter_steps=len(a.counter_steps),
        last_change=max(last)[1] if last else "",
        spark=sparkline(levels, marks=marks, counter_marks=[st.index for st in a.counter_steps]),
    )


def _x_labels(s: Series, x0: int, span: int) -> list[tuple[float, str]]:
    """About six commit labels along the x axis."""
    pos = s.runs["position"].to_numpy() - x0
    commits = s.runs["commit"].astype(str).to_numpy()
    want = np.linspace(0, span - 1, num=min(6, len(pos)))
    idx = sorted({int(np.abs(pos - w).argmin()) for w in want})
    return [(float(pos[i]), commits[i][:7]) for i in idx]


def _marks(s: Series, a: Analysed, x0: int) -> list[Mark]:
    kind = _level_kind(s.metric)[1]
    pos = s.runs["position"].to_numpy() - x0
    out = []
    for cp in a.change_points:
        what = "spread" if cp.kind == "variance" else _pct(cp.change_pct)
        out.append(
            Mark(
                float(pos[cp.index]),
                what,
                "#d55e00",
                f"{cp.commit[:12]}: {cp.what} {_pct(cp.change_pct)} "
                f"({figure(cp.before_ns, kind)} → "
                f"{figure(cp.after_ns, kind)})",
            )
        )
    at: dict[int, list[CounterStepView]] = {}
    for st in a.counter_steps:  # one mark per run: its counters in one label
        at.setdefault(st.index, []).append(st)
    order = {name: i for i, name in enumerate(COUNTER_TITLES)}
    for index, steps in at.items():
        steps.sort(key=lambda st: order.get(st.counter, len(order)))
        names = [st.counter for st in steps]
        label = ", ".join(names) if len(names) <= 3 else f"{names[0]} & {len(names) - 1} more"
        what = "; ".join(
            f"{st.counter} {human(st.before, st.counter)} → {human(st.after, st.counter)}"
            for st in steps
        )
        out.append(
            Mark(
                float(pos[index]), label, "#7c3aed", f"{steps[0].commit[:12]}: {what}", dashed=True
            )
        )
    for p, commit, reason, _, _ in s.acceptances:
        out.append(
            Mark(
                float(p - x0),
                "accepted",
                "#15803d",
                f"accepted at {commit[:12]}: {reason}",
                dashed=True,
            )
        )
    return sorted(out, key=lambda m: m.x)


def _change_table(s: Series, a: Analysed, kind: str) -> str:
    if not a.change_points:
        return '<p class="empty">no timing change points</p>'
    rows = []
    for cp in a.change_points:
        ops = "<br>".join(
            f"{escape(o.op_name)}: {format_ns(o.before_ns)} → {format_ns(o.after_ns)}"
            for o in cp.ops
        )
        run = int(s.runs["run_id"].iloc[cp.index])
        rows.append(
            f'<tr><td class="sha" title="{escape(cp.commit)}">{escape(cp.commit[:10])}'
            f"</td><td class=num>{run}</td><td>{escape(cp.what)}</td>"
            f"<td class=num>{_pct(cp.change_pct)}</td>"
            f"<td class=num>{escape(figure(cp.before_ns, kind))} → "
            f"{escape(figure(cp.after_ns, kind))}"
            f"</td><td>{ops}</td></tr>"
        )
    return (
        "<table><thead><tr><th>commit</th><th>run</th><th>kind</th><th>size</th>"
        "<th>level</th><th>ops that moved (time / iteration)</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _step_table(a: Analysed) -> str:
    if not a.counter_steps:
        return '<p class="empty">no counter change points</p>'
    rows = []
    for st in a.counter_steps:
        sets = st.counter in ("kernel_set", "tc_ops", "dtypes")
        ops = "<br>".join(
            (
                f"{'+' if after else '−'} {escape(name)}"
                if sets
                else f"{escape(name)}: {human(before, st.counter)} → {human(after, st.counter)}"
            )
            for name, before, after in st.ops
        )
        rows.append(
            f'<tr><td class="sha" title="{escape(st.commit)}">{escape(st.commit[:10])}'
            f"</td><td>{escape(st.counter)}</td><td class=num>"
            f"{escape(human(st.before, st.counter))} → "
            f"{escape(human(st.after, st.counter))}</td><td>{ops}</td></tr>"
        )
    return (
        "<table><thead><tr><th>commit</th><th>counter</th><th>before → after</th>"
        "<th>ops</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _counter_charts(s: Series, x: np.ndarray, span: int) -> str:
    if s.counters.empty:
        return '<p class="empty">no counters stored</p>'
    out = []
    names = s.counters["counter"].astype(str).to_numpy()
    run, value = s.counters["run"].to_numpy(), s.counters["value"].to_numpy(np.float64)
    for counter, title in COUNTER_TITLES.items():
        mine = names == counter
        if not np.any(value[mine] != 0):
            continue
        y = np.full(len(s.runs), np.nan)
        y[run[mine]] = value[mine]
        out.append(
            chart(
                label=title,
                x_count=span,
                lines=[(title, x, y)],
                width=470,
                height=140,
                y_kind=counter,
                x_labels=(),
            )
        )
        out[-1] = f"<div><b>{escape(title)}</b>{out[-1]}</div>"
    return f'<div class="grid">{"".join(out)}</div>' if out else '<p class="empty">none</p>'


def _op_chart(s: Series, a: Analysed, x: np.ndarray, span: int, names: dict[str, str]) -> str:
    if not a.top_ops:
        return '<p class="empty">no ops stored</p>'
    lines = []
    ops = s.ops["op_id"].astype(str).to_numpy()
    run, time = s.ops["run"].to_numpy(), s.ops["time_ns"].to_numpy(np.float64)
    for op in a.top_ops:
        mine = ops == op
        y = np.full(len(s.runs), np.nan)
        y[run[mine]] = time[mine]
        lines.append((names.get(op, op), x, y))
    return chart(
        label="time per iteration of the top ops",
        x_count=span,
        lines=lines,
        y_kind="ns",
        legend=True,
        log=True,
        height=280,
    )


def _runs_table(s: Series, report_url: str | None, machine: str) -> str:
    rows = []
    link = ""
    kind = _level_kind(s.metric)[1]
    runs = s.runs.iloc[::-1]
    columns = (
        runs["run_id"].tolist(),
        runs["commit"].astype(str).tolist(),
        runs["time"].astype(str).tolist(),
        runs["level"].tolist(),
        runs["n_rounds"].tolist(),
    )
    for run_id, commit, when, level, n in zip(*columns, strict=True):
        if report_url:
            url = report_url.format(commit=commit, run_id=run_id, machine=machine)
            link = f'<td><a href="{escape(url)}">report</a></td>'
        rows.append(
            f'<tr><td class=num>{run_id}</td><td class="sha">{commit}</td>'
            f"<td>{escape(when[:19])}</td><td class=num>{figure(level, kind)}</td>"
            f"<td class=num>{n}</td>{link}</tr>"
        )
    head = "<th>report</th>" if report_url else ""
    return (
        f"<details><summary>{len(s.runs)} stored runs, newest first</summary><table><thead>"
        "<tr><th>run</th><th>commit</th><th>time</th><th>level</th><th>rounds</th>"
        f"{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table></details>"
    )


def test_page(
    s: Series,
    a: Analysed,
    names: dict[str, str],
    *,
    index_href: str,
    report_url: str | None,
    machine_slug: str,
) -> str:
    """The page of one test on one machine (module docstring)."""
    what, kind = _level_kind(s.metric)
    x0 = int(s.runs["position"].iloc[0])
    span = int(s.runs["position"].iloc[-1]) - x0 + 1
    x = s.runs["position"].to_numpy(np.float64) - x0
    rx = x[s.rounds["run"].to_numpy()]
    level = chart(
        label=f"{s.nodeid}: {what} per run",
        x_count=span,
        lines=[("run level (median of rounds)", x, s.runs["level"].to_numpy())],
        points=(rx, s.rounds["value"].to_numpy(np.float64)),
        marks=_marks(s, a, x0),
        x_labels=_x_labels(s, x0, span),
        y_kind=kind,
    )
    accepted = "".join(
        f"<li><span class=sha>{escape(c[:10])}</span>: {escape(reason)} "
        f'<span class="meta">({escape(when)}{", " + escape(who) if who else ""})'
        "</span></li>"
        for _, c, reason, when, who in s.acceptances
    )
    first, last = s.runs.iloc[0], s.runs.iloc[-1]
    change = _pct(a.change_pct)
    body = (
        f'<p><a href="{escape(index_href)}">← {escape(s.machine_label)}</a> · '
        f'<a href="../index.html">all machines</a></p><h1>{escape(s.nodeid)}</h1>'
        f'<p class="meta">{escape(s.machine_label)} · {escape(what)} · {len(s.runs)} runs over '
        f"{span} first-parent commits, {escape(str(first['commit'])[:10])} … "
        f"{escape(str(last['commit'])[:10])}</p>"
        f"<p>latest run {_outcome(a.outcome)} {change} "
        f'<span class="why">{escape(a.reason)}</span></p>'
        f"<h2>Level per run</h2>{level}"
        '<p class="meta">grey dots: each round; line: the run level (the geometric mean '
        "of its rounds); "
        f'<span style="color:{COLOURS[1]}">orange</span>: timing change points; '
        '<span style="color:#7c3aed">purple, dashed</span>: counter change points; '
        '<span style="color:#15803d">green, dashed</span>: acceptances</p>'
        f"<h2>Timing change points</h2>{_change_table(s, a, kind)}"
        f"<h2>Counter change points</h2>{_step_table(a)}"
        + (f"<h2>Acceptances</h2><ul>{accepted}</ul>" if accepted else "")
        + f"<h2>Gate counters</h2>{_counter_charts(s, x, span)}"
        f"<h2>Top ops: time per iteration</h2>{_op_chart(s, a, x, span, names)}"
        '<p class="meta">each op: its share of the profiled time times the run level '
        "(log scale)</p>"
        f"<h2>Runs</h2>{_runs_table(s, report_url, machine_slug)}"
    )
    return _page(f"{s.nodeid} on {s.machine_label}", body)
