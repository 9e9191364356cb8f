"""A real history to find change points in: one ``pytest --perfguard --perfguard-save``
session per commit of a temp git repo whose benchmark test does real torch CPU work.

The test runs ``BASE`` 128x128 matmuls per iteration; from commit ``up`` on
it also runs ``EXTRA_UP`` more inside a ``extra_work`` range (+10 %), and
from commit ``down`` on only ``EXTRA_DOWN`` of them (-5 % of the raised
level). The metric is the harness thread's CPU time, the one a shared
runner inflates least. Used by ``tests/test_history.py`` (a short history)
and ``benchmarks/history_steps.py`` (30 commits).

:func:`build_plan` commits any sequence of :class:`Version` instead: besides
the matmuls, ``tiny`` 1x1 adds (op calls move, the time by well under 1 %:
a counter step without a timing step) and ``spin`` iterations of a pure-
Python loop (CPU time moves, no op or counter does: a timing step without a
counter step).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BASE = 200
EXTRA_UP = 20  # 220 / 200: +10 %
EXTRA_DOWN = 9  # 209 / 220: -5 %

TEST = """
import pytest
import torch

torch.set_num_threads(1)
A = torch.randn(128, 128)
B = torch.ones(1)
EXTRA = {extra}  # commit {i}


def step():
    for _ in range({base}):
        torch.mm(A, A)
    if EXTRA:
        with torch.profiler.record_function("extra_work"):
            for _ in range(EXTRA):
                torch.mm(A, A)
    for _ in range({tiny}):
        torch.add(B, B)
    for _ in range({spin}):
        pass


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


@dataclass(frozen=True)
class Version:
    """One commit's benchmark: ``extra`` matmuls in ``extra_work``, ``tiny`` 1x1 adds and
    ``spin`` iterations of an empty Python loop per iteration, on top of ``BASE`` matmuls."""

    extra: int = 0
    tiny: int = 0
    spin: int = 0


def spin_for(fraction: float) -> int:
    """Empty-loop iterations that cost ``fraction`` of ``BASE`` 128x128 matmuls on this
    machine (the fastest of 5 timings of each, one thread): a timing step of that size."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(128, 128)

    def fastest(fn) -> float:
        out = []
        for _ in range(5):
            t = time.thread_time()
            fn()
            out.append(time.thread_time() - t)
        return min(out)

    def spin() -> None:
        for _ in range(1_000_000):
            pass

    mm = fastest(lambda: [torch.mm(a, a) for _ in range(BASE)])
    loop = fastest(spin) / 1_000_000
    return int(fraction * mm / loop)


def build(root: Path, n_commits: int, up: int, down: int, *, nice: int = 10) -> list[str]:
    """Commit ``n_commits`` versions of the benchmark in ``root``, one measured and saved
    session each; returns the commit shas, oldest first. A repo already there (an
    interrupted build) is continued after its last commit."""
    plan = [Version(extra=extra_at(i, up, down)) for i in range(n_commits)]
    return build_plan(root, plan, nice=nice)


def resume_project(root: Path) -> tuple[list[str], dict[str, str]]:
    """A project folder to add commits to: the shas it already has (oldest first; a new
    repository when it has none) and the environment its sessions run with (no .pyc files
    written, not an xdist worker of the caller's session)."""
    root.mkdir(parents=True, exist_ok=True)
    shas: list[str] = []
    if (root / ".git").exists():
        shas = git(root, "rev-list", "--reverse", "HEAD").split()
    else:
        init_project(root)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    return shas, env


def build_plan(root: Path, plan: list[Version], *, nice: int = 10) -> list[str]:
    """:func:`build` for any sequence of versions, one commit and session each."""
    shas, env = resume_project(root)
    for i in range(len(shas), len(plan)):
        v = plan[i]
        text = TEST.format(extra=v.extra, tiny=v.tiny, spin=v.spin, i=i, base=BASE)
        (root / "test_bench.py").write_text(text)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"commit {i}: extra={v.extra} tiny={v.tiny} spin={v.spin}")
        shas.append(git(root, "rev-parse", "HEAD"))
        # fail-on never: the step commits are regressions the gate would (rightly) fail
        cmd = [
            "nice",
            "-n",
            str(nice),
            sys.executable,
            "-m",
            "pytest",
            "--perfguard",
            "--perfguard-save",
            "--perfguard-fail-on",
            "never",
            "-p",
            "no:cacheprovider",
            "-q",
            "-p",
            "no:xdist",
        ]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"session {i} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return shas


#: commits of :func:`four_steps` where the op calls step (5: +40 adds, 14: 40 -> 15 adds)
COUNTER_STEPS = (5, 14)
#: commits of :func:`four_steps` where the CPU time steps (10: +15 %, 19: back to +3.5 %)
TIMING_STEPS = (10, 19)


def four_steps(n_commits: int = 24, spin_up: int | None = None) -> list[Version]:
    """Two counter steps and two timing steps, never at one commit (``COUNTER_STEPS``,
    ``TIMING_STEPS``): each kind of change point must be found where it happened only."""
    up = spin_for(0.15) if spin_up is None else spin_up
    down = round(up * 0.035 / 0.15)
    plan = []
    for i in range(n_commits):
        tiny = 15 if i >= COUNTER_STEPS[1] else 40 if i >= COUNTER_STEPS[0] else 0
        spin = down if i >= TIMING_STEPS[1] else up if i >= TIMING_STEPS[0] else 0
        plan.append(Version(tiny=tiny, spin=spin))
    return plan


def commit_per_run(doc: dict, repo: Path) -> list[str]:
    """A new project repository at ``repo`` with one commit per run of the baseline export
    ``doc``, each run given its commit (its data unchanged): a recorded history replayed
    onto git, as ``perfguard history`` reads it. Returns the shas, oldest first."""
    repo.mkdir(parents=True, exist_ok=True)
    init_project(repo)
    shas = []
    for i, entry in enumerate(doc["runs"]):
        (repo / "bench.py").write_text(f"# commit {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
        entry["run"]["commit"] = shas[-1]
    return shas
