"""The HTML reports and summary.md, rendered from real results and read back as parsed HTML.

Session results come from real captures: the V100 ResNet-50 training
fixture (6 iterations) compared by :func:`perfguard.compare.compare_records`
against itself with one op's per-iteration GPU time scaled, and two real
CPU torch-profiler runs of different work. Numbers on the page are checked
against medians computed here from the records, not from the results.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfguard import analyze
from perfguard.baseline.record import Fingerprint, RunInfo, TestRecord, record_from_analysis
from perfguard.errors import ReportError
from perfguard.report.html import (
    load_results,
    render_analysis_html,
    render_session_html,
    write_session_html,
)
from perfguard.report.html.render import fmt_ns, fmt_pct
from perfguard.report.markdown import REPORT_URL_PLACEHOLDER, render_markdown, write_markdown

RESNET = "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz"
TRAIN_2RANK = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"
EVIL_OP = "<script>alert(\"op\")</script> & 'quoted' op"
EVIL_KERNEL = 'void k<float, &x><script>alert(1)</script>"'
EVIL_TEST = "tests/test_evil.py::test_x[<b>|`tick`]"


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


def scaled(record: TestRecord, op_id: str, factor: float, nodeid: str) -> TestRecord:
    """``record`` with one op's per-iteration GPU time times ``factor`` (and the totals)."""
    ops = record.op_samples.copy()
    hit = ops["op_id"] == op_id
    extra = (ops.loc[hit, "gpu_time_ns"] * (factor - 1.0)).round().astype("int64")
    ops.loc[hit, "gpu_time_ns"] = ops.loc[hit, "gpu_time_ns"] + extra
    per_iter = extra.groupby(ops.loc[hit, "iteration"]).sum()
    samples = record.samples.copy()
    samples["gpu_time_ns"] += samples["iteration"].map(per_iter).fillna(0).astype("int64")
    return TestRecord(nodeid, record.metric, samples, ops, record.ops, record.kernels, {})


def renamed(record: TestRecord, op_id: str, new_name: str, nodeid: str) -> TestRecord:
    """``record`` with one op renamed and an extra kernel under it (a kernel that is new)."""
    ops = record.ops.copy()
    ops.loc[ops["op_id"] == op_id, "op_name"] = new_name
    kernels = record.kernels.copy()
    kernels.loc[kernels["op_id"] == op_id, "op_name"] = new_name
    extra = kernels[kernels["op_id"] == op_id].head(1).assign(kernel_name=EVIL_KERNEL)
    kernels = pd.concat([kernels, extra], ignore_index=True)
    return TestRecord(nodeid, record.metric, record.samples, record.op_samples, ops, kernels, {})


def cpu_record(tmp: Path, name: str, reps: int) -> TestRecord:
    """A real CPU torch-profiler run: 12 recorded iterations of ``reps`` 256x256 matmuls
    (about 1 ms each: big enough that a loaded CI machine does not blur 2 vs 10)."""
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
    return record_from_analysis("examples/test_cpu.py::test_matmul", analyze(load_trace(path)))


@pytest.fixture(scope="module")
def resnet(fixture_file, cached_trace) -> TestRecord:
    return record_from_analysis("base", analyze(cached_trace(fixture_file(RESNET))))


@pytest.fixture(scope="module")
def session(resnet, tmp_path_factory) -> dict[str, Any]:
    return build_session(resnet, tmp_path_factory.mktemp("cpu"))


def build_session(resnet: TestRecord, tmp: Path) -> dict[str, Any]:
    """A results.json dict from real records, plus what the tests check it against."""
    from perfguard.compare import compare_records

    top = resnet.ops.sort_values("gpu_time_total", ascending=False)["op_id"].tolist()
    slow = scaled(resnet, top[0], 1.5, "tests/test_resnet.py::test_slower")
    fast = scaled(resnet, top[1], 0.4, "tests/test_resnet.py::test_faster")
    same = scaled(resnet, top[0], 1.0, "tests/test_resnet.py::test_same")
    evil = renamed(resnet, top[2], EVIL_OP, EVIL_TEST)
    cpu_base, cpu_cur = cpu_record(tmp, "base", 2), cpu_record(tmp, "cur", 10)
    pairs = [
        (slow, resnet),
        (fast, resnet),
        (same, resnet),
        (evil, resnet),
        (cpu_cur, cpu_base),
        (resnet, None),
    ]
    tests = []
    for cur, base in pairs:
        entry = compare_records(cur, base, baseline_commit="b" * 40).to_dict()
        if base is None:
            entry["nodeid"] = "tests/test_resnet.py::test_first_time"
        entry["history"] = [
            {"commit": f"{i:x}" * 40, "time": f"2026-01-0{i + 1}", "median_ns": 1e8 + 1e6 * i}
            for i in range(4)
        ]
        entry["findings"] = []
        entry["backend"] = "torch"
        tests.append(entry)
    tests[3]["findings"] = [
        {"check": "bad_tensor_shape", "severity": "warning", "problem": EVIL_OP,
         "evidence": "K=<7> & N=3", "recommendation": "pad to a multiple of 8"},
    ]  # fmt: skip
    counts = Counter(t["outcome"] for t in tests)
    results = {
        "schema": 1,
        "perfguard_version": "0.1.0",
        "run": {"commit": "c" * 40, "branch": "feature/<x>", "dirty": True, "time": "2026-01-05",
                "fingerprint": Fingerprint(gpu_name="Tesla V100-SXM2-16GB", gpu_count=1,
                                           backend="torch").to_dict()},
        "baseline": {"ref": "origin/main", "commit": "b" * 40, "run_id": "1"},
        "settings": {"tolerance": 0.05, "alpha": 0.01, "fail_on": "regression",
                     "backend": "torch"},
        "counts": dict(counts),
        "tests": tests,
    }  # fmt: skip
    records = {t["nodeid"]: (cur, base) for t, (cur, base) in zip(tests, pairs, strict=True)}
    return {"results": results, "records": records, "top": top}


@pytest.fixture(scope="module")
def page(session) -> tuple[str, Node]:
    html = render_session_html(session["results"])
    return html, parse(html)


# --------------------------------------------------------------------------- session page


def test_outcomes_of_the_real_comparisons(session):
    outcomes = {t["nodeid"]: t["outcome"] for t in session["results"]["tests"]}
    assert outcomes == {
        "tests/test_resnet.py::test_slower": "regressed",
        "tests/test_resnet.py::test_faster": "improved",
        "tests/test_resnet.py::test_same": "unchanged",
        EVIL_TEST: "unchanged",
        "examples/test_cpu.py::test_matmul": "regressed",  # 10 vs 2 matmuls per iteration
        "tests/test_resnet.py::test_first_time": "no-baseline",
    }


def test_tests_table_rows_outcomes_and_medians(session, page):
    _, doc = page
    table = doc.find("table", id="tests")
    got = rows(table)
    tests = session["results"]["tests"]
    assert len(got) == len(tests)
    for cells, t in zip(got, tests, strict=True):
        cur, base = session["records"][t["nodeid"]]
        assert cells[0].text().strip() == t["nodeid"]
        assert cells[1].text().strip() == t["outcome"]
        mc = float(np.median(cur.values()))  # independent of the results dict
        assert cells[4].text() == fmt_ns(mc)
        if base is None:
            assert cells[3].text() == "n/a" and cells[5].text() == "n/a"
        else:
            mb = float(np.median(base.values()))
            assert cells[3].text() == fmt_ns(mb)
            assert cells[5].text() == fmt_pct(100 * (mc / mb - 1))
            assert float(cells[4].attrs["data-v"]) == pytest.approx(mc)


def test_overview_counts_commits_and_verdict(session, page):
    _, doc = page
    counts = Counter(t["outcome"] for t in session["results"]["tests"])
    got = {r[0].text().strip(): int(r[1].text()) for r in rows(doc.find("table", id="counts"))}
    assert got == {o: counts.get(o, 0) for o in got} and sum(got.values()) == 6
    assert doc.find("span", cls="verdict").text() == "FAIL"  # two regressions
    commits = doc.find("dl", id="commits").text()
    assert "c" * 12 in commits and "b" * 12 in commits and "origin/main" in commits
    assert "feature/<x>" in commits  # user text shown as text
    assert "Tesla V100-SXM2-16GB" in doc.find("dl", id="machine").text()


def test_regressed_section_lists_the_scaled_op_first_with_its_numbers(session, page, resnet):
    _, doc = page
    section = doc.find("section", id="test-0")
    assert section.attrs["data-outcome"] == "regressed"
    table = section.find("table", cls="ops")
    first = rows(table)[0]
    top = session["top"][0]
    assert first[0].text() == resnet.ops.set_index("op_id").loc[top, "op_name"]
    assert first[2].text() == "regressed"
    per_iter = resnet.op_samples[resnet.op_samples["op_id"] == top]["gpu_time_ns"]
    base = float(np.median(per_iter))
    cur = float(np.median((per_iter * 1.5).round()))
    assert first[3].text() == fmt_ns(base)
    assert first[4].text() == fmt_ns(cur)
    assert first[6].text() == fmt_pct(100 * (cur / base - 1))  # "+50.0 %"
    assert first[6].text() == "+50.0 %"
    # the rest: sorted by |delta time| (all unchanged here), descending
    gaps = [abs(float(r[5].attrs["data-v"] or 0)) for r in rows(table)[1:]]
    assert gaps == sorted(gaps, reverse=True)
    shown = len(rows(table))
    hidden = section.find("p", cls="ops-hidden").text()
    assert shown == 50 and f"{len(resnet.ops) - 50} more ops" in hidden


def test_improved_section_and_figures(page):
    html, doc = page
    section = doc.find("section", id="test-1")
    assert section.attrs["data-outcome"] == "improved"
    assert rows(section.find("table", cls="ops"))[0][2].text() == "improved"
    assert section.find_all("figure", cls="distribution") and section.find_all(
        "figure", cls="trend"
    )
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "figure ids collide"
    # no-baseline test: only the current samples are drawn, no history figure when < 2 points
    assert doc.find("section", id="test-5").find_all("figure", cls="distribution")


def test_hostile_names_are_text_never_markup(page):
    html, doc = page
    section = doc.find("section", id="test-3")
    assert section.find("h2").find("code").text() == EVIL_TEST
    op_names = [r[0].text() for r in rows(section.find("table", cls="ops"))]
    assert EVIL_OP in op_names
    changes = cell_texts(section.find("table", cls="kernel-changes"))
    assert ["added", EVIL_OP, " ".join(EVIL_KERNEL.split())] in [c[:3] for c in changes]
    finding = rows(section.find("table", cls="findings"))[0]
    assert finding[2].text() == EVIL_OP and finding[3].text() == "K=<7> & N=3"
    assert len(doc.find_all("script")) == 1  # only the table sorter
    assert "<script>alert" not in html and "<b>" not in html


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
    minimal = {"schema": 1, "tests": [{"nodeid": "t.py::a", "outcome": "new"}]}
    out = write_session_html(minimal, tmp_path / "r.html")
    doc = parse(out.read_text())
    assert cell_texts(doc.find("table", id="tests"))[0][:2] == ["t.py::a", "new"]
    assert doc.find("span", cls="verdict").text() == "PASS"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON (line 1"),
        ("[1, 2]", "not perfguard results"),
        ('{"tests": []}', "no 'schema' key"),
        ('{"schema": 9, "tests": []}', "newer perfguard (schema 9"),
        ('{"schema": 1, "tests": [{"nodeid": "a", "outcome": "slower"}]}', "unknown outcome"),
        ('{"schema": 1, "tests": [{"nodeid": "a", "outcome": "new", "delta_pct": "5%"}]}',
         "tests[0] (a).delta_pct: expected a number"),
        ('{"schema": 1, "tests": [{"nodeid": "a", "outcome": "new", "ops": [{"current_ns": []}]}]}',
         "ops[0].current_ns: expected a number"),
    ],
)  # fmt: skip
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
    assert json.dumps(session["results"], sort_keys=True) == before


# --------------------------------------------------------------------------- summary.md


def test_markdown_lines_details_and_link(session):
    md = render_markdown(session["results"])
    assert md.startswith(
        "## perfguard :x: FAIL: 2 regressed, 1 improved, 2 unchanged, 1 no-baseline"
    )
    bullets = [line for line in md.splitlines() if line.startswith("- ")]
    assert [b.split("**")[1] for b in bullets] == ["regressed", "regressed", "improved"]
    slower = next(b for b in bullets if "test_slower" in b)
    t = next(t for t in session["results"]["tests"] if t["nodeid"].endswith("test_slower"))
    assert fmt_pct(t["delta_pct"]) in slower and fmt_ns(t["median_current_ns"]) in slower
    details = md[md.index("<details>") : md.index("</details>")]
    assert "3 other tests (unchanged: 2, no-baseline: 1)" in details
    assert details.count("\n| `") == 3
    assert md.rstrip().endswith(f"({REPORT_URL_PLACEHOLDER})")
    assert len(md) < 65536


def test_markdown_keeps_hostile_names_in_code_spans(session):
    md = render_markdown(session["results"])
    row = next(line for line in md.splitlines() if "test_evil" in line)
    # a backtick run inside the name gets a longer fence; the table pipe is escaped
    assert "``tests/test_evil.py::test_x[<b>\\|`tick`]``" in row
    outside = re.sub(r"(`+).*?\1", "", md)  # text outside code spans
    assert "<b>" not in outside and "<script" not in outside


def test_markdown_appends_to_github_step_summary(session, tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = write_markdown(session["results"], tmp_path / "summary.md", report_url="https://x/y")
    text = out.read_text()
    assert text.rstrip().endswith("(https://x/y)")
    assert summary.read_text() == "earlier step\n" + text + "\n"


# --------------------------------------------------------------------------- CLI


def test_cli_report_from_results_json(session, tmp_path, capsys):
    from perfguard.cli import main

    src = tmp_path / "results.json"
    src.write_text(json.dumps(session["results"]))
    assert main(["report", str(src), "--markdown", str(tmp_path / "s.md")]) == 0
    doc = parse((tmp_path / "report.html").read_text())
    assert len(rows(doc.find("table", id="tests"))) == 6
    assert (tmp_path / "s.md").read_text().startswith("## perfguard :x: FAIL")
    assert "2 regressed" in capsys.readouterr().out


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
        b = store.save_run(RunInfo("a" * 40, "main", False, "2026-01-01T00:00:00Z", fp),
                           [TestRecord(cur.nodeid, base.metric, base.samples, base.op_samples,
                                       base.ops, base.kernels, {})])  # fmt: skip
        c = store.save_run(RunInfo("d" * 40, "pr", False, "2026-01-02T00:00:00Z", fp), [cur])
    out = tmp_path / "store.html"
    argv = ["report", str(store_path), "--run", str(c), "--baseline-run", str(b), "-o", str(out)]
    assert main(argv) == 0
    doc = parse(out.read_text())
    assert cell_texts(doc.find("table", id="tests"))[0][:2] == [cur.nodeid, "regressed"]
    assert "a" * 12 in doc.find("dl", id="commits").text()
    history = doc.find("details", cls="history")
    assert [r[0] for r in cell_texts(history.find("table"))] == ["a" * 12, "d" * 12]
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
    assert top[0][5] == f"{share:.1f} %"
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
