"""Exact change points of a test's counters across its stored runs.

The gate counters (op calls, kernel launches, FLOPs, bytes, memcpy, syncs,
host reads, peak memory: :data:`perfguard.analysis.counters.COUNTERS`) and
the yes/no facts the switch gates read (the set of kernels launched, the
ops on Tensor Cores, each op's input dtypes) are properties of the code, not
of the run: two runs of the same code give the same values. A series of
them has no noise, so a change point needs no statistics: wherever two
consecutive stored runs differ, the code changed at the later one's commit.
Each step names the counter, its per-iteration total before and after and
the ops whose share moved most.

What is compared is what the gates compare (:func:`~perfguard.compare.gates.judge_gates`):
an op whose counter varied between the rounds of either run (``stable``
false, e.g. a data-dependent ``nonzero``) is left out of that pair, and
peak memory, which the allocator's caching moves a little from run to run,
steps only beyond its default gate budget (:data:`PEAK_MEMORY_REL`). A run
stored without counters (an older perfguard) is skipped: the next run is
compared with the last one that had them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfguard.analysis.counters import COUNTERS

if TYPE_CHECKING:
    from perfguard.baseline.store import Store

__all__ = ["CounterStep", "counter_steps", "numeric_steps", "set_steps"]

#: relative change of peak memory that counts as a step (the default gate budget, 10 %)
PEAK_MEMORY_REL = 0.10
#: relative difference below which two totals are the same (float summation order)
SAME = 1e-9
#: ops named under each step
TOP_OPS = 3
#: set-valued facts: name -> what a member is
SET_COUNTERS = ("kernel_set", "tc_ops", "dtypes")
#: one step of a counter between consecutive runs: (position, counter, before, after,
#: the ops that moved it as (op, before, after))
Step = tuple[int, str, float, float, tuple[tuple[str, float, float], ...]]


@dataclass(frozen=True)
class CounterStep:
    """``counter`` changed between the run before ``index`` and the run at ``index``.

    Numeric counters: ``before``/``after`` are the per-iteration totals and
    ``ops`` (name, before, after) the ops that moved most. Set-valued ones
    (``kernel_set``, ``tc_ops``, ``dtypes``): ``before``/``after`` count the
    members and ``ops`` lists (member, 1 or 0 before, 1 or 0 after) added/removed.
    """

    index: int  # position of the run in the history (the first run with the new value)
    run_id: int
    commit: str
    counter: str
    before: float
    after: float
    ops: tuple[tuple[str, float, float], ...] = ()

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.after - self.before) / self.before if self.before else float("inf")


def numeric_steps(rows: pd.DataFrame, run_ids: np.ndarray, *, top_ops: int = TOP_OPS) -> list[Step]:
    """Steps of the numeric counters in ``rows`` (run_id, op_id, op_name, counter, value,
    stable: the store's ``counters`` table) along ``run_ids``: (position, counter, before,
    after, ops). Each pair of consecutive runs that have counters is compared on the ops
    stable in both."""
    order = {int(r): i for i, r in enumerate(run_ids)}
    rows = rows[rows["run_id"].isin(order)]
    have = sorted(order[int(r)] for r in rows["run_id"].unique())
    out: list[Step] = []
    if len(have) < 2:
        return out
    pos = rows["run_id"].map(order).to_numpy()
    for counter in (*COUNTERS, "peak_memory"):
        mask = (rows["counter"] == counter).to_numpy()
        if not mask.any():
            continue
        sub = rows[mask]
        ops = pd.Index(sub["op_id"].astype(str).unique())
        col = ops.get_indexer(sub["op_id"].astype(str))
        value = np.zeros((len(run_ids), len(ops)))
        stable = np.ones((len(run_ids), len(ops)), dtype=bool)
        np.add.at(value, (pos[mask], col), sub["value"].to_numpy(np.float64))
        stable[pos[mask], col] = sub["stable"].astype(bool).to_numpy()
        names = sub.groupby(sub["op_id"].astype(str))["op_name"].first().reindex(ops)
        prev, cur = np.array(have[:-1]), np.array(have[1:])
        both = stable[prev] & stable[cur]  # pairs x ops
        tb = (value[prev] * both).sum(axis=1)
        tc = (value[cur] * both).sum(axis=1)
        scale = np.maximum(np.abs(tb), np.abs(tc))
        limit = PEAK_MEMORY_REL * np.abs(tb) if counter == "peak_memory" else SAME * scale
        for k in np.flatnonzero(np.abs(tc - tb) > limit):
            moved = (value[cur[k]] - value[prev[k]]) * both[k]
            top = np.argsort(-np.abs(moved), kind="stable")[:top_ops]
            named = tuple(
                (
                    str(names.iloc[j] or ops[j] or "the test"),
                    float(value[prev[k], j]),
                    float(value[cur[k], j]),
                )
                for j in top
                if moved[j] != 0
            )
            out.append((int(cur[k]), counter, float(tb[k]), float(tc[k]), named))
    return out


def set_steps(members: pd.DataFrame, observed: set[int], run_ids: np.ndarray) -> list[Step]:
    """Steps of set-valued facts: ``members`` has run_id, counter, member, key (one row per
    member of the run's set); a run in ``observed`` without rows has the empty set,
    other runs are skipped. Only members whose key is in both runs' sets count (an op
    that appears has new dtypes, not changed ones; a kernel's key is itself)."""
    order = {int(r): i for i, r in enumerate(run_ids)}
    members = members[members["run_id"].isin(order)]
    seen = [r for r in map(int, run_ids) if r in observed]
    out: list[Step] = []
    for counter in members["counter"].unique():
        sub = members[members["counter"] == counter]
        pairs = sub.groupby("run_id")[["member", "key"]].agg(lambda s: frozenset(map(str, s)))
        empty: tuple[frozenset[str], ...] = (frozenset(), frozenset())
        pos = [(order[r], tuple(pairs.loc[r]) if r in pairs.index else empty) for r in seen]
        for (_, (a, ka)), (i, (b, kb)) in zip(pos, pos[1:], strict=False):
            both = ka & kb if counter == "dtypes" else ka | kb
            gone = sorted(m for m in a - b if m.split("\x1f")[0] in both)
            new = sorted(m for m in b - a if m.split("\x1f")[0] in both)
            if gone or new:
                changed = tuple((m.replace("\x1f", ": "), 1.0, 0.0) for m in gone)
                changed += tuple((m.replace("\x1f", ": "), 0.0, 1.0) for m in new)
                out.append((i, str(counter), float(len(a)), float(len(b)), changed))
    return out


def _members(store: Store, nodeid: str, run_ids: list[int]) -> tuple[pd.DataFrame, set[int]]:
    """kernel_set (kernel names), tc_ops (ops on Tensor Cores) and dtypes ("op: dtypes")
    per run, long form (run_id, counter, member), and the runs that recorded ops."""
    parts = []
    kernels = store.reader.test_rows(nodeid, "kernels", run_ids)
    if len(kernels):
        name = kernels["kernel_name"].astype(str)
        parts.append(
            pd.DataFrame(
                {"run_id": kernels["run_id"], "counter": "kernel_set", "member": name, "key": name}
            )
        )
    ops = store.reader.test_rows(nodeid, "ops", run_ids)
    if len(ops):
        tc = ops[ops["using_tc"].fillna(False).astype(bool)]
        name = tc["op_name"].astype(str)
        parts.append(
            pd.DataFrame({"run_id": tc["run_id"], "counter": "tc_ops", "member": name, "key": name})
        )
        typed = ops[ops["dtypes"].notna() & (ops["dtypes"].astype(str) != "")]
        name = typed["op_name"].astype(str)
        parts.append(
            pd.DataFrame(
                {
                    "run_id": typed["run_id"],
                    "counter": "dtypes",
                    "member": name + "\x1f" + typed["dtypes"].astype(str),
                    "key": name,
                }
            )
        )
    observed = set(ops["run_id"].astype(int))
    if not parts:
        return pd.DataFrame({"run_id": [], "counter": [], "member": [], "key": []}), observed
    return pd.concat(parts, ignore_index=True), observed


def counter_steps(
    store: Store, nodeid: str, levels: pd.DataFrame, *, top_ops: int = TOP_OPS
) -> list[CounterStep]:
    """Every counter step of ``nodeid`` along the runs of ``levels`` (its run_id and
    commit columns, history order), ordered by position then counter."""
    run_ids = levels["run_id"].to_numpy(np.int64)
    ids = [int(r) for r in run_ids]  # only these runs' rows are read: a store keeps many more
    found = numeric_steps(store.reader.test_rows(nodeid, "counters", ids), run_ids, top_ops=top_ops)
    found += set_steps(*_members(store, nodeid, ids), run_ids)
    commits = levels["commit"].astype(str).to_numpy()
    return [
        CounterStep(i, int(run_ids[i]), str(commits[i]), counter, before, after, ops)
        for i, counter, before, after, ops in sorted(found, key=lambda s: s[0])
    ]
