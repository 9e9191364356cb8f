"""Analysis of a :class:`~perfguard.trace.Trace`: attribution, iterations, metrics.

Knows the Trace model only. :func:`analyze` is the one call a notebook or
the CLI makes; it returns an :class:`Analysis`, the facade over every table the
reports show: snake_case frames, a typed :class:`RunSummary`, and the derived
tables (op types, group nodes, ranks, Tensor Core ops, expert findings) as
cached properties, computed on first use. The report layer only formats them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from perfguard.analysis.attribution import attribute, gpu_activities, graph_replay_note
from perfguard.analysis.call_sites import with_call_sites
from perfguard.analysis.cpu_only import CpuOnly, needs_row
from perfguard.analysis.enrich import add_flops, add_tensor_cores, range_flops
from perfguard.analysis.expert import Thresholds, detect
from perfguard.analysis.groups import aggregate_groups
from perfguard.analysis.iterations import (
    assign_iteration,
    iteration_intervals,
    iteration_numbers,
    select_window,
)
from perfguard.analysis.kernels import aggregate_kernels, tensor_core_ops
from perfguard.analysis.metrics import gpu_time
from perfguard.analysis.ops import (
    OpCodes,
    _gpu_per_instance,
    aggregate_op_types,
    aggregate_ops,
    api_time_inside,
    by_gpu_share,
    deep_range_note,
    fold_cpu_only,
    instance_rows,
    op_id_by_key,
    op_instances,
    tc_missed,
)
from perfguard.analysis.ranks import rank_figures, straggler
from perfguard.analysis.summary import RunSummary, iteration_table, run_summary
from perfguard.arrays import narrow
from perfguard.trace.model import INDEX, Trace
from perfguard.trace.sanity import TIMED_TABLES, repair_times

if TYPE_CHECKING:
    from perfguard.analysis.ranks import Straggler

__all__ = ["Analysis", "RunSummary", "analyze"]


@dataclass
class Analysis:
    """What :func:`analyze` found.

    * ``activities``: every kernel/memop in the window with its owner
      (``range_id``, ``op_name``, ``op_id``, ``direction``, ``instance_row``:
      its row of ``kept_instances``, -1 for none) and ``iteration``;
    * ``instances``: one row per op instance (see
      :func:`perfguard.analysis.ops.op_instances`), built on first use from
      ``kept_instances``, the rows with GPU work or per-instance figures, and
      ``cpu_only``, the instances with nothing but CPU time, folded
      (:mod:`perfguard.analysis.cpu_only`); the reports read those two;
    * ``ops``: per-op aggregates (detail report);
    * ``kernels``: per (kernel, op) aggregates (kernel report);
    * ``iterations``: per (rank, iteration) figures (iteration report);
    * ``summary``: run-level figures (summary report), a :class:`RunSummary`;
    * ``notes``: one line per caveat the reader should see once (an unknown
      GPU leaves FLOP efficiency empty, and why).

    Derived on first use and kept (cached properties): ``instances``,
    ``op_types``, ``group_nodes``, ``tensor_ops``, ``ranks``, ``straggler``,
    ``findings``, ``top_ops`` and ``tc_missed_ops``.

    ``activities`` and the instance tables hold a row per event, so they keep the
    Trace model's types (text coded, ids int32); the aggregates hold plain text.
    """

    trace: Trace
    activities: pd.DataFrame
    kept_instances: pd.DataFrame
    ops: pd.DataFrame
    kernels: pd.DataFrame
    iterations: pd.DataFrame
    summary: RunSummary
    window: pd.DataFrame
    #: things the reader should know once, e.g. why FLOP efficiency is empty
    notes: list[str] = field(default_factory=list)
    #: whether ``--iter-start/--iter-stop`` restricted the figures to ``window``
    restricted: bool = False
    #: the instances folded out of ``kept_instances`` (None or empty: none are)
    cpu_only: CpuOnly | None = None
    #: builds every instance's row (``instances``) when ``cpu_only`` holds some
    rebuild: Callable[[], pd.DataFrame] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def instances(self) -> pd.DataFrame:
        """Every op instance's row, as :func:`perfguard.analysis.ops.op_instances`
        and the enrichment give it; built once, when first asked for."""
        if self.cpu_only is None or not len(self.cpu_only) or self.rebuild is None:
            return self.kept_instances
        return self.rebuild()

    @cached_property
    def op_types(self) -> pd.DataFrame:
        """One row per op type (:func:`perfguard.analysis.ops.aggregate_op_types`)."""
        return aggregate_op_types(self.kept_instances, self.cpu_only)

    @cached_property
    def group_nodes(self) -> pd.DataFrame:
        """Inclusive roll-ups over the op hierarchy (:mod:`perfguard.analysis.groups`)."""
        return aggregate_groups(self.trace, self.activities, self.kept_instances, self.cpu_only)

    @cached_property
    def tensor_ops(self) -> pd.DataFrame:
        """The TC-eligible ops with their TC and non-TC kernel counts and names
        (:func:`perfguard.analysis.kernels.tensor_core_ops`)."""
        return tensor_core_ops(self.ops, self.kernels)

    @cached_property
    def ranks(self) -> pd.DataFrame:
        """One row per rank (:mod:`perfguard.analysis.ranks`)."""
        return rank_figures(self)

    @cached_property
    def straggler(self) -> Straggler | None:
        """The straggler of a multi-rank run, None for one rank."""
        return straggler(self.ranks)

    @cached_property
    def findings(self) -> pd.DataFrame:
        """The expert detectors' findings under the default thresholds."""
        return detect(self, Thresholds())

    @cached_property
    def top_ops(self) -> pd.DataFrame:
        """``ops`` by GPU time, most first, with ``gpu_share``: each op's share in % of
        the run's GPU time (NaN for a run without GPU time)."""
        return by_gpu_share(self.ops)

    @cached_property
    def tc_missed_ops(self) -> pd.DataFrame:
        """``top_ops`` that are Tensor Core eligible, ran GPU work and used no Tensor Core
        kernel (:func:`perfguard.analysis.ops.tc_missed`)."""
        return tc_missed(self.top_ops)


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
    chosen = pd.MultiIndex.from_frame(window[["rank", "iteration"]]) if restricted else None

    attributed = attribute(trace, gpu_activities(trace))
    when = attributed["launch_start"].fillna(attributed["start"]).to_numpy(np.int64)
    attributed["iteration"] = assign_iteration(attributed["rank"].to_numpy(), when, intervals).array
    codes = OpCodes.of(trace, attributed)
    by_range = range_flops(trace)
    keep = needs_row(trace.ranges, codes.op_rows, _owners(trace, codes, attributed), by_range)
    api_time = api_time_inside(trace, codes.op_rows)
    inst, acts, notes = _instances(trace, attributed, codes, intervals, by_range, keep, api_time)
    notes = [*trace.notes, *deep_range_note(trace.ranges), *graph_replay_note(attributed), *notes]
    cpu_only = fold_cpu_only(trace, codes, keep, api_time)
    del codes, api_time, keep  # millions of entries each: freed before the next step
    start = trace.ranges["start"].to_numpy(np.int64)[cpu_only.range_row]
    it = iteration_numbers(cpu_only.rank, start, intervals)
    del start
    it[it < 0] = -1  # as assign_iteration's NA
    cpu_only = dataclasses.replace(cpu_only, iteration=narrow(it))
    del it

    timeline = acts  # every activity: busy time inside an iteration counts them all
    if restricted:
        assert chosen is not None
        acts = acts[_in(acts, chosen)].reset_index(drop=True)
        # replayed graph work counts in the iteration that replayed it, and its op is
        # the one that recorded it at capture time, outside the window: keep that op
        kept_in = _in(inst, chosen) | _records_replay(inst, acts)
        inst = inst[kept_in].reset_index(drop=True)
        acts["instance_row"] = instance_rows(
            inst["instance"].to_numpy(np.int64), acts["instance"].to_numpy(np.int64)
        ).astype(INDEX)
        _per_replay(trace, inst, acts, by_range, window_only=True)
        fold_in = pd.MultiIndex.from_arrays(
            [cpu_only.rank.astype(np.int64), cpu_only.iteration.astype(np.int64)]
        ).isin(chosen) & (cpu_only.iteration >= 0)
        cpu_only = cpu_only.within(fold_in, kept_in)
    ops = with_call_sites(aggregate_ops(inst, cpu_only), trace.ranges, inst, cpu_only)
    kernels = aggregate_kernels(acts, trace.kernels)
    iterations = iteration_table(window, inst, acts, timeline, cpu_only)
    summary = run_summary(
        trace, window if restricted else None, acts, inst, iterations, timeline, cpu_only
    )

    def rebuild() -> pd.DataFrame:
        """Every instance's row: the same steps on every op range."""
        everything = OpCodes.of(trace, attributed)
        full, _, _ = _instances(trace, attributed, everything, intervals, by_range, None)
        return full[_in(full, chosen)].reset_index(drop=True) if chosen is not None else full

    return Analysis(
        notes=notes,
        trace=trace,
        activities=acts,
        kept_instances=inst,
        ops=ops,
        kernels=kernels,
        iterations=iterations,
        summary=summary,
        window=window,
        restricted=restricted,
        cpu_only=cpu_only,
        rebuild=rebuild,
    )


def _instances(
    trace: Trace,
    attributed: pd.DataFrame,
    codes: OpCodes,
    intervals: pd.DataFrame,
    by_range: pd.DataFrame | None,
    keep: np.ndarray | None,
    api_time: np.ndarray | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The instance table (the op ranges ``keep`` selects, all when None, and the
    unassociated work) with iterations, op ids, Tensor Core and FLOP columns; the
    activities joined to it; the notes of the FLOP step. ``api_time``: every op
    range's :func:`perfguard.analysis.ops.api_time_inside`, when known."""
    inst = op_instances(trace, attributed, keep, codes, api_time)
    inst["iteration"] = assign_iteration(
        inst["rank"].to_numpy(), inst["start"].to_numpy(), intervals
    ).array
    inst["op_id"] = op_id_by_key(inst)
    acts = _join_op(attributed, inst)
    add_tensor_cores(trace, acts, inst)
    notes = add_flops(trace, acts, inst, by_range)
    _per_replay(trace, inst, acts, by_range)
    return inst, acts, notes


def _per_replay(
    trace: Trace,
    inst: pd.DataFrame,
    acts: pd.DataFrame,
    by_range: pd.DataFrame | None,
    window_only: bool = False,
) -> None:
    """In place: an op instance that recorded CUDA-graph work ran once per replay, so
    its FLOPs and bytes are its call's times the replays in ``acts``; with
    ``window_only`` (``acts`` limited to some iterations) its GPU figures are
    recomputed from those replays too, as the capture itself lies outside them."""
    if "graph_recorded" not in acts or not acts["graph_recorded"].any():
        return
    rec = acts["graph_recorded"].to_numpy(dtype=bool) & (acts["instance_row"] >= 0).to_numpy()
    pairs = np.unique(
        np.stack(
            [
                acts["instance_row"].to_numpy(np.int64)[rec],
                acts["correlation_id"].to_numpy(np.int64)[rec],
            ]
        ),
        axis=1,
    )
    replays = np.bincount(pairs[0], minlength=len(inst))
    rows = np.flatnonzero(replays)
    if window_only:
        figures = _gpu_per_instance(inst["instance"].to_numpy(np.int64)[rows], acts)
        for column, values in figures.items():
            inst[column] = _replaced(inst[column], rows, values)
        owner = acts["instance_row"].to_numpy(np.int64)
        kernel = (acts["activity"] == "kernel").to_numpy(dtype=bool)
        tc = kernel.copy()
        tc &= acts["uses_tc"].fillna(False).to_numpy(dtype=bool) if "uses_tc" in acts else False
        dur = gpu_time(acts).astype(np.int64, copy=False)
        for column, mask in (("kernel_time", kernel), ("tc_kernel_time", tc)):
            if column in inst:
                sums = np.bincount(
                    owner[mask & (owner >= 0)], dur[mask & (owner >= 0)], minlength=len(inst)
                )
                inst[column] = _replaced(inst[column], rows, sums[rows])
    if by_range is None or "flops" not in inst:
        return
    at = instance_rows(
        trace.ranges["range_id"].to_numpy(np.int64), inst["instance"].to_numpy(np.int64)[rows]
    )
    for column in ("flops", "bytes"):
        per_call = pd.api.extensions.take(by_range[column].array, at, allow_fill=True)
        inst.loc[rows, column] = cast(Any, per_call) * replays[rows]


def _replaced(column: pd.Series, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``column``'s values with those at positions ``rows`` replaced by ``values`` (cast
    to the column's numpy dtype)."""
    out = column.to_numpy(copy=True)
    out[rows] = values.astype(out.dtype)
    return out


def _owners(trace: Trace, codes: OpCodes, acts: pd.DataFrame) -> np.ndarray:
    """Which op ranges (a mask over ``codes.op_rows``) own an activity."""
    range_ids = trace.ranges["range_id"].to_numpy(np.int64)[codes.op_rows]
    owner = acts["range_id"].to_numpy(np.int64)
    at = instance_rows(range_ids, owner[owner >= 0])
    owned = np.zeros(len(codes.op_rows), dtype=bool)
    owned[at[at >= 0]] = True
    return owned


def repaired(trace: Trace) -> Trace:
    """``trace`` with intervals that end before they start clamped (and a note), or
    a :class:`perfguard.TraceError` for timestamps beyond int64 arithmetic: the
    readers repair what they read, this holds for a Trace from anywhere."""
    tables = {t: getattr(trace, t) for t in TIMED_TABLES}
    fixed, notes = repair_times(tables, trace.meta.get("path", "trace"))
    if not notes:
        return trace
    return dataclasses.replace(trace, notes=[*trace.notes, *notes], **cast(dict[str, Any], fixed))


def _join_op(acts: pd.DataFrame, inst: pd.DataFrame) -> pd.DataFrame:
    """``acts`` with ``op_name, direction, op_id`` of the instance that owns each, and
    ``instance_row``, the row of ``inst`` that owns it (-1 for none): the later steps
    look instances up by it instead of searching ids again."""
    row = instance_rows(inst["instance"].to_numpy(np.int64), acts["instance"].to_numpy(np.int64))
    acts = acts.copy(deep=False)
    acts["instance_row"] = row.astype(INDEX)
    for col in ("op_name", "direction", "op_id", "op_key"):
        acts[col] = pd.api.extensions.take(inst[col].array, row, allow_fill=True)
    return acts


def _records_replay(inst: pd.DataFrame, acts: pd.DataFrame) -> np.ndarray:
    """Which op instances recorded graph work that ``acts`` replays (a mask over ``inst``)."""
    if "graph_recorded" not in acts or not acts["graph_recorded"].any():
        return np.zeros(len(inst), dtype=bool)
    owners = acts.loc[acts["graph_recorded"].to_numpy(dtype=bool), "instance"].unique()
    return inst["instance"].isin(owners).to_numpy(dtype=bool)


def _in(df: pd.DataFrame, keep: pd.MultiIndex) -> np.ndarray:
    it = df["iteration"]
    idx = pd.MultiIndex.from_arrays([df["rank"], it.fillna(-1).astype(np.int64)])
    return idx.isin(keep) & it.notna().to_numpy()
