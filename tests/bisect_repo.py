"""A real 16-commit git history with one real regression, for ``perfguard bisect``.

Every commit changes the benchmark's module (a renamed helper, a comment,
a reordered import: edits that leave the work alone); commit ``REGRESSION``
adds one host read of a device value (``.item()``) per step, the kind of
change the ``host_reads`` gate catches exactly on any machine, plus, with
``slow=True``, ``EXTRA`` more matmuls per step (a timing regression for the
A/B oracle). Used by ``tests/test_bisect.py`` and ``benchmarks/bisect16.py``.
"""

from __future__ import annotations

from pathlib import Path

from history_repo import git, init_project

__all__ = ["NODEID", "REGRESSION", "build", "git"]

N_COMMITS = 16
#: index (0 = the first commit) of the commit that regresses
REGRESSION = 11
BASE = 40  # matmuls per step
EXTRA = 12  # more matmuls per step from REGRESSION on, with slow=True (+30 %)

MODEL = '''"""The model step (commit {i}: {what})."""
import torch

torch.set_num_threads(1)
A = torch.randn(96, 96)
{helper} = {n}


def step():
    x = A
    for _ in range({helper}):
        x = torch.mm(A, A)
{regression}    return x
'''

REGRESSION_LINES = "    x.sum().item()  # log the loss every step\n"

TEST = """import pytest

from model import step


@pytest.mark.gpuprofile(iterations=8, warmup=2, metrics=("cpu_time",))
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        step()
"""
NODEID = "test_bench.py::test_step"

WHAT = [
    "first version",
    "rename the loop constant",
    "docstring",
    "a comment",
    "tidy",
    "another rename",
    "spacing",
    "comment the step",
    "rename back",
    "docs",
    "tidy again",
    "log the loss every step",
    "comment",
    "rename",
    "docstring again",
    "last tidy",
]


def build(root: Path, *, slow: bool = False) -> list[str]:
    """Commit the 16 versions in ``root`` (a new folder); returns their shas, oldest first."""
    root.mkdir(parents=True, exist_ok=True)
    init_project(root)
    (root / "test_bench.py").write_text(TEST)
    shas = []
    for i in range(N_COMMITS):
        bad = i >= REGRESSION
        (root / "model.py").write_text(
            MODEL.format(
                i=i,
                what=WHAT[i],
                helper=f"STEPS_{i % 3}",
                n=BASE + (EXTRA if bad and slow else 0),
                regression=REGRESSION_LINES if bad else "",
            )
        )
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"commit {i}: {WHAT[i]}")
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas
