"""The independent side of the model acceptance run (issue 44): what each test's step
costs and computes without perfguard, for ``gpu_acceptance.py --suite models``.

For every step of the model project's ``models.STEPS`` (the code the tests run), in one
process: the step's plain wall time (warmed up, the device synchronised after each step,
no profiler), its FLOPs by ``torch.utils.flop_counter.FlopCounterMode`` (per aten op; a
compiled step is counted eagerly, as Inductor's kernels are no aten ops) and, once, the
device's achieved bf16 matmul rate (a large square product), against which perfguard's
FLOP efficiency of the top GEMMs is checked. One JSON document out; a step that fails is
an ``error`` entry, and the others still run.

    python benchmarks/acceptance_probe.py --project DIR --device cuda --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def matmul_rate(device: str) -> dict[str, Any]:
    """The achieved bf16 TFLOP/s of an n x n x n product (n 8192 on a GPU, 512 on the CPU):
    the best of a few timed runs after warm-up, the ceiling a real GEMM can approach."""
    import torch

    n, reps = (8192, 10) if device == "cuda" else (512, 3)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return {"n": n, "dtype": "bf16", "tflops": round(2 * n**3 / best / 1e12, 2)}


def probe_step(models: Any, name: str, device: str, steps: int) -> dict[str, Any]:
    """One test's step: plain wall time per step and FLOPs per step by aten op."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    out: dict[str, Any] = {}
    factory = models.STEPS[name]
    if "compiled" in name:
        why = models.can_compile(device)
        if why or (name.endswith("cudagraphs") and device != "cuda"):
            return {"skipped": why or "reduce-overhead is CUDA graphs: GPU only"}
    torch.manual_seed(0)
    step = factory(device)
    out["source"] = models.CNN_SOURCE if "cnn" in name else None
    for _ in range(models.SIZE.warmup):
        step()
    sync(device)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t)
    out["plain_ms"] = round(1e3 * statistics.median(times), 4)
    out["plain_steps"] = steps
    if "compiled" in name:  # counted on the same block run eagerly
        mode = "reduce-overhead" if name.endswith("cudagraphs") else "default"
        step = models.compiled_block_step(device, mode, compile=False)
        out["counted"] = "the block eagerly (compiled kernels are no aten ops)"
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    sync(device)
    flops = counter.get_flop_counts().get("Global", {})
    out["flops_total"] = int(counter.get_total_flops())
    out["flops_by_op"] = {str(k).replace("aten.", "aten::", 1): int(v) for k, v in flops.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--project", type=Path, required=True, help="the model project's folder")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=10, help="plain steps timed per test")
    p.add_argument("--only", help="comma list of test names")
    a = p.parse_args(argv)
    sys.path.insert(0, str(a.project.resolve()))
    import torch

    if a.device == "cuda":  # the project's conftest settings, which the tests run under
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    else:
        torch.set_num_threads(1)
    import models

    doc: dict[str, Any] = {"device": a.device, "torch": torch.__version__, "steps": {}}
    if a.device == "cuda":
        doc["gpu"] = torch.cuda.get_device_name(0)
    try:
        doc["matmul"] = matmul_rate(a.device)
    except Exception as exc:  # noqa: BLE001 (the steps are worth more)
        doc["matmul"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    names = [n for n in models.STEPS if not a.only or n in a.only.split(",")]
    for name in names:
        t = time.perf_counter()
        try:
            doc["steps"][name] = probe_step(models, name, a.device, a.steps)
        except Exception:  # noqa: BLE001 (one step's failure is its entry)
            doc["steps"][name] = {"error": traceback.format_exc()[-1500:]}
        doc["steps"][name]["wall_s"] = round(time.perf_counter() - t, 2)
        a.out.write_text(json.dumps(doc, indent=1))  # a timeout keeps the steps done
        print(
            f"{name}: {doc['steps'][name].get('plain_ms')} ms, "
            f"{doc['steps'][name].get('flops_total')} FLOP",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
