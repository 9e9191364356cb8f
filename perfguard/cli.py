"""The ``perfguard`` command. A thin client of the library.

``perfguard analyze`` mirrors DLProf's analysis options; DLProf's own
underscore spellings (``--key_node``, ``--iter_start``, ``--output_path``)
are accepted too, so existing scripts keep working. Bad input exits 2 with
one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from perfguard.commands import argtypes
from perfguard.commands.memory import release_free_pages, reuse_freed_memory
from perfguard.errors import AnalysisError, PerfguardError

if TYPE_CHECKING:
    from perfguard.trace.gpu_ranges import RangeFilter

PROG = "perfguard"


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors on one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _choices(allowed: Sequence[str], extra: Sequence[str] = ()) -> argparse._ActionType:
    def parse(text: str) -> list[str]:
        items = [t.strip().lower() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        if "all" in items and "all" in extra:
            return list(allowed)
        bad = [t for t in items if t not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown value(s) {', '.join(bad)}; choose from {', '.join(allowed)}"
            )
        return list(dict.fromkeys(items))

    return parse


def _file_name(text: str) -> str:
    name = text.strip()
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise argparse.ArgumentTypeError(
            f"must be a plain file name prefix (no directory part), got {text!r}; "
            "use --output-path for the directory"
        )
    return name


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def add_analyze_options(parser: argparse.ArgumentParser) -> None:
    """Analysis options, shared by ``analyze`` and (later) ``profile``."""
    from perfguard.report.dlprof import ALL_REPORTS, FORMATS
    from perfguard.report.perfetto import FORMAT as PERFETTO

    parser.add_argument("--key-node", "--key_node", dest="key_node", metavar="NAME",
                        help="range name that ends each iteration (DLProf: N instances give "
                             "N+1 iterations)")  # fmt: skip
    parser.add_argument(
        "--iter-start",
        "--iter_start",
        dest="iter_start",
        type=argtypes.integer(0),
        metavar="N",
        help="first iteration to aggregate (inclusive)",
    )
    parser.add_argument(
        "--iter-stop",
        "--iter_stop",
        dest="iter_stop",
        type=argtypes.integer(0),
        metavar="N",
        help="last iteration to aggregate (inclusive)",
    )
    parser.add_argument("--reports", type=_choices(ALL_REPORTS, ("all",)),
                        default=list(ALL_REPORTS), metavar="LIST",
                        help=f"comma-separated reports: {','.join(ALL_REPORTS)} or all "
                             "(default: all)")  # fmt: skip
    parser.add_argument(
        "--formats",
        type=_choices((*FORMATS, PERFETTO)),
        default=list(FORMATS),
        metavar="LIST",
        help="comma-separated: csv,json,html,perfetto (default: csv,json,html; html is one "
        "page, <base>_report.html, with every report; perfetto is a timeline for "
        "ui.perfetto.dev, <base>_perfetto.json.gz)",
    )
    parser.add_argument(
        "--output-path",
        "--output_path",
        dest="output_path",
        default=".",
        metavar="DIR",
        help="directory for the reports (default: .)",
    )
    parser.add_argument(
        "--base-name",
        "--base_name",
        "--file_prefix",
        dest="base_name",
        type=_file_name,
        default="dlprof",
        metavar="NAME",
        help="report file prefix: <base>_<report>.<ext> (default: dlprof)",
    )
    parser.add_argument(
        "-f", "--force", action="store_true", help="overwrite existing report files"
    )
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress line on stderr (it shows only on a terminal, "
                             "after 2 s)")  # fmt: skip
    parser.add_argument("--gpu-ranges-only", action="store_true",
                        help="nsys exports: keep only the NVTX ranges that enclose GPU work "
                             "(and the --key-node ranges); less memory at emit_nvtx density, "
                             "but ops that launch nothing leave the detail report")  # fmt: skip
    parser.add_argument("-j", "--jobs", type=argtypes.integer(1), metavar="N",
                        help="processes reading a directory's per-rank captures at once "
                             "(default: one per core, up to one per rank)")  # fmt: skip


#: one module per further subcommand, each with ``add_parser(subparsers)`` that
#: registers it (``set_defaults(func=...)``); they import their layer lazily,
#: inside ``func``, so ``perfguard --help`` stays fast
COMMAND_MODULES: tuple[str, ...] = (
    "perfguard.commands.profile",
    "perfguard.commands.baseline",
    "perfguard.commands.compare",
    "perfguard.commands.report",
    "perfguard.commands.history",
    "perfguard.commands.bisect",
    "perfguard.commands.publish",
)


def build_parser() -> argparse.ArgumentParser:
    from perfguard import __version__

    parser = _Parser(prog=PROG, description="Find and stop GPU performance regressions.")
    parser.add_argument("--version", action="version", version=f"perfguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    analyze = sub.add_parser(
        "analyze",
        help="analyse an nsys SQLite export or PyTorch profiler trace; write DLProf-style reports",
        description="Attribute every GPU kernel to the op that launched it and write "
        "summary/detail/iteration/kernel reports.",
    )
    analyze.add_argument("--database", "-d", required=True, metavar="FILE_OR_DIR",
                         help="nsys .sqlite export, Kineto .json/.json.gz trace, or a "
                              "directory of per-rank traces")  # fmt: skip
    add_analyze_options(analyze)
    analyze.add_argument(
        "--per-rank",
        action="store_true",
        help="directory only: analyse each rank in its own worker process "
        "(memory bounded by one rank); write per-rank tables with a "
        "Rank column and the rank report (no HTML page or timeline)",
    )
    analyze.set_defaults(func=run_analyze, skip_teardown=True)
    for module in COMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


def run_analyze(args: argparse.Namespace) -> int:
    from perfguard.report.writer import check_output

    # refuse before the (possibly long) read when the reports could not be written anyway
    if getattr(args, "per_rank", False):
        from perfguard.commands.rank_report import analyze_per_rank

        return analyze_per_rank(args)
    check_output(args.output_path, args.base_name, args.reports, args.formats, args.force)
    analyze_and_report(args)
    return 0


def analyze_and_report(args: argparse.Namespace) -> None:
    """Load ``args.database``, analyse it with the analysis options, print the
    summary and notes, write the reports (shared by ``analyze`` and ``profile``)."""
    from perfguard.analysis import analyze
    from perfguard.analysis.ranks import rank_table, straggler
    from perfguard.commands.progress import Progress
    from perfguard.report import format_summary, write_reports
    from perfguard.trace import load_trace

    if "html" in args.formats:
        _import_in_background("matplotlib.figure")
    with Progress(quiet=getattr(args, "quiet", False)) as progress:
        progress.phase("reading", _what(args.database))
        trace = load_trace(
            args.database,
            jobs=getattr(args, "jobs", None),
            on_rank=lambda done, total, n: progress.events(n, f"{done}/{total} ranks"),
            range_filter=_range_filter(args),
        )
        release_free_pages()  # the reader's dropped pieces: see the function
        progress.phase("analysing")
        progress.events(sum(len(t) for t in (trace.ranges, trace.api_calls, trace.kernels,
                                             trace.memops)))  # fmt: skip
        try:
            result = analyze(
                trace, key_node=args.key_node, iter_start=args.iter_start, iter_stop=args.iter_stop
            )
        except AnalysisError as exc:  # name the capture the request does not fit
            raise AnalysisError(f"{args.database}: {exc}") from None
        progress.phase("writing reports")
        found = straggler(rank_table(result))  # None for one rank
        written = write_reports(
            result,
            args.output_path,
            reports=args.reports,
            formats=args.formats,
            base=args.base_name,
            force=args.force,
        )
    print(format_summary(result))
    if found is not None:
        print(f"\n{found.describe()}")
    for note in result.notes:
        print(f"note: {note}")
    print("\nReports written:")
    for path in written:
        print(f"  {path}")


def _range_filter(args: argparse.Namespace) -> RangeFilter | None:
    """``--gpu-ranges-only``'s filter, keeping the key node's ranges; None without it."""
    if not getattr(args, "gpu_ranges_only", False):
        return None
    from perfguard.trace.gpu_ranges import RangeFilter

    return RangeFilter(keep_names=(args.key_node,) if args.key_node else ())


def _what(path: str) -> str:
    """The capture's name and size (and events, for an nsys export) for the progress line."""
    from perfguard.trace.loader import events_in

    name = os.path.basename(os.path.normpath(path))
    try:
        if not os.path.isfile(path):
            return name
        size = f"{os.path.getsize(path) / 1e6:,.0f} MB"
    except OSError:
        return name
    events = events_in(path)
    return f"{name} ({size}, {events:,} events)" if events else f"{name} ({size})"


def _import_in_background(module: str) -> None:
    """Import ``module`` on a daemon thread: the HTML page needs matplotlib (0.3-0.5 s
    to import), and while a capture is read the main thread mostly waits on SQLite."""
    import threading

    def work() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the page's own import reports any real problem
            pass

    from perfguard.trace.kineto_split import IMPORT_THREAD

    threading.Thread(target=work, name=IMPORT_THREAD, daemon=True).start()


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
