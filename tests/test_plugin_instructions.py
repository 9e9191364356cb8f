"""The ``instructions`` metric end to end: a real project, a real git history, real Valgrind.

The session counts the host instructions of each test asking for them in one
Callgrind child pytest, saves them with the run, and the gate compares the
next session's with them: the same code again is not flagged, 4 % more Python
work per step is, naming the interpreter. The step is pure Python (the child
needs no torch, so its start-up under Valgrind takes seconds); the parent
captures it with the torch profiler as any CPU test. Skipped, with the reason,
only where Valgrind cannot run.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from test_plugin import _profiler_loaded, commit, entry, init_repo, results, run

from perfguard.capture.valgrind import valgrind_missing

pytest_plugins = ["pytester"]
MISSING = valgrind_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
#: torch's profiler started once before pytester's snapshots (an autouse fixture, imported)
__all__ = ["_profiler_loaded"]

STEP = """
import pytest

EXTRA = {extra}


def work(extra):
    data = sorted((i * 7919) % 1009 for i in range(3000))
    total = sum(x * x for x in data)
    for _ in range(extra):
        total += 1
    return total


@pytest.mark.gpuprofile(iterations=8, rounds=3, warmup=1, tolerance="50%",
                        metrics=("wall_time", "instructions"))
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        work(EXTRA)


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1, tolerance="50%")
def test_timed_only(gpuprofile):
    for _ in gpuprofile.iterations():
        work(0)
"""
STEP_ID = "test_step.py::test_step"


def test_instructions_are_counted_saved_and_gated(pytester: pytest.Pytester) -> None:
    repo = init_repo(pytester)
    path = repo.path
    repo.makepyfile(test_step=STEP.format(extra=0))
    commit(path, "A")
    run(repo, "--perfguard-save").assert_outcomes(passed=2)
    doc = results(repo)
    assert any("counted under Callgrind" in n for n in doc["notes"])
    with sqlite3.connect(path / "baselines" / "perfguard.db") as db:
        counts = dict(
            db.execute(
                "SELECT t.nodeid, c.value FROM counters c JOIN tests t USING (test_id) "
                "WHERE c.counter = 'instructions'"
            ).fetchall()
        )
        functions = db.execute("SELECT count(*) FROM functions").fetchone()[0]
    assert set(counts) == {STEP_ID}  # the other test did not ask for them
    assert counts[STEP_ID] > 100_000 and functions > 5
    with sqlite3.connect(path / "baselines" / "perfguard.db") as db:
        (meta,) = db.execute("SELECT meta FROM tests WHERE nodeid = ?", (STEP_ID,)).fetchone()
    assert json.loads(meta)["instructions_steps"] == 3  # of 8 recorded: counts do not vary
    layouts = json.loads(meta)["instructions_layouts"]  # each heap layout's count, kept
    assert len(layouts) == 4 and sum(layouts) / 4 == pytest.approx(counts[STEP_ID])

    # the same code again, now with the store's folder beside it (pytest's collection lists
    # the root folder, which moves the heap): this step grows lists, whose realloc copies or
    # extends by the heap's holes, so its layouts spread ~0.3 % and the budget widens to
    # that; CI measured +0.18 % here against the plain 0.15 %
    run(repo).assert_outcomes(passed=2)
    same = entry(results(repo), STEP_ID)
    assert "instructions" in same["gates"]["checked"]
    assert not [f for f in same["gates"]["regressions"] if f["gate"] == "instructions"]

    # about 4 % more Python work per step: beyond the 1 % budget, whatever the load
    repo.makepyfile(test_step=STEP.format(extra=1500))
    commit(path, "B: a slower Python step")
    run(repo).assert_outcomes(passed=1, failed=1)
    slower = entry(results(repo), STEP_ID)
    assert slower["outcome"] == "regressed"
    (finding,) = [f for f in slower["gates"]["regressions"] if f["gate"] == "instructions"]
    assert finding["current"] > 1.01 * finding["baseline"]
    assert "libpython" in finding["message"]


def _counts(repo: pytest.Pytester) -> dict[str, list[float]]:
    with sqlite3.connect(repo.path / "baselines" / "perfguard.db") as db:
        rows = db.execute(
            "SELECT t.nodeid, c.value FROM counters c JOIN tests t USING (test_id) "
            "WHERE c.counter = 'instructions' ORDER BY t.run_id"
        ).fetchall()
    out: dict[str, list[float]] = {}
    for nodeid, value in rows:
        out.setdefault(nodeid, []).append(value)
    return out


def test_the_session_option_and_a_bad_value(pytester: pytest.Pytester) -> None:
    """``--perfguard-metric instructions`` counts every measured test; a test that did not
    change counts the same after one that ran before it did (each test is forked from the
    same state), within the spread a code change's heap shift makes (up to 0.122 % over 4
    layouts, benchmarks/README.md: here the module's own bytes changed around it), under the
    0.15 % budget and well under the changed test's move."""
    repo = init_repo(pytester)
    repo.makepyfile(test_step=STEP.format(extra=0))
    commit(repo.path, "A")
    bad = run(repo, "--perfguard-metric", "cycles")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--perfguard-metric*'cycles' is not one of instructions*"])
    run(repo, "--perfguard-metric", "instructions", "--perfguard-save").assert_outcomes(passed=2)
    assert set(_counts(repo)) == {STEP_ID, "test_step.py::test_timed_only"}
    repo.makepyfile(test_step=STEP.format(extra=1500))  # only the first test changes
    commit(repo.path, "B")
    run(repo, "--perfguard-metric", "instructions", "--perfguard-save").assert_outcomes(
        passed=1, failed=1
    )
    counts = _counts(repo)
    assert counts[STEP_ID][1] > 1.01 * counts[STEP_ID][0]
    same = counts["test_step.py::test_timed_only"]
    # its verdict is the gate's (passed above: within its budget, widened to the step's heap
    # layouts); the figure itself moved 3.0e-4 in a fresh clone, 2.1e-3 in a loaded suite
    assert abs(same[1] / same[0] - 1) < 1e-2, same


def test_ab_mode_counts_both_trees_and_gates_them(tmp_path) -> None:
    """A/B with the metric: each tree's tests counted once under Callgrind, from that tree's
    own code; 4 % more Python work in the head is a regression named by the interpreter, a
    test that did not change counts the same in both trees (well inside the budget), and
    every view shows the two counts."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from history_repo import git, init_project

    init_project(tmp_path)
    (tmp_path / "test_step.py").write_text(STEP.format(extra=0))
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "A")
    base = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "test_step.py").write_text(STEP.format(extra=1500))
    git(tmp_path, "commit", "-qam", "B: a slower Python step")
    # a session of its own, not an xdist worker of this one
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--perfguard",
            f"--perfguard-against={base}",
            "--perfguard-ab-pairs=3",
            "--perfguard-ab-budget=0",
            "--perfguard-metric=instructions",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    out = done.stdout + done.stderr
    assert (tmp_path / ".perfguard" / "results.json").is_file(), out[-3000:]
    doc = json.loads((tmp_path / ".perfguard" / "results.json").read_text())
    assert any("in the base tree" in n and "counted under Callgrind" in n for n in doc["notes"]), (
        doc["notes"]
    )
    step = entry(doc, STEP_ID)
    assert step["mode"] == "ab" and step["outcome"] == "regressed", out[-3000:]
    (finding,) = [f for f in step["gates"]["regressions"] if f["gate"] == "instructions"]
    assert finding["current"] > 1.01 * finding["baseline"] and "libpython" in finding["message"]
    other = entry(doc, "test_step.py::test_timed_only")
    b, c = other["gates"]["totals"]["instructions"]
    # the same code in two trees whose paths differ, so their heap layouts do: the verdict
    # is the gate's, with its budget widened to the layouts' spread (a full suite under
    # load measured 3.2e-3 here once, against 3.0e-4 in a fresh clone)
    assert not [f for f in other["gates"]["regressions"] if f["gate"] == "instructions"], (b, c)
    assert abs(c / b - 1) < 1e-2, (b, c)  # far below the changed test's +1 %
    shown = 100 * (c / b - 1)
    shown = 0.0 if round(shown, 2) == 0 else shown  # the column never reads "-0.00%"
    assert "instructions" in out and f"{shown:+.2f}%" in out  # the terminal column
    summary = (tmp_path / ".perfguard" / "summary.md").read_text()
    assert "host instructions" in summary


def test_the_child_passes_on_only_the_variables_asked_for(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that needs its own variable is counted once the option names it; without it
    the Callgrind child does not see the variable (a CI run's own ones must not reach it)."""
    repo = init_repo(pytester)
    repo.makepyfile(
        test_env="""
import os
import pytest


@pytest.mark.gpuprofile(iterations=2, rounds=2, warmup=1, metrics=("wall_time", "instructions"))
def test_env(gpuprofile):
    assert os.environ.get("MYAPP_FLAG") == "1"
    for _ in gpuprofile.iterations():
        sum(range(1000))
"""
    )
    commit(repo.path, "A")
    monkeypatch.setenv("MYAPP_FLAG", "1")
    run(repo).assert_outcomes(passed=1)
    assert "test_env.py::test_env" not in _counts_in(results(repo))
    run(repo, "--perfguard-instructions-env", "MYAPP_*").assert_outcomes(passed=1)
    assert "test_env.py::test_env" in _counts_in(results(repo))


def _counts_in(doc: dict) -> set[str]:
    return {t["nodeid"] for t in doc["tests"] if (t.get("counted") or {}).get("instructions")}
