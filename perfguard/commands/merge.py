"""``perfguard merge RESULTS.json... --output DIR``: a CI run's shards as one verdict.

Reads each shard's ``results.json`` (``--perfguard-shard K/N`` sessions), merges them
(:func:`perfguard.compare.merged.merge`: the entries as their jobs judged them, a missing
or killed shard a ``crashed`` row named ``shard K/N``) and writes one ``results.json``,
one ``summary.md`` (the PR comment; which shard measured each test in a collapsed block)
and one ``report.html`` into DIR. Prints the badge, the table and any missing shard.
Exit 1 when a test regressed (the session's fail rule) or a shard is missing or
incomplete, else 0; an unreadable file is one line naming it (exit 2).

Files from several machine kinds (a CI matrix over an A100 and an H100 pool; the kind is
the fingerprint's GPU model and count, backend, CPU without a GPU and workers) are a
**matrix**: each kind's shards are merged apart, as its jobs judged them against that
kind's baseline, into ``DIR/<kind>/`` (results.json, summary.md, report.html), and
``DIR/summary.md`` and ``DIR/report.html`` put the kinds side by side: a column per
machine (outcome, change), the culprit per machine where they differ, and how the
machines differ, said and not judged. ``DIR/matrix.json`` lists the kinds and their
folders. The exit status is the worst kind's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from perfguard.commands import argtypes
from perfguard.compare.merged import Matrix, Merged, merge_matrix
from perfguard.errors import ReportError
from perfguard.plugin.summary import results_lines
from perfguard.report.html import write_session_html
from perfguard.report.html.matrix import write_matrix_html
from perfguard.report.html.render import write_text
from perfguard.report.markdown import render_markdown
from perfguard.report.matrix import render_matrix


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


def _write_one(merged: Merged, out: Path, args: argparse.Namespace) -> list[Path]:
    """One machine kind's merged results.json, summary.md and report.html in ``out``."""
    doc = merged.results
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
    return [results, summary, report]


def _slug(label: str, taken: set[str]) -> str:
    """A folder name for a machine kind's label (``cpu-amd-epyc-torch-2-workers``)."""
    base = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:60] or "machine"
    name, k = base, 2
    while name in taken:
        name, k = f"{base}-{k}", k + 1
    taken.add(name)
    return name


def _write_matrix(matrix: Matrix, out: Path, args: argparse.Namespace) -> int:
    taken: set[str] = set()
    folders = [_slug(m.label, taken) for m in matrix.machines]
    _refuse_overwrite(args.files, [out / f / "results.json" for f in folders])
    for m, folder in zip(matrix.machines, folders, strict=True):
        _write_one(m.merged, out / folder, args)
    index = {
        "machines": [
            {
                "label": m.label,
                "key": m.key,
                "folder": folder,
                "badge": m.merged.results.badge(),
                "exit": m.merged.exit_status,
                "files": [str(s.path) for s in m.merged.shards],
            }
            for m, folder in zip(matrix.machines, folders, strict=True)
        ],
        "exit": matrix.exit_status,
    }
    written = [
        write_text(out / "matrix.json", json.dumps(index, indent=1) + "\n", "matrix index"),
        write_text(out / "summary.md", render_matrix(matrix, args.report_url), "summary"),
        write_matrix_html(matrix, out / "report.html", [f"{f}/report.html" for f in folders]),
    ]
    for m, folder in zip(matrix.machines, folders, strict=True):
        doc = m.merged.results
        print(f"{m.label} ({out / folder}): {doc.badge()}, {doc.badge_reason()}")
        for line in results_lines(doc):
            print(f"  {line}")
        for problem in m.merged.problems:
            print(f"perfguard merge: {m.label}: {problem}", file=sys.stderr)
    differ = matrix.differences()
    if differ:
        print(f"perfguard merge: the machines differ in {'; '.join(differ)} (said, not judged)")
    print(
        f"perfguard merge: {sum(len(m.merged.shards) for m in matrix.machines)} file(s), "
        f"{len(matrix.nodeids)} test(s) on {len(matrix.machines)} machine kinds; "
        f"exit {matrix.exit_status}"
    )
    for path in written:
        print(f"  {path}")
    return matrix.exit_status


def _refuse_overwrite(given: list[str], written: list[Path]) -> None:
    """One line, before anything is written, when the merge would overwrite an input."""
    targets = {p.resolve() for p in written}
    for name in given:
        if Path(name).resolve() in targets:
            raise ReportError(f"{name}: the merged results would overwrite it; choose another -o")


def run(args: argparse.Namespace) -> int:
    out = Path(args.output)
    matrix = merge_matrix(args.files, expect=args.expect_shards)
    if len(matrix.machines) > 1:
        return _write_matrix(matrix, out, args)
    _refuse_overwrite(args.files, [out / "results.json"])
    merged = matrix.machines[0].merged
    doc = merged.results
    results, summary, report = _write_one(merged, out, args)
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
