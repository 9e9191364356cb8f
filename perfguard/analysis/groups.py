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

from perfguard.analysis.intervals import segment_figures
from perfguard.analysis.ops import MAX_OP_PATH_DEPTH
from perfguard.arrays import unique_sorted
from perfguard.trace.model import Trace

COLUMNS = [
    "op_id", "op_name", "direction", "calls", "child_ops", "kernel_count", "cpu_time_total",
    "gpu_time_total", "gpu_time_flattened", "gpu_idle_total",
]  # fmt: skip


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
    while len(rows):
        hit = group[cur]
        out_rows.append(rows[hit])
        out_groups.append(cur[hit])
        cur = parent[cur]
        alive = cur >= 0
        rows, cur = rows[alive], cur[alive]
    if not out_rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(out_rows), np.concatenate(out_groups)


def _shallow_anchor(parent: np.ndarray, depth: np.ndarray) -> np.ndarray | None:
    """Each range itself, or for one nested ``MAX_OP_PATH_DEPTH`` deep or more its
    ancestor at that depth less one; ``None`` when no range is that deep."""
    deep = np.flatnonzero(depth >= MAX_OP_PATH_DEPTH)
    if not len(deep):
        return None
    anchor = np.arange(len(parent), dtype=np.int64)
    deep = deep[np.argsort(depth[deep], kind="stable")]  # parents before children
    bounds = np.flatnonzero(np.diff(depth[deep])) + 1
    for level in np.split(deep, bounds):  # one vector step per level
        up = parent[level]
        anchor[level] = np.where(up >= 0, anchor[np.clip(up, 0, None)], level)
    return anchor


def _op_parent(parent: np.ndarray, is_op: np.ndarray) -> np.ndarray:
    """Nearest enclosing *op* range of every range (skipping iteration markers), -1 if none."""
    out = parent.copy()
    for _ in range(len(parent)):  # bounded by tree depth; stops at the first level without markers
        bad = (out >= 0) & ~is_op[np.clip(out, 0, None)]
        if not bad.any():
            break
        out[bad] = parent[out[bad]]
    return out


def aggregate_groups(trace: Trace, acts: pd.DataFrame, instances: pd.DataFrame) -> pd.DataFrame:
    """The group-node table (columns :data:`COLUMNS`), sorted by accumulated GPU time.

    ``acts`` and ``instances`` are :class:`perfguard.analysis.Analysis`'s
    ``activities`` and ``instances`` (already limited to the selected
    iterations); a group instance outside them is left out.
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
    inst_row = np.full(n, -1, dtype=np.int64)  # row of ``inst`` of each range, -1: outside
    inst_row[inst["instance"].to_numpy(np.int64)] = np.arange(len(inst))
    is_op = (r["kind"] == "op").to_numpy()
    op_parent = _op_parent(r["parent_id"].to_numpy(np.int64), is_op)
    is_group = np.zeros(n, dtype=bool)
    is_group[op_parent[is_op & (op_parent >= 0)]] = True
    is_group &= inst_row >= 0
    depth = r["depth"].to_numpy(np.int64)
    is_group &= depth < MAX_OP_PATH_DEPTH
    groups = np.flatnonzero(is_group)

    # every (activity, enclosing group) pair; the figures are segment reductions of
    # one sort of the pairs by group and start
    parent = r["parent_id"].to_numpy(np.int64)
    rows, g = _member_pairs(
        parent, acts["range_id"].to_numpy(np.int64), is_group, _shallow_anchor(parent, depth)
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
    for col, name in (("gpu_time", "time"), ("kernel_count", "kernels"), ("span", "span"),
                      ("flat", "busy")):  # fmt: skip
        figures[col] = np.zeros(len(groups), dtype=np.int64)
        figures[col][at] = fig[name]
    gi = inst.iloc[inst_row[groups]].reset_index(drop=True)
    for col, values in figures.items():
        gi[col] = values
    gi["idle"] = gi["span"] - gi["flat"]
    gi["child_ops"] = _child_ops(r, is_op, op_parent, inst, inst_row)[groups]
    if gi.empty:
        return pd.DataFrame(columns=COLUMNS)
    keys = ["op_key"] if "op_key" in gi else ["op_id", "op_name", "direction"]
    out = (
        gi.groupby(keys, sort=False)
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


def _child_ops(
    r: pd.DataFrame,
    is_op: np.ndarray,
    op_parent: np.ndarray,
    inst: pd.DataFrame,
    inst_row: np.ndarray,
) -> np.ndarray:
    """Number of distinct ops (name, direction) directly under each range (by range id)."""
    child = np.flatnonzero(is_op & (op_parent >= 0) & (inst_row >= 0))
    if "op_key" in inst:
        op = inst["op_key"].to_numpy(np.int64)[inst_row[child]]
    else:
        op = pd.factorize(inst["op_id"].to_numpy(dtype=object)[inst_row[child]])[0]
    width = int(op.max()) + 1 if len(op) else 1
    parents = unique_sorted(op_parent[child] * width + op) // width
    return np.bincount(parents, minlength=len(r)).astype(np.int64)
