"""Each verdict mode and outcome through real sessions: git repos, real CPU captures.

* A/B mode (``--perfguard-against``): the base commit really slower, really
  faster, a test new in the head, a test that raises in the head; the base
  tree's code is the one imported (an editable-style path to the head is
  overridden).
* Deterministic gates in store mode: an added ``.item()``, a float64 op, twice the
  FLOPs in a small op: each is a regression named by its gate, whatever the timing.
* A test whose rounds disagree reads ``noisy``; unchanged code never ``regressed``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
from history_repo import git, init_project  # noqa: E402

STEP = """
import time

import pytest
import torch

torch.set_num_threads(1)
A = torch.randn(96, 96)
B = torch.randn(8, 96)
SLEEP_MS = {sleep}


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds={rounds}, tolerance="10%")
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        x = torch.tanh(A @ A)
        y = torch.relu(B @ A)
        {extra}
        time.sleep(SLEEP_MS / 1000)
"""


def commit(path: Path, message: str) -> str:
    git(path, "add", "-A")  # .gitignore keeps baselines/ and .perfguard/ out
    git(path, "commit", "-q", "-m", message)
    return git(path, "rev-parse", "HEAD")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    init_project(tmp_path)
    return tmp_path


def write(path: Path, *, sleep: float = 20, extra: str = "pass", rounds: int = 5) -> None:
    (path / "test_bench.py").write_text(STEP.format(sleep=sleep, extra=extra, rounds=rounds))


def session(path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
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
            *args,
        ],
        cwd=path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    doc = json.loads((path / ".perfguard" / "results.json").read_text())
    return done, doc


def only(doc: dict) -> dict:
    (test,) = [t for t in doc["tests"] if t["nodeid"].endswith("test_step")]
    return test


# ---------------------------------------------------------------------------- A/B


def test_ab_head_slower_regresses_and_faster_improves(project: Path) -> None:
    write(project, sleep=20)
    base = commit(project, "base")
    write(project, sleep=40)  # the head sleeps twice as long per step
    commit(project, "slower")
    done, doc = session(project, f"--perfguard-against={base}", "--perfguard-ab-pairs=5")
    assert done.returncode == 1, done.stdout[-2000:]
    t = only(doc)
    assert t["outcome"] == "regressed" and t["mode"] == "ab", t["message"]
    timing = t["timing"]
    assert timing["mode"] == "ab" and timing["outcome"] == "regressed"
    assert timing["n_current"] == timing["n_baseline"] == 5  # five pairs of rounds
    # each pair child: AB_CHILD_ROUNDS timing rounds of 3 iterations per tree, each side's
    # value its median step (the two trees stepped in turn in one process)
    from perfguard.plugin.options import AB_CHILD_ROUNDS

    samples = np.asarray(t["samples_current"], dtype=float)
    assert len(samples) == 5 * AB_CHILD_ROUNDS * 3
    per_child = samples.reshape(5, AB_CHILD_ROUNDS * 3)
    assert t["rounds_current"] == pytest.approx(np.median(per_child, axis=1), abs=1)
    # the children forked from a warm server (the default), not fresh interpreters
    assert "children fork from a server that imported" in done.stdout, done.stdout[-2000:]
    assert timing["delta_pct"] > 40 and timing["ci_low_pct"] > 0
    assert "stepping both trees in turn" in timing["replicated"]
    # five pair children, each one process that ran both trees' sessions
    logs = sorted((project / ".perfguard" / "ab").glob("round-*-pair.log"))
    assert len(logs) == 5
    assert t["baseline_commit"] == base
    assert "regressed against the base tree at" in done.stdout
    # each side's rounds hold its own tree's sleep (a sleep never returns early; no upper
    # bound: load only adds); that the base tree ran the base code is the verdict above
    # (both trees sleeping 40 ms would read unchanged) and the improved one below
    assert min(t["rounds_current"]) >= 40e6 and min(t["rounds_baseline"]) >= 20e6
    # ... and the worktree lives in the git folder, not in the working tree
    assert not git(project, "status", "--porcelain")

    # the other way round: the head is the fast one -> improved, the run passes
    head = git(project, "rev-parse", "HEAD")
    git(project, "checkout", "-q", base)
    done, doc = session(project, f"--perfguard-against={head}", "--perfguard-ab-pairs=5")
    assert done.returncode == 0, done.stdout[-2000:]
    assert only(doc)["outcome"] == "improved", only(doc)["message"]


MODEL = """
import time

SLEEP_MS = {sleep}


def step(x):
    time.sleep(SLEEP_MS / 1000)
    return x * 2
"""

CONFTEST = """
import pytest


@pytest.fixture
def scale():
    return {scale}
"""

USES_MODEL = """
import pytest

from model import step


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=3, tolerance="10%")
def test_step(gpuprofile, scale):
    import model  # looked up at run time too: must be this tree's module

    for _ in gpuprofile.iterations():
        step(scale)
        assert model.SLEEP_MS == {sleep}
    # the step timed is this tree's function, and the fixture this tree's conftest's
    assert step.__globals__["SLEEP_MS"] == {sleep} and scale == {scale}
"""


@pytest.mark.parametrize(
    "ab_children, children", [("pair", "fork"), ("pair", "spawn"), ("separate", "fork")]
)
def test_ab_each_tree_runs_its_own_modules_and_fixtures(
    project: Path, ab_children: str, children: str
) -> None:
    """Both trees have a ``model`` module, a ``conftest`` fixture and a test module of the
    same names: in a pair child both live in one process, each test bound to its own."""
    shas = []
    for sleep, scale, message in ((15, 1, "base"), (30, 2, "head")):
        (project / "model.py").write_text(MODEL.format(sleep=sleep))
        (project / "conftest.py").write_text(CONFTEST.format(scale=scale))
        (project / "test_bench.py").write_text(USES_MODEL.format(sleep=sleep, scale=scale))
        shas.append(commit(project, message))
    base = shas[0]
    done, doc = session(
        project,
        f"--perfguard-against={base}",
        "--perfguard-ab-pairs=4",
        "--perfguard-ab-budget=0",  # four pairs, not more when a loaded box reads it wide
        f"--perfguard-ab-children={ab_children}",
        f"--perfguard-children={children}",
    )
    t = only(doc)
    assert t["outcome"] == "regressed", (t["message"], done.stdout[-3000:])
    timing = t["timing"]
    assert timing["n_current"] == timing["n_baseline"] == 4
    # the head sleeps 30 ms a step, the base 15 ms: +100 % against a 10 % tolerance, a
    # verdict, not a figure; each side's test asserted it ran its own tree's step, model
    # and fixture (a failed assertion would make the outcome an error), and each side's
    # rounds hold at least its own sleep (no upper bound: load only adds)
    assert timing["outcome"] == "regressed", timing
    assert min(t["rounds_current"]) >= 30e6 and min(t["rounds_baseline"]) >= 15e6
    pair_logs = list((project / ".perfguard" / "ab").glob("round-*-pair.log"))
    assert len(pair_logs) == (4 if ab_children == "pair" else 0)
    if ab_children == "pair":
        assert "stepping both trees in turn" in timing["replicated"]


def test_ab_unchanged_code_and_gates(project: Path) -> None:
    write(project)
    base = commit(project, "base")
    (project / "README").write_text("docs only\n")
    commit(project, "docs")
    done, doc = session(project, f"--perfguard-against={base}", "--perfguard-ab-pairs=5")
    assert done.returncode == 0, done.stdout[-2000:]
    t = only(doc)
    assert t["outcome"] in ("unchanged", "noisy"), t["message"]
    assert t["gates"]["outcome"] == "unchanged", t["gates"]["message"]
    # A/B reads as A/B everywhere: the base commit is the baseline, never "no baseline"
    assert doc["baseline"] == {"ref": base, "commit": base, "run_id": None, "ab": True}
    summary = (project / ".perfguard" / "summary.md").read_text()
    assert f"vs base commit `{base[:12]}`" in summary and "no baseline" not in summary
    html = (project / ".perfguard" / "report.html").read_text()
    assert "none found" not in html and "the base tree of" in html
    assert f"baseline: A/B: the base tree at {base[:12]}" in done.stdout
    assert t["profile"]["ops"], "an A/B test has its profile too (from the merged record)"

    # a real .item() per step: a sync on a GPU; the gate names it, timing or not
    write(project, extra="x.sum().item()")
    commit(project, "sync")
    done, doc = session(project, f"--perfguard-against={base}", "--perfguard-ab-pairs=5")
    t = only(doc)
    assert t["outcome"] == "regressed", t["message"]
    gates = {f["gate"]: f for f in t["gates"]["regressions"]}
    assert gates["host_reads"]["current"] - gates["host_reads"]["baseline"] == 1
    assert "_local_scalar_dense" in gates["host_reads"]["op_name"]


def test_ab_new_test_and_failing_head(project: Path) -> None:
    write(project)
    base = commit(project, "base")
    (project / "test_more.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpuprofile(iterations=2, warmup=0)\n"
        "def test_new(gpuprofile):\n    for _ in gpuprofile.iterations():\n        pass\n"
    )
    write(project, extra="raise RuntimeError('broken in the head')")
    commit(project, "head")
    done, doc = session(project, f"--perfguard-against={base}", "--perfguard-ab-pairs=5")
    tests = {t["nodeid"]: t for t in doc["tests"]}
    assert tests["test_more.py::test_new"]["outcome"] == "new"
    broken = tests["test_bench.py::test_step"]
    assert broken["outcome"] == "error" and "broken in the head" in broken["message"]
    assert "broken in the head" in done.stdout


def test_ab_bad_ref_is_a_usage_error(project: Path) -> None:
    write(project)
    commit(project, "base")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--perfguard",
            "--perfguard-against=no-such-ref",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 4
    assert "--perfguard-against no-such-ref: cannot check it out" in done.stderr


# ---------------------------------------------------------------------------- store mode


@pytest.mark.parametrize(
    "old, new, gate",
    [
        # an added sync, hidden in a 20 ms sleep
        ("pass", "x.sum().item()", "host_reads"),
        # the same ops on float64 inputs: twice the bytes, another dtype
        (
            "torch.set_num_threads(1)",
            "torch.set_num_threads(1)\ntorch.set_default_dtype(torch.float64)",
            "dtypes",
        ),
        # a small op doing twice the FLOPs (a matmul of twice the rows): +6 % of the step's
        # FLOPs in all, nothing against the sleep, but +100 % for that op
        ("B = torch.randn(8, 96)", "B = torch.randn(16, 96)", "flops"),
    ],
    ids=["item-sync", "float64", "flops"],
)
def test_store_mode_gates_catch_what_timing_hides(
    project: Path, old: str, new: str, gate: str
) -> None:
    write(project)
    commit(project, "base")
    done, _ = session(project, "--perfguard-save")
    assert done.returncode == 0, done.stdout[-2000:]
    source = (project / "test_bench.py").read_text()
    assert old in source
    (project / "test_bench.py").write_text(source.replace(old, new, 1))
    commit(project, "change")
    done, doc = session(project)
    t = only(doc)
    assert t["outcome"] == "regressed" and done.returncode == 1, t["message"]
    found = {f["gate"]: f for f in t["gates"]["regressions"]}
    assert gate in found, t["gates"]
    if gate == "dtypes":
        current = str(found["dtypes"]["current"]).lower()
        assert "double" in current or "fp64" in current, found["dtypes"]
    if gate == "flops":
        # the step's FLOPs grew beyond the budget, named by the op that moved most; the
        # small op whose own FLOPs doubled (+100 %, 0.04 % of the step's) is shown as a
        # change of no measurable cost, never failing (compare/weigh.py)
        assert (
            found["flops"]["whole_test"] and found["flops"]["current"] > found["flops"]["baseline"]
        )
        free = [f for f in t["gates"]["immaterial"] if f["gate"] == "flops"]
        assert any(f["current"] == pytest.approx(2 * f["baseline"]) for f in free), free
        assert all(f["cost_pct"] < 1 for f in free), free
    # the timing half is judged on its own and reported beside the gates
    assert t["timing"]["outcome"] in ("unchanged", "noisy", "regressed")


def test_rounds_that_disagree_read_noisy_and_unchanged_code_passes(project: Path) -> None:
    write(project)
    commit(project, "base")
    assert session(project, "--perfguard-save")[0].returncode == 0
    # same code, but every other round sleeps 3x longer: the rounds disagree by far more
    # than the 10 % tolerance, so no verdict on a change of that size is possible
    (project / "test_bench.py").write_text(
        STEP.format(sleep="6", extra="pass", rounds=6).replace(
            "time.sleep(SLEEP_MS / 1000)",
            "time.sleep(SLEEP_MS / 1000 * (3 if gpuprofile.round_of "
            "and len(gpuprofile.round_of) // 3 % 2 else 1))",
        )
    )
    commit(project, "jittery")
    done, doc = session(project)
    t = only(doc)
    assert t["outcome"] == "noisy" and done.returncode == 0, t["message"]
    assert t["timing"]["spread_pct"] > 10
