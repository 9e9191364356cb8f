"""A real store to publish: ``pytest --perfguard --perfguard-save`` over 30 commits of a
small torch project, with two real steps and one acceptance.

The project (a fresh git repository) trains a small MLP block (Linear, LayerNorm,
GELU, Linear) on the CPU and runs its inference, two benchmark tests. Its history:

* commit ``ADD_OP`` (10) adds a SiLU gate (``x * sigmoid(x)``) to the block: two
  more ops per step (a counter step of calls and kernels) and a little more time;
* commit ``BIGGER`` (20) trains on a batch of 96 instead of 64: the same ops, 1.5x
  the FLOPs and bytes, and a slower step (a timing step); it is accepted
  (``perfguard baseline accept --at BIGGER``) as intended.

Every commit is measured by one real session saved into ``--store`` (a SQLite
path or a ``postgresql://`` URL), then ``perfguard publish`` writes the site.
An interrupted build is continued after its last commit.

    python benchmarks/publish_real.py OUT_DIR [--store PATH_OR_URL | --postgres] [--commits 30]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from history_repo import git, resume_project  # noqa: E402

ADD_OP, BIGGER = 10, 20

MODEL = '''"""A small MLP block: the project whose history is published."""
import torch
from torch import nn

GATE = {gate}  # a SiLU gate after the first layer (commit {add_op} on)
BATCH = {batch}  # training batch (commit {bigger} on: 96)


class Block(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.norm = nn.LayerNorm(2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if GATE:
            h = h * torch.sigmoid(h)
        return x + self.down(torch.nn.functional.gelu(self.norm(h)))
'''

TESTS = """import pytest
import torch

from model import BATCH, Block

torch.set_num_threads(1)
torch.manual_seed(0)


@pytest.mark.gpuprofile(iterations=8, warmup=2, metrics=("cpu_time",))
def test_train_step(gpuprofile):
    model = Block()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, 256)
    for _ in gpuprofile.iterations():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


@pytest.mark.gpuprofile(iterations=10, warmup=2, metrics=("cpu_time",))
def test_inference(gpuprofile):
    model = Block().eval()
    x = torch.randn(32, 256)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x)
"""


def build(root: Path, store: str, n_commits: int) -> list[str]:
    """Commit and measure the project's versions; shas oldest first."""
    shas, env = resume_project(root)
    for i in range(len(shas), n_commits):
        text = MODEL.format(
            gate=i >= ADD_OP, batch=96 if i >= BIGGER else 64, add_op=ADD_OP, bigger=BIGGER
        )
        (root / "model.py").write_text(text + f"# commit {i}\n")
        (root / "test_block.py").write_text(TESTS)
        git(root, "add", "-A")
        git(
            root,
            "commit",
            "-q",
            "-m",
            f"commit {i}"
            + (": SiLU gate" if i == ADD_OP else "")
            + (": batch 96" if i == BIGGER else ""),
        )
        shas.append(git(root, "rev-parse", "HEAD"))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "--perfguard",
            "--perfguard-save",
            f"--perfguard-store={store}",
            "--perfguard-fail-on=never",
            "--perfguard-rounds=3",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
        ]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"session {i} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        print(f"commit {i} measured", flush=True)
        if i == BIGGER:
            perfguard(
                "baseline",
                "accept",
                "test_block.py::test_train_step",
                "--at",
                "HEAD",
                "--reason",
                "batch 96: more samples per step, intended",
                "--store",
                store,
                cwd=root,
            )
    return shas


def perfguard(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "perfguard", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"perfguard {args[0]} failed: {done.stderr}")
    return done.stdout


def start_postgres() -> Any:
    """A throwaway PostgreSQL cluster (tests/pgserver.py), or exit saying why not."""
    from pgserver import WHY_NOT, PgServer, find_binaries

    bindir = find_binaries()
    if bindir is None:
        raise SystemExit(f"no PostgreSQL server: {'; '.join(WHY_NOT)}")
    return PgServer(bindir).start()


def copy_and_publish(store: str, out: Path) -> None:
    """The store copied onto a new PostgreSQL server and published from there."""
    server = start_postgres()
    try:
        url = server.new_database()
        print(perfguard("baseline", "migrate", "--store", store, "--to", url, cwd=out))
        print(
            perfguard(
                "publish",
                url,
                str(out / "site-postgresql"),
                "--repo",
                str(out / "project"),
                cwd=out,
            )
        )
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder: project/, site/ (and store.db)")
    ap.add_argument("--store", help="store URL or path (default: OUT/store.db)")
    ap.add_argument("--commits", type=int, default=30)
    ap.add_argument(
        "--copy-to-postgres",
        action="store_true",
        help="then copy the store onto a throwaway PostgreSQL server (baseline "
        "migrate) and publish that too, to OUT/site-postgresql",
    )
    ap.add_argument(
        "--postgres",
        action="store_true",
        help="a throwaway PostgreSQL server (tests/pgserver.py) holds the store",
    )
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    server = start_postgres() if args.postgres else None
    try:
        store = server.new_database() if server else (args.store or str(out / "store.db"))
        build(out / "project", store, args.commits)
        print(
            perfguard("publish", store, str(out / "site"), "--repo", str(out / "project"), cwd=out)
        )
        if args.copy_to_postgres:
            copy_and_publish(store, out)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
