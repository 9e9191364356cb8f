"""A measured test's profile, whatever its outcome: where its step's time goes.

perfguard exists to show per-op time, Tensor Core use and FLOP efficiency; a reviewer
used to meet them only in a regressed test's op diff. A :class:`TestProfile` is built
from the test's own record (:func:`profile_of`), so a ``new``, ``no-baseline``,
``unchanged`` or ``noisy`` test shows the same figures as a regressed one, and A/B mode
(whose parent holds the merged record, not the analysis) builds it the same way.

Figures, each the record's (hence ``perfguard analyze``'s detail report's, on the same
capture) divided by the profiled iterations:

* the ops' **time**: GPU time where the capture has any (a kernel's time is its
  innermost op's, so ops never overlap), else **self CPU time** (an op's CPU time less
  its direct children's: ``aten::linear`` holds ``aten::linear/aten::addmm``), so the
  ops split the step and the shares add up to 100 %; each op's inclusive CPU time is
  kept beside it;
* Tensor Cores (eligible, used, utilization), FLOPs and FLOP efficiency against the
  device's peak for the op's dtype and path (the analysis's; missing, never guessed,
  where the device or the op has no peak);
* the whole test's syncs, host reads, copies and peak memory (the gates' counters), and
  the analysis's run figures the record keeps in ``meta["profile"]`` (:func:`run_figures`:
  GPU idle, run-level TC utilization, the device).

Standard library at import (``results.json`` is read by the plugin's summary); the
record is read with pandas only in :func:`profile_of`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from perfguard.jsonsafe import finite

#: ops a profile keeps, most time first (the rest are counted in ``other_ops``/``other_ns``)
PROFILE_OPS = 25
#: whole-test counters a profile shows, per iteration (op rows summed)
_COUNTERS = ("syncs", "host_reads", "memcpy", "memcpy_bytes")
#: the ops through which a step takes its input from a ``tf.data`` pipeline (their time is
#: the step waiting on the pipeline: Keras's ``fit`` reads through the Optional ops, a
#: custom loop and ``predict`` through ``IteratorGetNext``; TensorFlow's op registry)
INPUT_OPS = frozenset(
    {
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorGetNextAsOptional",
        "OptionalGetValue",
        "OptionalHasValue",
        "MultiDeviceIteratorGetNextFromShard",
    }
)


@dataclass
class ProfileOp:
    """One op of a profile; times are totals over the profiled iterations (ns)."""

    op_name: str
    direction: str = ""
    op_type: str = ""
    calls: float | None = None
    #: GPU time (a GPU capture) or self CPU time: the op's part of the step
    time_ns: float | None = None
    #: the op's CPU time, nested ops included (the detail report's ``cpu_time_total``)
    cpu_time_ns: float | None = None
    gpu_time_ns: float | None = None
    #: ``time_ns`` as a share of every op's (%)
    share_pct: float | None = None
    kernels: float | None = None
    tc_eligible: bool | None = None
    using_tc: bool | None = None
    tc_utilization: float | None = None
    flops: float | None = None
    #: the FLOPs of the ops nested in this one, where it counts none itself (None: it does,
    #: or none is known): ``aten::linear``'s are on its ``aten::addmm``
    nested_flops: float | None = None
    flop_efficiency: float | None = None
    dtypes: str = ""
    call_site: str = ""

    @property
    def short_name(self) -> str:
        """The op's own name (its last path part: ``aten::addmm``)."""
        return self.op_name.rsplit("/", 1)[-1]


@dataclass
class TestProfile:
    """Where a test's step time goes (module docstring); per-iteration figures are the
    totals over ``iterations``."""

    __test__ = False

    #: "gpu" (ops timed by their kernels) or "cpu" (by their self CPU time)
    basis: str
    iterations: int
    ops: list[ProfileOp] = field(default_factory=list)
    #: ops beyond :data:`PROFILE_OPS`, and their summed time (ns, all iterations)
    other_ops: int = 0
    other_ns: float = 0.0
    #: every op's time summed (ns, all iterations): the step's attributed time
    op_time_ns: float = 0.0
    device: str = ""
    #: 100 - GPU utilization over the profiled window (%), None without a GPU
    gpu_idle_pct: float | None = None
    #: run-level Tensor Core utilization over the eligible ops (%), None when none ran
    tc_utilization: float | None = None
    #: share of the ops' time in Tensor Core eligible ops (%)
    tc_eligible_pct: float | None = None
    #: FLOPs per iteration (the ops with a FLOP model)
    flops: float | None = None
    #: those ops' FLOPs over their time (FLOP/s)
    flop_rate: float | None = None
    #: their FLOP efficiency against the device's peak, weighted by their time (%)
    flop_efficiency: float | None = None
    #: whole-test counters per iteration (syncs, host reads, copies, copied bytes)
    counters: dict[str, float] = field(default_factory=dict)
    peak_memory: float | None = None
    #: the input pipeline's part of the ops' time (ns, all iterations: :data:`INPUT_OPS`),
    #: None where the step reads no ``tf.data`` iterator
    input_ns: float | None = None

    @property
    def input_pct(self) -> float | None:
        """The input pipeline's share of the ops' time (%)."""
        if self.input_ns is None or not self.op_time_ns:
            return None
        return 100.0 * self.input_ns / self.op_time_ns

    def per_iteration(self, total: float | None) -> float | None:
        """A total over the profiled iterations, per iteration."""
        if total is None or not self.iterations:
            return None
        return total / self.iterations

    @property
    def top(self) -> ProfileOp | None:
        return self.ops[0] if self.ops else None

    @property
    def time_label(self) -> str:
        """What an op's time is, in words (a column header)."""
        return "GPU time" if self.basis == "gpu" else "self CPU time"

    def to_dict(self) -> dict[str, Any]:
        return finite(asdict(self))

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> TestProfile:
        """A profile from its ``results.json`` object; unknown keys are ignored (a newer
        file), missing ones take their defaults. ValueError on a wrong type."""
        names = {f.name for f in fields(cls)}
        vals = {k: v for k, v in value.items() if k in names}
        op_names = {f.name for f in fields(ProfileOp)}
        rows = vals.get("ops") or []
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("ops must be a list of objects")
        vals["ops"] = [ProfileOp(**{k: v for k, v in r.items() if k in op_names}) for r in rows]
        if not isinstance(vals.get("basis"), str) or not isinstance(vals.get("iterations"), int):
            raise ValueError("basis (text) and iterations (an integer) are required")
        return cls(**vals)


def run_figures(analysis: Any) -> dict[str, Any]:
    """What only the analysis knows of a test's run, for the record's ``meta["profile"]``:
    the device, GPU idle over the window and the run-level Tensor Core utilization."""
    s = analysis.summary
    gpu = s.gpus_used > 0
    return finite(
        {
            "device": s.gpu_names,
            "gpu_idle_pct": 100.0 - float(s.gpu_utilization) if gpu else None,
            "tc_utilization": s.tc_utilization,
        }
    )


def profile_of(record: Any, top: int = PROFILE_OPS) -> TestProfile | None:
    """The profile of a :class:`~perfguard.baseline.record.TestRecord`; None for a record
    without ops (an A/B timing-only record, an empty capture)."""
    import numpy as np
    import pandas as pd

    from perfguard.analysis.ops import nested_flops
    from perfguard.baseline.record import profiled_mask

    ops = record.ops
    if ops is None or ops.empty:
        return None
    n = int(profiled_mask(record.samples).sum()) if len(record.samples) else 0
    gpu_total = _col(ops, "gpu_time_total")
    cpu_total = _col(ops, "cpu_time_total")
    basis = "gpu" if np.nansum(gpu_total) > 0 else "cpu"
    names = ops["op_name"].astype(str).to_numpy()
    directions = ops["direction"].fillna("").astype(str).to_numpy()
    if basis == "gpu":
        time = np.nan_to_num(gpu_total)
    else:  # self CPU time: less the direct children's (same direction, one level deeper)
        parents = pd.Series([n_.rsplit("/", 1)[0] if "/" in n_ else "" for n_ in names])
        child = pd.Series(np.nan_to_num(cpu_total)).groupby([parents.to_numpy(), directions]).sum()
        keys = pd.MultiIndex.from_arrays([names, directions])
        nested = child.reindex(keys).fillna(0.0).to_numpy()
        time = np.clip(np.nan_to_num(cpu_total) - nested, 0.0, None)
    whole = float(time.sum())
    order = np.argsort(-time, kind="stable")
    sites = record.meta.get("call_sites") or {}
    eligible = _flags(ops, "tc_eligible")
    using = _flags(ops, "using_tc")
    tc_util = _col(ops, "tc_utilization")
    flops = _col(ops, "flops")
    nested = nested_flops(ops).to_numpy(np.float64)
    eff = _col(ops, "flop_efficiency")
    calls, kernels = _col(ops, "calls"), _col(ops, "kernel_count")
    dtypes = ops["dtypes"].fillna("").astype(str).to_numpy() if "dtypes" in ops else None
    op_types = ops["op_type"].fillna("").astype(str).to_numpy() if "op_type" in ops else None
    rows = []
    for i in order[:top]:
        rows.append(
            ProfileOp(
                op_name=str(names[i]),
                direction=str(directions[i]),
                op_type=str(op_types[i]) if op_types is not None else "",
                calls=_num(calls[i]),
                time_ns=float(time[i]),
                cpu_time_ns=_num(cpu_total[i]),
                gpu_time_ns=_num(gpu_total[i]),
                share_pct=100.0 * float(time[i]) / whole if whole > 0 else None,
                kernels=_num(kernels[i]),
                tc_eligible=None if eligible[i] is None else bool(eligible[i]),
                using_tc=None if using[i] is None else bool(using[i]),
                tc_utilization=_num(tc_util[i]),
                flops=_num(flops[i]),
                nested_flops=_num(nested[i]),
                flop_efficiency=_num(eff[i]),
                dtypes=str(dtypes[i]) if dtypes is not None else "",
                call_site=str(sites.get(str(names[i])) or ""),
            )
        )
    rest = order[top:]
    figures = dict(record.meta.get("profile") or {})
    is_eligible = np.array([bool(e) for e in eligible])
    have_flops = np.isfinite(flops) & (flops > 0) & (time > 0)
    have_eff = np.isfinite(eff) & (time > 0)
    flop_time = float(time[have_flops].sum())
    counters = _counters(record.counters)
    reads = np.array([n_.rsplit("/", 1)[-1] in INPUT_OPS for n_ in names], dtype=bool)
    profile = TestProfile(
        basis=basis,
        iterations=n,
        ops=rows,
        other_ops=len(rest),
        other_ns=float(time[rest].sum()),
        op_time_ns=whole,
        device=str(figures.get("device") or ""),
        gpu_idle_pct=_num(figures.get("gpu_idle_pct")),
        tc_utilization=_num(figures.get("tc_utilization")),
        tc_eligible_pct=100.0 * float(time[is_eligible].sum()) / whole if whole > 0 else None,
        flops=float(np.nansum(flops[np.isfinite(flops)])) / n if n and have_flops.any() else None,
        flop_rate=float(flops[have_flops].sum()) / flop_time * 1e9 if flop_time > 0 else None,
        flop_efficiency=(
            float((eff[have_eff] * time[have_eff]).sum() / time[have_eff].sum())
            if have_eff.any()
            else None
        ),
        counters={k: v for k, v in counters.items() if k != "peak_memory"},
        peak_memory=counters.get("peak_memory"),
        input_ns=float(time[reads].sum()) if reads.any() else None,
    )
    return profile


def _col(ops: Any, name: str) -> Any:
    import numpy as np
    import pandas as pd

    if name not in ops:
        return np.full(len(ops), np.nan)
    return pd.to_numeric(ops[name], errors="coerce").to_numpy(np.float64, na_value=np.nan)


def _flags(ops: Any, name: str) -> list[bool | None]:
    if name not in ops:
        return [None] * len(ops)
    return [None if v is None or v != v or v is _NA else bool(v) for v in _na_free(ops[name])]


_NA: Any = object()


def _na_free(values: Any) -> list[Any]:
    """The column's values with pandas' NA as :data:`_NA` (``bool(pd.NA)`` raises)."""
    import pandas as pd

    return [_NA if v is pd.NA else v for v in values.astype(object).tolist()]


def _num(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _counters(counters: Any) -> dict[str, float]:
    """The whole test's counters per iteration: each op's mean per recorded iteration (the
    record keeps them so), summed; ``peak_memory``: the test's own row."""
    import pandas as pd

    if counters is None or counters.empty:
        return {}
    values = pd.to_numeric(counters["value"], errors="coerce")
    by = values.groupby(counters["counter"].astype(str)).sum()
    out = {k: float(by[k]) for k in _COUNTERS if k in by.index}
    peak = counters[(counters["counter"] == "peak_memory")]
    if len(peak):
        out["peak_memory"] = float(pd.to_numeric(peak["value"], errors="coerce").max())
    return out
