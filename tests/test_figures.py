"""Every figure a reader sees is written by one module (``perfguard/compare/units.py``):
durations, percentages, p-values, counts, bytes and FLOPs, and the charts' axes. The
views of a fixture suite (a real V100 ResNet-50 capture, judged against copies with an
op made slower, a kernel added and an op's FLOPs changed, saved in a real store) are
scanned for what only a second formatter writes: exponent notation (``3.44e+03``,
``1e-5``), an integer with ``.0`` (``3538944.0 → 2359296.0``), a space before ``%``
(``+1.2 %`` beside ``+1.2%``), ``< 1e-4``, a raw ``nan``; and a chart axis never
repeats a label (``67.4 MB`` five times)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from test_compare_verdict import RESNET, _copy, _scale_op, _top_gpu_op, rounds_record
from test_plugin_store_rules import git, new_repo

from perfguard.analysis import analyze
from perfguard.baseline.record import Fingerprint, RunInfo
from perfguard.baseline.store import Store
from perfguard.cli import main
from perfguard.compare import units
from perfguard.compare.explanation import shorten
from perfguard.compare.results import SessionResults
from perfguard.compare.stored import results_from_store
from perfguard.plugin.summary import results_lines
from perfguard.publish.charts import chart
from perfguard.report.html import write_session_html
from perfguard.report.markdown import render_markdown

#: what only a formatter other than units.py writes
FORBIDDEN = {
    # with its sign, as every float formatter writes one (Python, printf's %g, JSON, JS):
    # a short commit id of digits and one "e" (``8e80505``, a chart's label) is not one
    "exponent notation": re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?e[-+]\d+(?![\w])"),
    "an integer written with .0": re.compile(r"(?<![\w.])\d+\.0 (?:→|->)"),
    "a space before %": re.compile(r"\d %"),
    "a raw nan or inf": re.compile(r"(?<![\w-])(?:nan|inf)%|[+-](?:nan|inf)\b"),
}


def offences(text: str) -> list[str]:
    return [
        f"{why}: {m.group(0)!r} in …{text[max(m.start() - 40, 0) : m.end() + 20]}…"
        for why, rx in FORBIDDEN.items()
        for m in rx.finditer(text)
    ]


def test_the_scan_tells_a_float_from_a_commit_id() -> None:
    """A history chart labels its points with short commit ids; one of digits and an "e"
    (``8e80505``) read as exponent notation once and failed a run by the luck of a hash."""
    for flagged in ("3.44e+03", "1e-5", "< 1e-4", "p 2e-05", "-1.5e+10 ns"):
        assert offences(flagged), flagged
    for clean in ("8e80505", "run 3 at 1e0f2ab", "3,435", "+1.2%", "1.23 ms"):
        assert not offences(clean), clean


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e-5, "< 0.001"),
        (0.00042, "< 0.001"),
        (0.0342, "0.034"),
        (0.5, "0.5"),
        (1.0, "1"),
        (None, "n/a"),
        (float("nan"), "n/a"),
    ],
)
def test_p_values_are_decimals(value, text) -> None:
    assert units.p_value(value) == text


def test_counts_changes_and_percentages_have_one_shape() -> None:
    assert units.count(3538944.0) == "3,538,944"
    assert units.human(2359296.0, "flops") == "2.36 MFLOP"
    assert units.human(15_000_000.5, "calls") == "15,000,000"  # never 1.5e+07
    assert units.human(1.5e-7, "calls") == "0.00000015"
    assert units.signed(12288, "bytes") == "+12.3 kB"  # history's +1.229e+04
    assert units.signed(-40, "calls") == "-40"
    assert units.percent(1.23, True) == "+1.2%" and units.percent(-0.04, True) == "+0.0%"
    assert units.percent(5, digits=None) == "5%" and units.percent(2.5, digits=None) == "2.5%"
    assert units.interval(-1.23, 4) == "[-1.2%, +4.0%]"


@pytest.mark.parametrize(
    ("ticks", "kind", "labels"),
    [
        (
            [3430, 3432.5, 3435, 3437.5, 3440],
            "ns",
            ["3.4300 us", "3.4325 us", "3.4350 us", "3.4375 us", "3.4400 us"],
        ),
        ([67_400_000, 67_405_000, 67_410_000], "bytes", ["67.400 MB", "67.405 MB", "67.410 MB"]),
        ([3430, 3435, 3440], "calls", ["3,430", "3,435", "3,440"]),
        ([0, 2.5e6, 5e6], "ns", ["0 ms", "2.5 ms", "5.0 ms"]),
    ],
)
def test_axis_labels_share_a_unit_and_differ(ticks, kind, labels) -> None:
    assert units.axis(ticks, kind) == labels


def test_a_published_chart_never_repeats_an_axis_label() -> None:
    """The site's byte and call charts: values 12 kB apart on 67.4 MB (five ``67.4 MB``
    labels before), counts 3,430-3,440 (``3.44e+03, 3,435, 3.43e+03`` before)."""
    import numpy as np

    for kind, y in (
        ("bytes", 67_400_000 + np.arange(6) * 12_288.0),
        ("calls", np.array([3430.0, 3431.5, 3435.0, 3440.0])),
    ):
        svg = chart(label=kind, x_count=len(y), lines=[(kind, np.arange(len(y)), y)], y_kind=kind)
        labels = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
        assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
        assert not offences(" ".join(labels)), labels


def test_the_explanation_is_shortened_between_words_only() -> None:
    text = "between-run noise of 3% assumed until then (5 more saved run(s) on this machine)"
    short = shorten(text, 40)
    assert short.endswith("…") and len(short) <= 40
    assert text.startswith(short[:-1]) and text[len(short) - 1] == " "


@pytest.fixture(scope="module")
def suite(fixture_file, cached_trace, tmp_path_factory) -> tuple[Path, SessionResults]:
    """Three runs of a real ResNet-50 capture in a real store: the capture, an op made 30 %
    slower, then a kernel added and an op's FLOPs changed; the third judged against the
    second (``report --run``)."""
    base = rounds_record("test_resnet", analyze(cached_trace(fixture_file(RESNET))))
    op = _top_gpu_op(base)
    slower = _scale_op(base, op, 1.3)
    changed = _copy(slower)
    row = changed.kernels[changed.kernels["op_id"] == op].head(1)
    added = row.assign(kernel_name="new_fused_kernel")
    changed.kernels = pd.concat([changed.kernels, added], ignore_index=True)
    flops = changed.ops["flops"].astype(float)
    changed.ops.loc[flops.idxmax(), "flops"] = flops.max() * 2 / 3  # a conv's FLOPs per call
    repo = new_repo(tmp_path_factory.mktemp("figures"))
    store = repo / "perfguard.db"
    fp = Fingerprint(gpu_name="Tesla V100-SXM2-16GB", gpu_count=1, backend="torch", host="ci")
    with Store(store) as s:
        for k, rec in enumerate((base, slower, changed), 1):
            (repo / "model.py").write_text(f"# version {k}\n")
            git(repo, "add", "model.py")
            git(repo, "commit", "-q", "-m", f"version {k}")
            sha = git(repo, "rev-parse", "HEAD")
            s.save_run(RunInfo(sha, "main", False, f"2024-01-0{k}T00:00:00Z", fp), [rec])
    return store, results_from_store(store, 3, baseline_run=2)


def test_every_view_of_a_fixture_suite_writes_figures_one_way(suite, tmp_path, capsys) -> None:
    store, doc = suite
    (entry,) = doc.tests
    assert entry.outcome.value == "regressed" and len(entry.kernel_changes) >= 2
    page = write_session_html(doc, tmp_path / "report.html")
    views = {
        "terminal": "\n".join(results_lines(doc)),
        "summary.md": render_markdown(doc).replace("\\", ""),
        "report.html": html.unescape(page.read_text(encoding="utf-8")),
    }
    for args in (
        ["compare", f"{store}#3", f"{store}#1"],
        ["history", "test_resnet", "--store", str(store), "--repo", str(store.parent)],
        ["compare", f"{store}#3", f"{store}#2", "--json", "-"],
    ):
        main(args)
        views[" ".join(args[:2])] = capsys.readouterr().out
    assert "FLOP/call" in views["report.html"] and "/iter" in views["report.html"]
    for view, text in views.items():
        assert text.strip(), view
        assert not offences(text), (view, offences(text)[:5])


def _levels_by_commit(views: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """Per view, each commit's (first 10 hex digits) printed run level(s)."""
    found: dict[str, dict[str, set[str]]] = {}

    def add(view: str, commit: str, text: str) -> None:
        found.setdefault(commit[:10], {}).setdefault(view, set()).add(text)

    unit = r"[\d.,]+ (?:ns|us|ms|s)"
    for m in re.finditer(rf"^c?\s+\d+ ([0-9a-f]{{10}}) \S+\s+({unit})", views["history"], re.M):
        add("history", m.group(1), m.group(2))
    for run in json.loads(views["history --json"])["runs"]:
        add("history --json", run["commit"], units.format_ns(run["level_ns"]))
    cell = r"<td[^>]*>([^<]*)</td>"
    row = rf"<tr><td><code>([0-9a-f]{{12}})</code></td>{cell}{cell}"
    for m in re.finditer(row, views["report.html"]):
        add("report.html history", m.group(1), m.group(3))
    return found


def test_every_view_prints_one_number_for_one_fact(suite, tmp_path, capsys) -> None:
    """One fact, one number, across the views of a real store (issue 54: one run read
    25.5 ms in the report's history and 23.8 ms in ``perfguard history`` and the verdict's
    baseline level). Each stored run's level is the same text in ``history``, its JSON,
    the report's history table, the published site's run table and, for the two runs the
    verdict compares, the verdict's "level A → B" in the terminal, summary.md, ``compare``
    and report.html; the verdict's change is one text in all of them and the JSON."""
    from perfguard.publish import publish

    store, doc = suite
    (entry,) = doc.tests
    page = write_session_html(doc, tmp_path / "report.html")
    views = {
        "terminal": "\n".join(results_lines(doc)),
        "summary.md": render_markdown(doc).replace("\\", ""),
        "report.html": html.unescape(page.read_text(encoding="utf-8")),
    }
    hist = ["history", "test_resnet", "--store", str(store), "--repo", str(store.parent)]
    for name, args in (
        ("compare", ["compare", f"{store}#3", f"{store}#2"]),
        ("compare --json", ["compare", f"{store}#3", f"{store}#2", "--json", "-"]),
        ("history", hist),
        ("history --json", [*hist, "--json", "-"]),
    ):
        main(args)
        views[name] = capsys.readouterr().out
    site = tmp_path / "site"
    publish(store, site, repo=store.parent)
    (test_page,) = [p for p in site.rglob("*.html") if "test_resnet" in p.name]
    views["publish"] = html.unescape(test_page.read_text(encoding="utf-8"))

    levels = _levels_by_commit(views)
    runs = json.loads(views["history --json"])["runs"]
    assert len(levels) == len(runs) == 3, levels
    for commit, by_view in levels.items():
        assert {"history", "history --json", "report.html history"} <= set(by_view), by_view
        printed = set().union(*by_view.values())
        assert len(printed) == 1, (commit, by_view)
    base, cur = (runs[1]["commit"][:10], runs[2]["commit"][:10])
    want = f"level {next(iter(set().union(*levels[base].values())))} → "
    want += next(iter(set().union(*levels[cur].values())))
    for view in ("terminal", "summary.md", "compare", "report.html"):
        assert want in views[view], (view, want)
    site_rows = re.findall(
        r"<td><code>([0-9a-f]{10})[0-9a-f]*</code></td>.*?</tr>", views["publish"]
    )
    assert site_rows or "level" in views["publish"]
    for run in runs:  # the site's run table prints each run's level as every other view
        text = next(iter(set().union(*levels[run["commit"][:10]].values())))
        assert text in views["publish"], (run["commit"][:10], text)

    change = units.percent(entry.timing.delta_pct, True)
    data = json.loads(views["compare --json"])
    (judged,) = data["tests"]
    # to the last digit where a view prints them whole: the verdict's levels are the
    # history's levels of the two runs it compares (a median there and a geometric mean
    # here once differed by 0.02 % and printed alike)
    assert judged["timing"]["level_baseline_ns"] == pytest.approx(runs[1]["level_ns"], rel=1e-12)
    assert judged["timing"]["level_current_ns"] == pytest.approx(runs[2]["level_ns"], rel=1e-12)
    assert units.percent(judged["timing"]["delta_pct"], True) == change
    for view in ("terminal", "summary.md", "compare", "report.html"):
        assert change in views[view], (view, change)
