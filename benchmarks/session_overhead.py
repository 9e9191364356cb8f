"""Where a ``pytest --perfguard`` session's seconds go, beside plain ``pytest`` in one run.

Builds a small real project in a temporary git repository (three small torch tests of the
kind a team marks: an MLP forward, an MLP training step, a convolution), then runs, each
in a fresh process and ``--repeat`` times, alternating:

* ``plain``: ``pytest`` without perfguard (each test runs its warm-up and one loop);
* ``store``: ``pytest --perfguard`` against a saved baseline (five timed rounds per test,
  the profiled round, the analysis, the verdict, the reports).

For each it prints wall and CPU seconds (the child's user + system time, from
``os.wait4``: it does not grow when the machine is busy the way wall time does), and from
the session's ``results.json`` the seconds of each part: per test its warm-up and the kept
timed rounds' steps (the test's own work, which plain pytest does once) and perfguard's
parts beyond them (``round_checks``: the rest of the rounds' time, pauses, collections,
speed checks, rounds run again; ``profiled``: the capture's round with the trace written;
``analysis``; ``findings``;
``compare``; ``history``; ``timeline``), and the session's (``start``: the plugin's
start-up and imports beyond pytest's; ``results``: results.json after each test;
``reports``: results.json, report.html and summary.md at the end; ``save``).

``--ab`` also times an A/B session of two of the tests, 8 pairs (the README's figure).

    python benchmarks/session_overhead.py --repeat 3
    python benchmarks/session_overhead.py --repeat 3 --ab
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perfguard.plugin.phases import OWN_PHASES

TESTS = """
import pytest
import torch


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


@pytest.mark.gpuprofile(iterations=10, warmup=2)
def test_mlp_forward(gpuprofile):
    model = _mlp()
    x = torch.randn(32, 64)
    for _ in gpuprofile.iterations():
        model(x)


@pytest.mark.gpuprofile(iterations=10, warmup=2)
def test_mlp_train(gpuprofile):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in gpuprofile.iterations():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.gpuprofile(iterations=10, warmup=2)
def test_conv(gpuprofile):
    conv = torch.nn.Conv2d(3, 8, 3)
    x = torch.randn(4, 3, 32, 32)
    for _ in gpuprofile.iterations():
        conv(x).relu().sum()
"""


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def make_project(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "test_small.py").write_text(TESTS)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    who = ("-c", "user.name=b", "-c", "user.email=b@b")
    _git(root, *who, "commit", "-qm", "tests")
    _git(root, *who, "commit", "-qm", "the same tests (an A/A pair for --ab)", "--allow-empty")


def run(root: Path, *args: str) -> tuple[float, float, int]:
    """(wall s, CPU s of the child and its children, exit code) of one pytest process."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return wall, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status)


def results(root: Path) -> dict[str, Any]:
    """The last session's ``results.json``."""
    doc: dict[str, Any] = json.loads((root / ".perfguard" / "results.json").read_text())
    return doc


def phases(doc: dict[str, Any]) -> tuple[dict[str, float], dict[str, float], int]:
    """Per-test mean seconds by part, the session's parts, and the number of tests."""
    per_test: dict[str, float] = {}
    tests = [t for t in doc["tests"] if t.get("phase_s")]
    for t in tests:
        for k, v in t["phase_s"].items():
            per_test[k] = per_test.get(k, 0.0) + v / len(tests)
    return per_test, dict(doc.get("phase_s") or {}), len(tests)


def extra_steps(doc: dict[str, Any]) -> float:
    """Seconds of timed steps a session's rounds ran beyond the one loop plain pytest runs:
    each test's kept timed steps (``phase_s['timing']``) less one round of them."""
    extra = 0.0
    for t in doc["tests"]:
        timing = (t.get("phase_s") or {}).get("timing", 0.0)
        rounds = int((t.get("timing") or {}).get("n_current") or 1)
        extra += timing * (1 - 1 / max(rounds, 1))
    return extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ab", action="store_true", help="also time an A/B session (8 pairs)")
    ap.add_argument("--keep", type=Path, help="build the project here and keep it")
    ap.add_argument(
        "--project",
        type=Path,
        help="time this git project instead (its baseline already stored), e.g. the one "
        "suite_trust.py builds: 31 small tests of torch, pure Python, TF and JAX",
    )
    ap.add_argument(
        "--store-args",
        default="",
        help="more options of the --perfguard sessions, e.g. '--perfguard-baseline=main "
        "--perfguard-confirm-budget=0'",
    )
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="pg-overhead-"))
    if args.project is not None:
        root = args.project
    else:
        root = base / "proj"
        shutil.rmtree(root, ignore_errors=True)
        make_project(root)
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    if args.project is None:
        run(root, "--perfguard", "--perfguard-save")  # the baseline (and a warm page cache)
    rows: dict[str, list[tuple[float, float]]] = {"plain": [], "store": []}
    parts: list[tuple[dict[str, float], dict[str, float]]] = []
    measured: list[float] = []
    n_tests = 3
    for _ in range(args.repeat):
        wall, cpu, _code = run(root)
        rows["plain"].append((wall, cpu))
        wall, cpu, _code = run(root, "--perfguard", *args.store_args.split())
        rows["store"].append((wall, cpu))
        doc = results(root)
        per_test, session, n_tests = phases(doc)
        parts.append((per_test, session))
        measured.append(extra_steps(doc))
    print(f"\n{'session':<8} {'wall s (median)':>16} {'CPU s (median)':>15}  runs")
    for name, values in rows.items():
        walls = [w for w, _ in values]
        cpus = [c for _, c in values]
        print(
            f"{name:<8} {statistics.median(walls):>16.2f} {statistics.median(cpus):>15.2f}  "
            + ", ".join(f"{w:.1f}/{c:.1f}" for w, c in values)
        )
    extra_wall = statistics.median(w for w, _ in rows["store"]) - statistics.median(
        w for w, _ in rows["plain"]
    )
    extra_cpu = statistics.median(c for _, c in rows["store"]) - statistics.median(
        c for _, c in rows["plain"]
    )
    print(f"\n--perfguard adds {extra_wall:.2f} s wall, {extra_cpu:.2f} s CPU for {n_tests} tests")
    w = statistics.median(w for w, _ in rows["plain"]) + statistics.median(measured)
    store = statistics.median(w for w, _ in rows["store"])
    print(
        f"W (plain + the steps its rounds run beyond plain's one loop, issue 53): {w:.2f} s; "
        f"the --perfguard session {store / w:.2f} W"
    )
    keys = sorted({k for p, _ in parts for k in p})
    print("\nper test, median over runs (s):")
    own_total = []
    for k in keys:
        values = [p.get(k, 0.0) for p, _ in parts]
        tag = "  (the test's own)" if k in OWN_PHASES else ""
        print(f"  {k:<10} {statistics.median(values):6.3f}{tag}")
    for p, _ in parts:
        own_total.append(sum(v for k, v in p.items() if k not in OWN_PHASES))
    print(f"  perfguard's parts per test: {statistics.median(own_total):.3f}")
    session_keys = sorted({k for _, s in parts for k in s})
    print("session, median over runs (s):")
    for k in session_keys:
        print(f"  {k:<10} {statistics.median(s.get(k, 0.0) for _, s in parts):6.3f}")
    session_total = statistics.median(sum(s.values()) for _, s in parts)
    share = statistics.median(own_total) + session_total / n_tests
    print(f"perfguard's own share per test (its parts + the session's / {n_tests}): {share:.2f} s")
    if args.ab:
        wall, cpu, code = run(
            root, "--perfguard", "--perfguard-against=HEAD~1", "-k", "mlp_forward or conv"
        )
        print(f"\nA/B, 2 tests x 8 pairs: {wall:.1f} s wall, {cpu:.1f} s CPU (exit {code})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.keep is None and args.project is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
