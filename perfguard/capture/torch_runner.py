"""Run a Python program under the PyTorch profiler, in this process.

    python -m perfguard.capture.torch_runner --output OUT [--device auto|cuda|cpu]
        [--no-record-shapes] [--no-stack] [--no-flops] [--profile-memory]
        -- (SCRIPT.py | -m MODULE | -c CODE) [ARGS...]

The program runs as ``__main__`` the way ``python`` would run it: ``sys.argv``
is ``[SCRIPT, ARGS...]`` (the module's path for ``-m``, ``-c`` for code),
a script's folder comes first on ``sys.path``; both are restored afterwards.
``PERFGUARD_CAPTURE=torch`` is set for the program.

Exit status: the program's (``sys.exit(n)``; 1 after an uncaught exception,
whose traceback is printed as Python would). The trace is written in every
case; if it cannot be, the status is 3 (unless the program already failed).
Usage errors exit 2. See :mod:`perfguard.capture.torch_profiler` for how a
program marks iterations.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
import types
from collections.abc import Sequence

from perfguard.capture.torch_profiler import CAPTURE_ENV, DEVICES, profile_torch
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
    p.add_argument("--no-stack", dest="with_stack", action="store_false")
    p.add_argument("--no-flops", dest="with_flops", action="store_false")
    p.add_argument("--profile-memory", action="store_true")
    return p


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
        with profile_torch(
            opts.output, device=opts.device, record_shapes=opts.record_shapes,
            with_stack=opts.with_stack, with_flops=opts.with_flops,
            profile_memory=opts.profile_memory,
        ):  # fmt: skip
            status = run_target(target)
    except CaptureError as exc:
        print(f"perfguard: {exc}", file=sys.stderr)
        return status or EXIT_NO_TRACE
    return status


if __name__ == "__main__":
    sys.exit(main())
