"""``perfguard bisect GOOD BAD [-k EXPR] [NODEID ...]``: find the commit that regressed.

A thin client of :func:`perfguard.bisect.bisect`: prints a line per judged
commit as it goes, then the first bad commit with every step's evidence,
and writes ``bisect.md`` and ``bisect.json`` in ``--output``. Exit 0 when a
first bad commit was found, 1 when skipped commits left several candidates,
2 on bad input (refs, range, a BAD that is not regressed).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from perfguard.bisect import Settings, bisect, format_markdown, format_text
from perfguard.commands import argtypes
from perfguard.commands.baseline import DEFAULT_STORE
from perfguard.commands.jsonout import add_json_option, to_stdout, write_json
from perfguard.compare.documents import document
from perfguard.errors import CompareError


def add_parser(subparsers: Any) -> None:
    """Register ``bisect``."""
    p = subparsers.add_parser(
        "bisect",
        help="git bisect with perfguard's verdict as the oracle: the first commit that regressed",
        description="Run git bisect between GOOD and BAD (in a worktree of its own; your "
        "checkout is untouched), judging each candidate against GOOD: from the store when "
        "both have runs of the selected tests on one machine, else in A/B mode (alternating "
        "rounds of both commits on this machine).",
    )
    p.add_argument("good", metavar="GOOD", help="a commit where the tests are fine")
    p.add_argument("bad", metavar="BAD", help="a later commit where they regressed")
    p.add_argument(
        "tests", nargs="*", metavar="NODEID", help="test node ids to judge (relative to --repo)"
    )
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k selection")
    p.add_argument(
        "--pytest-args",
        default="",
        metavar="ARGS",
        help='more pytest arguments, e.g. "bench --perfguard-ab-pairs=3"',
    )
    p.add_argument(
        "--mode",
        choices=("auto", "store", "ab"),
        default="auto",
        help="auto (default): stored runs where both commits have them, else A/B; "
        "store: stored runs only (others skipped); ab: always measure",
    )
    p.add_argument(
        "--oracle",
        choices=("verdict", "gates", "timing", "instructions"),
        default="verdict",
        help="what marks a commit bad: the whole verdict (default), the "
        "deterministic gates only (exact on a CPU), timing only, or host "
        "instructions only (Valgrind's counts; A/B steps count them)",
    )
    p.add_argument(
        "--tolerance",
        type=argtypes.tolerance,
        default=None,
        metavar="PCT",
        help="slowdown allowed (default: the marker's, else 5%%)",
    )
    p.add_argument(
        "--store",
        default=DEFAULT_STORE,
        metavar="PATH_OR_URL",
        help=f"baseline store with stored runs (default: {DEFAULT_STORE})",
    )
    p.add_argument("--repo", default=".", metavar="DIR", help="git repository (default: .)")
    p.add_argument(
        "--output",
        default=".perfguard/bisect",
        metavar="DIR",
        help="bisect.md, bisect.json and each A/B step's reports (default: .perfguard/bisect)",
    )
    p.add_argument(
        "--timeout",
        type=argtypes.integer(1),
        default=3600,
        metavar="S",
        help="longest A/B session per commit (default: 3600)",
    )
    add_json_option(p, "the bisection (perfguard.bisect/1, as bisect.json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pytest_args = [*args.tests, *shlex.split(args.pytest_args)]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    output = Path(args.output)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CompareError(f"{output}: cannot write there ({exc.strerror or exc})") from None
    settings = Settings(
        good=args.good,
        bad=args.bad,
        pytest_args=tuple(pytest_args),
        mode=args.mode,
        oracle=args.oracle,
        tolerance=args.tolerance,
        store=args.store,
        repo=Path(args.repo),
        output=output,
        timeout=args.timeout,
    )
    text = sys.stderr if to_stdout(args) else sys.stdout  # stdout is the document's then
    result = bisect(
        settings, say=lambda line: print(f"perfguard bisect: {line}", flush=True, file=text)
    )
    print(file=text)
    print(format_text(result), file=text)
    doc = document("bisect", result.to_dict())
    (output / "bisect.md").write_text(format_markdown(result), encoding="utf-8")
    (output / "bisect.json").write_text(
        json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8"
    )
    if args.json_out:
        write_json(doc, args.json_out)
    print(f"\nwritten: {output / 'bisect.md'}, {output / 'bisect.json'}", file=text)
    return 0 if result.first_bad else 1
