"""`perfguard profile --backend torch` before and after the window (issue 40, item 4).

    python benchmarks/profile_window.py [--steps 5] [--long-steps 10000] [--skip-before]

In one run, with the machine's load (``/proc/loadavg``) before and after:

* **before**: the 5-step CNN of ``benchmarks/cnn_train.py`` profiled as the torch
  backend used to: the whole process, torch's Python tracer on
  (``--iterations all --with-stack``);
* **after**: the same script with the defaults (a window of 3 iterations after 2
  warm-up, no Python stacks);
* **long**: the same script for ``--long-steps`` steps (``--long-batch`` images
  each, default 1) with the defaults, beside the script run plainly (no
  profiler) for its own time.

Each is the whole command, analysis included (``perfguard profile ... --reports
summary --formats csv``, in a fresh process), timed by wall clock and by the CPU
seconds it and the profiled program took (the VM is shared); the capture's
size on disk (gzip) and its events counted by streaming the JSON (every event
(``"ph"``) and the Python-call ones, ``python_function``). Prints a table.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cnn_train.py"


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def count_events(trace: Path) -> tuple[int, int]:
    """(events, python_function events) of a Kineto JSON (one field per line, as torch
    writes it), streamed: the whole-run trace is 392 MB of JSON."""
    events = python = 0
    with gzip.open(trace, "rb") as f:
        for line in f:
            s = line.lstrip()
            if s.startswith(b'"ph":'):
                events += 1
            elif s.startswith(b'"cat": "python_function"'):
                python += 1
    return events, python


def profile(steps: int, *options: str, out: Path, batch: int = 16) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [
        sys.executable,
        "-m",
        "perfguard",
        "profile",
        "--backend",
        "torch",
        *options,
        "--output-path",
        str(out),
        "--reports",
        "summary",
        "--formats",
        "csv",
        "--force",
        "--",
        sys.executable,
        str(SCRIPT),
        "--steps",
        str(steps),
        "--batch",
        str(batch),
    ]
    t0, cpu0 = time.perf_counter(), _children_cpu()
    run = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if run.returncode != 0:
        raise SystemExit(f"perfguard profile failed ({run.returncode}): {run.stderr[-2000:]}")
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("capture: "))
    trace = out / "capture.pt.trace.json.gz"
    events, python = count_events(trace)
    summary = (out / "dlprof_summary.csv").read_text().splitlines()
    iterations = next((ln.split(",", 1)[1] for ln in summary if ln.startswith("Iterations,")), "")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "bytes": trace.stat().st_size,
        "events": events,
        "python": python,
        "iterations": iterations,
        "line": line,
    }


def _children_cpu() -> float:
    """User + system CPU seconds of the finished children so far (the command and its
    profiled program: the CPU it took, whatever else the machine was running)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def plain(steps: int, batch: int) -> tuple[float, float]:
    """Wall and CPU seconds of the script without a profiler."""
    t0, cpu0 = time.perf_counter(), _children_cpu()
    subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", str(steps), "--batch", str(batch)],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0, _children_cpu() - cpu0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--long-steps", type=int, default=10_000)
    p.add_argument("--long-batch", type=int, default=1, help="images a step in the long run")
    p.add_argument("--skip-before", action="store_true", help="not the (slow) former capture")
    p.add_argument("--skip-long", action="store_true")
    args = p.parse_args()
    print(f"load before: {loadavg()}  (CPUs: {os.cpu_count()})")
    rows: list[tuple[str, dict[str, object]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = plain(args.steps, 16)
        print(
            f"the {args.steps}-step script without a profiler: {wall:.1f} s wall, {cpu:.1f} s CPU"
        )
        if not args.skip_before:
            rows.append(
                (
                    f"before: {args.steps} steps, whole run + stacks",
                    profile(
                        args.steps, "--iterations", "all", "--with-stack", out=Path(tmp) / "before"
                    ),
                )
            )
        rows.append(
            (
                f"after: {args.steps} steps, default window",
                profile(args.steps, out=Path(tmp) / "after"),
            )
        )
        if not args.skip_long:
            rows.append(
                (
                    f"after: {args.long_steps} steps, default window",
                    profile(args.long_steps, out=Path(tmp) / "long", batch=args.long_batch),
                )
            )
            wall, cpu = plain(args.long_steps, args.long_batch)
            print(
                f"the {args.long_steps}-step script without a profiler: "
                f"{wall:.1f} s wall, {cpu:.1f} s CPU"
            )
    print(f"load after: {loadavg()}")
    print(
        f"{'case':<42} {'wall s':>7} {'CPU s':>7} {'MB (gz)':>8} {'events':>10} "
        f"{'python':>10} {'iters':>5}"
    )
    for name, r in rows:
        print(
            f"{name:<42} {r['wall_s']:>7.1f} {r['cpu_s']:>7.1f} "
            f"{int(r['bytes']) / 1e6:>8.2f} {r['events']:>10,} {r['python']:>10,} "  # type: ignore[call-overload]
            f"{r['iterations']:>5}"
        )
    for name, r in rows:
        print(f"{name}: {r['line']}")


if __name__ == "__main__":
    main()
