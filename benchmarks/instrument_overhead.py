"""Overhead of ``perfguard.instrument`` on a CPU training step (small MLP, small CNN).

A training step is ``zero_grad``, forward, cross-entropy, backward, SGD
``step``. Each variant runs blocks of ``--steps`` timed steps after
``--warmup`` untimed ones; the variants take turns block by block
(``off, modules, ops, ...`` then again), ``--repeats`` rounds, so drift in
machine speed hits all of them alike. A variant's figure is the median over
rounds of its per-block median step time; overhead is relative to ``off``.
Both wall time and the thread's CPU time are reported: with one intra-op
thread all the work is on the calling thread, and its CPU time is not
inflated when other processes compete for the cores (wall time is).

Variants:

* ``off``: no instrumentation.
* ``bare mode``: a ``TorchDispatchMode`` that only calls the op: torch's own
  floor for any Python op hook (not perfguard code; for reference).
* ``modules``: ``instrument(model, ops=False)``: module ranges only.
* ``modules+ops``: ``instrument(model, ops=True)``: module and aten-op ranges, as they
  run with no profiler attached (no payload is built, nothing is emitted).
* ``+nvtx payload``: as ``modules+ops`` with an NVTX tool simulated (a
  domain whose push/pop do nothing): every op builds its message (shapes,
  dtypes, call site). This is the Python cost under nsys, minus NVTX's own.

Small CPU models are the worst case: their ops take microseconds, so a fixed
cost per op weighs most. Target: under 5 %.

Usage::

    python benchmarks/instrument_overhead.py
    python benchmarks/instrument_overhead.py --repeats 9 --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from perfguard.capture.instrument import instrument  # noqa: E402

TARGET_PCT = 5.0


class _NullDomain:
    """An NVTX domain that accepts everything and records nothing (simulates nsys)."""

    def get_event_attributes(self, message: Any = None, **_: Any) -> Any:
        return message

    def push_range(self, attributes: Any) -> None:
        pass

    def pop_range(self) -> None:
        pass


@contextlib.contextmanager
def _nvtx_attached() -> Iterator[None]:
    from perfguard.capture import ranges as annotate

    saved = annotate._nvtx_domain
    annotate._nvtx_domain = lambda name: _NullDomain()
    try:
        yield
    finally:
        annotate._nvtx_domain = saved


def mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    return model, torch.randn(64, 256), torch.randint(0, 10, (64,))


def cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )
    return model, torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))


def _bare_mode() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Bare(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    return Bare()


def _variants(model: nn.Module) -> dict[str, Callable[[], contextlib.AbstractContextManager[Any]]]:
    @contextlib.contextmanager
    def with_payload() -> Iterator[None]:
        with _nvtx_attached(), instrument(model, ops=True):
            yield

    return {
        "off": contextlib.nullcontext,
        "bare mode": _bare_mode,
        "modules": lambda: instrument(model, ops=False),
        "modules+ops": lambda: instrument(model, ops=True),
        "+nvtx payload": with_payload,
    }


def _block(step: Callable[[], None], scope: Any, warmup: int, steps: int) -> tuple[float, float]:
    """Median wall and median thread-CPU time of one step in µs, ``steps`` steps in ``scope``."""
    with scope():
        for _ in range(warmup):
            step()
        wall, cpu = [], []
        for _ in range(steps):
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            step()
            cpu.append(time.thread_time_ns() - c0)
            wall.append(time.perf_counter_ns() - w0)
    return statistics.median(wall) / 1e3, statistics.median(cpu) / 1e3


def measure(
    build: Callable[[], tuple[nn.Module, torch.Tensor, torch.Tensor]],
    warmup: int,
    steps: int,
    repeats: int,
) -> dict[str, tuple[float, float]]:
    """Per variant: (wall, CPU) step time in µs, each the median over rounds of block medians."""
    torch.manual_seed(0)
    model, x, y = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    variants = _variants(model)
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, scope in variants.items():
            samples[name].append(_block(step, scope, warmup, steps))
    return {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in samples.items()
    }


def count_ops(build: Callable[[], tuple[nn.Module, torch.Tensor, torch.Tensor]]) -> int:
    """aten ops per training step (what the op ranges pay for)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, x, y = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            nonlocal n
            n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s); per variant: median of "
        f"{args.repeats} rounds x median of {args.steps} steps (after {args.warmup} warm-up)"
    )
    header = (
        f"{'model':<5} {'ops/step':>8} {'variant':<14} {'wall µs':>9} {'overhead':>9}"
        f" {'CPU µs':>9} {'overhead':>9} {'CPU µs/op':>10}"
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    for name, build in (("mlp", mlp), ("cnn", cnn)):
        ops = count_ops(build)
        result = measure(build, args.warmup, args.steps, args.repeats)
        base_wall, base_cpu = result["off"]
        for variant, (wall, cpu) in result.items():
            pct_wall = 100.0 * (wall - base_wall) / base_wall
            pct_cpu = 100.0 * (cpu - base_cpu) / base_cpu
            if variant == "modules":
                worst = max(worst, pct_cpu)
            off = variant == "off"
            per_op = "" if variant in ("off", "modules") else f"{(cpu - base_cpu) / ops:.1f}"
            print(
                f"{name:<5} {ops:>8} {variant:<14} {wall:>9.1f} "
                f"{'' if off else f'{pct_wall:+.1f} %':>9} {cpu:>9.1f} "
                f"{'' if off else f'{pct_cpu:+.1f} %':>9} {per_op:>10}"
            )
    print(f"target: module ranges under {TARGET_PCT:.0f} % (CPU time) -> worst {worst:+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
