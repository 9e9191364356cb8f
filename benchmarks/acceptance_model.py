"""The small programs ``gpu_acceptance.py`` captures: one model run eagerly, as a CUDA graph
and compiled, each under ``torch.profiler`` with the same iteration structure.

The traces become test fixtures (issue 32 items 2 and 3: kernels replayed from a CUDA
graph and Inductor's fused kernels, tied back to the ops that made them), so every
capture uses the same model, input and region names, and each writes a line per trace
to ``manifest.jsonl`` saying what is in it. A separate process per group of captures:
a crash in one (graph capture under the profiler is the risky one) loses only that
group, and the parent's timeout can kill it.

Modes (``python benchmarks/acceptance_model.py MODE --out DIR``):

* ``traces``: ``eager`` (the model op by op), ``graph_replay`` (a CUDA graph captured
  outside the profiler, only its replays profiled: what a vLLM-style capture at start-up
  looks like), and the matmul size table the +5 % change of the parent is sized from.
  Without CUDA only ``eager`` and the table.
* ``graph-capture``: ``graph_capture``, capture and replays in one profile, so the ops
  that recorded each graph node are in the trace (CUDA only).
* ``compile``: ``torch.compile`` (Inductor), ``--compile-mode default`` or
  ``reduce-overhead`` (CUDA graphs), compiled before the profile starts.
* ``run``: the eager model without a profiler, for ``ncu`` (which cannot share CUPTI).

Each profiled iteration is a ``perfguard.iteration`` range; the input is copied into a
static buffer at its start (``aten::copy_``), as a graph replay needs, in every mode, so
the per-op split of the modes can be compared op for op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

ITERATION = "perfguard.iteration"
#: the model: BLOCKS pre-norm MLP blocks of width D (hidden 4 D) on a (BATCH, TOKENS, D) input
D, BLOCKS, BATCH, TOKENS = 256, 3, 8, 64
#: matmul sizes timed for the parent's +5 % change (n x n @ n x n)
MM_SIZES = (16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024)


class Block(nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, with a residual: a few distinct aten ops each."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


def build(device: str, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor, list[torch.Tensor]]:
    """The model, its static input buffer and one input per iteration (same on each run)."""
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(D) for _ in range(BLOCKS))).to(device=device, dtype=dtype)
    model.eval()
    static = torch.zeros(BATCH, TOKENS, D, device=device, dtype=dtype)
    inputs = [torch.randn(BATCH, TOKENS, D, device=device, dtype=dtype) for _ in range(4)]
    return model, static, inputs


def activities(device: str) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def describe(device: str, dtype: torch.dtype) -> dict[str, Any]:
    """What every manifest line repeats: the model, shapes and the machine."""
    return {
        "model": f"{BLOCKS} x (LayerNorm -> Linear {D}->{4 * D} -> GELU -> Linear {4 * D}->{D}"
        " + residual)",
        "input_shape": [BATCH, TOKENS, D],
        "dtype": str(dtype).removeprefix("torch."),
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def export(prof: Any, out: Path, name: str, meta: dict[str, Any], **fields: Any) -> None:
    """Write ``<name>.pt.trace.json.gz`` and its manifest line (appended at once)."""
    path = out / f"{name}.pt.trace.json.gz"
    prof.export_chrome_trace(str(path))
    line = {"trace": path.name, "name": name, "bytes": path.stat().st_size, **meta, **fields}
    with open(out / "manifest.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)


def profiled_loop(
    step: Any, static: torch.Tensor, inputs: list[torch.Tensor], iters: int, device: str
) -> None:
    """``iters`` iterations, each a ``perfguard.iteration`` range: copy the input, step."""
    for i in range(iters):
        with record_function(ITERATION):
            static.copy_(inputs[i % len(inputs)])
            step()
        sync(device)


def warm_up_for_capture(model: nn.Module, static: torch.Tensor) -> None:
    """A few forwards on a side stream, as CUDA graph capture needs before it starts."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def run_traces(args: argparse.Namespace, device: str, dtype: torch.dtype) -> None:
    model, static, inputs = build(device, dtype)
    meta = describe(device, dtype)
    acts = activities(device)
    with torch.no_grad():
        for _ in range(3):  # warm-up: cuBLAS handles, allocator, lazy modules
            model(static)
        sync(device)
        graph = None
        if device == "cuda":  # captured before any profile ran: CUPTI is not involved yet
            try:
                warm_up_for_capture(model, static)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model(static)
                graph.replay()
                sync(device)
            except Exception as exc:  # noqa: BLE001 (the eager trace is still worth having)
                print(f"CUDA graph capture failed: {type(exc).__name__}: {exc}", flush=True)
                graph = None
        with profile(activities=acts, record_shapes=True) as prof:
            profiled_loop(lambda: model(static), static, inputs, args.iters, device)
        export(
            prof,
            args.out,
            "eager",
            meta,
            iterations=args.iters,
            regions={
                ITERATION: "copy_ of the input into the static buffer, then the "
                "model's forward op by op"
            },
        )
        mm_table(args.out, device, dtype)
        if graph is None:
            print("no CUDA graph: the replay trace is skipped", flush=True)
            return
        with profile(activities=acts, record_shapes=True) as prof:
            profiled_loop(graph.replay, static, inputs, args.iters, device)
        export(
            prof,
            args.out,
            "graph_replay",
            meta,
            iterations=args.iters,
            regions={
                ITERATION: "copy_ of the input, then graph.replay() "
                "(cudaGraphLaunch) of the model's forward captured before the "
                "profile started"
            },
        )


def run_graph_capture(args: argparse.Namespace, device: str, dtype: torch.dtype) -> None:
    """Capture and replays in one profile: the trace holds the ops (and launch calls) that
    recorded each graph node, then the replayed kernels. A process of its own: graph
    capture under an active profiler is the step most likely to fail."""
    if device != "cuda":
        raise SystemExit("graph-capture needs CUDA")
    model, static, inputs = build(device, dtype)
    meta = describe(device, dtype)
    acts = activities(device)
    with torch.no_grad():
        warm_up_for_capture(model, static)
        sync(device)
        graph = torch.cuda.CUDAGraph()
        with profile(activities=acts, record_shapes=True) as prof:
            with record_function("graph.capture"):
                with torch.cuda.graph(graph):
                    model(static)
            sync(device)
            with record_function("graph.first_replay"):
                graph.replay()
            sync(device)
            profiled_loop(graph.replay, static, inputs, args.iters, device)
        export(
            prof,
            args.out,
            "graph_capture",
            meta,
            iterations=args.iters,
            regions={
                "graph.capture": "the forward recorded into a CUDA graph: ops and "
                "launch calls, no kernels run",
                "graph.first_replay": "one replay outside the iterations",
                ITERATION: "copy_ of the input, then graph.replay()",
            },
        )


def device_us(event: Any) -> float:
    """Device (or, on the CPU, host) time of a key_averages row in microseconds, whatever
    this torch calls the attribute."""
    names = (
        "self_device_time_total",
        "self_cuda_time_total",
        "device_time_total",
        "cuda_time_total",
        "cpu_time_total",
    )
    for name in names:
        value = getattr(event, name, None)
        if value:
            return float(value)
    return 0.0


def mm_table(out: Path, device: str, dtype: torch.dtype, reps: int = 20) -> None:
    """Mean time of one ``n x n @ n x n`` matmul per size, from the profiler (kernel time on
    a GPU, where back-to-back timing of a 3 us kernel would only measure launches)."""
    mats = {n: torch.randn(n, n, device=device, dtype=dtype) for n in MM_SIZES}
    for a in mats.values():
        torch.mm(a, a)
    sync(device)
    with profile(activities=activities(device), record_shapes=True) as prof:
        for a in mats.values():
            for _ in range(reps):
                torch.mm(a, a)
        sync(device)
    rows = {}
    for row in prof.key_averages(group_by_input_shape=True):
        if row.key != "aten::mm" or not row.input_shapes:
            continue
        n = int(row.input_shapes[0][0])
        rows[n] = device_us(row) / max(int(row.count), 1)
    table = {
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "us_per_mm": {str(n): rows.get(n) for n in MM_SIZES},
    }
    (out / "mm_sizes.json").write_text(json.dumps(table, indent=1))
    print(f"wrote {out / 'mm_sizes.json'}", flush=True)


def inductor_provenance() -> str | None:
    """Turn on Inductor's provenance tracking (kernel -> fx nodes) under whichever name
    this torch has; the name set, or None. On the CPU also a profiler range per C++
    kernel (``cpp.enable_kernel_profile``), without which they are invisible."""
    try:
        from torch._inductor import config
    except ImportError:
        return None
    if hasattr(config, "cpp") and hasattr(config.cpp, "enable_kernel_profile"):
        config.cpp.enable_kernel_profile = True
    for name, value in (("provenance_tracking_level", 1), ("provenance_tracking", True)):
        try:
            if hasattr(config.trace, name):
                setattr(config.trace, name, value)
                return f"trace.{name}={value}"
        except Exception:  # noqa: BLE001 (a config that refuses the value: go without)
            continue
    return None


def run_compile(args: argparse.Namespace, device: str, dtype: torch.dtype) -> None:
    model, static, inputs = build(device, dtype)
    meta = describe(device, dtype)
    provenance = inductor_provenance()
    mode = None if args.compile_mode == "default" else args.compile_mode
    compiled = torch.compile(model, mode=mode)
    mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", None)

    def step() -> None:
        if mode == "reduce-overhead" and mark_step is not None:
            mark_step()  # a new inference step: earlier graph outputs may be overwritten
        compiled(static)

    t0 = time.monotonic()
    with torch.no_grad():
        for _ in range(3):  # compile; reduce-overhead records its graphs on later calls
            step()
        sync(device)
        compile_s = time.monotonic() - t0
        with profile(activities=activities(device), record_shapes=True) as prof:
            profiled_loop(step, static, inputs, args.iters, device)
    name = f"compile_{args.compile_mode.replace('-', '_')}"
    what = "the compiled forward: Inductor's fused kernels"
    if mode == "reduce-overhead":
        what += ", replayed from CUDA graphs (cudagraph trees)"
    export(
        prof,
        args.out,
        name,
        meta,
        iterations=args.iters,
        compile_mode=args.compile_mode,
        compile_s=round(compile_s, 2),
        provenance=provenance,
        inductor_debug_dir=os.environ.get("TORCH_COMPILE_DEBUG_DIR"),
        regions={ITERATION: f"copy_ of the input, then {what}"},
    )


def run_plain(args: argparse.Namespace, device: str, dtype: torch.dtype) -> None:
    model, static, inputs = build(device, dtype)
    with torch.no_grad():
        for i in range(args.iters):
            static.copy_(inputs[i % len(inputs)])
            model(static)
        sync(device)
    print("ran", args.iters, "iterations", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("traces", "graph-capture", "compile", "run"))
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--compile-mode", choices=("default", "reduce-overhead"), default="default")
    args = p.parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # bf16 on the GPU (Tensor Cores, as the examples autocast to); fp32 on the CPU
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cpu":
        torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    modes = {
        "traces": run_traces,
        "graph-capture": run_graph_capture,
        "compile": run_compile,
        "run": run_plain,
    }
    modes[args.mode](args, device, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
