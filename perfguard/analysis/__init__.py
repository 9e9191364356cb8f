"""Analysis of a :class:`~perfguard.trace.Trace`: attribution, iterations, metrics.

Knows the Trace model only. :func:`analyze` is the one call a notebook or
the CLI makes; everything it returns is a pandas DataFrame or Series.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfguard.analysis.attribution import attribute, gpu_activities
from perfguard.analysis.enrich import add_flops, add_tensor_cores
from perfguard.analysis.iterations import (
    assign_iteration,
    iteration_intervals,
    select_window,
)
from perfguard.analysis.kernels import aggregate_kernels
from perfguard.analysis.ops import (
    aggregate_ops,
    deep_range_note,
    instance_rows,
    op_id_by_key,
    op_instances,
)
from perfguard.analysis.summary import iteration_table, run_summary
from perfguard.trace.model import Trace
from perfguard.trace.sanity import TIMED_TABLES, repair_times

__all__ = ["Analysis", "analyze"]


@dataclass
class Analysis:
    """What :func:`analyze` found.

    * ``activities``: every kernel/memop in the window with its owner
      (``range_id``, ``op_name``, ``op_id``, ``direction``, ``instance_row``:
      its row of ``instances``, -1 for none) and ``iteration``;
    * ``instances``: one row per op instance (see
      :func:`perfguard.analysis.ops.op_instances`);
    * ``ops``: per-op aggregates (detail report);
    * ``kernels``: per (kernel, op) aggregates (kernel report);
    * ``iterations``: per (rank, iteration) figures (iteration report);
    * ``summary``: run-level figures (summary report), a Series;
    * ``notes``: one line per caveat the reader should see once (an unknown
      GPU leaves FLOP efficiency empty, and why).
    """

    trace: Trace
    activities: pd.DataFrame
    instances: pd.DataFrame
    ops: pd.DataFrame
    kernels: pd.DataFrame
    iterations: pd.DataFrame
    summary: pd.Series
    window: pd.DataFrame
    #: things the reader should know once, e.g. why FLOP efficiency is empty
    notes: list[str] = field(default_factory=list)
    #: whether ``--iter-start/--iter-stop`` restricted the figures to ``window``
    restricted: bool = False
    #: derived tables computed on demand and kept (e.g. the expert findings)
    cache: dict[str, object] = field(default_factory=dict, repr=False, compare=False)


def analyze(
    trace: Trace,
    key_node: str | None = None,
    iter_start: int | None = None,
    iter_stop: int | None = None,
) -> Analysis:
    """Attribute GPU work to ops and compute DLProf's per-op, kernel, iteration figures.

    ``key_node`` defines iterations as DLProf did (N instances give N+1
    intervals); otherwise ``ProfilerStep#N`` / ``perfguard.iteration``
    ranges are used when present. ``iter_start``/``iter_stop`` (inclusive)
    limit every aggregate to those iterations. Raises
    :class:`perfguard.AnalysisError` for a key node or range that selects
    nothing.
    """
    trace = repaired(trace)
    intervals = iteration_intervals(trace, key_node)
    window = select_window(intervals, iter_start, iter_stop)
    restricted = iter_start is not None or iter_stop is not None

    acts = attribute(trace, gpu_activities(trace))
    when = acts["launch_start"].fillna(acts["start"]).to_numpy(np.int64)
    acts["iteration"] = assign_iteration(acts["rank"].to_numpy(), when, intervals).array
    inst = op_instances(trace, acts)
    inst["iteration"] = assign_iteration(
        inst["rank"].to_numpy(), inst["start"].to_numpy(), intervals
    ).array

    inst["op_id"] = op_id_by_key(inst)
    acts = _join_op(acts, inst)
    add_tensor_cores(trace, acts, inst)
    notes = [*trace.notes, *deep_range_note(trace.ranges), *add_flops(trace, acts, inst)]

    timeline = acts  # every activity: busy time inside an iteration counts them all
    if restricted:
        keep = window.set_index(["rank", "iteration"]).index
        inst = inst[_in(inst, keep)].reset_index(drop=True)
        acts = acts[_in(acts, keep)].reset_index(drop=True)
        acts["instance_row"] = instance_rows(
            inst["instance"].to_numpy(np.int64), acts["instance"].to_numpy(np.int64)
        )
    ops = aggregate_ops(inst)
    kernels = aggregate_kernels(acts, trace.kernels)
    iterations = iteration_table(window, inst, acts, timeline)
    summary = run_summary(trace, window if restricted else None, acts, inst, iterations, timeline)
    return Analysis(
        notes=notes,
        trace=trace,
        activities=acts,
        instances=inst,
        ops=ops,
        kernels=kernels,
        iterations=iterations,
        summary=summary,
        window=window,
        restricted=restricted,
    )


def repaired(trace: Trace) -> Trace:
    """``trace`` with intervals that end before they start clamped (and a note), or
    a :class:`perfguard.TraceError` for timestamps beyond int64 arithmetic: the
    readers repair what they read, this holds for a Trace from anywhere."""
    tables = {t: getattr(trace, t) for t in TIMED_TABLES}
    fixed, notes = repair_times(tables, trace.meta.get("path", "trace"))
    if not notes:
        return trace
    return dataclasses.replace(trace, **fixed, notes=[*trace.notes, *notes])


def _join_op(acts: pd.DataFrame, inst: pd.DataFrame) -> pd.DataFrame:
    """``acts`` with ``op_name, direction, op_id`` of the instance that owns each, and
    ``instance_row``, the row of ``inst`` that owns it (-1 for none): the later steps
    look instances up by it instead of searching ids again."""
    row = instance_rows(inst["instance"].to_numpy(np.int64), acts["instance"].to_numpy(np.int64))
    acts = acts.copy(deep=False)
    acts["instance_row"] = row
    for col in ("op_name", "direction", "op_id", "op_key"):
        acts[col] = pd.api.extensions.take(inst[col].array, row, allow_fill=True)
    return acts


def _in(df: pd.DataFrame, keep: pd.MultiIndex) -> np.ndarray:
    it = df["iteration"]
    idx = pd.MultiIndex.from_arrays([df["rank"], it.fillna(-1).astype(np.int64)])
    return idx.isin(keep) & it.notna().to_numpy()
