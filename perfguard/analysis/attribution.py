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
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.trace.model import NO_CORRELATION, Trace
from perfguard.trace.nesting import Nesting, group_codes

UNASSOCIATED_PREFIX = "unassociated_"


def gpu_activities(trace: Trace) -> pd.DataFrame:
    """Kernels and memops in one table.

    Output columns: ``activity`` (``kernel``/``memop``), ``start, end, rank,
    pid, device_id, stream_id, correlation_id, name, short_name, bytes``
    plus the kernel launch geometry; row order is kernels then memops.
    """
    k = trace.kernels.assign(activity="kernel")
    m = trace.memops.rename(columns={"kind": "name"}).assign(
        activity="memop", short_name=lambda d: d["name"]
    )
    return pd.concat([k, m], ignore_index=True)


def attribute(trace: Trace, activities: pd.DataFrame) -> pd.DataFrame:
    """Add launch and op columns to ``activities`` (from :func:`gpu_activities`).

    Adds: ``launch_start`` (the API call's start, NA without one),
    ``launch_tid``, ``range_id`` (the owning op range, -1 when unassociated)
    and ``instance`` (``range_id``, or ``-1 - k`` for the k-th unassociated
    activity, which is an op instance of its own).
    """
    api = trace.api_calls
    api = api[api["correlation_id"] != NO_CORRELATION].drop_duplicates(
        ["rank", "pid", "correlation_id"]
    )
    keys = ["rank", "pid", "correlation_id"]
    launched = activities[keys].merge(
        # nullable ints: a float NaN column would round ns timestamps past 2**53
        api[keys + ["tid", "start"]]
        .rename(columns={"tid": "launch_tid", "start": "launch_start"})
        .astype({"launch_tid": "Int64", "launch_start": "Int64"}),
        on=keys,
        how="left",
        validate="many_to_one",
    )
    out = activities.copy()
    has_launch = launched["launch_start"].notna().to_numpy()
    out["launch_start"] = launched["launch_start"].array
    out["launch_tid"] = launched["launch_tid"].array

    ops = trace.ranges[trace.ranges["kind"] == "op"]
    calls = pd.DataFrame(
        {
            "rank": out["rank"].to_numpy()[has_launch],
            "pid": out["pid"].to_numpy()[has_launch],
            "tid": out["launch_tid"].to_numpy(dtype=np.int64, na_value=0)[has_launch],
        }
    )
    op_groups, call_groups = group_codes(ops[["rank", "pid", "tid"]], calls)
    nest = Nesting(ops["start"].to_numpy(), ops["end"].to_numpy(), op_groups)
    t = out["launch_start"].to_numpy(dtype=np.int64, na_value=0)[has_launch]
    pos = nest.innermost_enclosing(call_groups, t)
    range_id = np.full(len(out), -1, dtype=np.int64)
    found = pos >= 0
    owner = ops["range_id"].to_numpy()[nest.order[pos[found]]]
    range_id[np.flatnonzero(has_launch)[found]] = owner
    out["range_id"] = range_id
    # the op instance that owns it: the range, or a pseudo-instance of its own
    orphans = np.flatnonzero(range_id < 0)
    instance = range_id.copy()
    instance[orphans] = -1 - np.arange(len(orphans), dtype=np.int64)
    out["instance"] = instance
    return out
