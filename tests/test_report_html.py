"""The HTML reports and summary.md, rendered from real results and read back as parsed HTML.

Session results come from real captures: the V100 ResNet-50 training
fixture (6 iterations, each a round) judged by the real judge
(:func:`perfguard.compare.compare_records`) against itself with one op's
per-iteration GPU time scaled, its rounds jittered, a kernel added, or too
few rounds, and two real CPU torch-profiler runs of different work; the
error and crashed rows are what the plugin builds from a reason string.
Numbers on the page are checked against figures computed here from the
records, not from the results.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfguard import analyze
from perfguard.baseline.record import Fingerprint, RunInfo, TestRecord, record_from_analysis
from perfguard.compare.explanation import shorten
from perfguard.compare.results import OUTCOMES, Finding, HistoryRow, SessionResults, TestEntry
from perfguard.errors import ReportError
from perfguard.plugin.summary import results_lines
from perfguard.report.html import (
    load_results,
    render_analysis_html,
    render_session_html,
    write_session_html,
)
from perfguard.report.html.render import fmt_ns, fmt_pct
from perfguard.report.markdown import REPORT_URL_ENV, render_markdown, write_markdown

RESNET = "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz"
TRAIN_2RANK = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"
EVIL_OP = "<script>alert(\"op\")</script> & 'quoted' op"
EVIL_KERNEL = 'void k<float, &x><script>alert(1)</script>"'
EVIL_TEST = "tests/test_evil.py::test_x[<b>|`tick`]"
ERROR_TEST = 'tests/test_evil.py::test_err["<i>&amp;" ünï \udc80]'
ERROR_REASON = (
    "the test requests the gpuprofile fixture but never runs gpuprofile.iterations():\n"
    "  nothing was measured <op 'a&b'>"
)
CRASH_TEST = "tests/test_crash.py::test_segfault[ユニコード]"
CRASH_REASON = (
    "the test's process died: signal 11 (SIGSEGV) after 2 of 5 rounds; "
    "its output is in the captured log"
)


# --------------------------------------------------------------------------- a tiny DOM


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str, cls: str | None = None, id: str | None = None) -> list[Node]:
        return [
            n
            for n in self.iter()
            if n.tag == tag
            and (cls is None or cls in (n.attrs.get("class") or "").split())
            and (id is None or n.attrs.get("id") == id)
        ]

    def find(self, tag: str, cls: str | None = None, id: str | None = None) -> Node:
        found = self.find_all(tag, cls, id)
        assert found, f"no <{tag} class={cls} id={id}>"
        return found[0]


_VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source"}


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in _VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag):
        node = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(html: str) -> Node:
    b = _Builder()
    b.feed(html)
    b.close()
    return b.root


def rows(table: Node) -> list[list[Node]]:
    body = table.find("tbody")
    return [r.find_all("td") for r in body.find_all("tr")]


def cell_texts(table: Node) -> list[list[str]]:
    return [[" ".join(c.text().split()) for c in r] for r in rows(table)]


# --------------------------------------------------------------------------- real results


def with_rounds(record: TestRecord, rounds: Any) -> TestRecord:
    """``record`` with each iteration assigned to a round (the unit the judge replicates)."""
    samples = record.samples.assign(round=np.asarray(list(rounds), dtype=np.int64))
    return replace(record, samples=samples)


def scaled(record: TestRecord, op_id: str, factor: float, nodeid: str) -> TestRecord:
    """``record`` with one op's per-iteration GPU time times ``factor`` (and the totals)."""
    ops = record.op_samples.copy()
    hit = ops["op_id"] == op_id
    extra = (ops.loc[hit, "gpu_time_ns"] * (factor - 1.0)).round().astype("int64")
    ops.loc[hit, "gpu_time_ns"] = ops.loc[hit, "gpu_time_ns"] + extra
    per_iter = extra.groupby(ops.loc[hit, "iteration"]).sum()
    samples = record.samples.copy()
    samples["gpu_time_ns"] += samples["iteration"].map(per_iter).fillna(0).astype("int64")
    return replace(record, nodeid=nodeid, samples=samples, op_samples=ops, meta={})


def jittered(record: TestRecord, nodeid: str) -> TestRecord:
    """``record`` with its rounds disagreeing by about 20 % (a noisy machine)."""
    wobble = np.resize([0.9, 1.12, 0.95, 1.1, 0.92, 1.08], len(record.samples))
    samples = record.samples.copy()
    samples["gpu_time_ns"] = (samples["gpu_time_ns"] * wobble).round().astype("int64")
    return replace(record, nodeid=nodeid, samples=samples, meta={})


def renamed(record: TestRecord, op_id: str, new_name: str, nodeid: str) -> TestRecord:
    """``record`` with one op renamed and an extra kernel under it (a kernel that is new)."""
    ops = record.ops.copy()
    ops.loc[ops["op_id"] == op_id, "op_name"] = new_name
    kernels = record.kernels.copy()
    kernels.loc[kernels["op_id"] == op_id, "op_name"] = new_name
    extra = kernels[kernels["op_id"] == op_id].head(1).assign(kernel_name=EVIL_KERNEL)
    kernels = pd.concat([kernels, extra], ignore_index=True)
    return replace(record, nodeid=nodeid, ops=ops, kernels=kernels, meta={})


def cpu_record(tmp: Path, name: str, reps: int) -> TestRecord:
    """A real CPU torch-profiler run: 4 rounds of 3 recorded iterations of ``reps`` 256x256
    matmuls (about 1 ms each: big enough that a loaded CI machine does not blur 2 vs 10)."""
    torch = pytest.importorskip("torch")
    from perfguard.capture import profile_torch
    from perfguard.trace import load_trace

    torch.set_num_threads(1)
    x = torch.randn(256, 256)
    for _ in range(3):  # warm-up outside the capture
        x @ x
    path = tmp / f"{name}.json"
    with profile_torch(path, device="cpu", with_stack=False, record_shapes=False):
        for _ in range(12):
            with torch.profiler.record_function("perfguard.iteration"):
                for _ in range(reps):
                    x @ x
    return record_from_analysis(
        "examples/test_cpu.py::test_matmul",
        analyze(load_trace(path)),
        rounds=np.repeat(np.arange(4), 3),
    )


@pytest.fixture(scope="module")
def resnet(fixture_file, cached_trace) -> TestRecord:
    """The 6 real iterations of the ResNet-50 capture, each its own round."""
    return with_rounds(
        record_from_analysis("base", analyze(cached_trace(fixture_file(RESNET)))), range(6)
    )


@pytest.fixture(scope="module")
def session(resnet, tmp_path_factory) -> dict[str, Any]:
    return build_session(resnet, tmp_path_factory.mktemp("cpu"))


#: every outcome of the session built below, worst first: what its reports must list
EXPECTED = [
    ("examples/test_cpu.py::test_matmul", "regressed"),  # 10 vs 2 matmuls per iteration
    (EVIL_TEST, "regressed"),  # timing unchanged; the kernel_set gate: a new kernel
    ("tests/test_resnet.py::test_slower", "regressed"),
    (CRASH_TEST, "crashed"),
    (ERROR_TEST, "error"),
    ("tests/test_resnet.py::test_noisy", "noisy"),
    ("tests/test_resnet.py::test_other_gpu", "incomparable"),
    ("tests/test_resnet.py::test_two_rounds", "not-judged"),
    ("tests/test_resnet.py::test_first_time", "no-baseline"),
    ("tests/test_resnet.py::test_added", "new"),
    ("tests/test_resnet.py::test_faster", "improved"),
    ("tests/test_resnet.py::test_same", "unchanged"),
]


def build_session(resnet: TestRecord, tmp: Path) -> dict[str, Any]:
    """A results.json dict from real records, plus what the tests check it against.

    Every judged row is the real judge's verdict on real records; the error and crashed
    rows are what the plugin makes of a reason string.
    """
    from perfguard.compare import compare_records

    top = resnet.ops.sort_values("gpu_time_total", ascending=False)["op_id"].tolist()
    cpu_base, cpu_cur = cpu_record(tmp, "base", 2), cpu_record(tmp, "cur", 10)
    cases = [
        (scaled(resnet, top[0], 1.5, "tests/test_resnet.py::test_slower"), resnet, {}),
        (scaled(resnet, top[1], 0.4, "tests/test_resnet.py::test_faster"), resnet, {}),
        (scaled(resnet, top[0], 1.0, "tests/test_resnet.py::test_same"), resnet, {}),
        (renamed(resnet, top[2], EVIL_OP, EVIL_TEST), resnet, {}),
        (cpu_cur, cpu_base, {}),
        (replace(resnet, nodeid="tests/test_resnet.py::test_first_time"), None, {}),
        (jittered(resnet, "tests/test_resnet.py::test_noisy"), resnet, {}),
        (
            replace(resnet, nodeid="tests/test_resnet.py::test_other_gpu"),
            resnet,
            {"incompatibility": "GPU differs: Tesla V100-SXM2-16GB (baseline) vs NVIDIA A100"},
        ),
        (
            with_rounds(
                replace(resnet, nodeid="tests/test_resnet.py::test_two_rounds"), [0, 0, 0, 1, 1, 1]
            ),
            resnet,
            {},
        ),
        (
            replace(resnet, nodeid="tests/test_resnet.py::test_added"),
            None,
            {"baseline_run_exists": True},
        ),
    ]
    history = [
        {"commit": f"{i:x}" * 40, "time": f"2026-01-0{i + 1}", "median_ns": 1e8 + 1e6 * i}
        for i in range(4)
    ]
    tests, records = [], {}
    for cur, base, kw in cases:
        c = compare_records(cur, base, baseline_commit="b" * 40, **kw)
        findings = []
        if cur.nodeid == EVIL_TEST:
            findings = [
                {
                    "check": "bad_tensor_shape",
                    "severity": "warning",
                    "problem": EVIL_OP,
                    "evidence": "K=<7> & N=3",
                    "recommendation": "pad to a multiple of 8",
                }
            ]
        tests.append(
            c.entry(
                history=[HistoryRow(**h) for h in history],
                findings=[Finding.of(f) for f in findings],
                backend="torch",
                notes=[],
                worker=None,
            )
        )
        records[cur.nodeid] = (cur, base)
    tests.append(TestEntry.not_judged(ERROR_TEST, "error", ERROR_REASON, backend="torch"))
    tests.append(TestEntry.not_judged(CRASH_TEST, "crashed", CRASH_REASON, backend="torch"))
    doc = SessionResults(
        tests=tests,
        perfguard_version="0.1.0",
        run={
            "commit": "c" * 40,
            "branch": "feature/<x>",
            "dirty": True,
            "time": "2026-01-05",
            "fingerprint": Fingerprint(
                gpu_name="Tesla V100-SXM2-16GB", gpu_count=1, backend="torch"
            ).to_dict(),
        },
        baseline={"ref": "origin/main", "commit": "b" * 40, "run_id": "1"},
        settings={"tolerance": 0.05, "alpha": 0.01, "fail_on": "regression", "backend": "torch"},
    )
    results = json.loads(json.dumps(doc.to_dict(), allow_nan=False))  # as the plugin writes it
    return {"results": results, "records": records, "top": top}


@pytest.fixture(scope="module")
def page(session) -> tuple[str, Node]:
    html = render_session_html(session["results"])
    return html, parse(html)


def section_of(doc: Node, nodeid: str) -> Node:
    for s in doc.find_all("section", cls="test"):
        if s.find("h2").find("code").text() == nodeid:
            return s
    raise AssertionError(f"no section for {nodeid}")


def round_median(values: np.ndarray) -> float:
    """The judge's median of round values (the middle of the logs), computed here."""
    return float(np.exp(np.median(np.log(values))))


# --------------------------------------------------------------------------- session page


def test_every_outcome_from_the_real_comparisons(session):
    got = sorted((t["nodeid"], t["outcome"]) for t in session["results"]["tests"])
    assert got == sorted(EXPECTED)
    by = {t["nodeid"]: t for t in session["results"]["tests"]}
    evil = by[EVIL_TEST]
    assert evil["timing"]["outcome"] == "unchanged" and evil["gates"]["outcome"] == "regressed"
    assert by["tests/test_resnet.py::test_two_rounds"]["timing"]["n_current"] == 2


def test_tests_table_sorted_by_severity_with_reasons(session, page):
    _, doc = page
    got = cell_texts(doc.find("table", id="tests"))
    assert [(r[0], r[1]) for r in got] == EXPECTED
    by = {r[0]: r for r in got}
    assert by[ERROR_TEST][10] == " ".join(ERROR_REASON.split())
    assert by[CRASH_TEST][10] == CRASH_REASON
    assert by["tests/test_resnet.py::test_two_rounds"][10].startswith(
        "too few rounds to judge timing: this session has 2"
    )
    assert "machines" not in by["tests/test_resnet.py::test_other_gpu"][10]
    assert "NVIDIA A100" in by["tests/test_resnet.py::test_other_gpu"][10]
    assert by["tests/test_resnet.py::test_noisy"][10].startswith("too noisy to resolve a 5% change")
    assert by[EVIL_TEST][9] == "regressed"  # the gates column
    for nodeid, (cur, base) in session["records"].items():
        row = by[nodeid]
        # independent of the results dict: a compared test shows the levels whose ratio is
        # its change (geometric means of the rounds); one compared with nothing, its median
        if base is None or nodeid.endswith("test_other_gpu") or len(cur.round_values()) < 3:
            assert row[4] == fmt_ns(round_median(cur.round_values())), nodeid
            assert row[5] == "n/a"
            if base is None or nodeid.endswith("test_other_gpu"):
                assert row[3] == "n/a"
        else:
            gb = float(np.exp(np.mean(np.log(base.round_values()))))
            gc = float(np.exp(np.mean(np.log(cur.round_values()))))
            assert row[3] == fmt_ns(gb) and row[4] == fmt_ns(gc), nodeid
            assert row[5] == fmt_pct(100 * (gc / gb - 1)), nodeid
    for nodeid in (ERROR_TEST, CRASH_TEST):
        assert by[nodeid][3:6] == ["n/a", "n/a", "n/a"]


def test_overview_counts_commits_and_badge(session, page):
    _, doc = page
    counts = Counter(o for _, o in EXPECTED)
    got = {r[0].text().strip(): int(r[1].text()) for r in rows(doc.find("table", id="counts"))}
    assert got == {o: counts.get(o, 0) for o in OUTCOMES}
    assert list(got) == list(OUTCOMES)  # worst first
    assert doc.find("span", id="badge").text() == "FAIL"  # three regressions
    assert doc.find("p", cls="badge-reason").text() == "3 regressed"
    commits = doc.find("dl", id="commits").text()
    assert "c" * 12 in commits and "b" * 12 in commits and "origin/main" in commits
    assert "feature/<x>" in commits  # user text shown as text
    assert "Tesla V100-SXM2-16GB" in doc.find("dl", id="machine").text()


def test_timing_and_gates_halves_side_by_side(session, page, resnet):
    _, doc = page
    slow = section_of(doc, "tests/test_resnet.py::test_slower")
    timing, gates = slow.find("div", cls="timing"), slow.find("div", cls="gates")
    assert slow.find("div", cls="halves").children  # one grid holds both halves
    cur, _ = session["records"]["tests/test_resnet.py::test_slower"]
    delta = 100 * (
        np.exp(np.mean(np.log(cur.round_values())) - np.mean(np.log(resnet.round_values()))) - 1
    )
    assert timing.find("dd", cls="delta").text().startswith(fmt_pct(delta))
    assert timing.find("dd", cls="threshold").text().startswith("5.0% (tolerance 5.0%")
    assert (
        timing.find("dd", cls="replicated")
        .text()
        .startswith("6 rounds x 1 iterations this session vs 6 rounds of the baseline")
    )
    assert "regressed" in timing.find("h3").text() and "unchanged" in gates.find("h3").text()
    assert not slow.find_all("dd", cls="load")  # no load measured: nothing said

    evil = section_of(doc, EVIL_TEST)
    assert "unchanged" in evil.find("div", cls="timing").find("h3").text()
    found = cell_texts(evil.find("table", cls="gate-findings"))
    assert ["regression", "kernel_set", "on", EVIL_OP, " ".join(EVIL_KERNEL.split())] in [
        [r[0], r[1], r[3], r[4], r[5]] for r in found
    ]
    cpu = section_of(doc, "examples/test_cpu.py::test_matmul")
    calls = next(r for r in cell_texts(cpu.find("table", cls="gate-findings")) if r[1] == "calls")
    base, now = (float(x) for x in calls[2].split(" → "))
    assert now > base and calls[3] == "0"  # more calls per iteration than the budget allows


def test_a_cpu_run_shows_only_columns_that_have_figures(page):
    """A CPU capture has no GPU kernels: its op table carries no Tensor Core or FLOP
    efficiency column (a CPU run's report once had 223 n/a, columns of them in every op
    table) and says why; a GPU capture's keeps them. (The profile table of a real CPU
    session: tests/test_plugin.py.)"""
    _, doc = page
    cpu = section_of(doc, "examples/test_cpu.py::test_matmul")
    heads = [th.text() for th in cpu.find("table", cls="ops").find_all("th")]
    assert not {"TC util", "FLOP eff"} & set(heads), heads
    assert "no op here ran GPU kernels" in cpu.text()
    gpu = section_of(doc, "tests/test_resnet.py::test_slower")
    assert "TC util" in [th.text() for th in gpu.find("table", cls="ops").find_all("th")]


def test_rounds_table_and_figure_show_each_round(session, page):
    _, doc = page
    cur, base = session["records"]["tests/test_resnet.py::test_noisy"]
    sec = section_of(doc, "tests/test_resnet.py::test_noisy")
    got = cell_texts(sec.find("table", cls="rounds"))
    pairs = zip(base.round_values(), cur.round_values(), strict=True)
    want = [[str(i + 1), fmt_ns(b), fmt_ns(c)] for i, (b, c) in enumerate(pairs)]
    assert got == want
    assert sec.find("figure", cls="rounds").find_all("svg")
    two = cell_texts(
        section_of(doc, "tests/test_resnet.py::test_two_rounds").find("table", cls="rounds")
    )
    assert [r[2] for r in two] == [
        fmt_ns(v)
        for v in session["records"]["tests/test_resnet.py::test_two_rounds"][0].round_values()
    ] + ["n/a"] * 4


def test_error_crashed_and_not_judged_sections_say_why(page):
    _, doc = page
    for nodeid, reason in ((ERROR_TEST, ERROR_REASON), (CRASH_TEST, CRASH_REASON)):
        sec = section_of(doc, nodeid)
        assert sec.find("p", cls="reason").text() == " ".join(reason.split())
        assert "error" in sec.find("p", cls="reason").attrs["class"]
        assert "Nothing measured." in sec.find("div", cls="timing").text()
    sec = section_of(doc, "tests/test_resnet.py::test_two_rounds")
    assert sec.attrs["data-outcome"] == "not-judged"
    assert "gates unchanged" in sec.find("p", cls="reason").text()


def test_hostile_names_are_text_never_markup(page):
    html, doc = page
    section = section_of(doc, EVIL_TEST)
    op_names = [r[0].text() for r in rows(section.find("table", cls="ops"))]
    assert EVIL_OP in op_names
    changes = cell_texts(section.find("table", cls="kernel-changes"))
    assert ["added", EVIL_OP, " ".join(EVIL_KERNEL.split())] in [c[:3] for c in changes]
    finding = rows(section.find("table", cls="findings"))[0]
    assert finding[2].text() == EVIL_OP and finding[3].text() == "K=<7> & N=3"
    assert len(doc.find_all("script")) == 1  # only the table sorter
    assert "<script>alert" not in html and "<b>" not in html and "<i>" not in html
    assert ERROR_TEST in [r[0] for r in cell_texts(doc.find("table", id="tests"))]


def test_written_report_is_utf8_with_lone_surrogates_replaced(session, tmp_path):
    out = write_session_html(session["results"], tmp_path / "report.html")
    text = out.read_bytes().decode("utf-8")  # strict: raises on anything not UTF-8
    doc = parse(text)
    shown = ERROR_TEST.replace("\udc80", "\ufffd")
    assert shown in [r[0] for r in cell_texts(doc.find("table", id="tests"))]
    assert "ünï" in text and "\ufffd" in text


def test_self_contained_no_external_urls(page):
    html, doc = page
    assert not re.search(r"(?i)\b(?:https?:|ftp:)//|(?<![\w/])//[\w.-]+\.\w", html)
    for node in doc.iter():
        assert "src" not in node.attrs
        href = node.attrs.get("href")
        assert href is None or href.startswith("#"), href
    assert "@import" not in html and "url(http" not in html
    csp = [m for m in doc.find_all("meta") if m.attrs.get("http-equiv")]
    assert "default-src 'none'" in csp[0].attrs["content"]


def test_minimal_results_render_and_missing_keys_tolerated(tmp_path):
    minimal = {"schema": 2, "tests": [{"nodeid": "t.py::a", "outcome": "new"}]}
    out = write_session_html(minimal, tmp_path / "r.html")
    doc = parse(out.read_text())
    assert cell_texts(doc.find("table", id="tests"))[0][:2] == ["t.py::a", "new"]
    assert doc.find("span", id="badge").text() == "NOT JUDGED"  # nothing was compared


# --------------------------------------------------------------------------- the badge


def _doc(session: dict[str, Any], keep: set[str], fail_on: str = "regression") -> dict:
    results = dict(session["results"])
    results["tests"] = [t for t in results["tests"] if t["outcome"] in keep]
    results["settings"] = dict(results["settings"], fail_on=fail_on)
    return results


@pytest.mark.parametrize(
    ("keep", "fail_on", "badge"),
    [
        (set(OUTCOMES), "regression", "FAIL"),
        (set(OUTCOMES), "never", "ADVISORY"),
        ({"regressed", "unchanged"}, "never", "ADVISORY"),
        (set(OUTCOMES) - {"regressed"}, "regression", "INCOMPLETE"),
        ({"crashed", "unchanged"}, "regression", "INCOMPLETE"),
        ({"error"}, "never", "INCOMPLETE"),
        ({"not-judged", "no-baseline", "new", "incomparable"}, "regression", "NOT JUDGED"),
        (set(), "regression", "NOT JUDGED"),
        ({"unchanged", "improved", "not-judged", "no-baseline"}, "regression", "PASS"),
        ({"noisy", "unchanged"}, "regression", "PASS"),
    ],
)
def test_badge_rules_in_every_report(session, keep, fail_on, badge):
    results = _doc(session, keep, fail_on)
    doc = SessionResults.from_dict(results)
    assert doc.badge() == badge
    assert parse(render_session_html(results)).find("span", id="badge").text() == badge
    head = render_markdown(results).splitlines()[0]
    assert re.match(r"## perfguard :[a-z_]+: ([A-Z ]+):", head).group(1) == badge
    assert results_lines(doc)[0].startswith(f"perfguard: {badge} (")


def test_pass_says_what_was_not_judged_or_too_noisy(session):
    doc = SessionResults.from_dict(_doc(session, {"unchanged", "improved", "noisy", "new"}))
    assert doc.badge() == "PASS"
    assert doc.badge_reason() == "2 passed, none regressed; 1 too noisy to judge; not judged: 1 new"


def test_sorted_tests_by_severity_then_name(session):
    doc = SessionResults.from_dict(session["results"])
    got = [(t.nodeid, t.outcome.value) for t in doc.sorted_tests()]
    assert got == EXPECTED
    severities = [t.outcome.severity for t in doc.sorted_tests()]
    assert severities == sorted(severities)


def test_not_judged_rows_refuse_a_verdict():
    with pytest.raises(ValueError, match="is a verdict"):
        TestEntry.not_judged("t.py::a", "unchanged", "why")
    e = TestEntry.not_judged("t.py::a", "not-judged", "nothing captured\n  (loop skipped)")
    assert e.reason == "nothing captured (loop skipped)" and e.error is None
    assert TestEntry.from_dict(e.to_dict()) == e


def test_round_trip_keeps_every_field(session):
    doc = SessionResults.from_dict(session["results"])
    again = SessionResults.from_dict(json.loads(json.dumps(doc.to_dict())))
    assert again == doc
    evil = next(t for t in again.tests if t.nodeid == EVIL_TEST)
    assert evil.gates is not None and evil.gates.regressions[0].kernel_name == EVIL_KERNEL
    assert evil.timing is not None and evil.timing.n_current == 6


# --------------------------------------------------------------------------- schema 1


def schema1(session: dict[str, Any]) -> dict[str, Any]:
    """The session as schema 1 wrote it: flat figures and per-iteration samples only (no
    rounds, no timing/gates halves, no mode), its outcome list, and an ``unchanged`` that
    was too short to judge; ``error`` rows as the schema-1 plugin wrote them."""
    old = {"regressed", "improved", "unchanged", "new", "no-baseline", "incomparable", "error"}
    tests = []
    for t in session["results"]["tests"]:
        if t["outcome"] not in old:
            continue
        t = {
            k: v
            for k, v in t.items()
            if k
            not in (
                "rounds_current",
                "rounds_baseline",
                "timing",
                "gates",
                "mode",
                "ci_level_pct",
                "load",
            )
        }
        tests.append(t)
    same = next(t for t in tests if t["nodeid"].endswith("test_same"))
    short = dict(
        same,
        nodeid="tests/test_old.py::test_short",
        outcome="unchanged",
        samples_current=same["samples_current"][:3],
        samples_baseline=same["samples_baseline"][:3],
        n_current=3,
        n_baseline=3,
        message="statistics impossible: n=3/3 samples (current/baseline), need >= 5 on each "
        "side; not judged",
    )
    tests.append(short)
    counts = Counter(t["outcome"] for t in tests)
    return {**session["results"], "schema": 1, "tests": tests, "counts": dict(counts), "mode": None}


def test_schema1_file_still_renders(session, tmp_path):
    from perfguard.cli import main

    src = tmp_path / "results.json"
    src.write_text(json.dumps(schema1(session)))
    doc = load_results(src)
    outcomes = {t.nodeid: t.outcome.value for t in doc.tests}
    assert outcomes["tests/test_old.py::test_short"] == "not-judged"  # never "unchanged"
    assert outcomes[ERROR_TEST] == "error"
    assert any("schema 1" in n for n in doc.notes)
    assert main(["report", str(src), "--markdown", str(tmp_path / "s.md")]) == 0
    page = parse((tmp_path / "report.html").read_text())
    got = cell_texts(page.find("table", id="tests"))
    assert [r[1] for r in got] == [t.outcome.value for t in doc.sorted_tests()]
    short = section_of(page, "tests/test_old.py::test_short")
    assert "(this file has no rounds)" in short.find("figure", cls="distribution").text()
    assert "statistics impossible" in short.find("p", cls="reason").text()
    assert (tmp_path / "s.md").read_text().startswith("## perfguard :x: FAIL")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON (line 1"),
        ("[1, 2]", "not perfguard results"),
        ('{"tests": []}', "no 'schema' key"),
        ('{"schema": 4, "tests": []}', "newer perfguard (schema 4; this one reads up to 3)"),
        ('{"schema": 0, "tests": []}', "schema must be a positive integer"),
        ('{"schema": 2, "tests": [{"nodeid": "a", "outcome": "slower"}]}', "unknown outcome"),
        (
            '{"schema": 1, "tests": [{"nodeid": "a", "outcome": "new", "delta_pct": "5%"}]}',
            "tests[0] (a).delta_pct: expected a number",
        ),
        (
            '{"schema": 2, "tests": [{"nodeid": "a", "outcome": "new", '
            '"ops": [{"current_ns": []}]}]}',
            "ops[0].current_ns: expected a number",
        ),
        (
            '{"schema": 2, "tests": [{"nodeid": "a", "outcome": "new", "rounds_current": ["x"]}]}',
            "tests[0] (a).rounds_current[0]: expected a number",
        ),
        (
            '{"schema": 2, "tests": [{"nodeid": "a", "outcome": "noisy", '
            '"timing": {"outcome": "meh"}}]}',
            "tests[0] (a).timing.outcome: unknown outcome",
        ),
        (
            '{"schema": 2, "tests": [{"nodeid": "a", "outcome": "noisy", '
            '"timing": {"outcome": "noisy", "delta_pct": "big"}}]}',
            "timing.delta_pct: expected",
        ),
        (
            '{"schema": 2, "tests": [{"nodeid": "a", "outcome": "regressed", '
            '"gates": {"outcome": "regressed", "regressions": [3]}}]}',
            "gates.regressions[0]: expected an object",
        ),
    ],
)
def test_bad_results_file_is_one_line_naming_it(tmp_path, content, problem):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(ReportError) as err:
        load_results(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and problem in msg and "\n" not in msg


def test_loader_does_not_change_its_input(session):
    before = json.dumps(session["results"], sort_keys=True)
    render_session_html(session["results"])
    render_markdown(session["results"])
    assert json.dumps(session["results"], sort_keys=True) == before


# --------------------------------------------------------------------------- terminal table


def test_terminal_table_lists_every_outcome_worst_first_with_why(session):
    from perfguard.plugin.summary import MAX_WHY

    results = SessionResults.from_dict(session["results"])
    lines = results_lines(results)
    assert lines[0] == "perfguard: FAIL (3 regressed)"
    # what the timing could see, under the badge (its one home: SessionResults.resolution)
    assert lines[1].startswith("Smallest timing change this run could see: ")
    assert lines[1][1:] == results.resolution()[1:]
    header, rule, *rest = lines[2:]
    body, counts, explained = rest[: len(EXPECTED)], rest[len(EXPECTED)], rest[len(EXPECTED) + 1 :]
    assert header.split()[:2] == ["test", "outcome"]
    assert len(body) == len(EXPECTED)
    widths = [len(c) for c in rule.split("  ")]
    starts = np.cumsum([0] + [w + 2 for w in widths])
    cells = [
        [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        for line in body
    ]
    assert [c[1] for c in cells] == [o for _, o in EXPECTED]
    by = {o: c for c, (_, o) in zip(cells, EXPECTED, strict=True)}
    # shortened between words, the whole line after the table
    assert by["crashed"][5] == shorten(CRASH_REASON, MAX_WHY) and by["crashed"][5].endswith("…")
    cut = by["crashed"][5][:-1]
    assert CRASH_REASON.startswith(cut) and CRASH_REASON[len(cut)] in " ;,:"
    assert any(x.startswith("crashed ") and x.endswith(f": {CRASH_REASON}") for x in lines)
    assert by["error"][5].startswith("the test requests the gpuprofile fixture")
    assert "\udc80" not in "".join(lines)  # printable on any terminal
    assert by["not-judged"][5].startswith("too few rounds")
    improved = next(
        t for t in SessionResults.from_dict(session["results"]).tests if t.outcome == "improved"
    )
    assert improved.explanation is not None and improved.explanation.lead
    assert by["improved"][5].startswith(improved.explanation.lead[:30])
    assert counts.startswith("3 regressed, 1 crashed, 1 error, 1 noisy")
    # under the table, each regressed or improved test's explanation, as its failure says it
    heads = [x for x in explained if not x.startswith("  - ")]
    decided = [h for h in heads if h.split()[0] in ("regressed", "improved")]
    assert [h.split()[0] for h in decided] == ["regressed"] * 3 + ["improved"]
    # then the whole "why" of each other test whose cell was shortened
    assert all(len(h.split(": ", 1)[1]) > MAX_WHY for h in heads if h not in decided)
    assert f"improved {improved.nodeid}: {improved.explanation.headline}" in heads


# --------------------------------------------------------------------------- summary.md


def test_markdown_lines_details_and_link(session):
    md = render_markdown(session["results"])
    assert md.startswith(
        "## perfguard :x: FAIL: 3 regressed, 1 crashed, 1 error, 1 noisy, 1 incomparable, "
        "1 not-judged, 1 no-baseline, 1 new, 1 improved, 1 unchanged"
    )
    bullets = [line for line in md.splitlines() if line.startswith("- ")]
    assert [b.split("**")[1] for b in bullets] == [
        o for _, o in EXPECTED if o not in ("no-baseline", "new", "unchanged")
    ]
    slower = next(b for b in bullets if "test_slower" in b)
    t = next(t for t in session["results"]["tests"] if t["nodeid"].endswith("test_slower"))
    t = t["timing"]  # the figures' one home in an entry
    block = md[md.index(slower) :].split("\n- ")[0]  # the bullet and its sub-bullets
    from perfguard.compare.culprits import format_ns as level_ns

    levels = f"level {level_ns(t['level_baseline_ns'])} → {level_ns(t['level_current_ns'])}"
    assert f"{t['delta_pct']:+.1f}%" in block and levels in block and "6/6 rounds" in block
    # the change is the change of the levels shown beside it, never of other figures
    assert t["level_current_ns"] / t["level_baseline_ns"] - 1 == pytest.approx(t["delta_pct"] / 100)
    crashed = next(b for b in bullets if "**crashed**" in b)
    assert crashed.endswith(CRASH_REASON.replace("(", "(").replace("_", "\\_"))
    details = md[md.index("<details>") : md.index("</details>")]
    assert "3 other tests (no-baseline: 1, new: 1, unchanged: 1)" in details
    assert details.count("\n| `") == 3
    assert "no baseline to compare with" in details  # the reason column
    assert md.rstrip().endswith(
        f"(set {REPORT_URL_ENV}, or pass --report-url to `perfguard report`, to link it here)"
    )  # no URL given, no CI: no dead link
    assert len(md) < 65536


def test_markdown_keeps_hostile_names_in_code_spans(session):
    md = render_markdown(session["results"])
    line = next(x for x in md.splitlines() if "test_evil" in x)
    assert "``tests/test_evil.py::test_x[<b>|`tick`]``" in line  # a longer fence
    outside = re.sub(r"(`+).*?\1", "", md)  # text outside code spans
    assert "<b>" not in outside and "<script" not in outside and "<i>" not in outside


def test_markdown_appends_to_github_step_summary(session, tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = write_markdown(session["results"], tmp_path / "summary.md", report_url="https://x/y")
    text = out.read_text(encoding="utf-8")
    assert text.rstrip().endswith("(https://x/y)")
    assert "\ufffd" in text  # the lone surrogate of a test name, replaced
    assert summary.read_text(encoding="utf-8") == "earlier step\n" + text + "\n"


# --------------------------------------------------------------------------- CLI


def test_cli_report_from_results_json(session, tmp_path, capsys):
    from perfguard.cli import main

    src = tmp_path / "results.json"
    src.write_text(json.dumps(session["results"]))
    assert main(["report", str(src), "--markdown", str(tmp_path / "s.md")]) == 0
    doc = parse((tmp_path / "report.html").read_text())
    assert len(rows(doc.find("table", id="tests"))) == len(EXPECTED)
    assert (tmp_path / "s.md").read_text().startswith("## perfguard :x: FAIL")
    out = capsys.readouterr().out
    assert "FAIL: 3 regressed, 1 crashed, 1 error" in out


def test_cli_report_bad_input_is_one_line(tmp_path, capsys):
    from perfguard.cli import main

    bad = tmp_path / "results.json"
    bad.write_text("[]")
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "not perfguard results" in err
    assert main(["report", str(bad), "--run", "3"]) == 2
    assert "--run applies to a baseline store" in capsys.readouterr().err


def test_cli_report_from_store_runs(session, tmp_path, capsys):
    from perfguard.baseline.store import Store
    from perfguard.cli import main

    cur, base = session["records"]["tests/test_resnet.py::test_slower"]
    fp = Fingerprint(gpu_name="Tesla V100-SXM2-16GB", gpu_count=1, backend="torch")
    store_path = tmp_path / "perfguard.db"
    with Store(store_path) as store:
        b = store.save_run(
            RunInfo("a" * 40, "main", False, "2026-01-01T00:00:00Z", fp),
            [replace(base, nodeid=cur.nodeid)],
        )
        c = store.save_run(RunInfo("d" * 40, "pr", False, "2026-01-02T00:00:00Z", fp), [cur])
    out = tmp_path / "store.html"
    argv = ["report", str(store_path), "--run", str(c), "--baseline-run", str(b), "-o", str(out)]
    assert main(argv) == 0
    doc = parse(out.read_text())
    assert cell_texts(doc.find("table", id="tests"))[0][:2] == [cur.nodeid, "regressed"]
    assert "a" * 12 in doc.find("dl", id="commits").text()
    history = doc.find("details", cls="history")
    rows = cell_texts(history.find("table"))
    assert [r[0] for r in rows] == ["a" * 12, "d" * 12]
    assert [r[3] for r in rows] == ["", ""]  # the change-point column: same code, 2 runs
    assert main(["report", str(store_path)]) == 2
    assert "give --run RUN_ID" in capsys.readouterr().err
    with sqlite3.connect(store_path) as conn:  # the store was only read
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2


# --------------------------------------------------------------------------- analysis page


@pytest.fixture(scope="module")
def train_analysis(fixture_file, cached_trace):
    return analyze(cached_trace(fixture_file(TRAIN_2RANK)))


def test_analysis_page_tables_match_the_analysis(train_analysis):
    from perfguard.analysis.expert import run_detectors

    a = train_analysis
    doc = parse(render_analysis_html(a))
    top = cell_texts(doc.find("table", id="top-ops"))
    ops = a.ops.sort_values("gpu_time_total", ascending=False)
    assert len(top) == 10
    assert [r[0] for r in top] == ops["op_name"].head(10).tolist()
    assert top[0][4] == fmt_ns(ops["gpu_time_total"].iloc[0])
    share = 100 * ops["gpu_time_total"].iloc[0] / ops["gpu_time_total"].sum()
    assert top[0][5] == f"{share:.1f}%"
    from perfguard.compare.units import human

    assert [r[10] for r in top] == [human(f, "flops") for f in ops["flops"].head(10)]
    missing = ops[
        ops["tc_eligible"].fillna(False).astype(bool)
        & ~ops["using_tc"].fillna(False).astype(bool)
        & (ops["gpu_time_total"] > 0)
    ]
    got = cell_texts(doc.find("table", id="tc-missing"))
    assert sorted(r[0] for r in got) == sorted(missing["op_name"])
    assert got and all(r[6] == "yes" and r[7] == "no" for r in got)  # no GPU % column here
    kernels = cell_texts(doc.find("table", id="kernels"))
    assert len(kernels) == min(len(a.kernels), 200)
    assert kernels[0][0] == a.kernels.sort_values("gpu_time_total").iloc[-1]["name"]
    assert len(rows(doc.find("table", cls="findings"))) == len(run_detectors(a))
    assert doc.find("figure", cls="iterations").find_all("svg")


def test_analysis_page_without_tensor_core_columns_says_na(train_analysis):
    from dataclasses import replace

    a = replace(
        train_analysis,
        ops=train_analysis.ops.drop(columns=["tc_eligible", "using_tc", "tc_utilization"]),
    )
    doc = parse(render_analysis_html(a))
    assert "n/a" in doc.find("p", id="tc-missing-na").text()
    first = cell_texts(doc.find("table", id="top-ops"))[0]
    assert first[7:10] == ["n/a", "n/a", "n/a"]


def test_a_cpu_capture_reads_as_cpu_time_with_a_parents_flops_marked(tmp_path: Path) -> None:
    """A real CPU capture of a linear layer: ranked by CPU time, said once; no GPU, Tensor
    Core, FLOP-efficiency column or kernel table; ``aten::linear`` shows its ``addmm``'s
    FLOPs (2·M·N·K per call, counted once, on the addmm), marked as its nested ops'."""
    import html

    import torch

    from perfguard.capture.torch_profiler import profile_torch
    from perfguard.compare.units import human
    from perfguard.trace import load_trace

    layer, x = torch.nn.Linear(64, 32), torch.randn(16, 64)
    capture = tmp_path / "cpu.pt.trace.json"
    with profile_torch(capture, device="cpu", with_stack=False):
        for _ in range(3):
            with torch.profiler.record_function("perfguard.iteration"):
                layer(x)
    analysis = analyze(load_trace(capture))
    page = html.unescape(render_analysis_html(analysis))
    assert "Top " in page and "ops by CPU time</h2>" in page and "by GPU time" not in page
    assert page.count("No GPU work in this capture") == 1
    for gone in ('<th class="n">GPU time</th>', "TC eligible", "FLOP eff", 'id="kernels"'):
        assert gone not in page, gone
    flops = 2 * 16 * 64 * 32 * 3  # three calls
    rows = re.findall(r"<tr data-op-id=[^>]*>(.*?)</tr>", page)
    (linear,) = [r for r in rows if "<code>aten::linear</code>" in r]
    (addmm,) = [r for r in rows if "<code>aten::linear/aten::addmm</code>" in r]
    want = human(flops, "flops")
    assert f'{want} <span class="muted">(nested ops)</span>' in linear, linear
    assert want in addmm and "(nested ops)" not in addmm, addmm


def test_an_op_whose_time_was_not_judged_carries_no_verdict_word(session) -> None:
    """A store-mode CPU run judges the test's time, not each op's: an op row shows its
    change (+27.2 %) without a ``not-judged`` status beside it, which read like a verdict
    on that change; the note above the table says once that per-op times are not judged."""
    results = json.loads(json.dumps(session["results"]))
    (cpu,) = [t for t in results["tests"] if t["nodeid"] == "examples/test_cpu.py::test_matmul"]
    for op in cpu["ops"]:
        op.update(ci_low_pct=None, ci_high_pct=None, p_value=None, delta_pct=27.2)
        op["status"] = op["status"] if op["status"] in ("added", "removed") else "not-judged"
    doc = parse(render_session_html(results))
    sec = section_of(doc, "examples/test_cpu.py::test_matmul")
    table = sec.find("table", cls="ops")
    assert "Interval" not in [th.text() for th in table.find_all("th")]
    statuses = [r[2] for r in cell_texts(table)]
    assert statuses and "not-judged" not in statuses, statuses
    assert "+27.2%" in [c for r in cell_texts(table) for c in r]
    assert "Per-op times are not judged here" in sec.text()
