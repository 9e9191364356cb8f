"""The whole suite N times in a row under ``-n 2`` beside a CPU spinner (issue 45).

A flaky test shows up as a failure in one run of several on a busy machine; this runs the
README's test command ``runs`` times back to back while a spinner process keeps one core
busy, and writes each run's pytest summary line, wall time, the load average before and
after, and the failed tests' ids::

    python benchmarks/suite_repeat.py --runs 5 --out benchmarks/data/suite_repeat.json

Run it from a clone whose ``perfguard`` is the code under test (``PYTHONPATH`` is set to the
clone, so the children the tests start import it too).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: where a failed run's output is kept (set from --out) and the runs made so far
OUT_STEM: list[str] = ["suite_repeat"]
RUNS_SEEN: list[int] = []


def spin(stop: Any) -> None:
    """Keep one core busy until told to stop."""
    n = 0
    while not stop.is_set():
        for _ in range(100_000):
            n += 1


def one_run(args: list[str]) -> dict[str, object]:
    load_before = os.getloadavg()
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.monotonic() - t0
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    # each failure with pytest's one-line reason, from the run's own summary (the last one:
    # a pytester session's captured output holds summaries of its own); a failed run's
    # report kept beside --out
    own = done.stdout.rsplit("short test summary info", 1)[-1]
    failed = re.findall(r"^(?:FAILED|ERROR) (.+)$", own, flags=re.M)
    if done.returncode != 0:
        keep = Path(f"{OUT_STEM[0]}.run{len(RUNS_SEEN) + 1}.log")
        keep.write_text(done.stdout[-200_000:] + done.stderr[-20_000:])
    counts = {
        k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)", summary)
    }
    return {
        "rc": done.returncode,
        "summary": summary,
        "counts": counts,
        "failed": failed,
        "wall_s": round(wall, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-spinner", action="store_true")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (default: the whole suite)")
    ns = ap.parse_args()
    OUT_STEM[0] = str(ns.out.with_suffix(""))
    stop = multiprocessing.Event()
    spinner = None if ns.no_spinner else multiprocessing.Process(target=spin, args=(stop,))
    if spinner is not None:
        spinner.start()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    doc: dict[str, object] = {
        "commit": commit,
        "cpus": os.cpu_count(),
        "spinner": spinner is not None,
        "runs": [],
    }
    runs: list[dict[str, object]] = doc["runs"]  # type: ignore[assignment]
    try:
        for i in range(ns.runs):
            runs.append(one_run(ns.pytest_args))
            RUNS_SEEN.append(i)
            r = runs[-1]
            line = (
                f"run {i + 1}/{ns.runs}: {r['summary']} ({r['wall_s']} s, load {r['load_after']})"
            )
            print(line, flush=True)
            ns.out.write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        stop.set()
        if spinner is not None:
            spinner.join(5)
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
