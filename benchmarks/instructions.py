"""Instruction counts against wall time on a shared CPU: false alarms and detection.

Each *session* is what one CI job would measure: a fresh Callgrind child
(:func:`perfguard.capture.instructions.run_callgrind`) that builds a small
MLP training step and counts the instructions of 10 recorded steps of each
variant (:data:`VARIANTS`), and a fresh plain child that times the same
variants as perfguard times a CPU test (rounds of recorded steps, a round's
value its fastest step, the session's value the geometric mean of rounds).
The variants:

* ``base``: the step as written;
* ``py2``/``py5``: a pure-Python loop added to the step, sized (by timing, in
  this process before the sessions) to +2 % and +5 % of the step's time;
* ``extra_op``: one more small op per step (``abs`` of the 32x64 input);
* ``slow_kernel``: the first layer's weight stored transposed (same values,
  same ops, column-major strides), so its GEMMs take another BLAS path.

A/A: session k's ``base`` against session k-1's ``base`` (two processes, as
store mode compares runs). Detection: session k's variant against session
k-1's ``base``. A change counts when it exceeds the budget (instructions and
estimated cycles: the gate's default ``0.2%`` and ``1%``; wall time: 1 % and
5 %). ``--busy`` starts one spinning process per core for the sessions (stopped
by pid afterwards).

    python benchmarks/instructions.py --sessions 6 --out /tmp/ig/run.json [--busy] [--jobs 2]
    python benchmarks/instructions.py --table /tmp/ig/run.json   # the table of a saved run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = ("base", "py2", "py5", "extra_op", "slow_kernel")
ITERATIONS = 10
WARMUP = 3
ROUNDS, ROUND_ITERS = 5, 20


def _model(variant: str):  # noqa: ANN202 - torch is imported in the child only
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )  # fmt: skip
    if variant == "slow_kernel":
        w = model[0].weight.detach()
        model[0].weight = torch.nn.Parameter(w.t().contiguous().t())  # same values, F-order
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))
    return torch, model, opt, x, y


def make_step(variant: str, spins: dict[str, int]):  # noqa: ANN201
    torch, model, opt, x, y = _model(variant)
    loops = spins.get(variant, 0)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if variant == "extra_op":
            x.abs()
        loss.backward()
        opt.step()
        for _ in range(loops):  # the pure-Python slowdown
            pass

    return step


def child_count(spins: dict[str, int]) -> None:
    """Each variant in a process forked from the same warm parent (torch imported): a block's
    count does not then depend on the blocks measured before it (the type cache, allocator
    and free lists they warmed: the same loop measured first and second in one process
    counted 10.40 M and 10.17 M instructions)."""
    import torch  # noqa: F401 - imported once, before the forks

    from perfguard.capture.instructions import measured

    for variant in VARIANTS:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                step = make_step(variant, spins)
                for _ in range(WARMUP):
                    step()
                with measured(variant):
                    for _ in range(ITERATIONS):
                        step()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status:
            raise SystemExit(f"the {variant} child failed ({status})")


def child_time(spins: dict[str, int]) -> dict[str, float]:
    import gc

    out = {}
    for variant in VARIANTS:
        step = make_step(variant, spins)
        for _ in range(WARMUP):
            step()
        rounds = []
        for _ in range(ROUNDS):
            gc.collect()
            best = math.inf
            for _ in range(ROUND_ITERS):
                t0 = time.perf_counter_ns()
                step()
                best = min(best, time.perf_counter_ns() - t0)
            rounds.append(best)
        out[variant] = math.exp(sum(math.log(r) for r in rounds) / len(rounds))
    return out


def calibrate() -> dict[str, int]:
    """Loop counts that add 2 % and 5 % of the base step's time (timed here, fastest of 5)."""
    step = make_step("base", {})
    for _ in range(WARMUP):
        step()
    best = min(_timed(step) for _ in range(200))
    per_loop = min(_timed(_spin) for _ in range(20)) / 10_000
    return {"py2": int(0.02 * best / per_loop), "py5": int(0.05 * best / per_loop)}


def _spin() -> None:
    for _ in range(10_000):
        pass


def _timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0


def session(k: int, spins: dict[str, int], cache_sim: bool) -> dict:
    from perfguard.analysis.instructions import summarize
    from perfguard.capture.instructions import DETERMINISTIC_ENV, run_callgrind
    from perfguard.trace.callgrind import read_callgrind

    me = [sys.executable, os.path.abspath(__file__)]
    spec = json.dumps(spins)
    env = {**os.environ, **DETERMINISTIC_ENV}
    timed = subprocess.run([*me, "--child-time", spec], env=env, capture_output=True,
                           text=True, check=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pg-cg-") as out:
        run = run_callgrind([*me, "--child-count", spec], out, cache_sim=cache_sim, timeout=1800)
        counts, tops = {}, {}
        for variant in VARIANTS:
            figures, functions = summarize(read_callgrind(run.dumps[variant]), ITERATIONS)
            counts[variant] = figures
            tops[variant] = functions.to_dict("list")
    return {"session": k, "wall_ns": json.loads(timed.stdout), "counts": counts,
            "callgrind_s": run.wall_time_s, "functions": tops,
            "load": os.getloadavg()[0]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--out", required=True)
    ap.add_argument("--busy", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--cache-sim", action="store_true")
    ap.add_argument("--spins", help="loop counts as JSON (default: calibrate here)")
    args = ap.parse_args()
    spins = json.loads(args.spins) if args.spins else calibrate()
    print(f"spins {spins}", file=sys.stderr)
    hogs = []
    if args.busy:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]  # fmt: skip
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(
                pool.map(lambda k: session(k, spins, args.cache_sim), range(args.sessions))
            )
    finally:
        for h in hogs:
            h.terminate()
            h.wait()
    doc = {"spins": spins, "busy": args.busy, "cache_sim": args.cache_sim, "sessions": results}
    Path(args.out).write_text(json.dumps(doc))
    print(json.dumps(table(doc), indent=1))


def table(doc: dict) -> dict:
    """False alarms, detections and spread of instructions and wall time."""
    s = doc["sessions"]
    out: dict[str, object] = {"sessions": len(s), "busy": doc["busy"]}
    metrics = {"instructions": lambda r, v: r["counts"][v]["instructions"],
               "wall": lambda r, v: r["wall_ns"][v]}  # fmt: skip
    if doc.get("cache_sim"):
        metrics["est_cycles"] = lambda r, v: r["counts"][v]["est_cycles"]
    for name, get in metrics.items():
        base = [get(r, "base") for r in s]
        mean = sum(base) / len(base)
        sd = math.sqrt(sum((b - mean) ** 2 for b in base) / max(len(base) - 1, 1))
        out[f"{name}_base_mean"] = mean
        out[f"{name}_base_cv_pct"] = 100 * sd / mean
        out[f"{name}_base_range_pct"] = 100 * (max(base) - min(base)) / mean
        for gate in (1.0, 5.0) if name == "wall" else (0.2, 1.0):
            row = {}
            pairs = list(zip(s[:-1], s[1:], strict=True))
            for v in VARIANTS:
                deltas = [100 * (get(b, v) / get(a, "base") - 1) for a, b in pairs]
                hits = (
                    sum(d > gate for d in deltas)
                    if v != "base"
                    else sum(abs(d) > gate for d in deltas)
                )
                row[v] = {
                    "alarms" if v == "base" else "detected": f"{hits}/{len(pairs)}",
                    "median_delta_pct": sorted(deltas)[len(deltas) // 2] if deltas else None,
                }
            out[f"{name}@{gate:g}%"] = row
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(json.dumps(table(json.loads(Path(sys.argv[2]).read_text())), indent=1))
    elif len(sys.argv) == 3 and sys.argv[1] == "--child-count":
        child_count(json.loads(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--child-time":
        print(json.dumps(child_time(json.loads(sys.argv[2]))))
    else:
        main()
