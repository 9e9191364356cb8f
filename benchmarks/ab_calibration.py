"""A/B sensitivity per test: five small models in separate real sessions (issue 34).

A fresh git project holds the five training steps of :mod:`ab_models` as
``models.py`` and one ``@pytest.mark.gpuprofile`` test per model. Commit
``c0`` is the base; on top of it:

* ``aa``: a comment changes (A/A: the measured code is the same);
* ``slow5`` / ``slow10``: every test's step also runs pure-Python work
  (:func:`python_work`: no torch op, no counter moves) sized by measurement
  to +5 % / +10 % of that model's step.

Each session is ``pytest --perfguard --perfguard-against c0`` on a
condition's commit, all five tests in it, so every session gives one verdict
per model. Sessions alternate the conditions (session ``i`` of each before
``i + 1`` of any). ``--load busy`` runs one spinning process per core beside
the sessions. Rows go to ``OUT/sessions.jsonl`` as they finish (resumable);
``OUT/summary.md`` has the table per model: false alarms (``regressed`` or
``improved`` on A/A), detections (``regressed``), the smallest change each
session could resolve, and the session's wall time.

Run::

    python benchmarks/ab_calibration.py --out benchmarks/out/ab --sessions 10
    python benchmarks/ab_calibration.py --out benchmarks/out/ab --sessions 6 --load busy \\
        --conditions aa slow10
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ab_models  # noqa: E402
from calibration import busy_load, child_env, git, loadavg, now  # noqa: E402

TEST_FILE = "test_models.py"
SIZES = {"aa": 0.0, "slow5": 0.05, "slow10": 0.10}
ITERATIONS = 30
TEST_TEMPLATE = '''"""perfguard A/B calibration: five small CPU training steps."""

import pytest

import models
{header}

{tests}
'''
ONE_TEST = """
@pytest.mark.gpuprofile(iterations={iterations}, warmup=10, tolerance="{tolerance}")
def test_{name}(gpuprofile):
    step = models.BUILDERS["{name}"](0)
    for _ in gpuprofile.iterations():
        step()
{extra}"""


def render(cond: str | None, units: dict[str, int], tolerance: str) -> str:
    header = (
        "\n# calibration A/A: this comment is the commit's only change\n" if cond == "aa" else ""
    )
    tests = []
    for name in ab_models.NAMES:
        extra = ""
        if cond in ("slow5", "slow10") and units.get(name):
            extra = f"        models.python_work({units[name]})\n"
        tests.append(
            ONE_TEST.format(iterations=ITERATIONS, tolerance=tolerance, name=name, extra=extra)
        )
    return TEST_TEMPLATE.format(header=header, tests="\n".join(tests))


def measure_sizes(reps: int = 7) -> dict[str, Any]:
    """Each model's step (median of ``reps`` blocks) and one python_work unit, in a child
    interpreter with one thread, as the tests run."""
    code = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import ab_models
ns = ab_models.load()
out = {}
for name, build in ns["BUILDERS"].items():
    step = build(0)
    for _ in range(30):
        step()
    blocks = []
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter_ns()
        for _ in range(20):
            step()
        blocks.append((time.perf_counter_ns() - t0) / 20)
    out[name] = float(np.median(blocks))
work = ns["python_work"]
blocks = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter_ns()
    work(2000)
    blocks.append((time.perf_counter_ns() - t0) / 2000)
out["unit_ns"] = float(np.median(blocks))
print(json.dumps(out))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(HERE), str(reps)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_project(out: Path, tolerance: str) -> dict[str, Any]:
    """The git project and its commits (``OUT/state.json``), made once."""
    state_file = out / "state.json"
    if state_file.is_file():
        return json.loads(state_file.read_text())
    proj = out / "project"
    proj.mkdir(parents=True)
    git(proj, "init", "-q", "-b", "main")
    (proj / ".gitignore").write_text(".perfguard/\nbaselines/\n__pycache__/\n")
    (proj / "models.py").write_text(ab_models.SOURCE)
    (proj / TEST_FILE).write_text(render(None, {}, tolerance))
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "c0: five models")
    sizes = measure_sizes()
    commits = {"c0": git(proj, "rev-parse", "HEAD")}
    units_by: dict[str, dict[str, int]] = {}
    for cond, frac in SIZES.items():
        units = (
            {n: max(1, round(frac * sizes[n] / sizes["unit_ns"])) for n in ab_models.NAMES}
            if frac
            else {}
        )
        units_by[cond] = units
        git(proj, "checkout", "-q", commits["c0"])
        git(proj, "checkout", "-q", "-B", cond)
        (proj / TEST_FILE).write_text(render(cond, units, tolerance))
        git(proj, "commit", "-q", "-am", f"{cond}")
        commits[cond] = git(proj, "rev-parse", "HEAD")
    state = {
        "project": str(proj),
        "commits": commits,
        "sizes_ns": sizes,
        "units": units_by,
        "tolerance": tolerance,
        "made": now(),
    }
    state_file.write_text(json.dumps(state, indent=1))
    return state


def run_session(state: dict, cond: str, extra: list[str], folder: Path, timeout: float) -> dict:
    proj = Path(state["project"])
    git(proj, "checkout", "-q", "-f", state["commits"][cond])
    argv = [
        sys.executable,
        "-m",
        "pytest",
        TEST_FILE,
        "-q",
        "-p",
        "no:cacheprovider",
        f"--perfguard-against={state['commits']['c0']}",
        f"--perfguard-output={folder}",
        "--perfguard-fail-on=never",
        f"--rootdir={proj}",
        *extra,
    ]
    before, t0 = loadavg(), time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=proj,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        code, tail = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        code, tail = -1, f"timed out after {timeout:g} s"
    wall = time.monotonic() - t0
    tests: dict[str, Any] = {}
    path = folder / "results.json"
    if path.is_file():
        doc = json.loads(path.read_text())
        for t in doc["tests"]:
            timing = t.get("timing") or {}
            tests[t["nodeid"].rsplit("test_", 1)[-1]] = {
                "outcome": t["outcome"],
                "timing_outcome": timing.get("outcome"),
                "delta_pct": timing.get("delta_pct"),
                "ci_low_pct": timing.get("ci_low_pct"),
                "ci_high_pct": timing.get("ci_high_pct"),
                "threshold_pct": timing.get("threshold_pct"),
                "noise_pct": timing.get("noise_pct"),
                "n": timing.get("n_current"),
                "gates": (t.get("gates") or {}).get("outcome"),
            }
    return {
        "cond": cond,
        "returncode": code,
        "wall_s": round(wall, 1),
        "load_before": before,
        "load_after": loadavg(),
        "tests": tests,
        "tail": tail[-800:] if not tests else "",
    }


def tally(rows: list[dict]) -> list[dict[str, Any]]:
    lines = []
    for load in sorted({r["load"] for r in rows}):
        for cond in SIZES:
            sel = [r for r in rows if r["cond"] == cond and r["load"] == load]
            if not sel:
                continue
            for model in ab_models.NAMES:
                ts = [r["tests"][model] for r in sel if model in r["tests"]]
                outs = [t["outcome"] for t in ts]
                half = [
                    (t["ci_high_pct"] - t["ci_low_pct"]) / 2
                    for t in ts
                    if t["ci_low_pct"] is not None and math.isfinite(t["ci_low_pct"])
                ]
                deltas = [t["delta_pct"] for t in ts if t["delta_pct"] is not None]
                lines.append(
                    {
                        "load": load,
                        "cond": cond,
                        "model": model,
                        "sessions": len(ts),
                        "regressed": outs.count("regressed"),
                        "improved": outs.count("improved"),
                        "noisy": outs.count("noisy"),
                        "unchanged": outs.count("unchanged"),
                        "other": len(outs)
                        - sum(
                            outs.count(o) for o in ("regressed", "improved", "noisy", "unchanged")
                        ),
                        "delta_median": float(np.median(deltas)) if deltas else None,
                        "half_width_median": float(np.median(half)) if half else None,
                        "wall_s_median": float(np.median([r["wall_s"] for r in sel])),
                    }
                )
    return lines


def markdown(lines: list[dict], state: dict) -> str:
    out = [
        f"Sizes (ns per step): {json.dumps({k: round(v) for k, v in state['sizes_ns'].items()})}",
        "",
        "| load | condition | model | sessions | regressed | improved | noisy | unchanged | "
        "Δ median | interval ± (median) | session wall (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in lines:
        d = "-" if x["delta_median"] is None else f"{x['delta_median']:+.1f} %"
        h = "-" if x["half_width_median"] is None else f"{x['half_width_median']:.1f} %"
        out.append(
            f"| {x['load']} | {x['cond']} | {x['model']} | {x['sessions']} | {x['regressed']} | "
            f"{x['improved']} | {x['noisy']} | {x['unchanged']} | {d} | {h} | "
            f"{x['wall_s_median']:.0f} s |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--conditions", nargs="*", default=list(SIZES))
    ap.add_argument("--load", choices=("idle", "busy"), default="idle")
    ap.add_argument("--tolerance", default="2%")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--tag", default="", help="a label for these rows (e.g. the A/B design)")
    ap.add_argument("extra", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # the sessions run in the project's folder
    args.out.mkdir(parents=True, exist_ok=True)
    state = build_project(args.out, args.tolerance)
    print(f"sizes: {state['sizes_ns']}, units: {state['units']}", flush=True)
    rows_file = args.out / "sessions.jsonl"
    rows = (
        [json.loads(x) for x in rows_file.read_text().splitlines()] if rows_file.is_file() else []
    )
    done = {(r["load"], r["cond"], r["i"], r.get("tag", "")) for r in rows}
    with busy_load(args.load):
        for i in range(args.sessions):
            for cond in args.conditions:
                if (args.load, cond, i, args.tag) in done:
                    continue
                folder = args.out / "sessions" / f"{args.load}-{args.tag}-{cond}-{i:02d}"
                row = run_session(state, cond, args.extra, folder, args.timeout)
                row.update(load=args.load, i=i, tag=args.tag, at=now())
                with rows_file.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                rows.append(row)
                said = ", ".join(
                    f"{m} {t['outcome']} {t['delta_pct']:+.1f}%"
                    if t["delta_pct"] is not None
                    else f"{m} {t['outcome']}"
                    for m, t in row["tests"].items()
                )
                print(
                    f"{row['at']} {args.load} {cond} #{i}: {row['wall_s']} s, load "
                    f"{row['load_before'][0]:.2f}: {said or row['tail']}",
                    flush=True,
                )
    sel = [r for r in rows if r.get("tag", "") == args.tag]
    md = markdown(tally(sel), state)
    (args.out / f"summary{('-' + args.tag) if args.tag else ''}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
