"""``perfguard report``: render the HTML report (and summary.md) from stored results.

Two sources:

* a session's ``results.json`` (what the pytest plugin wrote, schema 1 or 2):
  re-rendered as is;
* a baseline store (SQLite) with ``--run RUN_ID``: that run is compared with
  ``--baseline-run ID`` (or the run found for ``--baseline REF`` in the git
  repository), test by test, exactly as the plugin would, and rendered.
  Without a baseline every test reads ``no-baseline``.

Errors are one line naming the file (exit 2 through :mod:`perfguard.cli`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from perfguard.baseline.db import is_url
from perfguard.commands import argtypes
from perfguard.compare.stored import results_from_store
from perfguard.compare.tolerance import ALPHA
from perfguard.errors import ReportError
from perfguard.report.html import load_results, write_session_html
from perfguard.report.markdown import write_markdown

_SQLITE_MAGIC = b"SQLite format 3\x00"


def add_parser(subparsers: Any) -> None:
    """Register ``report``."""
    p = subparsers.add_parser(
        "report",
        help="render report.html (and summary.md) from results.json or a baseline store",
        description="Render the self-contained HTML report of a pytest session from its "
        "results.json, or of a stored run compared with a baseline run.",
    )
    p.add_argument(
        "source",
        metavar="RESULTS.json|STORE.db",
        help="a session's results.json, or a baseline store (then --run)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="HTML file to write (default: report.html next to SOURCE)",
    )
    p.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the Markdown summary (appended to $GITHUB_STEP_SUMMARY when that is set)",
    )
    p.add_argument(
        "--report-url",
        metavar="URL",
        help="link target for the HTML report in the Markdown summary",
    )
    p.add_argument(
        "--run",
        type=argtypes.integer(1, "a run id"),
        metavar="RUN_ID",
        help="store only: the run to report",
    )
    base = p.add_mutually_exclusive_group()
    base.add_argument(
        "--baseline-run",
        type=argtypes.integer(1, "a run id"),
        metavar="ID",
        help="store only: compare with this run",
    )
    base.add_argument(
        "--baseline",
        metavar="REF",
        help="store only: compare with the run of the nearest first-parent "
        "ancestor of REF measured on a compatible machine",
    )
    p.add_argument(
        "--repo", default=".", metavar="DIR", help="git repository for --baseline (default: .)"
    )
    p.add_argument(
        "--tolerance",
        type=argtypes.tolerance,
        default=None,
        metavar="PCT",
        help="store only: slowdown that counts, e.g. 5%% (default: each test's "
        "marker, else the session's, else 5%%)",
    )
    p.add_argument(
        "--alpha",
        type=argtypes.alpha,
        default=ALPHA,
        metavar="P",
        help=f"store only: significance level (default {ALPHA:g})",
    )
    p.add_argument(
        "--max-ops",
        type=argtypes.integer(1),
        default=50,
        metavar="N",
        help="ops listed per test, largest change first (default 50)",
    )
    p.set_defaults(func=run)


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    url = is_url(args.source)
    source = Path(args.source)
    if not url and not source.exists():
        raise ReportError(f"{source}: no such file")
    if url or _is_sqlite(source):
        if args.run is None:
            raise ReportError(
                f"{source}: is a baseline store; give --run RUN_ID "
                "(see `perfguard baseline list --store ...`)"
            )
        results = results_from_store(
            args.source if url else source,
            args.run,
            baseline_run=args.baseline_run,
            baseline_ref=args.baseline,
            repo=args.repo,
            tolerance=args.tolerance,
            alpha=args.alpha,
        )
    else:
        store_only = [f for f in ("run", "baseline_run", "baseline") if getattr(args, f)]
        if store_only:
            flag = "--" + store_only[0].replace("_", "-")
            raise ReportError(f"{source}: {flag} applies to a baseline store, not results.json")
        results = load_results(source)
    default = Path("report.html") if url else source.with_name("report.html")
    output = Path(args.output) if args.output else default
    if output.resolve() == source.resolve():
        raise ReportError(f"{output}: would overwrite the input; choose another --output")
    written = [write_session_html(results, output, max_ops=args.max_ops)]
    if args.markdown:
        written.append(write_markdown(results, args.markdown, report_url=args.report_url))
    counts = results.counts
    summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "no tests"
    print(f"perfguard report: {results.badge()}: {summary}")
    for path in written:
        print(f"  {path}")
    return 0


__all__ = ["add_parser", "run"]
