"""What a gate's finding costs: the share of the step it can be seen to take.

A counter is exact, but an exact change can cost nothing: a Python scalar's dtype
(``fp64 → bool`` on one input of an ``aten::add``), 35 bytes of a 7 MB step, 25 ops of
microseconds in a 30 ms step. On a public transformer library's real history, two of
14 commits went red on such changes while A/B measured them at +0.0 % [−2.1, +2.3]
(issue 55). So a counter change fails when it matters:

* **by its time** (``calls``, ``kernels``, ``kernel_set``, and ``dtypes`` where the
  op's bytes are unknown): the time the capture saw the ops it added or grew take, per
  iteration, as a share of the profiled step, against the test's tolerance (the same
  yardstick its timing uses: a team that tolerates 5 % does not want red for 0.4 %);
* **by its size** (``flops``, ``bytes``, ``memcpy_bytes``, and ``dtypes``: a widened
  tensor that carries work moves bytes): the change against the step's total of that
  counter, not against one op's, with the counter's own budget (1 %);
* **by its kind**, whatever this machine shows: a host-device sync or read
  (``syncs``, ``host_reads``), a copy between host and device (``memcpy``) and a lost
  Tensor Core path (``tc_lost``) cost on the device even where a CPU runner cannot see
  it; and the whole-test counters (peak memory, host instructions) are totals already.

A gate the user marks strict (the marker's ``gates={"strict": [...]}`` or ``True``) is
never weighed. Standard library, numpy and pandas only; no text beyond the figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from perfguard.baseline.record import TestRecord, profiled_mask
from perfguard.compare.halves import GateFinding

#: kinds that cost on the device whatever the capture's host times show
BY_KIND = frozenset({"syncs", "host_reads", "memcpy", "tc_lost"})
#: counters weighed by their size against the step's total of the same counter
BY_SIZE = frozenset({"flops", "bytes", "memcpy_bytes"})
#: the share of the step's total a change of size must reach where its gate has no
#: relative budget to say it (the default budgets of FLOPs and bytes: 1 %)
SIZE_SHARE = 0.01
#: counters weighed by the time of the ops that moved
BY_TIME = frozenset({"calls", "kernels", "kernel_set", "dtypes"})


def _names(record: TestRecord) -> pd.Series:
    """op_id -> op_name (the name is the op's path, ``parent/child``: what nesting reads)."""
    parts = [
        f[["op_id", "op_name"]]
        for f in (record.ops, record.counters)
        if f is not None and not f.empty
    ]
    if not parts:
        return pd.Series(dtype=object)
    both = pd.concat(parts).drop_duplicates("op_id")
    return pd.Series(both["op_name"].astype(str).to_numpy(), index=both["op_id"].to_numpy())


def _per_iteration(record: TestRecord, column: str) -> pd.Series:
    """Each op's ``column`` (ns) per recorded iteration, by op name."""
    s = record.op_samples
    if s is None or s.empty or column not in s:
        return pd.Series(dtype=np.float64)
    n = max(int(s["iteration"].nunique()), 1)
    names = s["op_id"].map(_names(record)).fillna(s["op_id"]).astype(str)
    values = pd.to_numeric(s[column], errors="coerce").astype(np.float64)
    # an op whose time the capture did not give stays NaN: unknown, never 0
    return values.groupby(names.to_numpy()).sum(min_count=1) / n


def _step_ns(record: TestRecord, column: str) -> float:
    """The profiled iteration's time (ns), the median over the profiled iterations: what
    the op times were captured against (the same profiler's cost on both)."""
    samples = record.samples
    if samples is None or samples.empty or column not in samples:
        return math.nan
    values = samples.loc[profiled_mask(samples), column].to_numpy(dtype=np.float64, na_value=np.nan)
    values = values[np.isfinite(values) & (values > 0)]
    return float(np.median(values)) if len(values) else math.nan


def _counter(record: TestRecord, counter: str) -> pd.Series:
    c = record.counters
    if c is None or c.empty:
        return pd.Series(dtype=np.float64)
    rows = c[c["counter"] == counter]
    return rows.groupby(rows["op_name"].astype(str).to_numpy())["value"].sum().astype(np.float64)


def _top_most(op_ids: list[str]) -> list[str]:
    """The op names none of whose enclosing ops (``a/b`` is inside ``a``) is in the list:
    a parent's time holds its children's, so both would count twice."""
    have = set(op_ids)
    out = []
    for op in op_ids:
        parts = op.split("/")
        if not any("/".join(parts[:k]) in have for k in range(1, len(parts))):
            out.append(op)
    return out


@dataclass
class StepCosts:
    """The two records' per-op times and counter totals, read once per verdict."""

    current: TestRecord
    baseline: TestRecord
    metric: str
    _cache: dict[str, pd.Series] = field(default_factory=dict)

    @property
    def column(self) -> str:
        return "gpu_time_ns" if self.metric == "gpu_time" else "cpu_time_ns"

    @property
    def step_column(self) -> str:
        """The samples' column a step's time is read from."""
        return "gpu_time_ns" if self.metric == "gpu_time" else "wall_time_ns"

    @property
    def step_ns(self) -> float:
        """The current profiled step (the baseline's where the current lacks one)."""
        now = _step_ns(self.current, self.step_column)
        return now if math.isfinite(now) else _step_ns(self.baseline, self.step_column)

    def op_time(self, side: str) -> pd.Series:
        key = f"time:{side}"
        if key not in self._cache:
            record = self.current if side == "current" else self.baseline
            self._cache[key] = _per_iteration(record, self.column)
        return self._cache[key]

    def counter(self, side: str, counter: str) -> pd.Series:
        key = f"{counter}:{side}"
        if key not in self._cache:
            record = self.current if side == "current" else self.baseline
            self._cache[key] = _counter(record, counter)
        return self._cache[key]

    def subtree(self, side: str, counter: str, op_id: str) -> float | None:
        """``counter`` (``""``: the op's time, ns) per iteration of ``op_id`` and the ops
        inside it; None where none of them has the figure."""
        values = self.op_time(side) if not counter else self.counter(side, counter)
        ids = values.index.astype(str)
        inside = values[(ids == op_id) | ids.str.startswith(op_id + "/")].dropna()
        if not counter:
            inside = inside[inside > 0]  # a time of 0 is none the capture gave
        return float(inside.sum()) if len(inside) else None

    def total(self, counter: str) -> float:
        """The step's total of ``counter`` per iteration: the larger side's."""
        return max(
            float(self.counter("current", counter).sum()),
            float(self.counter("baseline", counter).sum()),
        )

    def fell(self, counter: str) -> float:
        """How much the step's total of ``counter`` fell, as a share of the larger side's
        (negative: it grew). FLOPs that moved from one op to others did not fall."""
        b = float(self.counter("baseline", counter).sum())
        c = float(self.counter("current", counter).sum())
        top = max(b, c)
        return (b - c) / top if top > 0 else 0.0

    def net_saved(self, counter: str) -> float:
        """The share of the step an improvement of ``counter`` can be seen to save: the
        time of the ops it moved down less that of the ops it moved up, and no more than
        the profiled step itself fell by. Infinite where nothing can be read (the saving
        counts). Δcalls × time per call assumes an op's calls alike: ``aten::linear``
        averaged over a model's large projections and its small head made the head's
        removal (``addmm`` → ``matmul`` + ``add``) look like 47 % of the step saved,
        while the step was 3.8 % slower."""
        step = self.step_ns
        if not step > 0:
            return math.inf
        down, up = self.moved_time(counter, None, False), self.moved_time(counter, None, True)
        net = (down - up) / step if math.isfinite(down - up) else math.inf
        before = _step_ns(self.baseline, self.step_column)
        if math.isfinite(before) and before > 0:
            net = min(net, (before - step) / before)
        return net

    def moved_time(self, counter: str, op_ids: list[str] | None, up: bool) -> float:
        """Time per iteration (ns) of the ops ``counter`` moved ``up`` (or down): each op's
        time per unit of the counter, times how many units it moved; over the top-most
        ops of ``op_ids`` (None: every op that moved)."""
        base, cur = self.counter("baseline", counter), self.counter("current", counter)
        ids = base.index.union(cur.index)
        b, c = base.reindex(ids, fill_value=0.0), cur.reindex(ids, fill_value=0.0)
        diff = (c - b) if up else (b - c)
        diff = diff[diff > 0]
        if op_ids is not None:
            diff = diff[diff.index.isin(op_ids)]
        side = "current" if up else "baseline"
        times = self.op_time(side)
        others = self.op_time("baseline" if up else "current")
        units = (c if up else b).reindex(diff.index)
        total = 0.0
        for op in _top_most([str(i) for i in diff.index]):
            t, n = float(times.get(op, math.nan)), float(units.get(op, 0.0))
            if n > 0 and not (math.isfinite(t) and t > 0):
                # an op the capture did not time, or timed as 0 (an aten op fused into a
                # compiled kernel, whose time is the kernel's): its cost cannot be read
                return math.nan
            if n > 0:
                moved = t * float(diff[op]) / n
                other = float(others.get(op, 0.0))
                if not up and math.isfinite(other) and other > 0:
                    # a saving is no more than the op's time fell: Δcalls × time per call
                    # takes the op's calls alike, and aten::linear's averaged over large
                    # projections and a small head made the head's removal 47 % of a step
                    moved = min(moved, max(t - other, 0.0))
                total += moved
        return total


def weigh(finding: GateFinding, costs: StepCosts) -> GateFinding:
    """``finding`` with its cost (share of the step, %) and how it was read; the caller
    decides by :func:`material`."""
    gate = finding.gate
    if gate in BY_KIND:
        return replace(finding, cost_basis="kind")
    if finding.whole_test and gate not in BY_TIME and gate not in BY_SIZE:
        return replace(finding, cost_basis="total")  # peak memory, host instructions
    up = _num(finding.current) >= _num(finding.baseline) if gate not in ("dtypes",) else True
    if gate in BY_SIZE or gate == "dtypes":
        size = "bytes" if gate in ("dtypes", "bytes") else gate
        total = costs.total(size)
        if gate == "dtypes":
            # a type is widened where its bytes grow: the op's own and those of the ops it
            # runs (aten::to's copy_ holds the bytes of the conversion it makes)
            op = finding.op_name
            b, c = costs.subtree("baseline", size, op), costs.subtree("current", size, op)
            if (b is None and c is None) or total <= 0:
                # no bytes figure: what the op's time moved by (the profiled round's)
                t_b, t_c = costs.subtree("baseline", "", op), costs.subtree("current", "", op)
                step = costs.step_ns
                known = t_b is not None and t_c is not None and step > 0
                moved = abs((t_c or 0.0) - (t_b or 0.0)) / step if known else math.nan
                return replace(finding, cost_pct=_pct(moved), cost_basis="time")
            moved = abs((c or 0.0) - (b or 0.0)) / total
            return replace(finding, cost_pct=_pct(moved), cost_basis="bytes")
        delta = abs(_num(finding.current) - _num(finding.baseline))
        if total <= 0 or not math.isfinite(delta):
            return replace(finding, cost_basis="strict")
        return replace(finding, cost_pct=_pct(delta / total), cost_basis=size)
    # by time: the ops the counter moved, the finding's own op, or every op for the total
    step = costs.step_ns
    if gate == "kernel_set":
        ns = _kernel_time(costs, finding)
    else:
        ops = None if finding.whole_test else [finding.op_name]
        ns = costs.moved_time(gate, ops, up)
    share = ns / step if step > 0 else math.nan
    return replace(finding, cost_pct=_pct(share), cost_basis="time")


def material(
    finding: GateFinding, tolerance: float, relative_budget: float | None, strict: bool
) -> bool:
    """Whether a weighed finding fails (module docstring): strict gates, kinds that cost
    on the device, whole-test totals and findings that could not be weighed always do."""
    if strict or finding.cost_basis in ("kind", "total", "strict", ""):
        return True
    if finding.cost_pct is None:
        return True  # no time or size to weigh it by: kept, as before weighing
    share = finding.cost_pct / 100.0
    if finding.cost_basis == "time":
        return share >= tolerance
    return share >= (relative_budget if relative_budget is not None else SIZE_SHARE)


def _kernel_time(costs: StepCosts, finding: GateFinding) -> float:
    """A kernel added (or removed) by an op: its GPU time per recorded iteration."""
    side = costs.current if finding.current not in (None, 0, False) else costs.baseline
    k = side.kernels
    if k is None or k.empty:
        return 0.0
    hit = k[(k["op_name"] == finding.op_name) & (k["kernel_name"] == finding.kernel_name)]
    n = side.samples["profiled"].sum() if "profiled" in side.samples else len(side.samples)
    return float(hit["gpu_time_total"].sum()) / max(float(n), 1.0)


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _pct(share: float) -> float | None:
    return 100.0 * share if math.isfinite(share) else None
