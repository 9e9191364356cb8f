"""A directory of per-rank captures analysed rank by rank, each rank in its own worker.

``perfguard analyze -d DIR`` reads every rank and analyses the merged run
in one process, whose memory grows with the whole run (8 ranks of 200k
kernels: 2.3 GB). With ``--per-rank`` each worker process reads *and
analyses* one rank and sends back only that rank's report tables (one row
per op, per kernel and op, per iteration: thousands of rows, not millions
of events) and its row of the rank report. The parent concatenates the
tables (a ``Rank`` column first) and compares the ranks (straggler,
communication wait) with the same code as the merged run
(:func:`perfguard.analysis.ranks.combine_ranks`). A worker's memory is what
one rank needs, and no more workers run than the cores and the available
memory allow (:func:`perfguard.trace.loader.worker_count`).

Every figure of a rank is the single analysis of that rank's file, so the
per-rank tables differ from the merged run's in one way: each rank numbers
its own ops (``Op ID``) and the detail/kernel rows are per rank, not summed
over the ranks. The HTML page and the Perfetto timeline need the events and
are not written.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfguard.analysis import analyze
from perfguard.analysis.ranks import COLUMNS, Straggler, combine_ranks, rank_table, straggler
from perfguard.errors import AnalysisError, TraceError
from perfguard.report.dlprof import TABLES, rank_report_of
from perfguard.trace.loader import (
    RankProgress,
    check_unique_ranks,
    load_trace,
    map_ranks,
    rank_files,
    rank_of,
    set_rank,
    worker_count,
)

#: columns of the rank report that compare the ranks, filled in by the parent
_COMPARED = ("comm_wait", "straggler")
#: the column that says which rank a row of a concatenated table belongs to
RANK_COLUMN = "Rank"


@dataclass(frozen=True)
class AnalysisOptions:
    """What :func:`perfguard.analyze` is asked for, the same for every rank."""

    key_node: str | None = None
    iter_start: int | None = None
    iter_stop: int | None = None
    #: the DLProf tables to build (names of :data:`perfguard.report.dlprof.TABLES`)
    reports: tuple[str, ...] = ("summary", "detail", "iteration", "kernel", "rank")


@dataclass(frozen=True)
class RankResult:
    """One rank, analysed: what its worker sends back."""

    rank: int
    file: Path
    #: the rank's row of the rank report (no ``comm_wait``/``straggler`` yet)
    figures: pd.DataFrame
    #: report name -> that rank's DLProf table (``rank`` excepted)
    tables: dict[str, pd.DataFrame]
    notes: list[str]
    #: events read (ranges, API calls, kernels, memops)
    events: int
    #: peak resident memory of the worker (bytes, ``ru_maxrss``)
    peak_rss: int


@dataclass
class RankRun:
    """A directory's ranks, each analysed on its own, merged."""

    path: Path
    ranks: list[RankResult]
    #: the rank report (:data:`perfguard.analysis.ranks.COLUMNS`), sorted by rank
    table: pd.DataFrame
    straggler: Straggler | None
    notes: list[str] = field(default_factory=list)

    def report(self, name: str) -> pd.DataFrame:
        """DLProf table ``name`` of every rank: ``rank`` is the rank report; ``summary``
        has one value column per rank; the others are the ranks' rows one after the
        other, with a ``Rank`` column first (the iteration report has its own)."""
        if name == "rank":
            return rank_report_of(self.table)
        results = sorted(self.ranks, key=lambda r: r.rank)
        if name == "summary":  # metrics in the first rank's order, any other's after them
            values = [
                r.tables["summary"].set_index("Metric")["Value"].rename(f"{RANK_COLUMN} {r.rank}")
                for r in results
            ]
            return pd.concat(values, axis=1, sort=False).rename_axis("Metric").reset_index()
        parts = []
        for r in results:
            t = r.tables[name]
            if RANK_COLUMN not in t.columns:
                t = t.copy()
                t.insert(0, RANK_COLUMN, r.rank)
            parts.append(t)
        return pd.concat(parts, ignore_index=True)


def analyze_ranks(
    path: str | Path,
    options: AnalysisOptions = AnalysisOptions(),
    *,
    jobs: int | None = None,
    on_rank: RankProgress | None = None,
) -> RankRun:
    """Analyse each rank of directory ``path`` in its own worker; merge the results.

    ``jobs`` caps the workers (default: cores and available memory allow,
    see :func:`perfguard.trace.loader.worker_count`; 1 works in this
    process). Raises TraceError naming the file of a rank that cannot be read
    or analysed.
    """
    path = Path(path)
    if not path.is_dir():
        raise TraceError(path, "--per-rank analyses a directory of per-rank captures")
    files = rank_files(path)
    runner = _TaskRunner([_Task(f, i, options) for i, f in enumerate(files)])
    results: list[RankResult] = []
    events = 0
    for _, result in map_ranks(files, runner, worker_count(files, jobs), __name__):
        results.append(result)
        events += result.events
        if on_rank is not None:
            on_rank(len(results), len(files), events)
    check_unique_ranks(path, [r.file for r in results], [r.rank for r in results])
    rows = pd.concat([r.figures for r in results], ignore_index=True)
    table = combine_ranks(rows)
    notes = [f"rank {r.rank}: {n}" for r in results for n in r.notes]
    return RankRun(path=path, ranks=results, table=table, straggler=straggler(table), notes=notes)


@dataclass(frozen=True)
class _Task:
    file: Path
    index: int
    options: AnalysisOptions


class _TaskRunner:
    """``file -> _run(task of file)``, picklable for the worker processes."""

    def __init__(self, tasks: list[_Task]) -> None:
        self.tasks = {t.file: t for t in tasks}

    def __call__(self, file: Path) -> tuple[RankResult | None, str]:
        return _run(self.tasks[file])


def _run(task: _Task) -> tuple[RankResult | None, str]:
    """Read and analyse one rank (in a worker): ``(result, "")`` or ``(None, problem)``."""
    try:
        return _analyse(task), ""
    except TraceError as exc:
        return None, exc.problem
    except AnalysisError as exc:
        return None, str(exc)
    except MemoryError:
        return None, "not enough memory to analyse this rank; try fewer workers (--jobs 1)"


def _analyse(task: _Task) -> RankResult:
    opts = task.options
    trace = load_trace(task.file)
    rank = rank_of(task.file, trace, task.index)
    set_rank(trace, rank)
    events = sum(len(getattr(trace, t)) for t in ("ranges", "api_calls", "kernels", "memops"))
    analysis = analyze(trace, opts.key_node, opts.iter_start, opts.iter_stop)
    del trace  # the analysis holds what it needs
    figures = rank_table(analysis).drop(columns=list(_COMPARED))
    tables = {r: TABLES[r](analysis) for r in opts.reports if r != "rank"}
    return RankResult(
        rank=rank,
        file=task.file,
        figures=figures,
        tables=tables,
        notes=list(analysis.notes),
        events=events,
        peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )


__all__ = ["COLUMNS", "AnalysisOptions", "RankResult", "RankRun", "analyze_ranks"]
