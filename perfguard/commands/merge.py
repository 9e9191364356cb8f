"""``perfguard merge RESULTS.json... --output DIR``: a CI run's shards as one verdict.

Reads each shard's ``results.json`` (``--perfguard-shard K/N`` sessions), merges them
(:func:`perfguard.compare.merged.merge`: the entries as their jobs judged them, a missing
or killed shard a ``crashed`` row named ``shard K/N``) and writes one ``results.json``,
one ``summary.md`` (the PR comment; which shard measured each test in a collapsed block)
and one ``report.html`` into DIR. Prints the badge, the table and any missing shard.
Exit 1 when a test regressed (the session's fail rule) or a shard is missing or
incomplete, else 0; an unreadable file is one line naming it (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from perfguard.commands import argtypes
from perfguard.compare.merged import Merged, merge
from perfguard.errors import ReportError
from perfguard.plugin.summary import results_lines
from perfguard.report.html import write_session_html
from perfguard.report.html.render import write_text
from perfguard.report.markdown import render_markdown


def add_parser(subparsers: Any) -> None:
    """Register ``merge``."""
    p = subparsers.add_parser(
        "merge",
        help="merge the results.json of a CI run's shards into one results.json, "
        "summary.md and report.html, with one exit status",
        description="Merge the results.json files of the jobs of one CI run (pytest "
        "--perfguard --perfguard-shard K/N) into one results.json, summary.md and "
        "report.html. Every test keeps the verdict its job gave; a shard expected and "
        "absent, or killed mid-run, is named missing. Exit 1 when a test regressed or a "
        "shard is missing, 0 otherwise.",
    )
    p.add_argument("files", nargs="+", metavar="RESULTS.json", help="one per shard")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="folder for the merged results.json, summary.md, report.html",
    )
    p.add_argument(
        "--expect-shards",
        type=argtypes.integer(1, "a shard count"),
        metavar="N",
        help="shards the run had (default: the N the files recorded)",
    )
    p.add_argument(
        "--report-url", metavar="URL", help="link target for the HTML report in summary.md"
    )
    p.add_argument(
        "--max-ops",
        type=argtypes.integer(1),
        default=50,
        metavar="N",
        help="ops listed per test in report.html (default 50)",
    )
    p.set_defaults(func=run)


def shards_block(merged: Merged) -> list[str]:
    """summary.md's collapsed block: each test and the shard that measured it."""
    tests = sorted(merged.measured_by.items())
    out = [
        f"<details><summary>Shards: {len(merged.shards)} merged"
        + (f", missing {', '.join(merged.missing)}" if merged.missing else "")
        + "</summary>",
        "",
        "| test | measured by |",
        "|---|---|",
    ]
    out += [f"| `{nodeid}` | {shard} |" for nodeid, shard in tests]
    return [*out, "", "</details>", ""]


def run(args: argparse.Namespace) -> int:
    merged = merge(args.files, expect=args.expect_shards)
    doc = merged.results
    out = Path(args.output)
    for given in args.files:
        if Path(given).resolve() == (out / "results.json").resolve():
            raise ReportError(f"{given}: the merged results would overwrite it; choose another -o")
    results = write_text(
        out / "results.json",
        json.dumps(doc.to_dict(), indent=1, allow_nan=False, ensure_ascii=False) + "\n",
        "merged results",
    )
    lines = render_markdown(doc, args.report_url).rstrip("\n").split("\n")
    link = lines.pop()  # the summary's last line is the report link: it stays last
    summary = write_text(
        out / "summary.md", "\n".join([*lines, *shards_block(merged), link]) + "\n", "summary"
    )
    report = write_session_html(doc, out / "report.html", max_ops=args.max_ops)

    for line in results_lines(doc):
        print(line)
    for problem in merged.problems:
        print(f"perfguard merge: {problem}", file=sys.stderr)
    print(
        f"perfguard merge: {len(merged.shards)} file(s), {len(merged.measured_by)} test(s): "
        f"{doc.badge()}; exit {merged.exit_status}"
    )
    for path in (results, summary, report):
        print(f"  {path}")
    return merged.exit_status


__all__ = ["add_parser", "run", "shards_block"]
