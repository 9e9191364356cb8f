"""``perfguard publish STORE OUT_DIR``: a static, offline site of the store's history.

A thin client of :func:`perfguard.publish.publish`: prints what it built.
"""

from __future__ import annotations

import argparse
from typing import Any

from perfguard.baseline.store import store_location
from perfguard.commands import argtypes
from perfguard.compare.tolerance import TOLERANCE
from perfguard.publish import publish


def add_parser(subparsers: Any) -> None:
    """Register ``publish``."""
    p = subparsers.add_parser(
        "publish",
        help="write a static site of the store: every test's history per machine",
        description="Write a self-contained static site (no network needed) of a store: an "
        "index of tests per machine with a trend line and the latest outcome each, and a "
        "page per test with its level per first-parent commit (rounds as points), change "
        "points, counter steps, acceptances, gate counters and the top ops' trends. Only "
        "pages whose content changed are rebuilt.",
    )
    p.add_argument("store", metavar="STORE", help="a SQLite store file or a postgresql:// URL")
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder of the site (created)")
    p.add_argument(
        "--repo",
        default=".",
        metavar="DIR",
        help="git repository whose first-parent history orders the runs (default: .)",
    )
    p.add_argument("--ref", default="HEAD", metavar="REF", help="history of (default: HEAD)")
    p.add_argument(
        "--by-time", action="store_true", help="order runs by their time instead of by git history"
    )
    p.add_argument(
        "--report-url",
        metavar="TEMPLATE",
        help="link each run to its report: a URL or path with {commit}, {run_id} "
        "and {machine} filled in (e.g. a CI artifact URL)",
    )
    p.add_argument(
        "--tolerance",
        type=argtypes.tolerance,
        default=TOLERANCE,
        metavar="PCT",
        help="slowdown of the latest run that counts (default: 5%%)",
    )
    p.add_argument(
        "-j",
        "--jobs",
        type=argtypes.integer(1),
        metavar="N",
        help="worker processes building pages (default: one per core)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    done = publish(
        store_location(args.store),
        args.out_dir,
        repo=None if args.by_time else args.repo,
        ref=args.ref,
        report_url=args.report_url,
        tolerance=args.tolerance,
        jobs=args.jobs,
    )
    print(done.describe())
    return 0
