"""``perfguard publish`` at scale: 1,000 commits x 200 tests x 3 machines (600,000 records).

Synthesises a git repository of ``--commits`` first-parent commits (``git
fast-import``, seconds) and a SQLite store of one run per commit and machine,
written through the store's own schema (``Store`` creates and migrates it;
rows go in with the backend's ``insert_rows``, one bulk insert per table per
chunk of commits, no ``TestRecord`` objects). Each test has a level, a
run-to-run noise of 1-3 %, up to two timing steps and sometimes an added op
(a calls/FLOPs step), five ops with counters, and a peak-memory counter; the
GPU machines profile 5 rounds of 4 iterations, the CPU machine times 5
unprofiled rounds and profiles one. A few tests carry an acceptance.

Then it publishes the store twice (all pages, then nothing changed) and once
more after one more commit's partial run (20 tests on one machine: only their
pages are rebuilt), printing wall and CPU time, the machine's load (``uptime``), the
page count and the largest page. Numbers: ``benchmarks/README.md``.

    python benchmarks/publish_scale.py [--commits 1000 --tests 200] [--keep DIR [--build-only]]

``--keep DIR`` keeps the store, repository and site there; a later run reuses the store
(the partial run an earlier one added is pruned first, so each run measures the same
three steps), and ``--build-only`` only builds it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfguard.baseline.record import Fingerprint  # noqa: E402
from perfguard.baseline.schema import FINGERPRINT_COLUMNS  # noqa: E402
from perfguard.baseline.store import open_store  # noqa: E402

MACHINES = (
    (
        Fingerprint(
            gpu_name="NVIDIA H100 80GB HBM3",
            gpu_count=1,
            backend="nsys",
            host="gpu-a",
            cpu="x86_64",
        ),
        "gpu_time",
    ),
    (
        Fingerprint(
            gpu_name="NVIDIA A100-SXM4-80GB",
            gpu_count=1,
            backend="torch",
            host="gpu-b",
            cpu="x86_64",
        ),
        "gpu_time",
    ),
    (Fingerprint(gpu_name="", gpu_count=0, backend="cpu", host="ci-cpu", cpu="x86_64"), "cpu_time"),
)
OPS = ("aten::linear", "aten::layer_norm", "aten::gelu", "aten::softmax", "aten::add")
ROUNDS, ITERS = 5, 4
START = datetime(2025, 1, 1, tzinfo=timezone.utc)


def make_repo(root: Path, n: int) -> list[str]:
    """``n`` first-parent commits with fast-import; their shas, oldest first."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    lines = []
    for i in range(n):
        msg = f"commit {i}\n"
        lines += [
            "commit refs/heads/main",
            f"mark :{i + 1}",
            f"committer CI <ci@example.com> {1_700_000_000 + 60 * i} +0000",
            f"data {len(msg)}",
            msg.rstrip("\n"),
        ]
        if i:
            lines.append(f"from :{i}")
        lines.append(f"M 644 inline f.txt\ndata {len(str(i))}\n{i}")
    subprocess.run(
        ["git", "-C", str(root), "fast-import", "--quiet"],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
    )
    out = subprocess.run(
        ["git", "-C", str(root), "rev-list", "--reverse", "main"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


class Plan:
    """Every test's level, noise, steps and op changes, drawn once (seeded)."""

    def __init__(self, n_tests: int, n_commits: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.n_tests, self.n_commits = n_tests, n_commits
        self.base = rng.lognormal(np.log(2e6), 1.0, n_tests)
        self.noise = rng.uniform(0.01, 0.03, n_tests)
        edge = n_commits // 20 + 6  # a step has runs on both sides
        where = np.arange(edge, n_commits - edge)
        self.steps = [
            sorted(rng.choice(where, rng.integers(0, 3), replace=False).tolist())
            for _ in range(n_tests)
        ]
        self.sizes = [rng.choice([-0.08, 0.1, 0.15, 0.25], len(s)) for s in self.steps]
        self.added = rng.integers(n_commits // 4, n_commits, n_tests)  # commit adding an op
        self.has_added = rng.random(n_tests) < 0.3

    def level(self, t: int, c: int) -> float:
        f = 1.0
        for at, size in zip(self.steps[t], self.sizes[t], strict=True):
            if c >= at:
                f *= 1 + size
        return self.base[t] * f

    def accepted(self) -> list[tuple[int, int]]:
        """(test, commit) of an acceptance: each test's first upward step, for a few."""
        out = []
        for t in range(0, self.n_tests, 17):
            up = [a for a, s in zip(self.steps[t], self.sizes[t], strict=True) if s > 0]
            if up:
                out.append((t, up[0]))
        return out


def write_store(
    path: Path, shas: list[str], plan: Plan, start: int = 0, *, partial: int | None = None
) -> float:
    """Runs of commits ``start..`` on every machine into the store at ``path`` (``partial``:
    only that many tests, on the first machine: a ``-k`` session); seconds."""
    t0 = time.perf_counter()
    rng = plan.rng
    n_t = plan.n_tests if partial is None else partial
    machines = MACHINES if partial is None else MACHINES[:1]
    nodeids = [f"tests/test_model_{t // 20:02d}.py::test_case_{t:03d}" for t in range(n_t)]
    with open_store(path) as store:
        db = store.db
        (next_test,) = db.execute("SELECT coalesce(max(test_id), 0) FROM tests").fetchone()
        (next_run,) = db.execute("SELECT coalesce(max(run_id), 0) FROM runs").fetchone()
        chunk = 50
        for lo in range(start, len(shas), chunk):
            commits = range(lo, min(lo + chunk, len(shas)))
            runs, tests, samples, counters, ops = [], [], [], [], []
            for c in commits:
                for m, (fp, metric) in enumerate(machines):
                    next_run += 1
                    when = (START + timedelta(minutes=c, seconds=m)).isoformat()
                    fpd = fp.to_dict()
                    runs.append(
                        (
                            next_run,
                            shas[c],
                            "main",
                            0,
                            when,
                            json.dumps(fpd, sort_keys=True),
                            "bench",
                            *[fpd[k] for k in FINGERPRINT_COLUMNS],
                        )
                    )
                    ids = np.arange(next_test + 1, next_test + 1 + n_t)
                    next_test += n_t
                    tests += [
                        (int(i), next_run, nodeids[t], metric, "{}") for t, i in enumerate(ids)
                    ]
                    lv = np.array([plan.level(t, c) for t in range(n_t)]) * (1 + 0.2 * m)
                    run_lv = lv * np.exp(plan.noise[:n_t] * rng.standard_normal(n_t))
                    timed = metric != "gpu_time"
                    n_rounds = ROUNDS + (1 if timed else 0)
                    vals = run_lv[:, None] * np.exp(
                        0.005 * rng.standard_normal((n_t, n_rounds * ITERS))
                    )
                    rnd = np.tile(np.repeat(np.arange(n_rounds), ITERS), n_t)
                    prof = np.ones_like(rnd) if not timed else (rnd == ROUNDS).astype(int)
                    tid = np.repeat(ids, n_rounds * ITERS)
                    it = np.tile(np.arange(n_rounds * ITERS), n_t)
                    v = vals.ravel().astype(np.int64)
                    gpu = v if not timed else np.zeros_like(v)
                    samples += zip(
                        tid.tolist(),
                        it.tolist(),
                        gpu.tolist(),
                        v.tolist(),
                        v.tolist(),
                        rnd.tolist(),
                        prof.tolist(),
                        strict=True,
                    )
                    extra = (plan.has_added & (c >= plan.added))[:n_t]
                    for t, i in enumerate(ids):
                        n_ops = len(OPS) - (0 if extra[t] else 1)
                        share = run_lv[t] / n_ops
                        for k in range(n_ops):
                            op = OPS[k]
                            calls = 2.0 if k == 0 else 1.0
                            flops = 1e9 * (k + 1) * (1 + t % 7)
                            counters += [
                                (int(i), f"op{k}", op, "calls", calls, 1),
                                (int(i), f"op{k}", op, "kernels", calls, 1),
                                (int(i), f"op{k}", op, "flops", flops, 1),
                                (int(i), f"op{k}", op, "bytes", flops / 8, 1),
                            ]
                            ops.append(
                                (
                                    int(i),
                                    f"op{k}",
                                    op,
                                    "fprop",
                                    "x",
                                    int(calls * ITERS),
                                    int(calls * ITERS),
                                    int(share * ITERS),
                                    int(share * ITERS),
                                    1,
                                    int(k == 0),
                                    flops * ITERS,
                                    int(flops / 8 * ITERS),
                                    "float32",
                                )
                            )
                        counters.append((int(i), "", "", "peak_memory", 1e8 * (1 + t % 5), 1))
            with db.write():
                db.insert_rows(
                    "runs",
                    (
                        "run_id",
                        "commit",
                        "branch",
                        "dirty",
                        "time",
                        "fingerprint",
                        "perfguard_version",
                        *FINGERPRINT_COLUMNS,
                    ),
                    runs,
                )
                db.insert_rows("tests", ("test_id", "run_id", "nodeid", "metric", "meta"), tests)
                db.insert_rows(
                    "samples",
                    (
                        "test_id",
                        "iteration",
                        "gpu_time_ns",
                        "wall_time_ns",
                        "cpu_time_ns",
                        "round",
                        "profiled",
                    ),
                    samples,
                )
                db.insert_rows(
                    "counters",
                    ("test_id", "op_id", "op_name", "counter", "value", "stable"),
                    counters,
                )
                db.insert_rows(
                    "ops",
                    (
                        "test_id",
                        "op_id",
                        "op_name",
                        "direction",
                        "op_type",
                        "calls",
                        "kernel_count",
                        "cpu_time_total",
                        "gpu_time_total",
                        "tc_eligible",
                        "using_tc",
                        "flops",
                        "bytes",
                        "dtypes",
                    ),
                    ops,
                )
        if start == 0:
            for t, c in plan.accepted():
                store.accept(
                    nodeids[t],
                    shas[c],
                    "bigger model, intended",
                    time=f"2025-02-01T00:00:{t % 60:02d}+00:00",
                )
    return time.perf_counter() - t0


def publish(store: Path, out: Path, repo: Path) -> dict[str, float]:
    """One ``perfguard publish`` in a fresh process: wall, CPU (children), load, pages."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "perfguard", "publish", str(store), str(out), "--repo", str(repo)],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"publish failed: {done.stderr[-3000:]}")
    pages = list(out.rglob("*.html"))
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "load": load,
        "pages": len(pages),
        "largest_kb": max(p.stat().st_size for p in pages) / 1024,
        "summary": done.stdout.strip().splitlines()[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--tests", type=int, default=200)
    ap.add_argument("--keep", type=Path, help="build (or reuse) the store and repo here")
    ap.add_argument(
        "--build-only",
        action="store_true",
        help="build the store and repo (--keep) and publish nothing",
    )
    args = ap.parse_args()
    if args.build_only and args.keep is None:
        ap.error("--build-only needs --keep DIR")
    root = args.keep or Path(tempfile.mkdtemp(prefix="perfguard-publish-"))
    root.mkdir(parents=True, exist_ok=True)
    repo, store, out = root / "repo", root / "store.db", root / "site"
    plan = Plan(args.tests, args.commits + 1)
    if not store.exists():
        shas = make_repo(repo, args.commits + 1)  # the last commit is the "one more" below
        secs = write_store(store, shas[:-1], plan)
        print(f"store: {store.stat().st_size / 1e9:.2f} GB written in {secs:.0f} s")
    if args.build_only:
        return
    shas = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--reverse", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    with open_store(store) as s:  # a kept store is measured as built: without "one more"
        if s.prune(commits=[shas[-1]]):
            print("removed the partial run an earlier measurement added")
    shutil.rmtree(out, ignore_errors=True)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for what in ("full", "unchanged"):
        r = publish(store, out, repo)
        print(
            f"{what}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, load {r['load']:.2f}, "
            f"{r['pages']} pages, largest {r['largest_kb']:.0f} KB; {r['summary']}"
        )
    partial = min(20, args.tests)
    write_store(store, shas, plan, start=args.commits, partial=partial)
    r = publish(store, out, repo)
    print(
        f"one more commit, {partial} tests: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, load "
        f"{r['load']:.2f}, largest {r['largest_kb']:.0f} KB; {r['summary']}"
    )
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
