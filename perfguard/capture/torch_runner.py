"""Run a Python program under the PyTorch profiler, in this process.

    python -m perfguard.capture.torch_runner --output OUT [--device auto|cuda|cpu]
        [--no-record-shapes] [--with-stack | --no-stack] [--no-flops] [--profile-memory]
        [--warmup N] [--iterations N|all] [--key-node NAME] [--fallback-seconds S]
        [--report FILE] -- (SCRIPT.py | -m MODULE | -c CODE) [ARGS...]

The program runs as ``__main__`` the way ``python`` would run it: ``sys.argv``
is ``[SCRIPT, ARGS...]`` (the module's path for ``-m``, ``-c`` for code),
a script's folder comes first on ``sys.path``; both are restored afterwards.
``PERFGUARD_CAPTURE=torch`` is set for the program.

What is recorded: a window of ``--iterations`` (default 3) after ``--warmup``
(default 2), the iterations found by their key node, with no Python stacks
unless ``--with-stack`` (:mod:`perfguard.capture.torch_window`);
``--iterations all`` records the whole run from the start, as the runner once
always did. ``--report FILE`` gets what the capture holds (JSON: ``kind``,
``iterations``, ``warmup``, ``key_node``, ``detail``, ``note``).

Exit status: the program's (``sys.exit(n)``; 1 after an uncaught exception,
whose traceback is printed as Python would). The trace is written in every
case; if it cannot be, the status is 3 (unless the program already failed).
Usage errors exit 2. See :mod:`perfguard.capture.torch_profiler` for how a
program marks iterations.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

from perfguard.capture.sites import WindowSites
from perfguard.capture.torch_profiler import (
    CAPTURE_ENV,
    DEFAULT_FALLBACK_S,
    DEFAULT_ITERATIONS,
    DEFAULT_WARMUP,
    DEVICES,
    WHOLE_RUN,
    _import_torch,
    profile_torch,
    record_compiled_kernels,
    resolve_device,
    trace_path,
)
from perfguard.capture.torch_window import (
    WindowObserver,
    WindowReport,
    WindowSpec,
    window_capture,
)
from perfguard.errors import CaptureError

PROG = "python -m perfguard.capture.torch_runner"
EXIT_NO_TRACE = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Run a Python program under the PyTorch profiler."
    )
    p.add_argument("--output", required=True, help="trace file to write (.json or .json.gz)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--no-record-shapes", dest="record_shapes", action="store_false")
    stack = p.add_mutually_exclusive_group()
    stack.add_argument("--with-stack", dest="with_stack", action="store_true")
    stack.add_argument("--no-stack", dest="with_stack", action="store_false")
    p.add_argument("--no-flops", dest="with_flops", action="store_false")
    p.add_argument("--profile-memory", action="store_true")
    p.add_argument("--warmup", type=_count, default=DEFAULT_WARMUP, metavar="N")
    p.add_argument("--iterations", type=iterations, default=DEFAULT_ITERATIONS, metavar="N|all")
    p.add_argument("--key-node", metavar="NAME")
    p.add_argument("--fallback-seconds", type=float, default=DEFAULT_FALLBACK_S, metavar="S")
    p.add_argument("--report", metavar="FILE")
    return p


def iterations(text: str) -> int:
    """``N`` >= 1, or ``all`` (:data:`WHOLE_RUN`)."""
    return WHOLE_RUN if text.strip().lower() == "all" else _count(text)


def _count(text: str) -> int:
    """An int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def exit_code(exc: SystemExit) -> int:
    """The process status ``sys.exit(value)`` gives, as Python computes it."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_target(target: Sequence[str]) -> int:
    """Run ``[SCRIPT, ARGS]``, ``[-m, MODULE, ARGS]`` or ``[-c, CODE, ARGS]`` as ``__main__``.

    Returns the program's exit status; never raises for the program's own
    errors (``SystemExit`` gives its code, any other exception prints its
    traceback and gives 1). ``sys.argv`` and ``sys.path[0]`` are restored.
    """
    saved_argv, saved_path0 = sys.argv[:], (sys.path[0] if sys.path else None)
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]  # run_module puts the file path in argv[0]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        elif target[0] == "-c":
            sys.argv = ["-c", *target[2:]]
            _run_code(target[1])
        else:
            script = target[0]
            sys.argv = list(target)
            folder = os.path.dirname(os.path.abspath(script))
            if sys.path:
                sys.path[0] = folder
            else:
                sys.path.insert(0, folder)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
    return 0


def _run_code(code: str) -> None:
    module = types.ModuleType("__main__")
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(compile(code, "<string>", "exec"), module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the runner's options, profile the program, return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(f"{PROG}: error: put `--` before the program to run", file=sys.stderr)
        return 2
    at = args.index("--")
    opts, target = _parser().parse_args(args[:at]), args[at + 1 :]
    if not target or (target[0] in ("-m", "-c") and len(target) < 2):
        print(f"{PROG}: error: nothing to run after `--`", file=sys.stderr)
        return 2
    os.environ[CAPTURE_ENV] = "torch"
    status = 0
    try:
        if opts.iterations == WHOLE_RUN:
            with profile_torch(
                opts.output,
                device=opts.device,
                record_shapes=opts.record_shapes,
                with_stack=opts.with_stack,
                with_flops=opts.with_flops,
                profile_memory=opts.profile_memory,
            ) as handle:
                status = run_target(target)
            report = WindowReport("whole", 0, 0, "", "the whole run", "; ".join(handle.notes))
        else:
            report, status = _run_window(opts, target)
    except CaptureError as exc:
        print(f"perfguard: {exc}", file=sys.stderr)
        return status or EXIT_NO_TRACE
    if opts.report:
        _write_report(Path(opts.report), report)
    return status


#: passes that run only while the window records, each told when it opens and when its
#: trace is written (the call-site pass of perfguard/capture/sites.py belongs here)
OBSERVERS: list[WindowObserver] = []


def _run_window(opts: argparse.Namespace, target: Sequence[str]) -> tuple[WindowReport, int]:
    """Run the program under the window (:mod:`perfguard.capture.torch_window`)."""
    record_compiled_kernels()
    torch = _import_torch()
    device = resolve_device(opts.device, torch)
    spec = WindowSpec(opts.warmup, opts.iterations, opts.key_node, opts.fallback_seconds)
    status = 0
    with window_capture(
        torch,
        trace_path(opts.output),
        device,
        spec,
        record_shapes=opts.record_shapes,
        with_stack=opts.with_stack,
        with_flops=opts.with_flops,
        profile_memory=opts.profile_memory,
        observers=[*OBSERVERS, *([] if opts.with_stack else [WindowSites()])],
    ) as window:
        status = run_target(target)
    assert window.report is not None  # set whenever the window exits without an error
    return window.report, status


def _write_report(path: Path, report: WindowReport) -> None:
    try:
        path.write_text(json.dumps(report.as_json()))
    except OSError as exc:
        print(f"perfguard: note: {path}: the capture's report not written ({exc})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
