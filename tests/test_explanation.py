"""One explanation, rendered everywhere: real CPU captures of a small attention model in
real git repositories, across commits and sessions.

A reviewer reads the failure message, the terminal, ``summary.md``, ``report.html``,
the JUnit properties or ``results.json``; each must say what regressed, the same way,
because each renders the judge's one :class:`~perfguard.compare.explanation.Explanation`.
The baseline is looked up per test (a partial save never hides a test), the gates hold
across worker counts, and the plugin, ``perfguard report --run``, ``perfguard compare``
and the bisect oracle judge one store the same way.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch  # noqa: F401
from test_plugin import _profiler_loaded, commit, entry, init_repo, results, run  # noqa: F401

import perfguard.plugin.session  # noqa: F401  (before pytester snapshots sys.modules)

pytest_plugins = ["pytester"]

MODEL = """
import pytest
import torch
from torch.nn import functional as F

torch.set_num_threads(1)
ATTENTION = "{attention}"  # "fused": one SDPA op; "matmul": bmm, masked_fill, softmax
SOFTMAX = torch.{softmax}
torch.manual_seed(0)
X = torch.randn(2, 4, 16, 8)
MASK = torch.tril(torch.ones(16, 16)) == 0


def attend(q, k, v):
    if ATTENTION == "fused":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    att = (q @ k.transpose(-2, -1)) * k.size(-1) ** -0.5
    att = att.masked_fill(MASK, float("-inf"))
    return F.softmax(att.to(SOFTMAX), dim=-1).to(q.dtype) @ v


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1)
def test_attention(gpuprofile):
    for _ in gpuprofile.iterations():
        with torch.profiler.record_function('block "q"'):
            attend(X, X, X)


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1)
def test_two_heads(gpuprofile):
    for _ in gpuprofile.iterations():
        attend(X[:, :2], X[:, :2], X[:, :2])
"""


@pytest.fixture
def repo(pytester: pytest.Pytester) -> pytest.Pytester:
    """An empty git repository with a pytest.ini, as the project under test."""
    return init_repo(pytester)


ATT = "test_model.py::test_attention"
TWO = "test_model.py::test_two_heads"


def model(pytester: pytest.Pytester, attention: str = "matmul", softmax: str = "float32") -> None:
    pytester.makepyfile(test_model=MODEL.format(attention=attention, softmax=softmax))


def failure_text(result: pytest.RunResult, nodeid: str) -> str:
    """The failure message pytest printed for ``nodeid`` (its section of FAILURES)."""
    out = result.stdout.str()
    name = nodeid.split("::")[-1]
    start = out.index(f"_ {name} _")
    end = min(i for i in (out.find("\n____", start + 1), out.find("\n====", start + 1)) if i > 0)
    return out[start:end]


def test_every_view_names_the_same_culprit(repo: pytest.Pytester) -> None:
    """A dtype change decided by the gates: the failure message, the terminal, summary.md,
    report.html, JUnit and results.json all lead with it, in the same words."""
    model(repo)
    base = commit(repo.path, "A: float32 softmax")
    run(repo, "--perfguard-save").assert_outcomes(passed=2)
    model(repo, softmax="float64")
    commit(repo.path, "B: softmax in float64")
    junit = repo.path / "junit.xml"
    r = run(repo, f"--junitxml={junit}")
    r.assert_outcomes(failed=2)
    doc = results(repo)
    out = repo.path / ".perfguard"
    md = (out / "summary.md").read_text(encoding="utf-8")
    page = html.unescape((out / "report.html").read_text(encoding="utf-8"))
    props = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in ET.parse(junit).getroot().iter("testcase")
    }
    timelines = set()
    for nodeid in (ATT, TWO):
        t = entry(doc, nodeid)
        why = t["explanation"]
        assert t["outcome"] == "regressed" and t["baseline_commit"] == base
        assert why["decided_by"] in ("gates", "gates and timing")
        first = why["culprits"][0]
        assert first["kind"] == "dtypes" and "aten::softmax" in first["op"], first
        assert "input dtypes fp32 → fp64" in first["text"]
        assert why["headline"] == f"gates: {why['lead']}" or why["headline"].startswith(
            f"gates: {why['lead']}; timing"
        )
        assert why["lead"] == first["text"]
        # the failure message: the headline, then each line of the explanation
        failure = failure_text(r, nodeid)
        assert f"regressed against the baseline at {base[:12]}: {why['headline']}" in failure
        for line in why["lines"]:
            assert f"- {line}" in failure
        # the terminal: the table's why cell starts with the lead; the lines follow
        row = next(x for x in r.outlines if x.startswith(nodeid) and " regressed " in x)
        assert why["lead"][:40] in row
        assert f"regressed {nodeid}: {why['headline']}" in r.stdout.str()
        # summary.md: the bullet of the test says the same (Markdown-escaped)
        bullet = next(x for x in md.splitlines() if f"`{nodeid}`" in x)
        assert re.sub(r"\\(.)", r"\1", bullet).endswith(why["headline"][:190]) or (
            why["headline"][:100] in re.sub(r"\\(.)", r"\1", bullet)
        )
        # report.html: the test's section holds the headline and every line
        assert why["headline"] in page and all(line in page for line in why["lines"])
        # JUnit: the headline and the first culprit
        name = nodeid.split("::")[-1]
        assert props[name]["perfguard_explanation"] == why["headline"]
        assert props[name]["perfguard_culprit_1"] == first["text"]
        # one Perfetto timeline per test, each there
        assert t["timeline"] and (out / t["timeline"]).is_file()
        timelines.add(t["timeline"])
    assert len(timelines) == 2


def test_an_attention_path_change_is_one_grouped_line(repo: pytest.Pytester) -> None:
    """SDPA replaced by matmul + softmax: one line names what was removed and added, with
    calls per iteration as integers, and no child of an added op as a culprit of its own."""
    model(repo, attention="fused")
    commit(repo.path, "A: fused attention")
    run(repo, "--perfguard-save").assert_outcomes(passed=2)
    model(repo, attention="matmul")
    commit(repo.path, "B: attention through matmul")
    run(repo).assert_outcomes(failed=2)
    why = entry(results(repo), ATT)["explanation"]
    group = why["lead"]
    # one line, at the lines of attend() the change rewrote (the head's: ops were added)
    assert re.match(
        r'ops changed (under block "q" )?at test_model\.py:\d+-\d+ in attend: ', group
    ), group
    assert "aten::scaled_dot_product_attention removed" in group
    for op in ("aten::matmul ×2", "aten::softmax", "aten::masked_fill"):
        assert op in group, group
    # minimal: no op added or removed under another op added or removed
    changed = {c["op"] for c in why["culprits"] if c["kind"] in ("added", "removed")}
    for op in changed:
        assert "/" not in op or op.rsplit("/", 1)[0] not in changed, op
    counters = next(x for x in why["lines"] if x.startswith("counters per iteration"))
    assert re.search(r"op calls \d[\d,]* → \d[\d,]*", counters)  # integers
    assert re.search(r"FLOPs [\d.]+ [kMG]?FLOP → [\d.]+ [kMG]?FLOP", counters)  # humanized
    # the test's counters only, each once: an op's own counter move is its culprit's line
    names = [part.split(" ")[0] for part in counters.split(": ", 1)[1].split("; ")]
    assert len(names) == len(set(names)), counters


def test_a_partial_save_never_hides_a_test(repo: pytest.Pytester) -> None:
    """A save of one test (``-k``) at B: the other test is still compared with A's run."""
    model(repo)
    a = commit(repo.path, "A")
    run(repo, "--perfguard-save").assert_outcomes(passed=2)
    (repo.path / "notes.txt").write_text("B\n")
    b = commit(repo.path, "B")
    # unchanged code judged on 3 rounds against 1 stored run: the save is the point, not the
    # timing (a step of microseconds can read slower after a move of its memory)
    run(repo, "--perfguard-save", "-k", "two_heads", "--perfguard-fail-on=never").assert_outcomes(
        passed=1
    )
    model(repo, softmax="float64")
    commit(repo.path, "C: float64")
    run(repo).assert_outcomes(failed=2)
    doc = results(repo)
    att, two = entry(doc, ATT), entry(doc, TWO)
    assert att["outcome"] == "regressed" and att["baseline_commit"] == a
    assert two["outcome"] == "regressed" and two["baseline_commit"] == b
    assert att["explanation"]["culprits"][0]["kind"] == "dtypes"


def test_gates_hold_across_worker_counts(repo: pytest.Pytester) -> None:
    """A serial baseline, a ``-n 2`` session: the gate regression fails it (exit 1); the
    timing says it was not compared and how to fix that."""
    model(repo)
    commit(repo.path, "A")
    run(repo, "--perfguard-save").assert_outcomes(passed=2)
    model(repo, softmax="float64")
    commit(repo.path, "B: float64")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--perfguard", "-p", "no:cacheprovider", "-q"],
        cwd=repo.path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1, r.stdout[-3000:]
    doc = results(repo)
    for nodeid in (ATT, TWO):
        t = entry(doc, nodeid)
        assert t["outcome"] == "regressed" and t["gates"]["outcome"] == "regressed"
        assert t["timing"]["outcome"] == "not-judged"
        assert "workers differs: 1 (baseline) vs 2 (current)" in t["timing"]["message"]
        assert "run with the baseline's -n" in t["timing"]["message"]
        assert t["explanation"]["culprits"][0]["kind"] == "dtypes"
    # the regressed test's lines say why its timing was not judged, not only that
    summary = (repo.path / ".perfguard" / "summary.md").read_text()
    assert "timing not judged: workers differs: 1 (baseline) vs 2 (current)" in summary
    assert "timing not judged: workers differs: 1 (baseline) vs 2 (current)" in r.stdout


def test_the_four_entry_points_agree(repo: pytest.Pytester, capsys) -> None:
    """The plugin, ``perfguard report --run``, ``perfguard compare`` on two stored runs and
    the bisect oracle judge one store alike: outcomes, changes and first culprits."""
    from perfguard.bisect import Settings as BisectSettings
    from perfguard.bisect import _StoreOracle
    from perfguard.cli import main
    from perfguard.compare.stored import results_from_store

    model(repo)
    a = commit(repo.path, "A")
    run(repo, "--perfguard-save").assert_outcomes(passed=2)
    model(repo, softmax="float64")
    b = commit(repo.path, "B")
    run(repo, "--perfguard-save", "--perfguard-fail-on=never").assert_outcomes(passed=2)
    plugin = {t["nodeid"]: t for t in results(repo)["tests"]}
    store = repo.path / "baselines" / "perfguard.db"
    report = results_from_store(store, 2, baseline_ref=a, repo=repo.path)
    capsys.readouterr()
    json_out = repo.path / "compare.json"
    assert main(["compare", f"{store}#2", f"{store}#1", "--json", str(json_out)]) == 1
    compared = {t["nodeid"]: t for t in json.loads(json_out.read_text())["tests"]}
    oracle = _StoreOracle(store, a, [ATT, TWO])
    try:
        bisect = oracle.judge(b, BisectSettings(good=a, bad=b))
    finally:
        oracle.close()
    assert bisect is not None
    for t in report.tests:
        mine = plugin[t.nodeid]
        assert t.outcome.value == mine["outcome"] == compared[t.nodeid]["outcome"] == "regressed"
        delta = mine["timing"]["delta_pct"]  # the figures' one home in an entry
        assert t.delta_pct == pytest.approx(delta)
        assert compared[t.nodeid]["timing"]["delta_pct"] == pytest.approx(delta)
        assert t.explanation is not None
        assert t.explanation.headline == mine["explanation"]["headline"]
        assert t.explanation.timing == mine["explanation"]["timing"]
        first = mine["explanation"]["culprits"][0]["text"]
        assert compared[t.nodeid]["explanation"]["culprits"][0]["text"] == first
    assert all(v.outcome == "regressed" for v in bisect)


def test_compare_against_keeps_its_report(repo: pytest.Pytester, tmp_path: Path) -> None:
    """``perfguard compare --against`` writes where ``--output`` says and keeps it."""
    model(repo)
    commit(repo.path, "A")
    model(repo, softmax="float64")
    commit(repo.path, "B")
    out = tmp_path / "ab"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfguard.cli",
            "compare",
            "--against",
            "HEAD~1",
            "--pytest-args",
            "-k attention --perfguard-ab-pairs=3 --perfguard-ab-budget=0",
            "--output",
            str(out),
        ],
        cwd=repo.path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"report: {out / 'report.html'}" in r.stdout
    assert (out / "report.html").is_file() and (out / "summary.md").is_file()
    assert "input dtypes" in r.stdout


def test_dtype_change_names_the_input_that_changed() -> None:
    """torch's per-input type lists read as the types that changed, in the short names the
    peaks use, with the input's position when the op has several."""
    from perfguard.compare.culprits import dtype_change

    before = '["float","long int","","Scalar","Scalar","Scalar"]'
    after = '["double","long int","","Scalar","Scalar","Scalar"]'
    assert dtype_change(before, after) == "fp32 → fp64 (input 1 of 6)"
    assert dtype_change('["float"]', '["c10::BFloat16"]') == "fp32 → bf16"
    two = dtype_change('["float","float"]', '["c10::Half","double"]')
    assert two == "fp32 → fp16 (input 1 of 2), fp32 → fp64 (input 2 of 2)"
    assert dtype_change("fp32", "fp64") == "fp32 → fp64"  # not lists: as they are
    assert dtype_change('["float"]', '["float","float"]') == '["float"] → ["float","float"]'


def test_a_forward_dtype_change_ranks_before_the_backward_one() -> None:
    """A dtype finding carries its op's direction, so the rule "a forward op's change before
    the backward one that follows from it" holds for dtypes too, whatever the times (A/B
    once led with ``SoftmaxBackward0`` because a finding had no direction)."""
    from perfguard.compare.culprits import _rank, _switch_culprit
    from perfguard.compare.gates import GateFinding

    def finding(op: str) -> GateFinding:
        return GateFinding(
            gate="dtypes",
            op_name=op,
            kernel_name="",
            baseline='["float"]',
            current='["double"]',
            budget="",
            message="",
        )

    fwd, bwd = "attn/aten::softmax", "autograd::engine::evaluate_function: SoftmaxBackward0"
    impact = {(fwd, "fprop"): 485.5, (bwd, "bprop"): 3099.5}
    forward, backward = _switch_culprit(finding(fwd), impact), _switch_culprit(finding(bwd), impact)
    assert (forward.direction, backward.direction) == ("fprop", "bprop")
    assert sorted([backward, forward], key=lambda c: _rank(c, set())) == [forward, backward]


def test_an_op_whose_calls_changed_gets_no_dtype_finding(tmp_path: Path) -> None:
    """An op's dtypes are its first call's. Real captures: a reshape of int64 labels, then
    the same plus two fp32 reshapes that copy (a tiny GPT's explicit attention): the op's
    calls grew and the calls gate says so, but no input changed type, so no
    "input dtypes int64 → fp32" finding (read on that GPT's report)."""
    import torch as t

    import perfguard
    from perfguard.analysis import analyze
    from perfguard.baseline.record import record_from_analysis
    from perfguard.capture.torch_profiler import profile_torch
    from perfguard.compare.comparison import kernel_changes
    from perfguard.compare.gates import judge_gates, parse_gates

    labels = t.randint(0, 9, (4, 8))
    x = t.randn(2, 3, 4, 5)

    def record(extra: bool, name: str):
        path = tmp_path / f"{name}.pt.trace.json.gz"
        with profile_torch(path, device="cpu"):
            for _ in range(3):
                with t.profiler.record_function("perfguard.iteration"):
                    if extra:
                        for _ in range(2):
                            x.transpose(1, 2).reshape(2, -1)  # not contiguous: a clone
                    labels[:, 1:].reshape(-1)  # a clone of int64 values
        return record_from_analysis("t", analyze(perfguard.load_trace(path)))

    base, more = record(False, "base"), record(True, "more")
    found = judge_gates(more, base, parse_gates({}), kernel_changes(more, base))
    gates = {(f.gate, f.op_name.rsplit("/", 1)[-1]) for f in found.regressions}
    assert any(g == "calls" for g, _ in gates), gates  # the new calls: gated, named
    assert not [f for f in found.regressions if f.gate == "dtypes"], found.regressions


def test_a_counters_top_movers_name_each_op_once(tmp_path: Path) -> None:
    """The calls gate's line lists the ops that moved most by the name it shows: an op that
    moved under two parents (a real training step's ``aten::transpose`` in the forward and
    under ``TransposeBackward0``) read "aten::transpose 1 → 13; aten::transpose 1 → 13".
    Real captures: transposes added at the top of the step and inside a named range."""
    import torch as t

    import perfguard
    from perfguard.analysis import analyze
    from perfguard.baseline.record import record_from_analysis
    from perfguard.capture.torch_profiler import profile_torch
    from perfguard.compare.comparison import kernel_changes
    from perfguard.compare.gates import judge_gates, parse_gates

    x = t.randn(8, 16)

    def record(extra: int, name: str):
        path = tmp_path / f"{name}.pt.trace.json.gz"
        with profile_torch(path, device="cpu"):
            for _ in range(3):
                with t.profiler.record_function("perfguard.iteration"):
                    for _ in range(extra):
                        x.t()
                    with t.profiler.record_function("block"):
                        for _ in range(extra):
                            x.t()
                    x.sum()
        return record_from_analysis("t", analyze(perfguard.load_trace(path)))

    base, more = record(1, "base"), record(4, "more")
    found = judge_gates(more, base, parse_gates({}), kernel_changes(more, base))
    line = next(f.message for f in found.regressions + found.immaterial if f.gate == "calls")
    movers = [m.rsplit(" ", 3)[0] for m in line.split(": ", 1)[1].split("; ")]
    assert len(movers) == len(set(movers)), line  # each once, its paths' calls summed
    assert "aten::as_strided 2 → 8" in line, line  # under x.t(), at both places
