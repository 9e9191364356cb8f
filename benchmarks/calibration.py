"""Calibrate perfguard's verdict: false alarms on A/A pairs, detection of injected slowdowns.

Pools of real repeated timings:

* ``cpu-mlp``: a small MLP training step (forward, backward, SGD) on this
  machine's CPU, timed with ``perf_counter_ns``. 400 steps after 20 warmup
  steps by default.
* ``<fixture>:<kernel>``: the durations of one kernel launched many times
  in a real GPU capture from ``shared/fixtures``. It is the same work each
  time, on a real GPU. The fixtures' own iterations (3 to 6 ProfilerSteps
  each) are too few to draw disjoint samples of 30 from.

For each pool, ``--trials`` times (1,000 by default), with a fixed seed:

* **A/A**: two disjoint samples of n, drawn without replacement from one
  pool. A false alarm is a verdict of "regressed" or "improved". The rule is
  :func:`perfguard.compare.classify`, the one the verdicts use: tolerance 5 %,
  alpha 0.01. The ``p<a`` column is the rate of the U test alone, which
  should be close to alpha.
* **A/A, blocks**: two adjacent windows of n in time order. Drift and
  autocorrelation count here, and random draws hide them.
* **Slowdown s**: the current sample of each A/A pair times (1 + s), for s
  of 2 %, 5 % and 10 %. The detection rate is the share called "regressed".
  A 2 % slowdown is under the 5 % tolerance, so it should stay at 0: that is
  the design, not a miss.

Run: ``python benchmarks/calibration.py [--trials 1000] [--seed 0] [--skip-torch]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfguard.compare import classify  # noqa: E402
from perfguard.compare.stats import compare_samples  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KERNEL_POOLS = (
    ("kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz", 2),
    ("kineto/v100_torchrec_train_rank1_2022.pt.trace.json.gz", 2),
)
SIZES = (30, 50)
SLOWDOWNS = (0.02, 0.05, 0.10)


def fixtures_dir() -> Path | None:
    import os

    for cand in (
        ROOT.parent / "shared" / "fixtures",
        Path(os.environ.get("PERFGUARD_FIXTURES", "")),
    ):
        if str(cand) and cand.is_dir():
            return cand
    return None


def cpu_mlp_pool(steps: int, warmup: int = 20) -> np.ndarray:
    """Per-step wall times (ns) of a small MLP training step on the CPU."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)  # a shared 2-core machine: one thread keeps steps comparable
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = np.empty(steps + warmup, dtype=np.int64)
    for i in range(steps + warmup):
        t0 = time.perf_counter_ns()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        times[i] = time.perf_counter_ns() - t0
    return times[warmup:]


def kernel_pools(
    fixtures: Path, min_count: int = 100, min_ns: int = 20_000
) -> dict[str, np.ndarray]:
    """Durations (ns, launch order) of the most-launched kernels of some real captures."""
    from perfguard.trace import load_trace

    pools = {}
    for rel, top in KERNEL_POOLS:
        path = fixtures / rel
        if not path.exists():
            continue
        k = load_trace(path).kernels.sort_values("start")
        dur = (k["end"] - k["start"]).to_numpy(np.int64)
        # same work = same kernel, same launch configuration
        key = ["name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
        groups = k.groupby(key, dropna=False, sort=False).indices
        # long enough that the capture's 1 us resolution is < 5 % of the duration
        big = {g: r for g, r in groups.items() if np.median(dur[r]) >= min_ns}
        ranked = sorted(big.items(), key=lambda kv: -len(kv[1]))[:top]
        label = path.name.split(".pt.trace")[0]
        for (name, gx, gy, gz, *_), rows in ranked:
            if len(rows) < min_count:
                break
            values = dur[np.sort(rows)]
            short = str(k["short_name"].iloc[rows[0]] or name)[:32]
            pools[f"{label}:{short}[{gx}x{gy}x{gz}]"] = values[values > 0]
    return pools


def draw_pairs(pool: np.ndarray, n: int, trials: int, rng: np.random.Generator, blocks: bool):
    """``trials`` disjoint (baseline, current) pairs of size n: random draws or adjacent windows."""
    if blocks:
        starts = rng.integers(0, len(pool) - 2 * n + 1, size=trials)
        idx = starts[:, None] + np.arange(2 * n)[None, :]
    else:
        idx = np.argsort(rng.random((trials, len(pool))), axis=1)[:, : 2 * n]
    both = pool[idx].astype(np.float64)
    return both[:, :n], both[:, n:]


def rates(base: np.ndarray, cur: np.ndarray, tolerance: float, alpha: float) -> dict[str, float]:
    r = compare_samples(base, cur, alpha)
    verdict = classify(r.delta, r.p_value, tolerance, alpha)
    return {
        "regressed": float(np.mean(verdict == "regressed")),
        "flagged": float(np.mean(verdict != "unchanged")),
        "p_below_alpha": float(np.mean(r.p_value < alpha)),
    }


def calibrate(pools: dict[str, np.ndarray], trials: int, seed: int, tolerance: float,
              alpha: float) -> list[dict[str, object]]:  # fmt: skip
    rows = []
    for name, pool in pools.items():
        for n in SIZES:
            if len(pool) < 2 * n:
                continue
            rng = np.random.default_rng(seed)
            cv = float(np.std(pool) / np.mean(pool))
            row: dict[str, object] = {"pool": name, "size": len(pool), "cv": cv, "n": n}
            base, cur = draw_pairs(pool, n, trials, rng, blocks=False)
            aa = rates(base, cur, tolerance, alpha)
            row["aa_false_alarm"] = aa["flagged"]
            row["aa_p_below_alpha"] = aa["p_below_alpha"]
            bb, bc = draw_pairs(pool, n, trials, rng, blocks=True)
            row["aa_blocks_false_alarm"] = rates(bb, bc, tolerance, alpha)["flagged"]
            for s in SLOWDOWNS:
                row[f"detect_{round(100 * s)}pct"] = rates(base, cur * (1 + s), tolerance, alpha)[
                    "regressed"
                ]
            rows.append(row)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    head = ["pool", "N", "cv", "n", "A/A FA", "p<a", "blocks FA"] + [
        f"+{round(100 * s)}%" for s in SLOWDOWNS
    ]
    lines = [head]
    for r in rows:
        lines.append([
            str(r["pool"]), str(r["size"]), f"{r['cv']:.3f}", str(r["n"]),
            f"{100 * r['aa_false_alarm']:.1f}%", f"{100 * r['aa_p_below_alpha']:.1f}%",
            f"{100 * r['aa_blocks_false_alarm']:.1f}%",
            *[f"{100 * r[f'detect_{round(100 * s)}pct']:.1f}%" for s in SLOWDOWNS],
        ])  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=400, help="CPU MLP steps timed (default 400)")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--skip-torch", action="store_true", help="no CPU MLP pool")
    ap.add_argument("--skip-fixtures", action="store_true", help="no GPU kernel pools")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)

    pools: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    if not args.skip_torch:
        pools["cpu-mlp"] = cpu_mlp_pool(args.steps)
    fx = fixtures_dir()
    if not args.skip_fixtures and fx is not None:
        pools.update(kernel_pools(fx))
    if not pools:
        print("calibration: no sample pools (torch missing and no fixtures)", file=sys.stderr)
        return 2
    t1 = time.perf_counter()
    rows = calibrate(pools, args.trials, args.seed, args.tolerance, args.alpha)
    t2 = time.perf_counter()
    print(f"tolerance {100 * args.tolerance:g}%, alpha {args.alpha:g}, {args.trials} trials per "
          f"cell, seed {args.seed}; pools built in {t1 - t0:.1f} s, calibrated in "
          f"{t2 - t1:.1f} s")  # fmt: skip
    print("FA = verdict regressed or improved on A/A pairs (target <= 1%); p<a = U test alone;")
    print("blocks = adjacent windows in time order; +s% = share called regressed\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
