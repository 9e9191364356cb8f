"""What taking Python stacks (call sites) costs a profiled round.

On a GPU every round is profiled and timed (GPU time exists only in the capture),
so stacks would run in the timed rounds there; on the CPU perfguard takes them in
the one profiled round, which is not timed. This measures, on this CPU, a round
profiled the GPU way: the same step run plain, under the torch profiler without
stacks, and with stacks (torch's Python tracer), each the fastest step of
``--rounds`` rounds of ``--iterations`` steps, alternated so a slow spell of the
machine hits all three alike; and the cost of the capture's sidecar (exact names,
call sites) written after the round. Steps are timed in the thread's CPU time
(one intra-op thread): on a shared machine the wall time mostly measures the
neighbours, while the profiler's cost is CPU work on the test's own thread.

    PYTHONPATH=. python benchmarks/stack_cost.py [--rounds 7] [--iterations 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from perfguard.capture.torch_profiler import profile_torch
from perfguard.capture.torch_results import write_sidecar


class Block(torch.nn.Module):
    """A small transformer-ish MLP block: many small ops, as a test's step has."""

    def __init__(self, d: int = 128) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def step(model: torch.nn.Module, x: torch.Tensor) -> None:
    loss = model(x).pow(2).mean()
    loss.backward()


def timed_round(model, x, iterations: int, stacks: bool | None, out: Path) -> tuple[float, float]:
    """Fastest step of one round (ns) and the sidecar's write time (ms; 0 without)."""
    best = float("inf")
    side_ms = 0.0
    clock = time.thread_time_ns
    if stacks is None:
        for _ in range(iterations):
            t0 = clock()
            step(model, x)
            best = min(best, clock() - t0)
        return best, 0.0
    with profile_torch(out, device="cpu", with_stack=stacks) as handle:
        for _ in range(iterations):
            t0 = clock()
            with torch.profiler.record_function("perfguard.iteration"):
                step(model, x)
            best = min(best, clock() - t0)
    if stacks:
        t0 = time.thread_time()
        write_sidecar(handle.profiler, out)  # again, timed alone (the export wrote it once)
        side_ms = 1e3 * (time.thread_time() - t0)
    return best, side_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[Block() for _ in range(4)])
    x = torch.randn(32, 128)
    for _ in range(5):
        step(model, x)
    results: dict[str, list[float]] = {"plain": [], "profiled": [], "profiled+stacks": []}
    sidecar: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "round.pt.trace.json.gz"
        for _ in range(args.rounds):
            for label, stacks in (("plain", None), ("profiled", False), ("profiled+stacks", True)):
                best, side = timed_round(model, x, args.iterations, stacks, out)
                results[label].append(best)
                if stacks:
                    sidecar.append(side)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}")
    base = min(results["plain"])
    for label, values in results.items():
        v = min(values)
        median = sorted(values)[len(values) // 2]
        print(
            f"{label:16s} fastest step {v / 1e6:7.3f} CPU ms ({100 * (v / base - 1):+6.1f}% vs "
            f"plain), median of rounds' fastest {median / 1e6:7.3f} ms"
        )
    prof, stk = min(results["profiled"]), min(results["profiled+stacks"])
    print(
        f"stacks add {100 * (stk / prof - 1):+.1f}% to a profiled step "
        f"({(stk - prof) / 1e3:.0f} µs per step)"
    )
    print(
        f"sidecar (names, call sites) written in {min(sidecar):.1f} CPU ms per round "
        f"(median {sorted(sidecar)[len(sidecar) // 2]:.1f} ms)"
    )


if __name__ == "__main__":
    main()
