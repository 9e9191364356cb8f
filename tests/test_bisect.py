"""``perfguard bisect`` on a real 16-commit git history (``tests/bisect_repo.py``): one
real regression (an ``.item()`` per step from commit 11), stored runs made by real
``pytest --perfguard --perfguard-save`` sessions, a real ``git bisect`` in a worktree.

The oracle here is the deterministic gates (exact on a noisy CPU runner); the timing
oracle over A/B measurements is exercised in ``benchmarks/bisect16.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import bisect_repo  # noqa: E402

ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
ENV.pop("PYTEST_XDIST_WORKER", None)


def perfguard(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfguard", *args],
        cwd=root,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def save_run(root: Path, sha: str) -> None:
    bisect_repo.git(root, "checkout", "-q", sha)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--perfguard",
            "--perfguard-save",
            "--perfguard-rounds=3",
            "--perfguard-fail-on=never",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
        ],
        cwd=root,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture
def history(tmp_path) -> tuple[Path, list[str]]:
    """The 16 commits (no stored run), the checkout on main."""
    root = tmp_path / "repo"
    return root, bisect_repo.build(root)


def untouched(root: Path, head: str) -> None:
    """The user's checkout is where it was: same HEAD and branch, clean, no bisect state,
    no worktree left behind."""
    assert bisect_repo.git(root, "rev-parse", "HEAD") == head
    assert bisect_repo.git(root, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert bisect_repo.git(root, "status", "--porcelain") == ""
    assert not list((root / ".git").glob("BISECT_*"))
    assert len(bisect_repo.git(root, "worktree", "list").splitlines()) == 1
    assert not list((root / ".git" / "perfguard-bisect").glob("run-*"))


def test_bisect_over_16_stored_commits_finds_the_regression(history, tmp_path):
    root, shas = history
    for sha in shas:  # one real session per commit, each saved
        save_run(root, sha)
    bisect_repo.git(root, "checkout", "-q", "main")
    out = tmp_path / "out"
    done = perfguard(
        root,
        "bisect",
        shas[0],
        shas[-1],
        bisect_repo.NODEID,
        "--oracle",
        "gates",
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    bad = shas[bisect_repo.REGRESSION]
    assert f"first bad commit: {bad} commit {bisect_repo.REGRESSION}:" in done.stdout
    # and what it changed, at the user's line: the `.item()` the regression added
    culprit = done.stdout.split("first bad commit:", 1)[1].splitlines()[1]
    assert bisect_repo.NODEID in culprit and "test_bench.py:" in culprit, done.stdout
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["first_bad"] == bad and doc["selected"] == [bisect_repo.NODEID]
    steps = {s["commit"]: s for s in doc["steps"]}
    # binary search: BAD, then about log2(15) = 4 candidates, each judged once
    assert 4 <= len(doc["steps"]) <= 6 and len(steps) == len(doc["steps"])
    assert all(s["mode"] == "store" for s in doc["steps"])  # every commit had a stored run
    for sha, step in steps.items():
        want = "bad" if shas.index(sha) >= bisect_repo.REGRESSION else "good"
        assert step["mark"] == want, (shas.index(sha), step)
    # the evidence of the first bad commit names the gate and the op that read the value
    (test,) = steps[bad]["tests"]
    assert test["decided_by"] == "regressed"
    fired = {(g["gate"], g["op_name"]) for g in test["gates"]}
    assert any(gate == "host_reads" and "item" in op for gate, op in fired), fired
    assert bad in doc["log"] and "git bisect start" in doc["log"]
    md = (out / "bisect.md").read_text()
    assert f"**First bad commit:** `{bad[:12]}`" in md and "host_reads" in md
    untouched(root, shas[-1])
    cases = [
        ((shas[0], shas[5]), "is not regressed against GOOD"),  # BAD is fine: nothing to find
        # a GOOD that already has the regression: BAD is no worse than it
        ((shas[bisect_repo.REGRESSION], shas[-1]), "is not regressed against GOOD"),
    ]
    expect_errors(root, cases, tmp_path)


def expect_errors(root: Path, cases: list, tmp_path: Path) -> None:
    """Each (GOOD, BAD) is refused with exit 2 and one line holding its message."""
    args = (
        bisect_repo.NODEID,
        "--oracle",
        "gates",
        "--mode",
        "store",
        "--output",
        str(tmp_path / "o"),
    )
    for (good, bad), message in cases:
        done = perfguard(root, "bisect", good, bad, *args)
        assert done.returncode == 2, (good, bad, done.stdout, done.stderr)
        err = done.stderr.strip()
        assert len(err.splitlines()) == 1 and message in err, err
        assert "Traceback" not in done.stderr


def test_bisect_input_errors_are_one_line_and_leave_nothing(history, tmp_path):
    root, shas = history
    cases = [
        ((shas[0], "no-such-ref"), "BAD 'no-such-ref': git cannot resolve it"),
        ((shas[5], shas[2]), "not an ancestor of BAD"),
        ((shas[5], shas[2]), "are GOOD and BAD swapped?"),
        ((shas[3], shas[3]), "are the same commit"),
        ((shas[0], shas[-1]), "no stored run of test_bench.py::test_step at GOOD"),
    ]
    expect_errors(root, cases, tmp_path)
    none = perfguard(root, "bisect", shas[0], shas[-1], "-k", "nothing_matches")
    assert none.returncode == 2 and "selects no test" in none.stderr
    untouched(root, shas[-1])


def test_bisect_measures_a_commit_without_a_stored_run_in_ab_mode(history, tmp_path):
    """The A/B oracle for real: the candidate and GOOD in alternating rounds (GOOD and
    BAD adjacent, so one A/B session decides)."""
    root, shas = history
    good, bad = shas[bisect_repo.REGRESSION - 1], shas[bisect_repo.REGRESSION]
    out = tmp_path / "out"
    done = perfguard(
        root,
        "bisect",
        good,
        bad,
        bisect_repo.NODEID,
        "--oracle",
        "gates",
        "--mode",
        "ab",
        "--output",
        str(out),
        "--pytest-args",
        "--perfguard-ab-pairs=3 --perfguard-ab-budget=0",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["first_bad"] == bad
    (step,) = doc["steps"]
    assert step["mode"] == "ab" and step["mark"] == "bad"
    assert Path(step["report"]).is_file()  # the A/B session's own report, kept as evidence
    assert any(g["gate"] == "host_reads" for g in step["tests"][0]["gates"])
    untouched(root, shas[-1])


def test_sigterm_mid_bisect_removes_the_worktree(history, tmp_path):
    root, shas = history
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perfguard",
            "bisect",
            shas[0],
            shas[-1],
            bisect_repo.NODEID,
            "--mode",
            "ab",
            "--output",
            str(tmp_path / "o"),
        ],
        cwd=root,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = root / ".git" / "perfguard-bisect"
    deadline = time.monotonic() + 120
    while not list(folder.glob("run-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(folder.glob("run-*")), "the bisect worktree never appeared"
    time.sleep(2)  # inside the first A/B session by now
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    untouched(root, shas[-1])
