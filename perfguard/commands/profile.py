"""``perfguard profile [options] -- COMMAND ...``: capture a command, then analyse it.

The capture lands in ``--output-path`` next to the reports, so changing the
key node or iteration range later is ``perfguard analyze --database
<capture>``, without profiling again (as DLProf's ``--database`` was). The
torch backend records a window of iterations, not the whole run
(:mod:`perfguard.capture.torch_window`); the ``capture:`` line says what the
capture holds and its size.
"""

from __future__ import annotations

import argparse
import math

from perfguard.capture import profile_command
from perfguard.capture.base import RunOptions
from perfguard.capture.torch_profiler import (
    DEFAULT_FALLBACK_S,
    DEFAULT_ITERATIONS,
    DEFAULT_WARMUP,
    WHOLE_RUN,
)
from perfguard.commands import argtypes
from perfguard.commands.analyze import add_analyze_options, analyze_and_report
from perfguard.errors import CaptureError
from perfguard.report.writer import check_output


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile",
        help="profile a command (nsys, the PyTorch profiler, or CPU-only) and analyse it",
        description="Run COMMAND under a profiler, write the capture to --output-path, then "
        "analyse it as `perfguard analyze` does. Put `--` before the command.",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "nsys", "torch", "tf", "jax"),
        default="auto",
        help="auto: nsys when installed and a GPU is present, else the PyTorch "
        "profiler (CUDA when available, else CPU); tf/jax: the TensorFlow "
        "or JAX profiler (an .xplane.pb)",
    )
    p.add_argument("--name", default="capture", help="capture file name (default: capture)")
    p.add_argument(
        "--nsys", metavar="PATH", help="nsys executable (default: $PERFGUARD_NSYS, PATH)"
    )
    p.add_argument("--delay", "-y", type=float, metavar="S", help="nsys: start after S seconds")
    p.add_argument("--duration", type=float, metavar="S", help="nsys: stop after S seconds")
    p.add_argument(
        "--capture-range",
        "--capture_range",
        dest="capture_range",
        metavar="cudaProfilerApi|nvtx:NAME",
        help="nsys: capture only between cudaProfilerStart/Stop or inside an NVTX range",
    )
    p.add_argument(
        "--export-mode",
        choices=("inline", "separate"),
        default="inline",
        help="nsys: --export=sqlite (inline) or a separate `nsys export`",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="stop the command (its whole process group) after S seconds",
    )
    window = p.add_argument_group(
        "torch window",
        "The torch backend records a window of iterations, as torch.profiler.schedule does: "
        f"--warmup iterations (default {DEFAULT_WARMUP}) run unrecorded, then --iterations "
        f"(default {DEFAULT_ITERATIONS}) are recorded, each a ProfilerStep#N range, and the "
        "rest of the program runs unprofiled. An iteration ends at the key node: each end of "
        "a --key-node range, else of the program's perfguard.iteration ranges, else each "
        "optimizer.step() of its first optimizer. Without one (or when the program ends "
        "during the warm-up) the capture is the program's first --fallback-seconds, said "
        "in a note. No Python stacks unless --with-stack.",
    )
    window.add_argument(
        "--warmup",
        type=argtypes.integer(1),
        metavar="N",
        help=f"iterations run before the window (default {DEFAULT_WARMUP}; "
        "at least 1: the first holds the program's set-up)",
    )
    window.add_argument(
        "--iterations",
        type=_iterations,
        metavar="N|all",
        help=f"iterations recorded (default {DEFAULT_ITERATIONS}); all: the "
        "whole run from the start, no window",
    )
    window.add_argument(
        "--with-stack",
        action="store_const",
        const=True,
        help="record torch's Python stacks (its Python tracer: every Python "
        "call in the window; slow, large)",
    )
    window.add_argument(
        "--fallback-seconds",
        type=_seconds,
        metavar="S",
        help="without a key node, record the program's first S seconds "
        f"(default {DEFAULT_FALLBACK_S:g})",
    )
    add_analyze_options(p)
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the program to profile and its arguments",
    )
    p.set_defaults(func=run, skip_teardown=True)  # see perfguard.cli._exit_now


def _iterations(text: str) -> int:
    return WHOLE_RUN if text.strip().lower() == "all" else argtypes.integer(1)(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def size_text(nbytes: int) -> str:
    """A capture's size in MB, as the ``capture:`` line gives it."""
    mb = nbytes / 1e6
    return f"{mb:.2f} MB" if mb < 10 else f"{mb:.0f} MB"


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CaptureError(
            "no command to profile: put it after `--`, e.g. perfguard profile -- python train.py"
        )
    check_output(args.output_path, args.base_name, args.reports, args.formats, args.force)
    result = profile_command(
        command,
        backend=args.backend,
        output_dir=args.output_path,
        name=args.name,
        delay=args.delay,
        duration=args.duration,
        capture_range=args.capture_range,
        nsys=args.nsys,
        timeout=args.timeout,
        export_mode=args.export_mode,
        options=RunOptions(
            warmup=args.warmup,
            iterations=args.iterations,
            with_stack=args.with_stack,
            fallback_s=args.fallback_seconds,
            key_node=args.key_node,
        ),
    )
    size = size_text(result.path.stat().st_size)
    print(f"capture: {result.path} ({result.backend}: {result.detail or result.why}, {size})")
    if result.detail and result.why.startswith("auto"):
        print(f"backend: {result.why}")
    if result.returncode != 0:
        print(f"note: the command exited {result.returncode}; analysing what was captured")
    args.database = str(result.path)
    analyze_and_report(args)
    return 0 if result.returncode == 0 else 1
