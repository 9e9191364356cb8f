"""The pytest plugin end to end: real CPU captures (torch profiler) in real git repositories.

Each test builds a project with ``pytester`` and runs pytest on it, in
process (torch is imported once) except where a clean interpreter is the
point (heavy imports).

The benchmark workload is a real matmul chain plus a 30 ms blocking wait
that stands in for the device (a CPU-only machine has none). The wait
dominates on purpose: on this shared 2-core machine, CPU-bound iteration
times swing up to 2x between sessions with other jobs' load (measured: wall
time doubled while the thread's CPU time stayed within ~5%), which would
make any wall-time verdict flaky; a 30 ms wait moved by a few percent, also
with three extra busy loops running. The regression of commit C is a real
extra blocking op in the step (``extra_sync``, 10 ms: the classic stray
host-device synchronisation), so the trace, the analysis and the verdict
all see a real change.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch  # noqa: F401

# Loaded here, before pytester snapshots sys.modules: the in-process runs would
# otherwise drop torch after each run and the next import of it crashes.
import perfguard.plugin.session  # noqa: F401
from perfguard.baseline.reader import Reader
from perfguard.baseline.store import Store
from perfguard.capture.capturers import capture_name
from perfguard.capture.torch_profiler import TRACE_SUFFIX
from perfguard.compare.tolerance import parse_tolerance
from perfguard.plugin.marker import parse_marker

pytest_plugins = ["pytester"]

BENCH = """
import time

import pytest
import torch

torch.set_num_threads(1)
A = torch.randn(128, 128)
EXTRA_SYNC = {extra}


def step():
    x = torch.tanh(A @ A) @ A
    with torch.profiler.record_function("wait_for_device"):
        time.sleep(0.030)
    if EXTRA_SYNC:
        with torch.profiler.record_function("extra_sync"):
            time.sleep(0.010)
    return x


@pytest.mark.gpuprofile(iterations=4, rounds=4, warmup=1, tolerance="15%")
def test_train_step(gpuprofile):
    for _ in gpuprofile.iterations():
        step()


@pytest.mark.gpuprofile
def test_whole_call():
    step()
"""
TRAIN = "test_bench.py::test_train_step"
WHOLE = "test_bench.py::test_whole_call"


@pytest.fixture(scope="module", autouse=True)
def _profiler_loaded(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Run the profiler once before any pytester snapshot (see the imports above).

    Starting ``torch.profiler`` imports more of torch on first use; modules
    loaded inside an in-process run are dropped after it, and torch cannot
    register them twice.
    """
    from perfguard.capture.torch_profiler import profile_torch

    with profile_torch(tmp_path_factory.mktemp("warm") / "t.json", device="cpu"):
        torch.ones(2) @ torch.ones(2)


def git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def commit(path: Path, message: str) -> str:
    git(path, "add", "-A", "--", ".", ":!baselines", ":!.perfguard")
    git(path, "commit", "-q", "-m", message)
    return git(path, "rev-parse", "HEAD")


@pytest.fixture
def repo(pytester: pytest.Pytester) -> pytest.Pytester:
    """An empty git repository with a pytest.ini, as the project under test."""
    return init_repo(pytester)


def init_repo(pytester: pytest.Pytester) -> pytest.Pytester:
    """``pytester``'s folder made an empty git repository with a pytest.ini."""
    pytester.makeini("[pytest]\n")
    git(pytester.path, "init", "-q", "-b", "main")
    git(pytester.path, "config", "user.email", "ci@example.com")
    git(pytester.path, "config", "user.name", "CI")
    git(pytester.path, "config", "commit.gpgsign", "false")
    return pytester


def bench(pytester: pytest.Pytester, *, extra: bool, comment: str = "") -> None:
    pytester.makepyfile(test_bench=BENCH.format(extra=extra) + comment)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess("--perfguard", "-p", "no:cacheprovider", *args)


def results(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / ".perfguard" / "results.json").read_text())


def entry(doc: dict, nodeid: str) -> dict:
    (found,) = [t for t in doc["tests"] if t["nodeid"] == nodeid]
    return found


def store_runs(pytester: pytest.Pytester) -> list[tuple]:
    with sqlite3.connect(pytester.path / "baselines" / "perfguard.db") as db:
        return db.execute('SELECT run_id, "commit", dirty FROM runs ORDER BY run_id').fetchall()


# ---------------------------------------------------------------------------------- flow


def test_baseline_unchanged_regressed_incomparable_dirty(repo: pytest.Pytester) -> None:
    path = repo.path
    # A: the first commit has no baseline; --perfguard-save stores the run under A
    bench(repo, extra=False)
    sha_a = commit(path, "A")
    r = run(repo, "--perfguard-save")
    r.assert_outcomes(passed=2)
    doc = results(repo)
    assert doc["baseline"] is None
    assert doc["counts"] == {"no-baseline": 2}
    assert doc["run"]["commit"] == sha_a and doc["run"]["dirty"] is False
    assert doc["run"]["fingerprint"]["backend"] == "cpu"
    whole = entry(doc, WHOLE)
    assert whole["timing"]["n_current"] == 1
    assert "captured as one iteration" in " ".join(whole["notes"])
    assert store_runs(repo) == [(1, sha_a, 0)]
    r.stdout.fnmatch_lines(["*= perfguard =*", f"*{TRAIN}*no-baseline*", "*saved run 1*"])
    # a first run shows where each test's time goes: its profile, in every output
    profile = entry(doc, TRAIN)["profile"]
    top = profile["ops"][0]
    assert profile["basis"] == "cpu" and top["op_name"] == "wait_for_device"
    line = next(
        i
        for i, text in enumerate(BENCH.strip("\n").splitlines(), 1)
        if 'record_function("wait_for_device")' in text
    )
    assert 80 < top["share_pct"] < 100 and top["call_site"] == f"test_bench.py:{line} in step"
    assert top["calls"] == profile["iterations"] == 4  # one profiled round of 4 iterations
    html = (path / ".perfguard" / "report.html").read_text()
    assert html.count('<details class="profile">') == 2 and "split by op" in html
    # a CPU run: no Tensor Core or FLOP-efficiency column, said once per profile, no n/a
    assert "<th>Tensor Cores</th>" not in html and "FLOP efficiency</th>" not in html
    assert html.count("A CPU capture: no GPU kernels") == 2
    profiles = html.split('<details class="profile">')[1:]
    assert not any(">n/a<" in p.split("</details>")[0] for p in profiles)  # no n/a cell
    summary = (path / ".perfguard" / "summary.md").read_text()
    assert "Profiles of 2 tests" in summary
    assert f"`{TRAIN}` (no-baseline): " in summary and "top op wait\\_for\\_device" in summary

    # B: same workload, one commit later: compared with A; unchanged (or noisy when the
    # machine is busy, e.g. under -n 2): never a failure
    bench(repo, extra=False, comment="\n# refactor: no change to the step\n")
    sha_b = commit(path, "B")
    r = run(repo, "--perfguard-save")
    r.assert_outcomes(passed=2)
    doc = results(repo)
    # the walk starts at HEAD (B, no run yet) and finds A one first-parent step back
    assert doc["baseline"] == {"ref": sha_b, "commit": sha_a, "run_id": 1, "ab": False}
    train = entry(doc, TRAIN)
    assert train["outcome"] in ("unchanged", "noisy"), train["message"]
    assert (
        train["timing"]["n_current"] == train["timing"]["n_baseline"] == 4
    )  # rounds are the replicates
    assert len(train["samples_current"]) == 16
    assert train["gates"]["outcome"] == "unchanged", train["gates"]["message"]
    assert "syncs" in train["gates"]["checked"] and "calls" in train["gates"]["checked"]
    assert "1 of the 5 runs needed" in train["timing"]["replicated"]
    assert train["profile"]["ops"][0]["op_name"] == "wait_for_device"  # unchanged: profiled too
    assert [h["commit"] for h in train["history"]] == [sha_a]  # history before this run
    assert store_runs(repo)[-1] == (2, sha_b, 0)

    # C: one real extra blocking op per step (+10 ms on ~31 ms): regressed, the test fails;
    # the gates see the new op whatever the machine's load, the timing sees +30 %
    bench(repo, extra=True)
    commit(path, "C")
    r = run(repo, "--junitxml=junit.xml")
    # the whole-call test runs step() too: one round, so no timing verdict, but its
    # gates see the new op as well
    r.assert_outcomes(failed=2)
    r.stdout.fnmatch_lines([f"{TRAIN}*regressed*", f"FAILED {TRAIN} - Failed: perfguard: *"])
    doc = results(repo)
    assert doc["baseline"]["commit"] == sha_b  # the nearest first-parent run
    whole = entry(doc, WHOLE)
    assert whole["outcome"] == "regressed" and whole["timing"]["outcome"] == "not-judged"
    assert "too few rounds" in whole["timing"]["message"]
    train = entry(doc, TRAIN)
    assert train["outcome"] == "regressed"
    calls = [f for f in train["gates"]["regressions"] if f["gate"] == "calls"]
    assert calls and calls[0]["op_name"] == "extra_sync", train["gates"]
    assert calls[0]["current"] - calls[0]["baseline"] == pytest.approx(1.0)  # per iteration
    timing = train["timing"]
    assert timing["delta_pct"] > 15 and timing["mode"] == "store"
    assert timing["outcome"] in ("regressed", "noisy"), timing["message"]
    why = train["explanation"]  # the new op leads: the gates decided, whatever the timing
    assert (why["culprits"][0]["op"], why["culprits"][0]["kind"]) == ("extra_sync", "added")
    assert train["message"] == why["headline"] and why["headline"].startswith("gates: ")
    text = "\n".join([why["headline"], *why["lines"]])
    # the culprit names the statement that opened the range, its exact line (the call-site
    # pass), and the function it is in
    line = next(
        i
        for i, text in enumerate(BENCH.strip("\n").splitlines(), 1)
        if 'record_function("extra_sync")' in text
    )
    assert f"extra_sync added at test_bench.py:{line} in step" in why["headline"], why["headline"]
    for part in (
        "added at test_bench.py:",
        "ms per iteration)",
        "wall time",
        "rounds",
        "counters per iteration: op calls",
    ):
        assert part in text, text
    failure = "\n".join(r.outlines)
    assert f"perfguard: {TRAIN} regressed against the baseline at {sha_b[:12]}" in failure
    # the figures, cross-checked against the raw samples in results.json: a wall-time
    # round is the fastest of its 4 iterations, the change the ratio of the rounds'
    # geometric means
    cur, base = np.array(train["samples_current"]), np.array(train["samples_baseline"])
    rounds_cur = [np.min(cur[k * 4 : (k + 1) * 4]) for k in range(4)]
    assert train["rounds_current"] == pytest.approx(rounds_cur, abs=1)
    rb, rc = np.log(train["rounds_baseline"]), np.log(train["rounds_current"])
    assert train["timing"]["delta_pct"] == pytest.approx(
        100 * np.expm1(rc.mean() - rb.mean()), rel=1e-6
    )
    # the samples are nanoseconds and hold the step's waits: a sleep never returns early,
    # so every current iteration took 30 + 10 ms at least and every baseline one 30 ms (no
    # upper bound: a loaded machine only adds); that the 10 ms is new is the ops' verdict
    assert cur.min() >= 40e6 and base.min() >= 30e6
    assert min(train["rounds_current"]) >= 40e6
    assert isinstance(train["findings"], list)  # the expert system ran on the capture
    assert all({"check", "severity", "problem"} <= set(f) for f in train["findings"])
    top = train["ops"][0]
    assert (top["op_name"], top["status"]) == ("extra_sync", "added")
    assert top["baseline_ns"] is None  # nowhere in the baseline's profiled round
    assert top["current_ns"] >= 10e6 - 1e3  # its 10 ms sleep (Kineto's µs timestamps)
    # the regressed test's capture as a Perfetto timeline, linked from the report
    timeline = path / ".perfguard" / train["timeline"]
    with gzip.open(timeline, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    assert any(e.get("name") == "extra_sync" for e in events)
    html = (path / ".perfguard" / "report.html").read_text()
    assert f'href="{train["timeline"]}"' in html
    # the capture is a real Kineto trace with the profiled round's 4 iterations in it (the
    # 4 timing rounds ran with the profiler off)
    from perfguard.trace import load_trace

    trace = load_trace(train["capture"])
    assert (trace.ranges["name"] == "perfguard.iteration").sum() == 4
    # junit carries the figures
    props = {
        p.get("name"): p.get("value")
        for case in ET.parse(path / "junit.xml").iter("testcase")
        if case.get("name") == "test_train_step"
        for p in case.iter("property")
    }
    assert props["perfguard_outcome"] == "regressed"
    assert float(props["perfguard_delta_pct"]) == pytest.approx(train["timing"]["delta_pct"])

    # fail-on=never reports the regression without failing
    r = run(repo, "--perfguard-fail-on=never")
    r.assert_outcomes(passed=2)
    assert entry(results(repo), TRAIN)["outcome"] == "regressed"

    # another machine: every stored run's CPU rewritten -> incomparable, never a failure
    with sqlite3.connect(path / "baselines" / "perfguard.db") as db:
        for run_id, fp in db.execute("SELECT run_id, fingerprint FROM runs").fetchall():
            other = {**json.loads(fp), "cpu": "Some Other CPU 9000"}
            db.execute(
                "UPDATE runs SET cpu=?, fingerprint=? WHERE run_id=?",
                ("Some Other CPU 9000", json.dumps(other), run_id),
            )
    # ... measured on a dirty tree, which the saved run records
    bench(repo, extra=True, comment="\n# uncommitted edit\n")
    r = run(repo, "--perfguard-save")
    r.assert_outcomes(passed=2)
    doc = results(repo)
    assert doc["counts"] == {"incomparable": 2}
    assert "cpu differs" in entry(doc, TRAIN)["message"]
    assert doc["run"]["dirty"] is True
    assert store_runs(repo)[-1][2] == 1
    r.stdout.fnmatch_lines(["*baseline: only incomparable runs*cpu differs*", "*dirty tree*"])


def test_no_baseline_in_store_is_no_baseline(repo: pytest.Pytester) -> None:
    repo.makepyfile(
        test_one="""
        import time
        import pytest

        @pytest.mark.gpuprofile(iterations=6, warmup=1)
        def test_sleep(gpuprofile):
            for _ in gpuprofile.iterations():
                time.sleep(0.001)
        """
    )
    commit(repo.path, "A")
    (repo.path / "README").write_text("b\n")
    commit(repo.path, "B")  # HEAD has a parent, but no run is stored anywhere
    r = run(repo)
    r.assert_outcomes(passed=1)
    doc = results(repo)
    assert doc["baseline"] is None and doc["counts"] == {"no-baseline": 1}
    only = doc["tests"][0]
    # 5 rounds (the default) of 6 iterations: the rounds are what a verdict counts
    assert only["timing"]["n_current"] == 5 and len(only["samples_current"]) == 30
    assert only["baseline_commit"] is None
    assert not (repo.path / "baselines").exists()  # nothing saved without --perfguard-save
    r.stdout.fnmatch_lines(["*baseline: no baseline: no store at*"])


@pytest.mark.parametrize(
    ("args", "store_bytes", "message"),
    [
        (
            ["--perfguard-baseline=no-such-branch"],
            None,
            "ERROR: --perfguard-baseline: *cannot resolve ref 'no-such-branch'*",
        ),
        ([], b"this is not SQLite, just text" * 50, "ERROR: --perfguard-store: *perfguard.db*"),
    ],
    ids=["unknown-ref", "not-a-store"],
)
def test_bad_baseline_ref_or_store_is_a_usage_error(
    repo: pytest.Pytester, args: list[str], store_bytes: bytes | None, message: str
) -> None:
    repo.makepyfile(test_x="def test_x():\n    pass\n")
    commit(repo.path, "A")
    (repo.path / "README").write_text("b\n")
    commit(repo.path, "B")
    if store_bytes is not None:
        (repo.path / "baselines").mkdir()
        (repo.path / "baselines" / "perfguard.db").write_bytes(store_bytes)
    r = run(repo, *args)
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([message])
    if store_bytes is not None:  # refused, never modified
        assert (repo.path / "baselines" / "perfguard.db").read_bytes() == store_bytes


# ----------------------------------------------------------------- failures stay per test


def test_capture_failure_is_an_error_and_the_session_goes_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings from the ini; no git repository (then no baseline, still captured)."""
    pytester.makeini(
        """
        [pytest]
        perfguard = true
        perfguard_backend = cpu
        perfguard_output = out
        """
    )
    pytester.makepyfile(
        test_cap="""
        import time
        import pytest

        @pytest.mark.gpuprofile(iterations=5, warmup=0)
        def test_a_raises(gpuprofile):
            for step in gpuprofile.iterations():
                if step == 2:
                    raise RuntimeError("the workload broke")

        @pytest.mark.gpuprofile(iterations=5, warmup=0)
        def test_b_blocked(gpuprofile):
            for _ in gpuprofile.iterations():
                time.sleep(0.001)

        @pytest.mark.gpuprofile(iterations=5, warmup=0)
        def test_c_fine(gpuprofile):
            for _ in gpuprofile.iterations():
                time.sleep(0.001)

        @pytest.mark.gpuprofile(backend="nsys")
        def test_d_needs_nsys(gpuprofile):
            pass
        """
    )
    monkeypatch.delenv("PERFGUARD_NSYS", raising=False)
    monkeypatch.setenv(
        "PATH",
        os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nsys").exists()
        ),
    )
    name = capture_name("test_cap.py::test_b_blocked") + TRACE_SUFFIX
    blocked = pytester.path / "out" / "captures" / name
    blocked.mkdir(parents=True)  # the trace cannot be written where the capture goes
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=2, failed=1, errors=2)
    r.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_b_blocked*",
            "perfguard: capture of test_cap.py::test_b_blocked failed: "
            "the torch profiler did not start: *Is a directory*",
            "*ERROR at setup of test_d_needs_nsys*",
            "perfguard: backend 'nsys' of test_cap.py::test_d_needs_nsys: *nsys*not found*",
            "*RuntimeError: the workload broke*",
            "FAILED test_cap.py::test_a_raises - RuntimeError: the workload broke",
            "ERROR test_cap.py::test_b_blocked - Failed: perfguard: capture of*",
        ]
    )
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    by_id = {t["nodeid"]: t for t in doc["tests"]}
    names = ("a_raises", "b_blocked", "c_fine", "d_needs_nsys")
    assert set(by_id) == {f"test_cap.py::test_{n}" for n in names}
    # the test that raised is a row too, with its exception: no result is lost
    raised = by_id["test_cap.py::test_a_raises"]
    assert raised["outcome"] == "error"
    assert raised["message"] == "the test raised RuntimeError: the workload broke"
    assert "nsys" in by_id["test_cap.py::test_d_needs_nsys"]["error"]
    assert by_id["test_cap.py::test_b_blocked"]["outcome"] == "error"
    assert str(blocked) in by_id["test_cap.py::test_b_blocked"]["error"]
    fine = by_id["test_cap.py::test_c_fine"]  # captured after the failures
    assert fine["outcome"] == "no-baseline" and len(fine["samples_current"]) == 5 * 5
    assert doc["counts"] == {"error": 3, "no-baseline": 1}
    assert any("no git state" in n for n in doc["notes"])


def test_bad_marker_is_that_tests_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpuprofile(iterations=0)
        def test_bad(gpuprofile):
            pass

        @pytest.mark.gpuprofile(iterations=3, warmup=1)
        def test_good(gpuprofile):
            assert list(gpuprofile.iterations()) == [-1, 0, 1, 2]
        """
    )
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, errors=1)
    r.stdout.fnmatch_lines(
        ["*@pytest.mark.gpuprofile on *test_bad: iterations must be an integer >= 1, got 0*"]
    )


def test_misspelled_marker_is_that_tests_row_in_a_session(pytester: pytest.Pytester) -> None:
    """A marker error under --perfguard is the test's ``error`` row with the message, in
    results.json, the terminal and summary.md; never "no test was measured"."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpuprofile(iteration=3, tolerence="5%")
        def test_bad(gpuprofile):
            pass
        """
    )
    r = pytester.runpytest_inprocess("--perfguard", "-p", "no:cacheprovider")
    r.assert_outcomes(errors=1)
    doc = json.loads((pytester.path / ".perfguard" / "results.json").read_text())
    (entry,) = doc["tests"]
    assert entry["outcome"] == "error"
    assert "unknown argument(s) iteration, tolerence" in entry["error"]
    summary = (pytester.path / ".perfguard" / "summary.md").read_text()
    terminal = r.stdout.str()
    for text in (summary, terminal):
        assert "no test was measured" not in text
    assert "unknown argument(s) iteration, tolerence" in summary
    r.stdout.fnmatch_lines(["*test_bad*error*@pytest.mark.gpuprofile*"])


# ------------------------------------------------------------------ without --perfguard


def test_without_the_flag_iterations_run_and_nothing_is_captured(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpuprofile(iterations=4, warmup=2)
        def test_loop(gpuprofile):
            steps = list(gpuprofile.iterations())
            assert steps == [-2, -1, 0, 1, 2, 3]
            assert not gpuprofile.capturing and gpuprofile.wall_times_ns == []

        @pytest.mark.gpuprofile
        def test_no_fixture():
            pass
        """
    )
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=2)
    assert not (pytester.path / ".perfguard").exists()
    assert "= perfguard =" not in r.stdout.str()


def test_heavy_imports_only_with_the_flag(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys
        import pytest

        HEAVY = ("pandas", "numpy", "torch", "perfguard.analysis", "perfguard.baseline.store")

        @pytest.mark.gpuprofile(iterations=2, warmup=1)
        def test_light(gpuprofile):
            for _ in gpuprofile.iterations():
                pass
            loaded = [m for m in HEAVY if m in sys.modules]
            assert loaded == [], loaded
            assert "perfguard.plugin" in sys.modules
        """
    )
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=1)


def test_markers_help(pytester: pytest.Pytester) -> None:
    r = pytester.runpytest_inprocess("--markers")
    r.stdout.fnmatch_lines(
        [
            "@pytest.mark.gpuprofile(iterations=30, warmup=5, rounds=5, tolerance='5%', "
            "metrics=('gpu_time',), gates=None, framework=None, key_node=None, backend=None): "
            "profile this benchmark test with perfguard*"
        ]
    )


def test_help_lists_the_option_group(pytester: pytest.Pytester) -> None:
    r = pytester.runpytest_inprocess("--help")
    r.stdout.fnmatch_lines(
        [
            "perfguard: GPU performance regression checks:",
            "*--perfguard *",
            "*--perfguard-fail-on={regression,never}*",
            "*perfguard_tolerance *",
        ]
    )


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (
            ["--perfguard-backend=gpu"],
            "",
            "*--perfguard-backend*'gpu' is not one of auto, torch, nsys, cpu*",
        ),
        (["--perfguard-tolerance=abc"], "", "*--perfguard-tolerance*'abc' is not a percentage*"),
        (["--perfguard-tolerance=5"], "", "*--perfguard-tolerance*ambiguous*'5%'*'0.05'*"),
        (["--perfguard-tolerance=-0.1"], "", "*--perfguard-tolerance*non-negative*"),
        (
            ["--perfguard-fail-on=always"],
            "",
            "*--perfguard-fail-on*'always' is not one of regression, never*",
        ),
        (["--perfguard-baseline=--x"], "", "*--perfguard-baseline*not a git ref*"),
        ([], "perfguard_tolerance = lots", "*ini perfguard_tolerance*'lots'*"),
        (["--perfguard", "--perfguard-save"], "", "*--perfguard-save needs a git repository*"),
    ],
    ids=[
        "backend",
        "tolerance-text",
        "tolerance-bare",
        "tolerance-negative",
        "fail-on",
        "baseline",
        "ini",
        "save-without-git",
    ],
)
def test_bad_option_values_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], ini: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    r = pytester.runpytest_inprocess(*args)
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([f"ERROR: {message}"])


@pytest.mark.parametrize(
    ("text", "value"),
    [("5%", 0.05), ("0.05", 0.05), (" 12.5 % ", 0.125), (0.2, 0.2), ("150%", 1.5)],
)
def test_parse_tolerance(text: object, value: float) -> None:
    assert parse_tolerance(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "5", "x%", "-0.1", "nan", True, None])
def test_parse_tolerance_refuses(text: object) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        parse_tolerance(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"iterations": 1.5}, "iterations must be an integer >= 1"),
        ({"warmup": -1}, "warmup must be an integer >= 0"),
        ({"iterations": True}, "iterations must be an integer"),
        ({"metrics": ("flops",)}, "unknown metric"),
        ({"metrics": ()}, "metrics must be a non-empty tuple"),
        ({"backend": "gpu"}, "backend must be one of"),
        ({"key_node": ""}, "key_node must be a range name"),
        ({"tolerance": "big"}, "not a percentage"),
        ({"iteration": 3}, "unknown argument"),
    ],
)
def test_marker_arguments_are_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_marker(pytest.mark.gpuprofile(**kwargs).mark)


def test_marker_defaults_and_values() -> None:
    mark = pytest.mark.gpuprofile(iterations=7, tolerance="2%", metrics="wall_time").mark
    spec = parse_marker(mark)
    got = (spec.iterations, spec.warmup, spec.tolerance, spec.metrics)
    assert got == (7, 5, 0.02, ("wall_time",))
    assert parse_marker(pytest.mark.gpuprofile.mark).tolerance is None  # the session's applies


# ---------------------------------------------------------------------------------- xdist


def test_xdist_workers_capture_and_the_controller_saves_one_run(repo: pytest.Pytester) -> None:
    repo.makepyfile(
        test_par="""
        import time
        import pytest

        # each its own iteration count, so whose samples a row holds is a count, not a time
        @pytest.mark.parametrize(
            "ms",
            [pytest.param(ms, marks=pytest.mark.gpuprofile(iterations=ms + 3, warmup=1))
             for ms in (1, 2, 3)],
        )
        def test_sleep(gpuprofile, ms):
            for _ in gpuprofile.iterations():
                time.sleep(ms / 1000)
        """
    )
    sha = commit(repo.path, "A")
    r = run(repo, "-n", "2", "--perfguard-save")
    r.assert_outcomes(passed=3)
    doc = results(repo)
    assert doc["counts"] == {"no-baseline": 3}
    assert {t["worker"] for t in doc["tests"]} <= {"gw0", "gw1"}
    medians = {t["nodeid"]: t["timing"]["median_current_ns"] for t in doc["tests"]}
    samples = {t["nodeid"]: len(t["samples_current"]) for t in doc["tests"]}
    for ms in (1, 2, 3):
        nodeid = f"test_par.py::test_sleep[{ms}]"
        # its own samples (5 rounds of ms + 3 iterations), each at least its sleep (a sleep
        # never returns early; no upper bound: the machine's load only adds)
        assert samples[nodeid] == 5 * (ms + 3)
        assert medians[nodeid] >= ms * 1e6
    assert store_runs(repo) == [(1, sha, 0)]  # one run, saved by the controller
    with Store(repo.path / "baselines" / "perfguard.db", create=False) as store:
        _, records = store.load_run(1)
    assert sorted(records) == sorted(medians)
    # 5 timing rounds, then the profiled round, of the test's own ms + 3 iterations
    for ms in (1, 2, 3):
        assert len(records[f"test_par.py::test_sleep[{ms}]"].samples) == 6 * (ms + 3)
    assert all(len(rec.round_values()) == 5 for rec in records.values())


# ------------------------------------------------------------------------ nsys backend

# A stand-in for nsys (none on this machine): it logs its argv, reads it as the nsys
# release that exported the capture documents it (tests/nsys_options.py; an option that
# release does not document ends the run as nsys would), runs the program it was given (the
# child pytest) and writes what nsys would: a report and, as the SQLite export, a real
# nsys capture: the k-th of EXPORTS on its k-th run (the last one after that).
FAKE_NSYS = """
import json, os, shutil, subprocess, sys

sys.path.insert(0, TESTS)
from nsys_options import Undocumented, read_argv

with open(LOG, "a") as log:
    log.write(json.dumps({"argv": sys.argv, "child": os.environ.get("PERFGUARD_CHILD")}) + "\\n")
with open(LOG) as log:
    runs = len(log.readlines())
try:
    read = read_argv(sys.argv, RELEASE)
except Undocumented as exc:
    sys.exit(f"nsys: {exc}")
status = subprocess.call(read.rest)
out = read.options["output"]
open(out + ".nsys-rep", "wb").close()
shutil.copyfile(EXPORTS[min(runs, len(EXPORTS)) - 1], out + ".sqlite")
sys.exit(status)
"""
SAXPY = "nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite"


def fake_nsys(
    repo: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *exports: Path, release: str = "2022.2"
) -> Path:
    """``repo/bin/nsys``, the stand-in above, as the session's nsys; returns its call log."""
    log = repo.path / "nsys-calls.jsonl"
    fake = repo.path / "bin" / "nsys"
    fake.parent.mkdir(exist_ok=True)
    head = (
        f"#!{sys.executable}\nLOG = {str(log)!r}\nTESTS = {str(Path(__file__).parent)!r}\n"
        f"EXPORTS = {[str(e) for e in exports]!r}\nRELEASE = {release!r}\n"
    )
    fake.write_text(head + FAKE_NSYS)
    fake.chmod(0o755)
    monkeypatch.setenv("PERFGUARD_NSYS", str(fake))
    return log


def test_nsys_backend_reruns_each_test_in_a_child_pytest(
    repo: pytest.Pytester, fixture_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_nsys(repo, monkeypatch, fixture_file(SAXPY))
    repo.makepyfile(
        test_gpu="""
        import os
        import pytest

        @pytest.mark.gpuprofile(iterations=3, warmup=1, key_node="saxpy")
        def test_ok(gpuprofile):
            assert os.environ.get("PERFGUARD_CHILD")  # the body runs in the child only
            for _ in gpuprofile.iterations():
                pass

        @pytest.mark.gpuprofile(iterations=3, warmup=0)
        def test_fails(gpuprofile):
            assert os.environ.get("PERFGUARD_CHILD")
            assert 1 + 1 == 3, "wrong sum in the child"
        """
    )
    commit(repo.path, "A")
    r = run(repo, "--perfguard-backend=nsys")
    # test_ok: no usable CUDA here, so the child cannot open nsys's capture range:
    # a capture error, reported as that test's error; test_fails: the child's failure
    r.assert_outcomes(passed=1, failed=1, errors=1)
    r.stdout.fnmatch_lines(
        [
            "perfguard: capture of test_gpu.py::test_ok failed: *cudaProfilerStart*"
            "capture range never opens*",
            "AssertionError: wrong sum in the child*(run under nsys)",
            "FAILED test_gpu.py::test_fails - Failed: AssertionError: wrong sum*",
        ]
    )
    argvs = [c["argv"] for c in calls(log)]
    assert len(argvs) == 2
    for argv, name in zip(argvs, ("test_ok", "test_fails"), strict=True):
        assert argv[1:3] == ["profile", "-t"]
        assert "--capture-range=cudaProfilerApi" in argv and "--capture-range-end=stop" in argv
        at = argv.index("-m")
        assert argv[at - 1] == sys.executable and argv[at + 1] == "pytest"
        assert argv[at + 2] == f"{repo.path / 'test_gpu.py'}::{name}"  # one argument, no shell
    assert all(c["child"].endswith(".child.json") for c in calls(log))
    doc = results(repo)
    assert doc["settings"]["resolved_backend"] == "nsys"
    by = {t["nodeid"].split("::")[1]: t for t in doc["tests"]}
    only = by["test_ok"]
    assert only["outcome"] == "error" and "cudaProfilerStart" in only["error"]
    # the test that failed in the child is a row too, with the child's failure
    assert by["test_fails"]["outcome"] == "error"
    assert "wrong sum" in by["test_fails"]["message"]

    # with the CUDA profiler API stubbed in the child (conftest), the capture goes
    # through: the parent analyses the export, iterations from the marker's key node
    repo.makeconftest(STUB_CUDA_PROFILER)
    r = run(repo, "--perfguard-backend=nsys", "-k", "test_ok")
    r.assert_outcomes(passed=1)
    (ok,) = results(repo)["tests"]
    assert ok["outcome"] == "no-baseline" and ok["backend"] == "nsys"
    assert ok["timing"]["metric"] == "gpu_time"  # the export has kernels
    # 5 saxpy key-node instances -> 6 iterations (DLProf's rule), in one capture: one round;
    # the first and the last are parts of a step (half the GPU time), the record keeps the 4
    # whole steps between them, alike
    assert len(ok["samples_current"]) == 4 and ok["timing"]["n_current"] == 1
    assert max(ok["samples_current"]) < 1.01 * min(ok["samples_current"])
    assert "15 timed iterations but 6 in the capture" in " ".join(ok["notes"])
    assert ok["capture"].endswith(".sqlite")


# the CUDA profiler API stubbed in the nsys child: no GPU here to open the capture range
STUB_CUDA_PROFILER = """
import os

if os.environ.get("PERFGUARD_CHILD"):
    from perfguard.capture import capturers as capture

    capture._cuda_profiler = lambda which: None
"""


def launch_twice(export: Path, out: Path) -> Path:
    """A copy of a real nsys export whose program launches each kernel twice: every kernel
    and its launching call (both CUDA API rows) again, with a new correlation id, the call
    a nanosecond later in the same NVTX range, the kernel right after the first."""
    out.write_bytes(export.read_bytes())
    with sqlite3.connect(out) as db:
        (top,) = db.execute("SELECT max(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME")
        shift = int(top[0])
        for table, dt in (
            ("CUPTI_ACTIVITY_KIND_RUNTIME", "1"),
            ("CUPTI_ACTIVITY_KIND_KERNEL", '"end" - start + 1000'),
        ):
            cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            moved = {
                "start": f"start + {dt}",
                "end": f'"end" + {dt}',
                "correlationId": f"correlationId + {shift}",
            }
            picks = ", ".join(moved.get(c, f'"{c}"') for c in cols)
            where = (
                ""
                if table.endswith("KERNEL")
                else (
                    " WHERE correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)"
                )
            )
            db.execute(f"INSERT INTO {table} SELECT {picks} FROM {table}{where}")
    return out


NSYS_STEP = """
import pytest

@pytest.mark.gpuprofile(iterations=3, warmup=1, key_node="saxpy")
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        pass
"""


def nsys_project(repo: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *exports: Path) -> str:
    """A project whose test runs under the fake nsys fed ``exports``, saved once; its sha."""
    fake_nsys(repo, monkeypatch, *exports)
    repo.makeconftest(STUB_CUDA_PROFILER)
    repo.makepyfile(test_gpu=NSYS_STEP)
    sha = commit(repo.path, "A")
    run(repo, "--perfguard-backend=nsys", "--perfguard-save").assert_outcomes(passed=1)
    (saved,) = results(repo)["tests"]
    assert saved["outcome"] == "no-baseline" and saved["backend"] == "nsys"
    assert store_runs(repo) == [(1, sha, 0)]
    (repo.path / "README").write_text("docs only\n")
    commit(repo.path, "B")
    return sha


def test_nsys_store_mode_saves_one_session_and_judges_the_next(
    repo: pytest.Pytester, fixture_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store mode on the nsys backend end to end: a session saved with a real export, the
    next judged against it with the same program's export, both through the fake above
    (every argv read as nsys 2022.2, which exported the capture, documents it)."""
    saxpy = fixture_file(SAXPY)
    sha_a = nsys_project(repo, monkeypatch, saxpy, saxpy)
    run(repo, "--perfguard-backend=nsys").assert_outcomes(passed=1)
    doc = results(repo)
    assert doc["baseline"]["commit"] == sha_a
    (same,) = doc["tests"]
    assert same["gates"]["outcome"] == "unchanged", same["gates"]["message"]
    saxpy_op = next(o for o in same["ops"] if o["op_name"] == "saxpy")
    assert saxpy_op["current_ns"] == saxpy_op["baseline_ns"] > 0  # the same kernels
    # one capture is one round: the timing needs three rounds a side, so the test as a
    # whole is not judged, and passes
    assert same["timing"]["outcome"] == "not-judged"
    assert "too few rounds" in same["timing"]["message"]
    assert same["outcome"] == "not-judged", same["message"]


def test_nsys_store_mode_catches_a_doubled_launch(
    repo: pytest.Pytester, fixture_file, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same program launching its kernel twice per step, judged against the saved
    session: a regression the gates (kernel launches) must name."""
    saxpy = fixture_file(SAXPY)
    nsys_project(repo, monkeypatch, saxpy, launch_twice(saxpy, tmp_path / "twice.sqlite"))
    r = run(repo, "--perfguard-backend=nsys")
    (more,) = results(repo)["tests"]
    saxpy_op = next(o for o in more["ops"] if o["op_name"] == "saxpy")
    assert saxpy_op["current_ns"] == 2 * saxpy_op["baseline_ns"]  # the export did change
    assert more["outcome"] == "regressed", more["gates"]["message"]
    assert any(f["gate"] == "kernels" for f in more["gates"]["regressions"]), more["gates"]
    r.assert_outcomes(failed=1)


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


CPU_BENCH = """
import time

import pytest
import torch

torch.set_num_threads(1)
A = torch.randn(192, 192)
MATMULS, SLEEP = {matmuls}, {sleep}


@pytest.mark.gpuprofile(
    iterations=4, rounds=4, warmup=2, tolerance="15%", metrics=("cpu_time",)
)
def test_cpu_step(gpuprofile):
    for _ in gpuprofile.iterations():
        for _ in range(MATMULS):
            A @ A
        time.sleep(SLEEP)
"""


def test_cpu_time_metric_is_recorded_stored_and_judged(repo: pytest.Pytester) -> None:
    """``metrics=("cpu_time",)`` judges the per-iteration CPU time of the thread that ran
    the step (what other jobs on a shared runner inflate least); four times the matmuls
    per step is a regression on it, and the store keeps the CPU time of every iteration."""
    path = repo.path
    repo.makepyfile(test_cpu=CPU_BENCH.format(matmuls=12, sleep=0.002))
    commit(path, "A")
    run(repo, "--perfguard-save").assert_outcomes(passed=1)
    first = entry(results(repo), "test_cpu.py::test_cpu_step")
    assert first["timing"]["metric"] == "cpu_time" and first["timing"]["n_current"] == 4  # rounds
    with sqlite3.connect(path / "baselines" / "perfguard.db") as db:
        rows = db.execute("SELECT cpu_time_ns, round FROM samples WHERE profiled = 0").fetchall()
        profiled = db.execute("SELECT round FROM samples WHERE profiled = 1").fetchall()
    # four timing rounds with the profiler off, then one profiled round (ops and gates)
    assert [r[0] for r in profiled] == [4] * 4
    cpu = np.array([r[0] for r in rows], dtype=float)
    assert len(cpu) == 16 and (cpu > 0).all() and [r[1] for r in rows] == sorted(4 * [0, 1, 2, 3])
    rounds = [np.min(cpu[k * 4 : (k + 1) * 4]) for k in range(4)]  # the fastest step
    assert first["rounds_current"] == pytest.approx(rounds, abs=1)

    repo.makepyfile(test_cpu=CPU_BENCH.format(matmuls=48, sleep=0.002))  # 4x the compute
    commit(path, "C: computes four times as much")
    r = run(repo)
    r.assert_outcomes(failed=1)
    slower = entry(results(repo), "test_cpu.py::test_cpu_step")
    assert slower["outcome"] == "regressed" and slower["timing"]["metric"] == "cpu_time"
    # four times the matmuls: +300% on an idle machine; CPU contention inflates the fixed
    # per-step costs (profiler, wake-ups) of both sides, so only a clear rise is asserted;
    # the gates see the 36 extra matmuls per step whatever the load
    assert slower["timing"]["delta_pct"] > 30
    calls = {f["gate"]: f for f in slower["gates"]["regressions"]}
    assert calls["calls"]["current"] - calls["calls"]["baseline"] >= 36
    r.stdout.fnmatch_lines(["*test_cpu.py::test_cpu_step*regressed*"])


STEP_ONCE = """
import pytest
import torch

A = torch.randn(16, 16)


@pytest.mark.gpuprofile(iterations=2, warmup=1, rounds=3, metrics=("wall_time",))
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        A @ A
"""
STEP_NODEID = "test_step.py::test_step"


def test_one_history_read_per_judged_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One judged test reads its history from the store once: the same rows give the
    timing's between-run noise and the report's history rows (Reader.history counted)."""
    init_repo(pytester)
    pytester.makepyfile(test_step=STEP_ONCE)
    sha_a = commit(pytester.path, "A")
    args = ("--perfguard", "-p", "no:cacheprovider", "--perfguard-save")
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)
    pytester.makepyfile(test_step=STEP_ONCE + "\n# no change to the step\n")
    commit(pytester.path, "B")

    reads: Counter[str] = Counter()
    history = Reader.history  # the store's one query of a test's history

    def counted(self: Reader, nodeid: str, **kw: Any) -> Any:
        reads[nodeid] += 1
        return history(self, nodeid, **kw)

    monkeypatch.setattr(Reader, "history", counted)
    # the reads are counted whatever the verdict: a 16x16 matmul step of 6 us, judged on 3
    # rounds against 1 stored run, once read +129 % on unchanged code under a full suite
    # (round 18), so this session reports without failing the test
    pytester.runpytest_inprocess(*args, "--perfguard-fail-on=never").assert_outcomes(passed=1)
    doc = json.loads((pytester.path / ".perfguard" / "results.json").read_text())
    (entry,) = doc["tests"]
    assert entry["baseline_commit"] == sha_a  # judged against run A
    assert [h["commit"] for h in entry["history"]] == [sha_a]  # the rows, from that read
    # the noise, from it too: one stored run (its wording changes with the machine's load)
    assert entry["timing"]["history_runs"] == 1, entry["timing"]
    assert reads == {STEP_NODEID: 1}, (reads, entry["message"])
