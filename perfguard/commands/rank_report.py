"""``perfguard analyze -d DIR --per-rank``: each rank analysed in its own worker.

Prints one line per rank (the rank report's figures) and the straggler,
and writes the chosen table reports with every rank's rows
(:mod:`perfguard.report.rank_workers`).
"""

from __future__ import annotations

import argparse

import pandas as pd

from perfguard.analysis.ranks import straggler
from perfguard.commands.progress import Progress
from perfguard.report.rank_workers import AnalysisOptions, analyze_ranks
from perfguard.report.writer import check_output, write_tables

#: formats a rank-by-rank run cannot write: they need the run's events
_EVENT_FORMATS = ("html", "perfetto")


def analyze_per_rank(args: argparse.Namespace) -> int:
    """Run ``analyze --per-rank``; returns the exit code."""
    formats = [f for f in args.formats if f not in _EVENT_FORMATS]
    check_output(args.output_path, args.base_name, args.reports, formats, args.force)
    options = AnalysisOptions(
        key_node=args.key_node,
        iter_start=args.iter_start,
        iter_stop=args.iter_stop,
        reports=tuple(args.reports),
    )
    with Progress(quiet=args.quiet) as progress:
        progress.phase("analysing ranks", args.database)
        run = analyze_ranks(
            args.database,
            options,
            jobs=args.jobs,
            on_rank=lambda done, total, n: progress.events(n, f"{done}/{total} ranks"),
        )
        progress.phase("writing reports")
        tables = {r: run.report(r) for r in args.reports}
        written = write_tables(tables, args.output_path, formats, args.base_name, args.force)
    print(format_ranks(run.table))
    found = straggler(run.table)
    if found is not None:
        print(f"\n{found.describe()}")
    for note in run.notes:
        print(f"note: {note}")
    skipped = [f for f in args.formats if f in _EVENT_FORMATS]
    if skipped:
        print(
            f"note: --per-rank writes tables only, not {' or '.join(skipped)} "
            "(they need the merged run: drop --per-rank)"
        )
    print("\nReports written:")
    for path in written:
        print(f"  {path}")
    return 0


def format_ranks(table: pd.DataFrame) -> str:
    """The rank report as plain text, times in ms."""
    lines = [
        "perfguard ranks",
        f"  {'Rank':>5} {'GPUs':>4} {'Iter.':>6} {'Iter. avg ms':>13} {'Wall ms':>12} "
        f"{'GPU ms':>12} {'Comm. ms':>12} {'Idle %':>7}",
    ]
    for row in table.to_dict("records"):  # one per rank
        avg_ns = row["iteration_time_avg"]
        avg = "" if pd.isna(avg_ns) else f"{avg_ns / 1e6:,.3f}"
        lines.append(
            f"  {row['rank']:>5} {row['gpus']:>4} {row['iterations']:>6} {avg:>13} "
            f"{row['wall_time'] / 1e6:>12,.3f} {row['gpu_time'] / 1e6:>12,.3f} "
            f"{row['comm_time'] / 1e6:>12,.3f} {row['idle_pct']:>7.2f}"
        )
    return "\n".join(lines)
