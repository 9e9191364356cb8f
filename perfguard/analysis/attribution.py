"""Kernel -> launching API call -> innermost enclosing range -> op.

This is the DLProf/PyProf rule (DESIGN.md "Attribution"):

1. a GPU activity (kernel, memcpy, memset) belongs to the API call of the
   same process with the same correlation id;
2. it belongs to the innermost *op* range on that call's thread that
   encloses the call's start (``start <= t <= end``);
3. with no launching call or no enclosing range it goes to the op
   ``unassociated_<name>`` (kernel short name, or memop kind).

Iteration markers (``ProfilerStep#N``, ``perfguard.iteration``) are not ops,
so a kernel launched directly inside a step is unassociated, as in DLProf.

A kernel replayed from a CUDA graph has ``cudaGraphLaunch`` (``cuGraphLaunch``)
as its launching call, not the op that recorded it at capture time: the range
around the replay (a module, a step) did not launch it, so rule 2 does not
apply. Where the profiler also ran during the capture, the launch that recorded
the activity's graph node is found (:mod:`perfguard.analysis.graphs`) and rule 2
applies to that launch instead: the activity belongs to the op that recorded it.
Otherwise it goes to the pseudo-op ``graph_replay_<graph id>`` (rule 3's, with the
graph named) *under* the op range around the replay's launch when there is one
(``.../CompiledFunctionBackward/graph_replay_<id>``): still not that range's own work,
but named where it was launched, so forward and backward replays and the compiled
regions they came from stay apart. The analysis notes how much GPU time that is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.analysis.graphs import recorded_launch
from perfguard.arrays import unique_first
from perfguard.trace.model import INDEX, KERNEL_GEOMETRY, NO_CORRELATION, Trace, concat_tables
from perfguard.trace.nesting import Nesting, group_codes
from perfguard.trace.ranges import ids_are_rows

UNASSOCIATED_PREFIX = "unassociated_"
#: the op of work replayed from a CUDA graph that nothing ties to its recording op
GRAPH_REPLAY_PREFIX = "graph_replay_"
#: launching calls that replay a CUDA graph (runtime and driver API, any version suffix)
_GRAPH_LAUNCH = r"^(?:cudaGraphLaunch|cuGraphLaunch)(?:_v\d+|_ptsz)*$"
#: the values of the activities' ``activity`` column (a categorical)
ACTIVITY_KINDS = pd.CategoricalDtype(["kernel", "memop"])


def gpu_activities(trace: Trace) -> pd.DataFrame:
    """Kernels and memops in one table.

    Output columns: ``activity`` (``kernel``/``memop``), ``start, end, rank,
    pid, device_id, stream_id, correlation_id, name, short_name, bytes`` and
    ``kernel_row`` (the kernel's row of ``trace.kernels``, where its launch
    geometry is; -1 for a memop); row order is kernels then memops.
    """
    # the launch geometry stays in trace.kernels (8 columns of a million rows that only
    # the kernel report reads, at one row per kernel and op): ``kernel_row`` finds it
    k = trace.kernels.drop(columns=[c for c in KERNEL_GEOMETRY if c in trace.kernels.columns])
    k = k.assign(kernel_row=np.arange(len(k), dtype=INDEX))
    m = trace.memops.rename(columns={"kind": "name"}).assign(
        short_name=lambda d: d["name"], kernel_row=np.full(len(trace.memops), -1, dtype=INDEX)
    )
    out = concat_tables([k, m])
    # a categorical: every step asks "is it a kernel?", a code compare instead of
    # a million string compares each time
    is_memop = np.repeat(np.array([0, 1], dtype=np.int8), [len(k), len(m)])
    kind = pd.Series(pd.Categorical.from_codes(is_memop, dtype=ACTIVITY_KINDS), index=out.index)
    out.insert(len(k.columns), "activity", kind)
    return out


def attribute(trace: Trace, activities: pd.DataFrame) -> pd.DataFrame:
    """Add launch and op columns to ``activities`` (from :func:`gpu_activities`).

    Adds: ``launch_start`` (the API call's start, NA without one),
    ``launch_tid``, ``range_id`` (the owning op range, -1 when unassociated),
    ``graph_replay`` (launched by a CUDA graph launch: never owned by the range
    around it), ``graph_recorded`` (a replayed activity tied to the capture-time
    launch that recorded it: owned by the op around that launch), ``graph_launcher``
    (the op range around a replay's launch, -1 for none or for other work: an untied
    replay is named under it, :func:`orphan_names`) and ``instance`` (``range_id``,
    or ``-1 - k`` for the k-th unassociated activity, which is an op instance of its
    own).
    """
    api = trace.api_calls
    row = _launching_call(api, activities)
    has_launch = row >= 0
    at = np.where(has_launch, row, 0)
    out = activities.copy(deep=False)
    replay = np.zeros(len(out), dtype=bool)
    if len(api) and has_launch.any():
        names = api["name"].array  # coded text (the model's conform): one match per name
        is_graph = np.asarray(names.categories.str.match(_GRAPH_LAUNCH), dtype=bool)
        if is_graph.any():
            replay = has_launch & np.append(is_graph, False)[names.codes[at]]
    out["graph_replay"] = replay
    # nullable ints: a float NaN column would round ns timestamps past 2**53
    out["launch_start"] = pd.arrays.IntegerArray(
        api["start"].to_numpy(np.int64)[at] if len(api) else np.zeros(len(at), np.int64),
        ~has_launch,
    )
    out["launch_tid"] = pd.arrays.IntegerArray(
        api["tid"].to_numpy(np.int64)[at] if len(api) else np.zeros(len(at), np.int64),
        ~has_launch,
    )

    # the op range around each launching call: the owner, except of replayed work
    around = np.full(len(out), -1, dtype=np.int64)
    around[has_launch] = enclosing_op(
        trace,
        out["rank"].to_numpy()[has_launch],
        out["pid"].to_numpy()[has_launch],
        out["launch_tid"].to_numpy(dtype=np.int64, na_value=0)[has_launch],
        out["launch_start"].to_numpy(dtype=np.int64, na_value=0)[has_launch],
    )
    range_id = np.where(replay, -1, around)
    # replayed work: the op around the launch that recorded its node, where one did;
    # launch_start stays the replay's, so the work counts in the iteration that ran it
    recorded = recorded_launch(api, out, np.where(has_launch, row, -1), replay)
    tied = np.flatnonzero(recorded >= 0)
    if len(tied):
        rec = recorded[tied]
        range_id[tied] = enclosing_op(
            trace,
            api["rank"].to_numpy()[rec],
            api["pid"].to_numpy()[rec],
            api["tid"].to_numpy(np.int64)[rec],
            api["start"].to_numpy(np.int64)[rec],
        )
    out["graph_recorded"] = replay & (range_id >= 0)
    # the range around each untied replay's launch: where its work is named, never whose
    out["graph_launcher"] = np.where(replay & (range_id < 0), around, -1).astype(INDEX)
    out["range_id"] = range_id.astype(INDEX)
    # the op instance that owns it: the range, or a pseudo-instance of its own
    orphans = np.flatnonzero(range_id < 0)
    range_id[orphans] = -1 - np.arange(len(orphans), dtype=np.int64)
    out["instance"] = range_id.astype(INDEX)
    return out


def orphan_names(
    acts: pd.DataFrame, orphan: np.ndarray, launcher_path: np.ndarray | None = None
) -> pd.Series:
    """The op name of each unowned activity (rows ``orphan`` of ``acts``):
    ``graph_replay_<graph id>`` for work replayed from a CUDA graph, under the path of
    the range around its launch where ``launcher_path`` (per orphan, None for none)
    names one; else ``unassociated_<kernel short name or memop kind>``."""
    short = acts["short_name"].to_numpy(dtype=object)[orphan]
    full = acts["name"].to_numpy(dtype=object)[orphan]
    names = UNASSOCIATED_PREFIX + pd.Series(
        np.where(pd.isna(short), full, short), dtype="object"
    ).fillna("unnamed").astype(str)
    if "graph_replay" in acts:
        replay = acts["graph_replay"].to_numpy(dtype=bool)[orphan]
        if replay.any():
            graph = acts["graph_id"] if "graph_id" in acts else pd.Series(pd.NA, index=acts.index)
            gid = pd.Series(graph.to_numpy(dtype=object)[orphan][replay], dtype=object)
            label = GRAPH_REPLAY_PREFIX + gid.map(lambda g: "unknown" if pd.isna(g) else str(g))
            text = label.to_numpy(dtype=object)
            if launcher_path is not None:
                under = np.asarray(launcher_path, dtype=object)[replay]
                held = pd.notna(under)
                text[held] = under[held] + "/" + text[held]
            names[replay] = text
    return names


def graph_replay_note(acts: pd.DataFrame) -> list[str]:
    """One line saying how much GPU work was replayed from CUDA graphs and where it went:
    how much of it was tied to the ops that recorded it, and how much could not be."""
    if "graph_replay" not in acts or not acts["graph_replay"].any():
        return []
    replay = acts["graph_replay"].to_numpy(dtype=bool)
    tied = replay.copy()
    tied &= acts["graph_recorded"].to_numpy(dtype=bool) if "graph_recorded" in acts else False
    dur = acts["end"].to_numpy(np.int64) - acts["start"].to_numpy(np.int64)
    total = int(dur.sum())
    replayed = int(dur[replay].sum())
    share = 100.0 * replayed / total if total > 0 else 0.0
    graphs = int(acts.loc[replay, "graph_id"].dropna().nunique()) if "graph_id" in acts else 0
    which = f"{graphs} CUDA graph(s)" if graphs else "CUDA graphs (the capture numbers none)"
    head = (
        f"{int(replay.sum())} GPU activities ({share:.1f} % of GPU time) were replayed from "
        f"{which}: their launching call is cudaGraphLaunch"
    )
    untied = replay & ~tied
    held = untied & (acts["graph_launcher"].to_numpy() >= 0) if "graph_launcher" in acts else None
    if held is not None and held.any():
        rest = (
            f"so they are reported as {GRAPH_REPLAY_PREFIX}<graph id> under the op range "
            f"that launched the replay (<range>/{GRAPH_REPLAY_PREFIX}<graph id>), not as "
            "that range's own work"
        )
        if (untied & ~held).any():
            rest += f" ({int((untied & ~held).sum())} launched outside any op: on their own)"
    else:
        rest = f"so they are reported as {GRAPH_REPLAY_PREFIX}<graph id>, outside any op range"
    if not tied.any():
        return [f"{head}, and the capture does not say which op recorded them, {rest}"]
    named = 100.0 * int(dur[tied].sum()) / replayed if replayed > 0 else 0.0
    left = int((replay & ~tied).sum())
    tail = f"; the other {left} were not ({rest})" if left else ""
    return [
        f"{head}; {int(tied.sum())} of them ({named:.1f} % of the replayed GPU time) were "
        "tied to the op that recorded them, through the launches made during the graph's "
        f"profiled capture, in capture order{tail}"
    ]


def _is_tree(ranges: pd.DataFrame) -> bool:
    """Whether ``range_id`` is the row number and ``parent_id``/``depth`` form a forest
    (each parent one level up), as :func:`perfguard.trace.ranges.finalize_ranges`
    leaves them; a hand-built table may not."""
    n = len(ranges)
    if not ids_are_rows(ranges):
        return False
    parent = ranges["parent_id"].to_numpy(np.int64)
    depth = ranges["depth"].to_numpy(np.int64)
    root = parent < 0
    if (parent >= n).any() or (depth[root] != 0).any():
        return False
    return bool((depth[parent[~root]] + 1 == depth[~root]).all())


def enclosing_op(
    trace: Trace, rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, t: np.ndarray
) -> np.ndarray:
    """The ``range_id`` of the innermost op range on thread ``(rank, pid, tid)`` that
    encloses time ``t`` (``start <= t <= end``), -1 where none does; vectorised.

    Rule 2 of the module docstring, for any event with a thread and a time: a
    kernel's launching call here, a synchronising API call in the counters.
    """
    r = trace.ranges
    is_op = (r["kind"] == "op").to_numpy(dtype=bool)
    every = bool(is_op.all())  # the usual case: the columns themselves, not copies

    def op_column(c: str) -> np.ndarray:
        return r[c].to_numpy() if every else r[c].to_numpy()[is_op]

    ops = pd.DataFrame({c: op_column(c) for c in ("rank", "pid", "tid")}, copy=False)
    calls = pd.DataFrame({"rank": rank, "pid": pid, "tid": tid}, copy=False)
    op_groups, call_groups = group_codes(ops, calls)
    del ops
    start, end = op_column("start"), op_column("end")
    if every and _is_tree(r):
        # every range is an op: the reader's tree (finalize_ranges, the same Nesting on
        # the same ranges and threads) is this one, so only the sort is redone
        nest = Nesting.from_tree(
            start, end, op_groups, r["depth"].to_numpy(), r["parent_id"].to_numpy()
        )
    else:
        nest = Nesting(start, end, op_groups)
    pos = nest.innermost_enclosing(call_groups, np.asarray(t, dtype=np.int64))
    range_id = np.full(len(pos), -1, dtype=np.int64)
    found = pos >= 0
    range_id[found] = op_column("range_id")[nest.order[pos[found]]]
    return range_id


def _launching_call(api: pd.DataFrame, activities: pd.DataFrame) -> np.ndarray:
    """Row of ``api`` that launched each activity, -1 for none.

    The first call of the same ``(rank, pid, correlation_id)``; calls without
    a correlation id launch nothing. Keys are packed into one int64 and
    matched by binary search.
    """
    keys = ["rank", "pid"]
    out = np.full(len(activities), -1, dtype=np.int64)
    api = api[keys + ["correlation_id"]]
    valid = np.flatnonzero(api["correlation_id"].to_numpy(np.int64) != NO_CORRELATION)
    if not len(valid) or not len(activities):
        return out
    a_code, b_code = group_codes(api[keys], activities[keys])
    a_corr = api["correlation_id"].to_numpy(np.int64)
    b_corr = activities["correlation_id"].to_numpy(np.int64)
    lo = int(min(a_corr.min(), b_corr.min()))
    span = int(max(a_corr.max(), b_corr.max())) - lo + 1
    if (int(max(a_code.max(), b_code.max())) + 1) * span >= 2**62:  # pragma: no cover
        return _launching_call_merge(api, activities)
    a_key = a_code[valid] * span + (a_corr[valid] - lo)
    b_key = b_code * span + (b_corr - lo)
    uniq, first = unique_first(a_key)  # first call of each key
    at = np.clip(np.searchsorted(uniq, b_key), 0, len(uniq) - 1)
    hit = uniq[at] == b_key
    out[hit] = valid[first[at[hit]]]
    return out


def _launching_call_merge(api: pd.DataFrame, activities: pd.DataFrame) -> np.ndarray:
    """:func:`_launching_call` by a pandas merge, for ids too far apart to pack."""
    keys = ["rank", "pid", "correlation_id"]
    a = api[keys].assign(_row=np.arange(len(api), dtype=np.int64))
    a = a[a["correlation_id"] != NO_CORRELATION].drop_duplicates(keys)
    m = activities[keys].merge(a, on=keys, how="left", validate="many_to_one")
    return m["_row"].fillna(-1).to_numpy(np.int64)
