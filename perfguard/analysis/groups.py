"""Group nodes: inclusive roll-ups of GPU work over the op hierarchy.

DLProf's group-node report answers "how much does this module / name scope
cost, everything inside it included". A *group node* is an op range that
encloses other op ranges (a module, an NVTX scope, ``aten::linear`` around
``aten::addmm``); it is identified, like an op, by its hierarchical name and
direction. Every GPU activity counts toward the range that owns it *and*
every enclosing op range (DESIGN.md, "Attribution"). Two figures per group:

* accumulated GPU time: the summed durations of all activities inside it,
  overlap counted per activity (comparable with the detail report);
* flattened GPU time: the union of those activities' intervals per
  instance, then summed over instances, so concurrent streams are not
  counted twice (DESIGN.md, "flattening ... group nodes").

Iteration markers are transparent: they are never groups, and the walk up
the tree passes through them. Ranges nested ``MAX_OP_PATH_DEPTH`` levels deep
or more (whose op names are cut) are not groups either: their work counts
toward their enclosing groups above that depth, so the roll-up costs at most
that many pairs per activity, however deep a damaged capture nests.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.analysis.cpu_only import CpuOnly, typed_like
from perfguard.analysis.intervals import segment_figures
from perfguard.analysis.ops import MAX_OP_PATH_DEPTH, op_id
from perfguard.arrays import Groups, first_rows, index_dtype, levels
from perfguard.trace.model import Trace
from perfguard.trace.ranges import ids_are_rows

COLUMNS = [
    "op_id",
    "op_name",
    "direction",
    "calls",
    "child_ops",
    "kernel_count",
    "cpu_time_total",
    "gpu_time_total",
    "gpu_time_flattened",
    "gpu_idle_total",
]


def _member_pairs(
    parent: np.ndarray, owner: np.ndarray, group: np.ndarray, skip: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(activity row, range)`` for every range flagged in ``group`` that encloses (or
    is) the range owning each activity (``owner``: its range id, -1 for none). The
    walk up starts at ``skip[owner]`` where given (see :func:`_shallow_anchor`)."""
    rows = np.flatnonzero(owner >= 0)
    cur = owner[rows]
    if skip is not None:
        cur = skip[cur]
    out_rows, out_groups = [], []
    index = index_dtype(max(len(owner), len(group)))
    while len(rows):
        hit = group[cur]
        out_rows.append(rows[hit].astype(index))  # pairs of millions: half the bytes
        out_groups.append(cur[hit].astype(index))
        cur = parent[cur]
        alive = cur >= 0
        rows, cur = rows[alive], cur[alive]
    if not out_rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(out_rows), np.concatenate(out_groups)


def _range_ids(ranges: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The ``range_id`` of the ranges at ``rows``: the rows themselves when ids are row
    numbers, as :func:`perfguard.trace.ranges.finalize_ranges` numbers them (no copy of
    millions of ids)."""
    return rows if ids_are_rows(ranges) else ranges["range_id"].to_numpy(np.int64)[rows]


def _shallow_anchor(parent: np.ndarray, depth: np.ndarray) -> np.ndarray | None:
    """Each range itself, or for one nested ``MAX_OP_PATH_DEPTH`` deep or more its
    ancestor at that depth less one; ``None`` when no range is that deep."""
    deep = np.flatnonzero(depth >= MAX_OP_PATH_DEPTH)
    if not len(deep):
        return None
    anchor = np.arange(len(parent), dtype=np.int64)
    for at in levels(depth[deep])[MAX_OP_PATH_DEPTH:]:  # parents before children
        level = deep[at]
        up = parent[level]
        anchor[level] = np.where(up >= 0, anchor[np.clip(up, 0, None)], level)
    return anchor


def _op_parent(parent: np.ndarray, is_op: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """Nearest enclosing *op* range of every range (skipping iteration markers), -1 if
    none, as ``dtype``."""
    out: np.ndarray = parent.astype(dtype)
    for _ in range(len(parent)):  # bounded by tree depth; stops at the first level without markers
        bad = (out >= 0) & ~is_op[np.clip(out, 0, None)]
        if not bad.any():
            break
        out[bad] = parent[out[bad]]
    return out


def aggregate_groups(
    trace: Trace,
    acts: pd.DataFrame,
    instances: pd.DataFrame,
    cpu_only: CpuOnly | None = None,
) -> pd.DataFrame:
    """The group-node table (columns :data:`COLUMNS`), sorted by accumulated GPU time.

    ``acts`` and ``instances`` are :class:`perfguard.analysis.Analysis`'s
    ``activities`` and ``kept_instances`` with its ``cpu_only`` (or every
    instance, ``instances``, and no ``cpu_only``), already limited to the
    selected iterations; a group instance outside them is left out.
    """
    r = trace.ranges
    n = len(r)
    # range_id == row number (finalize_ranges): per-range arrays are indexed by it
    ranged = instances["instance"].to_numpy(np.int64) >= 0
    cols = ["instance", "op_id", "op_name", "direction", "cpu_time"]
    cols += ["op_key"] if "op_key" in instances else []
    k = int(ranged.sum())
    if ranged[:k].all():  # the ranges come first (op_instances): a view, not a copy of
        inst = instances.iloc[:k][cols]  # five columns of millions of rows
    else:
        inst = instances.loc[ranged, cols]
    # per-range arrays hold range ids and rows: int32 where they fit (36 -> 18 MiB
    # each at emit_nvtx's 4.8M ranges; this report is the reports' memory peak)
    index = index_dtype(n + len(inst) + (len(cpu_only) if cpu_only is not None else 0) + 2)
    # the instance of each range: its row of ``inst``, or -2 - j for the j-th folded
    # one; -1: none (not an op, or outside the selected iterations)
    inst_row = np.full(n, -1, dtype=index)
    inst_row[inst["instance"].to_numpy(np.int64)] = np.arange(len(inst), dtype=index)
    folded = cpu_only is not None and len(cpu_only) > 0
    if folded:
        assert cpu_only is not None
        inst_row[_range_ids(r, cpu_only.range_row)] = -2 - np.arange(len(cpu_only), dtype=index)
    is_op = (r["kind"] == "op").to_numpy()
    # the ranges' int32 columns as they are: an int64 copy is 36 MiB at 4.8M ranges
    parent = r["parent_id"].to_numpy()
    op_parent = _op_parent(parent, is_op, index)
    is_group = np.zeros(n, dtype=bool)
    is_group[op_parent[is_op & (op_parent >= 0)]] = True
    is_group &= inst_row != -1
    depth = r["depth"].to_numpy()
    is_group &= depth < MAX_OP_PATH_DEPTH
    groups = np.flatnonzero(is_group)

    # every (activity, enclosing group) pair; the figures are segment reductions of
    # one sort of the pairs by group and start
    rows, g = _member_pairs(
        parent, acts["range_id"].to_numpy(), is_group, _shallow_anchor(parent, depth)
    )
    present, fig = segment_figures(
        g,
        rows,
        acts["start"].to_numpy(np.int64),
        acts["end"].to_numpy(np.int64),
        (acts["activity"] == "kernel").to_numpy(dtype=bool),
    )
    del rows, g
    at = np.searchsorted(groups, present)
    figures = {}
    for col, name in (
        ("gpu_time", "time"),
        ("kernel_count", "kernels"),
        ("span", "span"),
        ("flat", "busy"),
    ):
        figures[col] = np.zeros(len(groups), dtype=np.int64)
        figures[col][at] = fig[name]
    del present, fig, at  # per-range arrays of millions: each freed once used
    op_key = _op_keys(inst, inst_row, cpu_only)
    child_ops = _child_ops(is_op, op_parent, op_key, groups)
    if not len(groups):
        return pd.DataFrame(columns=COLUMNS)
    del op_parent
    group_key = op_key[groups]
    del op_key
    at = inst_row[groups]
    del inst_row
    if "op_key" in inst:
        out = _per_op(inst, at, group_key, cpu_only, figures, child_ops)
    else:  # a hand-built instance table: grouped by name and direction
        gi = inst.iloc[at].reset_index(drop=True)
        for col, values in figures.items():
            gi[col] = values
        gi["idle"] = gi["span"] - gi["flat"]
        gi["child_ops"] = child_ops
        out = (
            gi.groupby(["op_id", "op_name", "direction"], sort=False)
            .agg(
                op_id=("op_id", "first"),
                op_name=("op_name", "first"),
                direction=("direction", "first"),
                calls=("cpu_time", "size"),
                child_ops=("child_ops", "max"),
                kernel_count=("kernel_count", "sum"),
                cpu_time_total=("cpu_time", "sum"),
                gpu_time_total=("gpu_time", "sum"),
                gpu_time_flattened=("flat", "sum"),
                gpu_idle_total=("idle", "sum"),
            )
            .reset_index(drop=True)
        )
    out = out.sort_values(["gpu_time_total", "op_name"], ascending=[False, True])
    return out.reset_index(drop=True)[COLUMNS]


def _per_op(
    inst: pd.DataFrame,
    at: np.ndarray,
    key: np.ndarray,
    cpu_only: CpuOnly | None,
    figures: dict[str, np.ndarray],
    child_ops: np.ndarray,
) -> pd.DataFrame:
    """The group figures per op (``key``), ops numbered as first seen. ``at``: each
    group instance's row of ``inst``, or ``-2 - j`` for the j-th folded one.

    Name, direction and id are the op key's, so they are read off one instance
    per op; the sums are ``reduceat`` over one sort of the codes.
    """
    own = at >= 0
    cpu = np.empty(len(at), dtype=np.int64)
    cpu[own] = inst["cpu_time"].to_numpy(np.int64)[at[own]]
    if not own.all():
        assert cpu_only is not None
        cpu[~own] = cpu_only.cpu_time[-2 - at[~own]]
    codes, _ = pd.factorize(key)
    g = Groups(codes)
    first = at[first_rows(codes)]
    out = _op_text(inst, first, cpu_only)
    out["calls"] = g.size
    out["child_ops"] = g.max(child_ops)
    out["kernel_count"] = g.sum(figures["kernel_count"])
    out["cpu_time_total"] = g.sum(cpu)
    out["gpu_time_total"] = g.sum(figures["gpu_time"])
    out["gpu_time_flattened"] = g.sum(figures["flat"])
    out["gpu_idle_total"] = g.sum(figures["span"] - figures["flat"])
    return out


def _op_text(inst: pd.DataFrame, at: np.ndarray, cpu_only: CpuOnly | None) -> pd.DataFrame:
    """``op_id, op_name, direction`` of the instances ``at`` (rows of ``inst``, or
    ``-2 - j`` for the j-th folded instance, named by its op key), typed as the
    columns of ``inst`` are."""
    own = at >= 0
    out = {}
    if not own.all():
        assert cpu_only is not None
        name, direction = cpu_only.op_text(cpu_only.op_key[-2 - at[~own]])
        ids = op_id(pd.Series(name), pd.Series(direction)).to_numpy(dtype=object)
        folded = {"op_id": ids, "op_name": name, "direction": direction}
    for col in ("op_id", "op_name", "direction"):
        values = np.empty(len(at), dtype=object)
        values[own] = inst[col].to_numpy(dtype=object)[at[own]]
        if not own.all():
            values[~own] = folded[col]
        # as the rows of ``inst`` are typed; without any, as a whole table's would be
        if len(inst):
            out[col] = typed_like(values, inst[col])
        else:
            out[col] = pd.Series(values, dtype=object if col == "op_id" else None)
    return pd.DataFrame(out, copy=False)


def _op_keys(inst: pd.DataFrame, inst_row: np.ndarray, cpu_only: CpuOnly | None) -> np.ndarray:
    """An op code per range (by range id; -1 where it has no instance): the op key,
    or without one a code per ``op_id``."""
    if "op_key" in inst:
        key = inst["op_key"].to_numpy(np.int64)
    else:
        key = pd.factorize(inst["op_id"].to_numpy(dtype=object))[0].astype(np.int64)
    fold_key = cpu_only.op_key if cpu_only is not None and len(cpu_only) else key[:0]
    top = max(int(key.max()) if len(key) else 0, int(fold_key.max()) if len(fold_key) else 0)
    out = np.full(len(inst_row), -1, dtype=index_dtype(top + 1))
    own = inst_row >= 0
    out[own] = key[inst_row[own]]
    del own
    if len(fold_key):
        fold = inst_row <= -2
        out[fold] = fold_key[-2 - inst_row[fold]]
    return out


def _child_ops(
    is_op: np.ndarray, op_parent: np.ndarray, op_key: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """Number of distinct ops (name, direction) directly under each of the ranges ``at``
    (range ids, ascending), counting the ranges with an instance (``op_key`` >= 0).
    Counted for those ranges only: a count per range is 36 MiB at 4.8M ranges."""
    child = is_op & (op_parent >= 0) & (op_key >= 0)
    op = op_key[child]
    width = int(op.max()) + 1 if len(op) else 1
    pair = op_parent[child].astype(np.int64)
    del child
    pair *= width
    pair += op
    del op
    pair.sort()  # in place: distinct (parent, op) pairs without a sorted copy
    distinct = np.empty(len(pair), dtype=bool)
    distinct[:1] = True
    np.not_equal(pair[1:], pair[:-1], out=distinct[1:])
    pair = pair[distinct]
    del distinct
    pair //= width  # each parent once per distinct op under it, sorted
    return np.searchsorted(pair, at, side="right") - np.searchsorted(pair, at, side="left")
