"""The ``perfguard`` command: the parser of every subcommand (each one's module under
:mod:`perfguard.commands` adds its own) and the mapping of errors to exit codes. Bad
input exits 2 with one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from perfguard import __version__
from perfguard.errors import PerfguardError
from perfguard.memory import reuse_freed_memory

PROG = "perfguard"


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors on one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


#: one module per subcommand, each with ``add_parser(subparsers)`` that
#: registers it (``set_defaults(func=...)``); each imports what it uses at its top (the
#: parsers load the analysis and report layers, numpy and pandas, so the store, compare
#: and publish modules add little: ``perfguard --help`` 1.20 s before, 1.22 s after)
COMMAND_MODULES: tuple[str, ...] = (
    "perfguard.commands.analyze",
    "perfguard.commands.profile",
    "perfguard.commands.baseline",
    "perfguard.commands.compare",
    "perfguard.commands.report",
    "perfguard.commands.merge",
    "perfguard.commands.history",
    "perfguard.commands.bisect",
    "perfguard.commands.publish",
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Find and stop GPU performance regressions.")
    parser.add_argument("--version", action="version", version=f"perfguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in COMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    program = argv is None  # run as a program: the process is ours (not a test or a notebook)
    if program:
        reuse_freed_memory()
    args = build_parser().parse_args(argv)
    rc = _run(args)
    if program and getattr(args, "skip_teardown", False):
        _exit_now(rc)
    return rc


def _exit_now(rc: int) -> NoReturn:
    """End the process without tearing the interpreter down.

    After a large analysis, freeing millions of objects one by one at exit
    takes a quarter of a second for nothing. The commands that opt in
    (``analyze``, ``profile``) have closed their files, databases and
    threads by then; only the standard streams need flushing.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(rc)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; errors become one line on stderr and an exit code."""
    debug = bool(os.environ.get("PERFGUARD_DEBUG"))
    try:
        with warnings.catch_warnings():
            if not debug:  # library warnings are for developers; stderr stays one line
                warnings.simplefilter("ignore")
            return int(args.func(args))
    except PerfguardError as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`perfguard analyze ... | head`): not a bug
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command killed by the signal
    except Exception as exc:  # a bug: one line unless the user asks for the traceback
        if debug:
            raise
        print(
            f"{PROG}: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(rerun with PERFGUARD_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
