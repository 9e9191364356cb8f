"""Instruction counts against wall time on a shared CPU: false alarms and detection.

Each *session* is what one CI job would measure: a fresh Callgrind child
(:func:`perfguard.capture.valgrind.run_callgrind`) that builds a small
MLP training step and counts the instructions of 10 recorded steps of each
variant (:data:`VARIANTS`), and a fresh plain child that times the same
variants as perfguard times a CPU test (rounds of recorded steps, a round's
value its fastest step, the session's value the geometric mean of rounds).
The variants:

* ``base``: the step as written;
* ``py2``/``py5``: a pure-Python loop added to the step, sized (by timing, in
  this process before the sessions) to +2 % and +5 % of the step's time;
* ``extra_op``: one more small op per step (``abs`` of the 32x64 input);
* ``slow_kernel``: the input batch stored transposed (same values, same ops,
  same calls, FLOPs and bytes: no gate counter moves), so the step's input
  normalisation runs TensorIterator's strided loops instead of its contiguous,
  vectorised ones: a slower CPU kernel path;
* ``blas_layout``: the first layer's weight stored transposed, so its GEMMs
  take another BLAS path (fewer instructions, not measurably slower: the
  method's blind spot, kept to show it).

Each counted variant runs in a fork that first moves the heap by a seeded
random amount (:func:`perfguard.capture.valgrind.layout_shift` with a per-session
seed): a real code change moves where every
later object lands, and with it the type cache's and pointer-keyed tables'
collisions and glibc's copy paths (a few hundred bytes of environment moved
this step's count by up to 0.09 %), so the variants' counts carry that noise
as a changed commit's would, and A/A pairs do too.

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

VARIANTS = ("base", "py2", "py5", "extra_op", "slow_kernel", "blas_layout")
ITERATIONS = 3  # counted steps per layout, as the plugin (MAX_COUNTED_STEPS)
WARMUP = 3
ROUNDS, ROUND_ITERS = 5, 20


def _model(variant: str):  # noqa: ANN202 - torch is imported in the child only
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )
    if variant == "blas_layout":
        w = model[0].weight.detach()
        model[0].weight = torch.nn.Parameter(w.t().contiguous().t())  # same values, F-order
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 64)
    if variant == "slow_kernel":
        x = x.t().contiguous().t()  # same values, column-major: strided elementwise loops
    y = torch.randint(0, 10, (32,))
    return torch, model, opt, x, y


def make_step(variant: str, spins: dict[str, int]):  # noqa: ANN201
    torch, model, opt, x, y = _model(variant)
    loops = spins.get(variant, 0)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        h = (x - x.mean(0)) * x.std(0).reciprocal()  # the input normalised per feature
        loss = torch.nn.functional.cross_entropy(model(h), y)
        if variant == "extra_op":
            x.abs()
        loss.backward()
        opt.step()
        for _ in range(loops):  # the pure-Python slowdown
            pass

    return step


def child_count(
    spins: dict[str, int], sessions: list[int], layouts: int = 1, variants: tuple = VARIANTS
) -> None:
    """Each variant of each session in a process forked from the same warm parent (torch
    imported): a block's count does not then depend on the blocks measured before it (the
    type cache, allocator and free lists they warmed: the same loop measured first and
    second in one process counted 10.40 M and 10.17 M instructions). A session's own heap
    shift stands for its code change (module docstring); ``layouts`` more fixed shifts on
    top are the plugin's (:data:`perfguard.plugin.valgrind_child.LAYOUTS`). Many sessions
    share one child: the count does not depend on the process (the plugin's sessions of
    unchanged code count the same to the instruction), and the start-up under Valgrind is
    paid once."""
    import torch  # noqa: F401 - imported once, before the forks

    from perfguard.capture.valgrind import layout_shift, measured

    for session in sessions:
        for variant in variants:
            for layout in range(layouts):
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        # the session's own shift, its 'code change' (the same draws as layouts)
                        shifted = layout_shift(hash((session, variant)) & 0xFFFFFFFF)
                        shifted += layout_shift(layout)
                        step = make_step(variant, spins)
                        for _ in range(WARMUP):
                            step()
                        with measured(f"{variant}#{layout}@{session}"):
                            for _ in range(ITERATIONS):
                                step()
                        del shifted
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


def sessions_in_one_child(
    ks: list[int], spins: dict[str, int], cache_sim: bool, layouts: int, variants: tuple
) -> list[dict]:
    """Sessions ``ks``: each timed in a fresh plain child, all counted in one Callgrind
    child (:func:`child_count`)."""
    from perfguard.analysis.instructions import mean_of, summarize
    from perfguard.capture.valgrind import DETERMINISTIC_ENV, run_callgrind
    from perfguard.trace.callgrind import read_callgrind

    me = [sys.executable, os.path.abspath(__file__)]
    spec = json.dumps(spins)
    env = {**os.environ, **DETERMINISTIC_ENV}
    walls, loads = {}, {}
    for k in ks:
        timed = subprocess.run(
            [*me, "--child-time", spec], env=env, capture_output=True, text=True, check=True
        )
        walls[k], loads[k] = json.loads(timed.stdout), os.getloadavg()[0]
    out_doc = []
    with tempfile.TemporaryDirectory(prefix="pg-cg-") as out:
        arg = json.dumps({"sessions": ks, "layouts": layouts, "variants": list(variants)})
        run = run_callgrind(
            [*me, "--child-count", spec, arg], out, cache_sim=cache_sim, timeout=4 * 3600
        )
        for k in ks:
            counts, tops = {}, {}
            for variant in variants:
                each = [
                    summarize(read_callgrind(run.dumps[f"{variant}#{j}@{k}"]), ITERATIONS)
                    for j in range(layouts)
                ]
                figures, table = mean_of(each)
                counts[variant] = {**figures, "per_layout": [f["instructions"] for f, _ in each]}
                tops[variant] = table.head(40).to_dict("list")
            out_doc.append(
                {
                    "session": k,
                    "wall_ns": walls[k],
                    "counts": counts,
                    "callgrind_s": run.wall_time_s / len(ks),
                    "functions": tops,
                    "load": loads[k],
                }
            )
    return out_doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--out", required=True)
    ap.add_argument("--busy", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--cache-sim", action="store_true")
    ap.add_argument(
        "--layouts",
        type=int,
        default=1,
        help="heap layouts averaged per count (perfguard.plugin.valgrind_child.LAYOUTS)",
    )
    ap.add_argument("--spins", help="loop counts as JSON (default: calibrate here)")
    ap.add_argument("--variants", help="comma list (default: all)")
    ap.add_argument("--first", type=int, default=0, help="first session's number (its seed)")
    args = ap.parse_args()
    spins = json.loads(args.spins) if args.spins else calibrate()
    print(f"spins {spins}", file=sys.stderr)
    hogs = []
    if args.busy:
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)
        ]
    variants = tuple(args.variants.split(",")) if args.variants else VARIANTS
    ids = list(range(args.first, args.first + args.sessions))
    chunks = [ids[j :: args.jobs] for j in range(args.jobs)]
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            parts = pool.map(
                lambda ks: sessions_in_one_child(ks, spins, args.cache_sim, args.layouts, variants),
                [c for c in chunks if c],
            )
            results = sorted((r for part in parts for r in part), key=lambda r: r["session"])
    finally:
        for h in hogs:
            h.terminate()
            h.wait()
    doc = {
        "spins": spins,
        "busy": args.busy,
        "cache_sim": args.cache_sim,
        "layouts": args.layouts,
        "variants": list(variants),
        "sessions": results,
    }
    Path(args.out).write_text(json.dumps(doc))
    print(json.dumps(table(doc), indent=1))


def table(doc: dict) -> dict:
    """False alarms, detections and spread of instructions and wall time, over every ordered
    pair of sessions (A/A: ``base`` of one against ``base`` of another; a variant of one
    against ``base`` of another). ``instructions_1_layout`` is each count's first layout
    alone: what the plugin measured before it averaged layouts."""
    s = doc["sessions"]
    variants = doc.get("variants") or list(VARIANTS)
    out: dict[str, object] = {
        "sessions": len(s),
        "busy": doc["busy"],
        "layouts": doc.get("layouts", 1),
        "load_median": sorted(r["load"] for r in s)[len(s) // 2],
    }
    metrics = {
        "instructions": lambda r, v: r["counts"][v]["instructions"],
        "wall": lambda r, v: r["wall_ns"][v],
    }
    if doc.get("layouts", 1) > 1:
        metrics["instructions_1_layout"] = lambda r, v: r["counts"][v]["per_layout"][0]
    if doc.get("cache_sim"):
        metrics["est_cycles"] = lambda r, v: r["counts"][v]["est_cycles"]
    pairs = [(a, b) for a in s for b in s if a is not b]
    for name, get in metrics.items():
        base = [get(r, "base") for r in s]
        mean = sum(base) / len(base)
        sd = math.sqrt(sum((b - mean) ** 2 for b in base) / max(len(base) - 1, 1))
        out[f"{name}_base_mean"] = mean
        out[f"{name}_base_cv_pct"] = 100 * sd / mean
        out[f"{name}_base_range_pct"] = 100 * (max(base) - min(base)) / mean
        for gate in (1.0, 5.0) if name == "wall" else (0.15, 0.2, 0.5, 1.0):
            row = {}
            for v in variants:
                deltas = sorted(100 * (get(b, v) / get(a, "base") - 1) for a, b in pairs)
                hits = sum(abs(d) > gate if v == "base" else d > gate for d in deltas)
                row[v] = {
                    "alarms" if v == "base" else "detected": f"{hits}/{len(pairs)}",
                    "median_delta_pct": round(deltas[len(deltas) // 2], 4) if deltas else None,
                    "range_pct": [round(deltas[0], 4), round(deltas[-1], 4)] if deltas else None,
                }
            out[f"{name}@{gate:g}%"] = row
    if doc.get("layouts", 1) > 1:
        out["instructions@layout_floor"] = _floor_rule(s, variants, pairs)
    return out


def _floor_rule(s: list, variants: list, pairs: list) -> dict:
    """The plugin's rule: 0.15 % widened to ``LAYOUT_SE`` standard errors of the difference of
    the two sides' layout means (``compare.instructions.floor_of`` each session's per-layout
    counts), with the largest budget it came to."""
    from perfguard.compare.host_functions import floor_of

    row = {}
    for v in variants:
        hits, widest = 0, 0.0015
        for a, b in pairs:
            floor = floor_of(a["counts"]["base"]["per_layout"], b["counts"][v]["per_layout"])
            budget = max(0.0015, floor[0] if floor else 0.0)
            widest = max(widest, budget)
            d = b["counts"][v]["instructions"] / a["counts"]["base"]["instructions"] - 1
            hits += abs(d) > budget if v == "base" else d > budget
        key = "alarms" if v == "base" else "detected"
        row[v] = {key: f"{hits}/{len(pairs)}", "largest_budget_pct": round(100 * widest, 3)}
    return row


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(json.dumps(table(json.loads(Path(sys.argv[2]).read_text())), indent=1))
    elif len(sys.argv) == 4 and sys.argv[1] == "--child-count":
        what = json.loads(sys.argv[3])
        child_count(
            json.loads(sys.argv[2]), what["sessions"], what["layouts"], tuple(what["variants"])
        )
    elif len(sys.argv) == 3 and sys.argv[1] == "--child-time":
        print(json.dumps(child_time(json.loads(sys.argv[2]))))
    else:
        main()
