"""How far one test's level moves between separate sessions, by the size of its step.

The store-mode judge assumes a between-run noise (``timing.PRIOR_RUN_SD``) until a test
has ``MIN_HISTORY`` stored runs: one session's rounds share a process, a memory placement
and a moment of the machine, so they cannot see what moves between sessions. That prior
was calibrated on steps of milliseconds (``calibration.py``); a step of microseconds moved
+129 % between two sessions of unchanged code in round 18. This measures the drift
between sessions as the step shrinks, on this machine, so the prior can follow it:

* a fresh git project with one test per step size (torch matmuls of 16 to 512 on one
  thread, from a few microseconds to milliseconds; the 16 once more with round 18's
  settings: 3 rounds of 2 iterations);
* ``--sessions`` separate ``pytest --perfguard --perfguard-save`` processes on the one
  commit (append mode: every session is kept), every ``--busy-every``-th beside one
  ``while True: pass`` process per core;
* then, from the store: each test's session levels (the rounds' geometric mean, as the
  judge's level), the SD of their logs (plain and the judge's robust
  ``between_run_sd``), and every ordered pair of sessions judged as a first comparison
  (``compare_records`` with no history, so the prior decides): how many of the
  ``n (n - 1)`` pairs of unchanged code read ``regressed`` or ``improved``.

    python benchmarks/prior_by_step.py --sessions 16 --out /tmp/prior
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from suite_repeat import spin  # noqa: E402  (the series' spinner: one busy core)

from perfguard.baseline.store import DEFAULT_STORE, open_store  # noqa: E402
from perfguard.compare.judge import compare_records  # noqa: E402
from perfguard.compare.timing import between_run_sd  # noqa: E402

#: test name -> (matrix size, marker settings)
STEPS = {
    "test_mm16_r3i2": (16, "iterations=2, warmup=1, rounds=3"),
    "test_mm16": (16, "iterations=20, warmup=2, rounds=5"),
    "test_mm64": (64, "iterations=20, warmup=2, rounds=5"),
    "test_mm128": (128, "iterations=20, warmup=2, rounds=5"),
    "test_mm256": (256, "iterations=10, warmup=2, rounds=5"),
    "test_mm512": (512, "iterations=5, warmup=1, rounds=5"),
}


def project_source() -> str:
    body = ["import pytest", "import torch", "", "torch.set_num_threads(1)", ""]
    for name, (n, marker) in STEPS.items():
        body += [
            "",
            f"@pytest.mark.gpuprofile({marker}, metrics=('wall_time',))",
            f"def {name}(gpuprofile):",
            f"    a = torch.randn({n}, {n})",
            "    for _ in gpuprofile.iterations():",
            "        a @ a",
            "",
        ]
    return "\n".join(body)


def make_project(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "test_steps.py").write_text(project_source())
    run = dict(cwd=path, check=True, capture_output=True)
    subprocess.run(["git", "init", "-q"], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "add", "."], **run)  # type: ignore[call-overload]
    subprocess.run(  # type: ignore[call-overload]
        ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "steps"], **run
    )


def session(project: Path, busy: bool) -> dict[str, Any]:
    stop = multiprocessing.Event()
    spinners = []
    if busy:
        for _ in range(os.cpu_count() or 1):
            p = multiprocessing.Process(target=spin, args=(stop,), daemon=True)
            p.start()
            spinners.append(p)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--perfguard",
            "--perfguard-save",
            "--perfguard-save-mode=append",
            "--perfguard-fail-on=never",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.monotonic() - t0
    stop.set()
    for p in spinners:
        p.join()
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    return {
        "busy": busy,
        "load_before": load,
        "wall_s": wall,
        "rc": done.returncode,
        "summary": tail[0],
    }


def analyse(project: Path, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    store = open_store(project / DEFAULT_STORE, create=False)
    runs = store.reader.runs()
    records = [store.reader.load_run(int(r))[1] for r in runs["run_id"]]
    out: dict[str, Any] = {}
    for name in STEPS:
        nodeid = f"test_steps.py::{name}"
        recs = [r[nodeid] for r in records if nodeid in r]
        levels = np.array([math.exp(np.log(r.round_values()).mean()) for r in recs])
        logs = np.log(levels)
        busy = np.array([s["busy"] for s in sessions][: len(recs)], dtype=bool)
        verdicts: dict[str, int] = {}
        worst: list[tuple[float, int, int, str]] = []
        in_alarms: set[int] = set()  # pairs share sessions: which sessions the alarms hold
        for i in range(len(recs)):
            for j in range(len(recs)):
                if i == j:
                    continue
                c = compare_records(recs[j], recs[i], baseline_commit="c0")
                key = str(c.timing.outcome.value)
                verdicts[key] = verdicts.get(key, 0) + 1
                worst.append((abs(c.timing.delta_pct or 0.0), i, j, key))
                if key in ("regressed", "improved"):
                    in_alarms.update((i, j))
        worst.sort(reverse=True)
        out[name] = {
            "step_us": float(np.median(levels)) / 1e3,
            "levels_us": [round(v / 1e3, 3) for v in levels],
            "busy": busy.tolist(),
            "sd_log": float(np.std(logs, ddof=1)),
            "sd_log_idle": float(np.std(logs[~busy], ddof=1)) if (~busy).sum() > 2 else None,
            "sd_log_busy": float(np.std(logs[busy], ddof=1)) if busy.sum() > 2 else None,
            "between_run_sd": between_run_sd(levels),
            "max_ratio": float(levels.max() / levels.min()),
            "pairs": len(recs) * (len(recs) - 1),
            "verdicts": verdicts,
            "sessions_in_alarms": sorted(in_alarms),
            "largest": [
                {"delta_pct": round(d, 1), "baseline": i, "current": j, "outcome": k}
                for d, i, j, k in worst[:4]
            ],
        }
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        "| test | step | SD log (all / no spinner / spinners) | robust SD | max/min | "
        "false alarms (pairs) | sessions in them |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in result["tests"].items():

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{100 * v:.1f} %"

        alarms = r["verdicts"].get("regressed", 0) + r["verdicts"].get("improved", 0)
        lines.append(
            f"| {name} | {r['step_us']:.1f} us | {pct(r['sd_log'])} / {pct(r['sd_log_idle'])}"
            f" / {pct(r['sd_log_busy'])} | {pct(r['between_run_sd'])} | {r['max_ratio']:.2f} |"
            f" {alarms} ({r['pairs']}) | {len(r['sessions_in_alarms'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument(
        "--busy-every",
        type=int,
        default=2,
        help="every Nth session beside one spinner per core (0: none)",
    )
    ap.add_argument("--out", type=Path, default=Path("prior_by_step"))
    ap.add_argument("--analyse-only", action="store_true")
    args = ap.parse_args()
    project = args.out / "project"
    log = args.out / "sessions.json"
    sessions: list[dict[str, Any]] = json.loads(log.read_text()) if log.exists() else []
    if not args.analyse_only:
        if not project.exists():
            make_project(project)
        while len(sessions) < args.sessions:
            k = len(sessions) + 1
            busy = bool(args.busy_every) and k % args.busy_every == 0
            s = session(project, busy)
            sessions.append(s)
            log.write_text(json.dumps(sessions, indent=1))
            print(
                f"session {k}: busy={busy} load={s['load_before']:.2f} "
                f"{s['wall_s']:.1f}s {s['summary']}",
                flush=True,
            )
    result = {
        "sessions": sessions,
        "cpu_count": os.cpu_count(),
        "tests": analyse(project, sessions),
    }
    (args.out / "prior_by_step.json").write_text(json.dumps(result, indent=1))
    text = f"# Between-session drift by step size ({len(sessions)} sessions)\n\n{table(result)}\n"
    (args.out / "prior_by_step.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
