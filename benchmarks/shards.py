"""A 40-test suite run as one job and as 4 shards in parallel, merged: same verdicts, one run.

    python benchmarks/shards.py [--tests 40] [--shards 4] [--no-postgres]

In a temp git repository: commit c0 is measured once and saved (the baseline
store); commit c1 changes one test's step (a float64 matmul: a gate regression,
which no load can hide) and is measured
* as one job on a copy of the store (the reference verdicts),
* as N shard jobs started together, each on its own copy of the store, their
  stores merged (``perfguard baseline merge``) and their results merged
  (``perfguard merge``),
* as N shard jobs started together saving into one PostgreSQL store (a
  throwaway cluster, ``tests/pgserver.py``), unless ``--no-postgres``,
* as N shards with one missing (the merge must name it and exit 1).
Prints per test whether the merged outcome equals the one job's (timing outcomes
of tiny CPU steps can differ between two sessions on a loaded machine; the gates
cannot), the runs per commit in each store, each test's record count, and wall
times.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from pgserver import WHY_NOT, PgServer, find_binaries  # noqa: E402

from perfguard.baseline.store import Store  # noqa: E402
from perfguard.compare.results import load_results  # noqa: E402

SUITE = """
import pytest
import torch

DTYPE = {dtype}


@pytest.mark.gpuprofile(iterations=3, warmup=1)
@pytest.mark.parametrize("n", range({tests}))
def test_step(gpuprofile, n):
    a = torch.randn(16 + 4 * n, 16 + 4 * n, dtype=DTYPE if n == 7 else torch.float32)
    for _ in gpuprofile.iterations():
        (a @ a).relu()
"""


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def pytest_args(store: str, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--perfguard",
        "--perfguard-save",
        "--perfguard-backend=cpu",
        "--perfguard-fail-on=never",
        f"--perfguard-store={store}",
        f"--perfguard-output={out}",
        *extra,
    ]


def run_jobs(root: Path, commands: list[list[str]]) -> float:
    """Start every command at once; wait for all; the wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_STEP_SUMMARY": ""}
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(c, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for c in commands
    ]
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def perfguard(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_STEP_SUMMARY": ""}
    return subprocess.run(
        [sys.executable, "-m", "perfguard", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )


def runs_per_commit(location: str | Path) -> dict[str, tuple[int, list[int]]]:
    with Store(location) as store:
        runs = store.reader.runs()
    out: dict[str, tuple[int, list[int]]] = {}
    for commit, group in runs.groupby("commit"):
        out[str(commit)[:8]] = (len(group), [int(n) for n in group["n_tests"]])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=40)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    n = args.shards
    root = Path(tempfile.mkdtemp(prefix="perfguard-shards-"))
    sh("git", "init", "-q", "-b", "main", cwd=root)
    sh("git", "config", "user.email", "b@example.com", cwd=root)
    sh("git", "config", "user.name", "bench", cwd=root)
    (root / "pytest.ini").write_text("[pytest]\n")
    for i, dtype in enumerate(("torch.float32", "torch.float64")):
        (root / "test_suite.py").write_text(SUITE.format(tests=args.tests, dtype=dtype))
        sh("git", "add", "-A", cwd=root)
        sh("git", "commit", "-q", "-m", f"c{i}", cwd=root)
        if i == 0:
            base = root / "base.db"
            t = run_jobs(root, [pytest_args(str(base), root / "c0")])
            print(f"c0: one job saved the baseline in {t:.1f} s")

    shutil.copy(base, root / "one.db")
    t_one = run_jobs(root, [pytest_args(str(root / "one.db"), root / "one")])
    one_doc = load_results(root / "one" / "results.json")
    one = {t.nodeid: t.outcome.value for t in one_doc.tests}
    one_gates = {t.nodeid: t.gates.outcome.value if t.gates else None for t in one_doc.tests}
    print(f"c1: one job: {t_one:.1f} s, {len(one)} tests")

    stores = []
    commands = []
    for k in range(1, n + 1):
        stores.append(root / f"s{k}.db")
        shutil.copy(base, stores[-1])
        shard = [f"--perfguard-shard={k}/{n}", "--perfguard-run-group=ci:1"]
        commands.append(pytest_args(str(stores[-1]), root / f"shard{k}", *shard))
    t_shards = run_jobs(root, commands)
    files = [f"shard{k}/results.json" for k in range(1, n + 1)]
    merged = perfguard(root, "merge", *files, "-o", "merged")
    doc = load_results(root / "merged" / "results.json")
    same = sum(one.get(t.nodeid) == t.outcome.value for t in doc.tests)
    diff = [
        (t.nodeid, one.get(t.nodeid), t.outcome.value)
        for t in doc.tests
        if one.get(t.nodeid) != t.outcome.value
    ]
    plans = {load_results(root / f).settings["shard_plan"]["plan"] for f in files}
    sizes = [len(load_results(root / f).tests) for f in files]
    print(
        f"c1: {n} shards in parallel: {t_shards:.1f} s, tests per shard {sizes}, "
        f"one split ({len(plans)} digest); merge exit {merged.returncode}"
    )
    gates = sum(
        one_gates.get(t.nodeid) == (t.gates.outcome.value if t.gates else None) for t in doc.tests
    )
    print(
        f"  merged {len(doc.tests)} tests: {same} with the one job's outcome, {gates} with its "
        f"gates' outcome; differing outcomes: {diff}"
    )
    regressed = [t.nodeid for t in doc.tests if t.outcome.value == "regressed"]
    print(f"  regressed in the merge: {regressed}; badge {doc.badge()}")
    perfguard(root, "baseline", "merge", "m.db", *map(str, stores))
    print(f"  SQLite shard stores merged: runs per commit {runs_per_commit(root / 'm.db')}")
    hist = json.loads(perfguard(root, "history", "--store", "m.db", "--json").stdout)
    print(f"  history: runs per test {sorted({t['runs'] for t in hist['tests']})}")

    missing = perfguard(root, "merge", *files[:-1], "-o", "missing", "--expect-shards", str(n))
    print(f"  one shard missing: exit {missing.returncode}: {missing.stderr.strip()}")

    if args.no_postgres:
        return
    bindir = find_binaries()
    if bindir is None:
        print(f"no PostgreSQL: {'; '.join(WHY_NOT)}")
        return
    server = PgServer(bindir).start()
    try:
        url = server.new_database()
        perfguard(root, "baseline", "migrate", "--store", str(base), "--to", url)
        commands = [
            pytest_args(
                url, root / f"pg{k}", f"--perfguard-shard={k}/{n}", "--perfguard-run-group=ci:2"
            )
            for k in range(1, n + 1)
        ]
        t_pg = run_jobs(root, commands)
        print(
            f"c1: {n} shards in parallel into PostgreSQL: {t_pg:.1f} s; runs per commit "
            f"{runs_per_commit(url)}"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
