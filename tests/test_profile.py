"""A test's profile (compare/profile.py, report/profile.py): the figures are
``perfguard analyze``'s on the same capture, and a 100-test session's pages stay small."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from perfguard.analysis import analyze
from perfguard.baseline.record import record_from_analysis
from perfguard.compare.profile import TestProfile, profile_of, run_figures
from perfguard.compare.results import Machine, Run, SessionResults, TestEntry
from perfguard.compare.timing import not_judged
from perfguard.report.html.session import render_session_html
from perfguard.report.markdown import render_markdown
from perfguard.report.profile import one_line
from perfguard.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
#: a real H200 capture (bf16 MLP block, eager): Tensor Core GEMMs, FLOP efficiency
H200 = ROOT / "tests" / "data" / "gpu_h200" / "eager.pt.trace.json.gz"
#: a real CPU capture of the examples' CNN training step (nested aten ops, backward)
CPU = ROOT / "examples" / "captures" / "a100_alexnet_tiny_cudasync.pt.trace.json.gz"


def _profile(path: Path) -> TestProfile:
    analysis = analyze(load_trace(path))
    record = record_from_analysis("t.py::test", analysis)
    record.meta["profile"] = run_figures(analysis)
    profile = profile_of(record, top=1000)
    assert profile is not None
    return profile


def _analyze_cli(path: Path, out: Path) -> tuple[list[dict], dict]:
    """``perfguard analyze``'s detail and summary reports (JSON), run as a user runs it."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "perfguard",
            "analyze",
            "-d",
            str(path),
            "--output-path",
            str(out),
            "--reports",
            "detail,summary",
            "--formats",
            "json",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    detail = json.loads((out / "dlprof_detail.json").read_text())
    summary = json.loads((out / "dlprof_summary.json").read_text())
    return detail, summary


@pytest.mark.parametrize("capture", [H200, CPU], ids=["h200", "a100-cudasync"])
def test_profile_figures_are_analyzes(capture: Path, tmp_path: Path) -> None:
    """Every op figure of the profile is the detail report's total; the run figures are the
    summary report's (GPU idle = 100 - GPU utilization, TC utilization)."""
    profile = _profile(capture)
    detail, summary = _analyze_cli(capture, tmp_path)
    rows = {(d["Op Name"], d["Direction"]): d for d in detail}
    assert len(profile.ops) == len(rows)
    for op in profile.ops:
        d = rows[(op.op_name, op.direction)]
        assert op.calls == d["No. Calls"]
        assert op.gpu_time_ns == d["Total GPU Time (ns)"]
        assert op.cpu_time_ns == d["Total CPU Time (ns)"]
        assert op.kernels == d["No. Kernels"]
        assert op.tc_eligible == d["TC Eligibility"]
        assert op.tc_utilization == pytest.approx(d["TC Utilization (%)"], nan_ok=True) or (
            op.tc_utilization is None and d["TC Utilization (%)"] is None
        )
        assert (op.flops or 0.0) == pytest.approx(d["FLOPs"] or 0.0)
        eff = d.get("FLOP Efficiency (%)")
        assert (op.flop_efficiency is None and eff is None) or op.flop_efficiency == pytest.approx(
            eff
        )
    assert profile.device == summary["GPU Names"]
    assert profile.gpu_idle_pct == pytest.approx(100.0 - summary["GPU Utilization (%)"])
    tc = summary["Tensor Core Kernel Utilization (%)"]
    assert (profile.tc_utilization is None and tc is None) or profile.tc_utilization == tc
    assert profile.iterations == summary["Iterations"]


def test_gpu_profile_splits_gpu_time_and_weighs_efficiency() -> None:
    """On the H200 capture the ops' GPU time splits the step (shares add to 100 %), addmm
    leads on Tensor Cores, and the test's efficiency is its FLOP ops' time-weighted one."""
    p = _profile(H200)
    assert p.basis == "gpu" and p.ops[0].short_name == "aten::addmm"
    assert sum(op.share_pct or 0.0 for op in p.ops) == pytest.approx(100.0)
    top = p.ops[0]
    assert top.using_tc and top.tc_utilization == 100.0
    assert p.flop_efficiency == pytest.approx(top.flop_efficiency)  # its only FLOP op with one
    assert p.counters["memcpy"] == 1.0  # one copy per iteration, the gates' counter
    line = one_line(_entry(p))
    assert "top op aten::addmm 56% of GPU time" in line
    assert "TC 100% of eligible ops' kernel time" in line
    assert "FLOP efficiency 6.9% of the NVIDIA H200 peak" in line


def test_cpu_profile_is_self_time_of_nested_ops() -> None:
    """Without GPU time an op's part is its self CPU time: nested ops' time is not counted
    twice, so the parts add up to the outermost ops' CPU time."""
    analysis = analyze(load_trace(H200))
    record = record_from_analysis("t.py::test", analysis)
    record.ops["gpu_time_total"] = 0  # the same ops, as a CPU capture would have them
    p = profile_of(record, top=1000)
    assert p is not None and p.basis == "cpu"
    outer = sum(op.cpu_time_ns or 0.0 for op in p.ops if "/" not in op.op_name)
    assert p.op_time_ns == pytest.approx(outer)
    linear = next(op for op in p.ops if op.op_name == "aten::linear")
    children = [op for op in p.ops if op.op_name.rpartition("/")[0] == "aten::linear"]
    nested = sum(op.cpu_time_ns or 0.0 for op in children)
    assert linear.time_ns == pytest.approx((linear.cpu_time_ns or 0.0) - nested)


def _entry(profile: TestProfile, nodeid: str = "t.py::test", outcome: str = "no-baseline"):
    timing = not_judged("gpu_time", "no baseline", 0.05, median_current_ns=1.2e6)
    return TestEntry.from_dict(
        {
            "nodeid": nodeid,
            "outcome": outcome,
            "timing": msgspec.to_builtins(timing),
            "samples_current": [1.2e6 + 1e3 * k for k in range(20)],
            "rounds_current": [1.2e6] * 5,
            "profile": profile.to_dict(),
        }
    )


def test_profile_round_trips_through_results_json() -> None:
    p = _profile(H200)
    entry = _entry(p)
    again = TestEntry.from_dict(json.loads(json.dumps(entry.to_dict())))
    assert again.profile == entry.profile == p


def test_hundred_tests_keep_the_report_and_the_comment_small(tmp_path: Path) -> None:
    """100 profiled tests: every profile is in the page, collapsed; the sizes are stated
    in docs/design.md (measured here: about 1.4 MB of HTML and 30 kB of Markdown)."""
    p = _profile(H200)
    doc = SessionResults(
        tests=[
            _entry(p, f"tests/test_model.py::test_case_{k:03d}", "unchanged") for k in range(100)
        ],
        run=Run(
            commit="a" * 40,
            branch="main",
            dirty=False,
            time="2026-01-01",
            fingerprint=Machine(gpu_name="NVIDIA H200", gpu_count=1, backend="torch"),
        ),
        settings={"tolerance": 0.05, "alpha": 0.01, "fail_on": "regression", "backend": "torch"},
    )
    html = render_session_html(doc)
    md = render_markdown(doc)
    assert html.count('<details class="profile">') == 100
    assert md.count("top op aten::addmm") == 100
    assert len(html.encode()) < 2_000_000
    assert len(md) < 65_536 // 2  # GitHub's comment limit, with room for the rest
    (tmp_path / "sizes.json").write_text(json.dumps({"html": len(html.encode()), "md": len(md)}))


def test_compare_of_two_captures_judges_their_iterations_and_names_the_test(
    tmp_path: Path,
) -> None:
    """``perfguard compare`` of two captures: the iterations are the samples (said so), no
    ``nan`` anywhere, and the test is named from the session's results.json that holds it."""
    captures = tmp_path / ".perfguard" / "captures"
    captures.mkdir(parents=True)
    a, b = captures / "t_a.pt.trace.json.gz", tmp_path / "t_b.pt.trace.json.gz"
    a.write_bytes(H200.read_bytes())
    b.write_bytes(H200.read_bytes())
    doc = {
        "schema": 2,
        "tests": [
            {"nodeid": "tests/test_mlp.py::test_step", "outcome": "no-baseline", "capture": str(a)}
        ],
    }
    (tmp_path / ".perfguard" / "results.json").write_text(json.dumps(doc))
    done = subprocess.run(
        [sys.executable, "-m", "perfguard", "compare", str(a), str(b)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "timing: each capture's per-iteration gpu_time" in out
    assert "tests/test_mlp.py::test_step" in out and "t_a.pt" not in out
    assert "nan" not in out.lower() and " n/a " not in out
    assert "10/10" in out  # ten iterations a side


def test_report_link_is_a_real_link_or_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    """GitHub Actions' run page from its environment; a given URL wins; else no dead link."""
    from perfguard.report.markdown import report_link

    for key in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID", "PERFGUARD_REPORT_URL"):
        monkeypatch.delenv(key, raising=False)
    assert "](" not in report_link() and "PERFGUARD_REPORT_URL" in report_link()
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/model")
    monkeypatch.setenv("GITHUB_RUN_ID", "42")
    assert report_link().endswith("(https://github.com/acme/model/actions/runs/42)")
    assert report_link("https://ci.example/r.html").endswith("(https://ci.example/r.html)")
    monkeypatch.setenv("PERFGUARD_REPORT_URL", "https://pages.example/r.html")
    assert report_link().endswith("(https://pages.example/r.html)")
