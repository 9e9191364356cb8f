"""A real history to find change points in: one ``pytest --perfguard --perfguard-save``
session per commit of a temp git repo whose benchmark test does real torch CPU work.

The test runs ``BASE`` 128x128 matmuls per iteration; from commit ``up`` on
it also runs ``EXTRA_UP`` more inside a ``extra_work`` range (+10 %), and
from commit ``down`` on only ``EXTRA_DOWN`` of them (-5 % of the raised
level). The metric is the harness thread's CPU time, the one a shared
runner inflates least. Used by ``tests/test_history.py`` (a short history)
and ``benchmarks/history_steps.py`` (30 commits).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BASE = 200
EXTRA_UP = 20  # 220 / 200: +10 %
EXTRA_DOWN = 9  # 209 / 220: -5 %

TEST = """
import pytest
import torch

torch.set_num_threads(1)
A = torch.randn(128, 128)
EXTRA = {extra}  # commit {i}


def step():
    for _ in range({base}):
        torch.mm(A, A)
    if EXTRA:
        with torch.profiler.record_function("extra_work"):
            for _ in range(EXTRA):
                torch.mm(A, A)


@pytest.mark.gpuprofile(iterations=12, warmup=2, metrics=("cpu_time",))
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        step()
"""
NODEID = "test_bench.py::test_step"


def git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def init_project(root: Path) -> None:
    """A new git repository in ``root`` (a folder that exists) set up as a pytest project
    whose perfguard store and output stay untracked."""
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "ci@example.com")
    git(root, "config", "user.name", "CI")
    git(root, "config", "commit.gpgsign", "false")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / ".gitignore").write_text("baselines/\n.perfguard/\n__pycache__/\n")


def extra_at(i: int, up: int, down: int) -> int:
    return EXTRA_DOWN if i >= down else EXTRA_UP if i >= up else 0


def build(root: Path, n_commits: int, up: int, down: int, *, nice: int = 10) -> list[str]:
    """Commit ``n_commits`` versions of the benchmark in ``root``, one measured and saved
    session each; returns the commit shas, oldest first. A repo already there (an
    interrupted build) is continued after its last commit."""
    root.mkdir(parents=True, exist_ok=True)
    shas = []
    if (root / ".git").exists():
        shas = git(root, "rev-list", "--reverse", "HEAD").split()
    else:
        init_project(root)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    for i in range(len(shas), n_commits):
        extra = extra_at(i, up, down)
        (root / "test_bench.py").write_text(TEST.format(extra=extra, i=i, base=BASE))
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"commit {i}: extra={extra}")
        shas.append(git(root, "rev-parse", "HEAD"))
        # fail-on never: the step commits are regressions the gate would (rightly) fail
        cmd = ["nice", "-n", str(nice), sys.executable, "-m", "pytest", "--perfguard",
               "--perfguard-save", "--perfguard-fail-on", "never", "-p", "no:cacheprovider",
               "-q", "-p", "no:xdist"]  # fmt: skip
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"session {i} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return shas
