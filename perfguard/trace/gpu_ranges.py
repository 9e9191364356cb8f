"""Keep only the NVTX ranges that enclose GPU work (opt-in, ``--gpu-ranges-only``).

PyTorch's ``emit_nvtx`` writes a range per aten op, 4.8 per kernel; most
launch nothing (``aten::view``, ``aten::empty``). At a million kernels
those ranges are most of the run's memory: the ranges table and the op
instances built from it. A range *encloses GPU work* when a call that
launched a kernel or memory operation (its correlation id is a kernel's or
memop's in the same process) starts inside it on its own thread, directly
(the call's innermost enclosing op range, as attribution finds it) or in a
range nested in it. Kept besides: every range that is not an op (iteration
markers, cross-thread start/end ranges), ranges named as asked (the key node
of ``--key-node``), and every ancestor of a kept range, so the kept set is
closed upwards and its tree is the full tree's, renumbered.

What changes in the reports (why this is not the default): the CPU-only op
instances are gone, so the detail, op_type, group_node and iteration
reports lose their calls and CPU time (an op that never launches GPU work
disappears), and the summary's op counts fall. GPU time and its
attribution to ops are unchanged: every kernel keeps its owner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfguard.trace.model import NO_PARENT
from perfguard.trace.nesting import Nesting, group_codes


@dataclass(frozen=True)
class RangeFilter:
    """Ask a reader to keep only the ranges that enclose GPU work, and these names."""

    #: range names kept whether or not they enclose GPU work (``--key-node``'s)
    keep_names: tuple[str, ...] = ()

    def apply(
        self, ranges: pd.DataFrame, api: pd.DataFrame, activities: list[pd.DataFrame]
    ) -> pd.DataFrame:
        """The kept rows of a finalized ranges table, renumbered."""
        if not len(ranges):  # no NVTX (the table may lack columns then)
            return ranges
        return keep_ranges(ranges, gpu_range_mask(ranges, api, activities, self.keep_names))


def gpu_range_mask(
    ranges: pd.DataFrame,
    api: pd.DataFrame,
    activities: list[pd.DataFrame],
    keep_names: tuple[str, ...] = (),
) -> np.ndarray:
    """Which rows of a finalized ranges table to keep (see the module docstring)."""
    n = len(ranges)
    keep = (ranges["kind"] != "op").to_numpy(dtype=bool).copy()
    if keep_names:
        keep |= ranges["name"].isin(keep_names).to_numpy(dtype=bool)
    launch = _launch_rows(api, activities)
    is_op = np.flatnonzero((ranges["kind"] == "op").to_numpy(dtype=bool))
    if len(launch) and len(is_op):
        thread = ["rank", "pid", "tid"] if "rank" in api and "rank" in ranges else ["pid", "tid"]
        op_codes, call_codes = group_codes(
            ranges[thread].iloc[is_op].reset_index(drop=True),
            api[thread].iloc[launch].reset_index(drop=True),
        )
        start, end = ranges["start"].to_numpy(np.int64), ranges["end"].to_numpy(np.int64)
        nest = Nesting(start[is_op], end[is_op], op_codes)
        pos = nest.innermost_enclosing(call_codes, api["start"].to_numpy(np.int64)[launch])
        keep[is_op[nest.order[pos[pos >= 0]]]] = True
    if not n:
        return keep
    return _with_ancestors(keep, ranges["parent_id"].to_numpy(np.int64), ranges["depth"])


def _launch_rows(api: pd.DataFrame, activities: list[pd.DataFrame]) -> np.ndarray:
    """Rows of ``api`` whose (pid, correlation id) is a GPU activity's."""
    if not len(api) or "correlation_id" not in api:
        return np.zeros(0, dtype=np.int64)
    acts = [a[["pid", "correlation_id"]] for a in activities if len(a) and "correlation_id" in a]
    if not acts:
        return np.zeros(0, dtype=np.int64)
    keys = [api[["pid", "correlation_id"]].reset_index(drop=True)]
    codes = group_codes(*keys, *(a.reset_index(drop=True) for a in acts))
    return np.flatnonzero(np.isin(codes[0], np.concatenate(codes[1:])))


def _with_ancestors(keep: np.ndarray, parent: np.ndarray, depth: pd.Series) -> np.ndarray:
    """``keep`` with every ancestor of a kept row kept, deepest level first."""
    keep = keep.copy()
    d = depth.to_numpy(np.int64)
    for level in range(int(d.max()), 0, -1):
        child = np.flatnonzero(keep & (d == level) & (parent != NO_PARENT))
        keep[parent[child]] = True
    return keep


def keep_ranges(ranges: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """The kept rows of a finalized ranges table, renumbered (``range_id`` the row number,
    ``parent_id`` following); ``keep`` must hold every kept row's parent."""
    if keep.all():
        return ranges
    new_id = np.cumsum(keep, dtype=np.int64) - 1
    out = ranges[keep].reset_index(drop=True)
    parent = out["parent_id"].to_numpy(np.int64)
    out["range_id"] = np.arange(len(out), dtype=np.int64)
    out["parent_id"] = np.where(parent != NO_PARENT, new_id[np.maximum(parent, 0)], NO_PARENT)
    return out
