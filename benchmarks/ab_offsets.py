"""Why A/B children disagree: the per-process offset of five small models (issue 34).

A/B mode's unit is a forked child per side per pair; the pair's difference
carries each child's own offset. This measures, for each model of
:mod:`ab_models`, children forked from one warm parent that imported torch
(as perfguard's fork server does) and never the model's code:

* ``between``: the spread of the child's value across children (robust
  SD of its log, in %), and the A/B pair noise it makes (SD of the
  difference of two successive children, in %);
* ``within``: the spread of a round's median step between the rounds of
  one child;
* what moves it, one condition at a time: ``plain`` (as A/B children run
  now), ``shift`` (a different heap layout before each round,
  :func:`perfguard.capture.valgrind.layout_shift`), ``pin`` (the child
  bound to one CPU), ``threads2`` (two intra-op threads instead of one),
  ``gcfreeze`` (``gc.freeze()`` before the model is built), ``mmap``
  (glibc's mmap threshold fixed at 64 KiB: every large buffer comes from
  fresh pages) and ``twin`` (two copies of the model built in one child,
  rounds alternating ABBA between them: the noise of a pair measured inside
  one process).

Run (nothing else on the machine)::

    python benchmarks/ab_offsets.py --children 10 --out benchmarks/data/ab_offsets.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import ab_models  # noqa: E402
import torch  # noqa: E402  (the warm parent, as the fork server)
import torch._dynamo  # noqa: E402,F401  (torch.optim imports it at the first step)

from perfguard.capture.valgrind import layout_shift  # noqa: E402

CONDITIONS = ("plain", "shift", "pin", "threads2", "gcfreeze", "mmap", "twin", "twinstep")
ROUNDS = 6
WARMUP_S = 1.0
ROUND_S = 0.1
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _rounds(steps: list, n: int, order: list[int], shift_seed: int | None) -> list[list[int]]:
    """Per round, each step's ns; ``order[r]`` is which model runs round ``r``."""
    out = []
    keep: list[object] = []
    for r, which in enumerate(order):
        if shift_seed is not None:
            keep = layout_shift(shift_seed * 16 + r + 1)
        gc.collect()
        time.sleep(0.05)
        if which < 0:  # twinstep: the two copies alternate step by step (ABBA)
            ta: list[int] = []
            tb: list[int] = []
            for k in range(n):
                for j in (0, 1) if k % 2 == 0 else (1, 0):
                    t0 = time.perf_counter_ns()
                    steps[j]()
                    (ta if j == 0 else tb).append(time.perf_counter_ns() - t0)
            out += [ta, tb]
            continue
        step = steps[which]
        times = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            step()
            times.append(time.perf_counter_ns() - t0)
        out.append(times)
    del keep
    return out


def child(model: str, cond: str, n: int, seed: int, fd: int) -> None:
    """One forked child: the condition, the model built from source, warm-up, rounds."""
    if cond == "pin":
        os.sched_setaffinity(0, {0})
    if cond == "gcfreeze":
        gc.freeze()
    if cond == "mmap":
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    ns = ab_models.load()
    if cond == "threads2":
        torch.set_num_threads(2)
    build = ns["BUILDERS"][model]
    steps = [build(0)] + ([build(0)] if cond.startswith("twin") else [])
    t_end = time.monotonic() + WARMUP_S
    while time.monotonic() < t_end:
        for s in steps:
            s()
    if cond == "twin":
        order = [0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0]
    elif cond == "twinstep":
        order = [-1] * ROUNDS
    else:
        order = [0] * ROUNDS
    rounds = _rounds(steps, n, order, seed if cond == "shift" else None)
    if cond == "twinstep":
        order = [0, 1] * ROUNDS
    os.write(fd, json.dumps({"order": order, "rounds": rounds}).encode())
    os.close(fd)


def fork_one(model: str, cond: str, n: int, seed: int) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            child(model, cond, n, seed, w)
        except BaseException as exc:  # noqa: BLE001 - a child must never return
            print(f"child {model}/{cond}: {exc!r}", file=sys.stderr)
            code = 1
        os._exit(code)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 1 << 20)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def steps_per_round(model: str) -> int:
    """Steps in a round of about ROUND_S, from a probe child."""
    out = fork_one(model, "plain", 20, 0)
    med = float(np.median(np.concatenate([np.asarray(x) for x in out["rounds"]])))
    return max(5, int(ROUND_S * 1e9 / med))


def robust_sd_pct(logs: np.ndarray) -> float:
    logs = np.asarray(logs, dtype=float)
    if len(logs) < 3:
        return float("nan")
    mad = np.median(np.abs(logs - np.median(logs)))
    return float(100 * 1.4826 * mad)


def _child_values(row: dict) -> dict[str, float]:
    """A child's value by each estimator: ``min`` (its fastest step over 3 rounds, what A/B
    children report now), ``median`` (the mean log of its rounds' medians); for twins the
    in-child log ratio of copy B to copy A by the same two estimators."""
    rounds = [np.asarray(x, dtype=float) for x in row["rounds"]]
    order = np.asarray(row["order"])
    meds = np.array([np.median(x) for x in rounds])
    a = [x for x, o in zip(rounds, order, strict=True) if o == 0]
    out = {
        "min": float(np.log(np.concatenate(a[:3]).min())),
        "median": float(np.log(meds[order == 0]).mean()),
        "within": float(np.std(np.log(meds[order == 0]), ddof=1)),
    }
    if (order == 1).any():
        b = [x for x, o in zip(rounds, order, strict=True) if o == 1]
        out["twin_median"] = float(np.log(meds[order == 1]).mean()) - out["median"]
        out["twin_min"] = float(np.log(np.concatenate(b[:3]).min())) - out["min"]
    return out


def summarize(results: list[dict]) -> dict:
    """Per model and condition: between-child spread, pair noise, within-child spread."""
    table: dict[str, dict] = {}
    for model in sorted({r["model"] for r in results}):
        table[model] = {}
        for cond in CONDITIONS:
            rows = [r for r in results if r["model"] == model and r["cond"] == cond]
            if len(rows) < 4:
                continue
            vals = [_child_values(r) for r in rows]
            entry: dict[str, float | int] = {
                "children": len(rows),
                "step_us": float(np.exp(np.median([v["median"] for v in vals])) / 1e3),
                "within_sd_pct": float(100 * np.median([v["within"] for v in vals])),
            }
            for est in ("min", "median"):
                logs = np.array([v[est] for v in vals])
                diffs = logs[1::2] - logs[0::2][: len(logs) // 2]  # successive children, A/B
                entry[f"between_sd_{est}_pct"] = robust_sd_pct(logs)
                entry[f"pair_sd_{est}_pct"] = float(100 * np.std(diffs, ddof=1))
                if f"twin_{est}" in vals[0]:
                    twin = np.array([v[f"twin_{est}"] for v in vals])
                    entry[f"twin_sd_{est}_pct"] = float(100 * np.std(twin, ddof=1))
                    entry[f"twin_mean_{est}_pct"] = float(100 * twin.mean())
            table[model][cond] = entry
    return table


def markdown(table: dict) -> str:
    """SD of a pair's log difference, in %: two forked children (the A/B unit now) or, for
    the twins, two copies inside one child; by the fastest step and by the round medians."""
    lines = [
        "| model | step | condition | between children, fastest / median | "
        "pair of children, fastest / median | rounds in a child | pair inside a child, "
        "fastest / median |",
        "|---|---|---|---|---|---|---|",
    ]

    def pct(e: dict, key: str) -> str:
        return f"{e[key]:.1f} %" if key in e else "-"

    for model, conds in table.items():
        for cond, e in conds.items():
            lines.append(
                f"| {model} | {e['step_us']:.0f} us | {cond} | "
                f"{pct(e, 'between_sd_min_pct')} / {pct(e, 'between_sd_median_pct')} | "
                f"{pct(e, 'pair_sd_min_pct')} / {pct(e, 'pair_sd_median_pct')} | "
                f"{pct(e, 'within_sd_pct')} | "
                f"{pct(e, 'twin_sd_min_pct')} / {pct(e, 'twin_sd_median_pct')} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=10)
    ap.add_argument("--models", nargs="*", default=list(ab_models.NAMES))
    ap.add_argument("--conditions", nargs="*", default=list(CONDITIONS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    t0 = time.time()
    n = {m: steps_per_round(m) for m in args.models}
    results = []
    for i in range(args.children):
        for model in args.models:
            for cond in args.conditions:
                out = fork_one(model, cond, n[model], i)
                results.append({"model": model, "cond": cond, "child": i, **out})
        print(f"child {i + 1}/{args.children} done, {time.time() - t0:.0f} s", flush=True)
    table = summarize(results)
    md = markdown(table)
    print(md)
    meta = {
        "load_before": load0,
        "load_after": os.getloadavg(),
        "seconds": time.time() - t0,
        "steps_per_round": n,
        "rounds": ROUNDS,
        "torch": torch.__version__,
    }
    print(json.dumps(meta))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "table": table, "raw": results}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
