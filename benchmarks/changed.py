"""``--perfguard-changed`` on 10 realistic pull requests: what it skips, and whether it should have.

    python benchmarks/changed.py [--out benchmarks/data/changed_round22.json]

The project is ``tests/data/changed_project`` (a model zoo: a CNN block, an MLP sized by
``configs/mlp.json``, attention with a shared helper and a norm, a GRU, an RMS norm; 8
benchmarks in 4 test files, a conftest, a lock file, a README), copied into a fresh git
repository. Main saves two runs (the baseline store). Each pull request branches from
main, makes one change and is measured twice against the same store: with
``--perfguard-changed`` and without it (everything runs). A skip is **wrong** when the
full run's verdict of that benchmark was not the carried one's kind: its gates found a
change, or it regressed (its timing confirmed A/B, as in any user's session). Prints per
pull request what ran, what was skipped, any wrong skip, and both sessions' wall times;
writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from history_repo import git  # noqa: E402

from perfguard.compare.outcomes import Outcome  # noqa: E402
from perfguard.compare.results import load_results  # noqa: E402

PROJECT = REPO / "tests" / "data" / "changed_project"
ALL = [
    "tests/test_attn.py::test_attn[16]",
    "tests/test_attn.py::test_attn[8]",
    "tests/test_cnn.py::test_cnn[1]",
    "tests/test_cnn.py::test_cnn[2]",
    "tests/test_mlp.py::test_mlp[16]",
    "tests/test_mlp.py::test_mlp[4]",
    "tests/test_seq.py::test_rms_norm",
    "tests/test_seq.py::test_rnn",
]


def edit(path: str, old: str, new: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        f = root / path
        text = f.read_text()
        assert old in text, (path, old)
        f.write_text(text.replace(old, new, 1))

    return apply


def add(path: str, text: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)

    return apply


#: (name, the change, the benchmarks that must run: None for every one)
PULL_REQUESTS: list[tuple[str, Callable[[Path], None], list[str] | None]] = [
    (
        "a model file: the CNN widened",
        edit("proj/models/cnn.py", "CHANNELS = 8", "CHANNELS = 16"),
        [n for n in ALL if "test_cnn" in n],
    ),
    (
        "a shared helper: relu -> gelu",
        edit("proj/layers/helpers.py", "torch.relu(x)", "torch.nn.functional.gelu(x)"),
        [n for n in ALL if "test_cnn" in n or "test_attn" in n],
    ),
    (
        "a config: the MLP's hidden size",
        edit("configs/mlp.json", '"hidden": 64', '"hidden": 256'),
        [n for n in ALL if "test_mlp" in n],
    ),
    (
        "the lock file",
        edit("requirements.txt", "torch==2.13.0\n", "torch==2.13.0\nnumpy>=1.26\n"),
        None,
    ),
    (
        "a test: attention's batch",
        edit("tests/test_attn.py", "BATCH = 2", "BATCH = 4"),
        [n for n in ALL if "test_attn" in n],
    ),
    (
        "a docstring",
        edit(
            "proj/models/mlp.py", "sized by configs/mlp.json", "whose width configs/mlp.json sets"
        ),
        [],
    ),
    (
        "a comment",
        edit("proj/layers/helpers.py", "# the activation of every block", "# every block's"),
        [],
    ),
    ("the README", edit("README.md", "A small model zoo.", "A small zoo of models."), []),
    (
        "a new module nothing imports",
        add("proj/experimental.py", "import torch\n\n\ndef fused(x):\n    return x * 2\n"),
        [],
    ),
    (
        "the conftest",
        edit("tests/conftest.py", "torch.manual_seed(0)", "torch.manual_seed(1)"),
        ALL,
    ),
]


def session(root: Path, out: str, *extra: str) -> tuple[float, dict[str, object]]:
    """One ``pytest --perfguard`` session: its wall seconds and its results by node id."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PERFGUARD_CONFIRM_BUDGET", None)  # confirmed as a user's session is
    t0 = time.perf_counter()
    flags = ["--perfguard", "--perfguard-backend=cpu", "--perfguard-store=store.db"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags]
    subprocess.run(
        [*command, f"--perfguard-output={out}", *extra],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    wall = time.perf_counter() - t0
    doc = load_results(root / out / "results.json")
    return wall, {
        t.nodeid: {
            "outcome": t.outcome.value,
            "gates": t.gates.outcome.value if t.gates is not None else None,
            "carried": t.carried_from is not None,
        }
        for t in doc.tests
    } | {"_note": [n for n in doc.notes if n.startswith("--perfguard-changed")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="perfguard-changed-"))
    root = work / "proj"
    shutil.copytree(PROJECT, root)
    (root / ".gitignore").write_text(".perfguard*/\nstore.db*\n__pycache__/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "ci@example.com")
    git(root, "config", "user.name", "CI")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "c0")
    session(root, ".perfguard-main0", "--perfguard-save")
    git(root, "commit", "-q", "--allow-empty", "-m", "c1")
    session(root, ".perfguard-main1", "--perfguard-save")

    rows = []
    for i, (name, change, must_run) in enumerate(PULL_REQUESTS):
        git(root, "checkout", "-q", "-b", f"pr{i}", "main")
        change(root)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", name)
        t_changed, changed = session(root, f".perfguard-pr{i}-changed", "--perfguard-changed")
        t_full, full = session(root, f".perfguard-pr{i}-full")
        git(root, "checkout", "-q", "main")
        skipped = sorted(
            n for n in ALL if isinstance(changed.get(n), dict) and changed[n]["carried"]
        )
        ran = sorted(n for n in ALL if n not in skipped)
        wrong = [
            f"{n} ({full[n]['outcome']}, gates {full[n]['gates']})"  # type: ignore[index]
            for n in skipped
            if full[n]["gates"] not in (None, "unchanged")  # type: ignore[index]
            or full[n]["outcome"] == Outcome.REGRESSED.value  # type: ignore[index]
        ]
        expected = ALL if must_run is None else must_run
        missing = sorted(set(expected) - set(ran))  # should have run and did not
        extra = sorted(set(ran) - set(expected))  # ran though it need not have
        changed_by_gates = sorted(
            n
            for n in ALL
            if full[n]["gates"] not in (None, "unchanged")  # type: ignore[index]
        )
        rows.append(
            {
                "pull_request": name,
                "ran": ran,
                "skipped": skipped,
                "wrong_skips": wrong,
                "expected_to_run": expected,
                "missing": missing,
                "ran_though_unneeded": extra,
                "full_run_gates_changed": changed_by_gates,
                "note": changed["_note"],
                "seconds_changed": round(t_changed, 2),
                "seconds_full": round(t_full, 2),
            }
        )
        print(
            f"{name}: ran {len(ran)}/{len(ALL)}, skipped {len(skipped)}, wrong skips "
            f"{len(wrong)}, gates changed in the full run {len(changed_by_gates)}; "
            f"{t_changed:.1f} s vs {t_full:.1f} s; {changed['_note']}"
        )
    total = len(ALL) * len(rows)
    skipped_n = sum(len(r["skipped"]) for r in rows)
    wrong_n = sum(len(r["wrong_skips"]) for r in rows)
    summary = {
        "pull_requests": len(rows),
        "benchmarks": len(ALL),
        "skipped": skipped_n,
        "of": total,
        "wrong_skips": wrong_n,
        "seconds_changed": round(sum(r["seconds_changed"] for r in rows), 1),
        "seconds_full": round(sum(r["seconds_full"] for r in rows), 1),
        "load": os.getloadavg(),
    }
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
