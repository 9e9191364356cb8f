"""``perfguard analyze``: read a capture, analyse it, write DLProf-style reports.

Its options mirror DLProf's analysis options; DLProf's own underscore spellings
(``--key_node``, ``--iter_start``, ``--output_path``) are accepted too, so existing
scripts keep working. ``perfguard profile`` captures, then analyses the same way
(:func:`add_analyze_options`, :func:`analyze_and_report`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfguard.analysis import analyze
from perfguard.analysis.ranks import rank_table, straggler
from perfguard.commands import argtypes
from perfguard.commands.progress import Progress
from perfguard.commands.rank_report import analyze_per_rank
from perfguard.errors import AnalysisError
from perfguard.memory import release_free_pages
from perfguard.report import format_summary, write_reports
from perfguard.report.dlprof import ALL_REPORTS, FORMATS
from perfguard.report.perfetto import FORMAT as PERFETTO
from perfguard.report.writer import check_output
from perfguard.trace import load_trace
from perfguard.trace.gpu_ranges import RangeFilter
from perfguard.trace.kineto_split import IMPORT_THREAD
from perfguard.trace.loader import events_in

if TYPE_CHECKING:
    from perfguard.trace.gpu_ranges import RangeFilter


def add_parser(subparsers: Any) -> None:
    """Register ``analyze``."""
    analyze = subparsers.add_parser(
        "analyze",
        help="analyse an nsys SQLite export or PyTorch profiler trace; write DLProf-style reports",
        description="Attribute every GPU kernel to the op that launched it and write "
        "summary/detail/iteration/kernel reports.",
    )
    analyze.add_argument(
        "--database",
        "-d",
        required=True,
        metavar="FILE_OR_DIR",
        help="nsys .sqlite export, Kineto .json/.json.gz trace, or a directory of per-rank traces",
    )
    add_analyze_options(analyze)
    analyze.add_argument(
        "--per-rank",
        action="store_true",
        help="directory only: analyse each rank in its own worker process "
        "(memory bounded by one rank); write per-rank tables with a "
        "Rank column and the rank report (no HTML page or timeline)",
    )
    analyze.set_defaults(func=run_analyze, skip_teardown=True)


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


def add_analyze_options(parser: argparse.ArgumentParser) -> None:
    """Analysis options, shared by ``analyze`` and ``profile``."""
    parser.add_argument(
        "--key-node",
        "--key_node",
        dest="key_node",
        metavar="NAME",
        help="range name that ends each iteration (DLProf: N instances give N+1 iterations)",
    )
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
    parser.add_argument(
        "--reports",
        type=_choices(ALL_REPORTS, ("all",)),
        default=list(ALL_REPORTS),
        metavar="LIST",
        help=f"comma-separated reports: {','.join(ALL_REPORTS)} or all (default: all)",
    )
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
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress line on stderr (it shows only on a terminal, after 2 s)",
    )
    parser.add_argument(
        "--gpu-ranges-only",
        action="store_true",
        help="nsys exports: keep only the NVTX ranges that enclose GPU work "
        "(and the --key-node ranges); less memory at emit_nvtx density, "
        "but ops that launch nothing leave the detail report",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=argtypes.integer(1),
        metavar="N",
        help="processes reading a directory's per-rank captures at once "
        "(default: one per core, up to one per rank)",
    )


def run_analyze(args: argparse.Namespace) -> int:
    # refuse before the (possibly long) read when the reports could not be written anyway
    if getattr(args, "per_rank", False):
        return analyze_per_rank(args)
    check_output(args.output_path, args.base_name, args.reports, args.formats, args.force)
    analyze_and_report(args)
    return 0


def analyze_and_report(args: argparse.Namespace) -> None:
    """Load ``args.database``, analyse it with the analysis options, print the
    summary and notes, write the reports (shared by ``analyze`` and ``profile``)."""
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
        progress.events(
            sum(len(t) for t in (trace.ranges, trace.api_calls, trace.kernels, trace.memops))
        )
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
    return RangeFilter(keep_names=(args.key_node,) if args.key_node else ())


def _what(path: str) -> str:
    """The capture's name and size (and events, for an nsys export) for the progress line."""
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

    def work() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the page's own import reports any real problem
            pass

    threading.Thread(target=work, name=IMPORT_THREAD, daemon=True).start()
