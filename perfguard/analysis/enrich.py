"""Tensor Core and FLOP columns on attributed activities and op instances.

The rules live in :mod:`perfguard.analysis.tensor_cores`,
:mod:`perfguard.analysis.flops` and :mod:`perfguard.analysis.peaks`; this
module applies them to one analysis, in the order the definitions need:

1. each kernel's TC use from its name (unknown names stay ``<NA>``);
2. each op instance's eligibility from its op type;
3. unknown kernels of eligible ops resolved from the op's input dtypes and
   the GPU's compute capability (never guessed);
4. xprof's rule: an op whose kernel used TC is eligible;
5. FLOPs and bytes per instance from shapes, counted once up the op tree;
6. the peak of the GPU the instance's kernels ran on, for efficiency.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionArray

from perfguard.analysis.flops import count_once, op_flops
from perfguard.analysis.flops.tensorflow import tf_op_cost
from perfguard.analysis.metrics import gpu_time
from perfguard.analysis.ops import instance_rows
from perfguard.analysis.peaks import match_gpu, peak_flops_series, why_unknown
from perfguard.analysis.tensor_cores import (
    classify_kernels,
    eligible_by_kernels,
    op_tc_eligible,
    resolve_unknown,
)
from perfguard.arrays import NONE, unique_first
from perfguard.trace.model import Trace, coded_text, with_category
from perfguard.trace.nesting import group_codes


def _device_column(trace: Trace, acts: pd.DataFrame, column: str) -> pd.Series:
    """``trace.devices[column]`` for each activity's (rank, device_id), aligned with ``acts``."""
    dev = trace.devices.drop_duplicates(["rank", "device_id"]).set_index(["rank", "device_id"])
    if dev.empty or acts.empty:
        return pd.Series(None, index=acts.index, dtype="object")
    idx = pd.MultiIndex.from_arrays([acts["rank"], acts["device_id"]])
    return pd.Series(dev[column].reindex(idx).to_numpy(), index=acts.index, dtype="object")


def add_tensor_cores(trace: Trace, acts: pd.DataFrame, inst: pd.DataFrame) -> None:
    """Add ``uses_tc``/``tc_reason`` to ``acts`` and ``tc_eligible``/``uses_tc``/
    ``tc_kernel_time`` to ``inst`` (in place).

    Memops are not kernels: their ``uses_tc`` is False and they never count
    in TC figures.
    """
    kernel = (acts["activity"] == "kernel").to_numpy()
    cls = classify_kernels(with_category(acts["name"], "").where(kernel, ""))
    uses = cls["uses_tc"].astype("boolean")
    uses[~kernel] = False
    reason = cls["tc_reason"].where(kernel, "memory operation")

    rows = activity_rows(acts, inst)
    has_op = rows >= 0
    at = np.where(has_op, rows, 0)
    leaf_eligible = op_tc_eligible(with_category(inst["name"], "").fillna("")).to_numpy(bool)
    op_eligible = pd.Series(np.where(has_op, leaf_eligible[at], False), index=acts.index)
    dtypes = inst["dtypes"].to_numpy(dtype=object)
    op_dtypes = pd.Series(np.where(has_op, dtypes[at], NONE), index=acts.index, dtype="object")
    cc = _device_column(trace, acts, "compute_capability")
    unknown = uses.isna()
    resolved = resolve_unknown(uses, op_dtypes, cc, eligible=op_eligible)
    reason = reason.where(~(unknown & resolved.notna()), "resolved from the op's input dtypes")
    acts["uses_tc"] = resolved
    acts["tc_reason"] = coded_text(reason)

    # per instance row: kernel time, TC kernel time, any TC kernel (activities of
    # instances outside ``inst`` count nowhere)
    n = len(inst)
    counted = kernel & has_op
    krows = rows[counted]
    dur = gpu_time(acts).astype(np.int64, copy=False)[counted]
    tc = acts["uses_tc"].fillna(False).to_numpy(bool)[counted]
    has_kernel = np.bincount(krows, minlength=n) > 0
    any_tc = np.bincount(krows[tc], minlength=n) > 0
    inst["kernel_time"] = sum_by_row(krows, dur, n)
    inst["tc_kernel_time"] = sum_by_row(krows[tc], dur[tc], n)
    inst["tc_eligible"] = eligible_by_kernels(
        pd.Series(leaf_eligible, index=inst.index), pd.Series(any_tc, index=inst.index)
    ).to_numpy(bool)
    inst["uses_tc"] = pd.arrays.BooleanArray(any_tc, ~has_kernel)


def activity_rows(acts: pd.DataFrame, inst: pd.DataFrame) -> np.ndarray:
    """Row of ``inst`` owning each activity (-1 for none): ``acts["instance_row"]`` as
    :func:`perfguard.analysis.analyze` leaves it, else looked up by instance id."""
    if "instance_row" in acts.columns:
        return acts["instance_row"].to_numpy(np.int64)
    return instance_rows(inst["instance"].to_numpy(np.int64), acts["instance"].to_numpy(np.int64))


def sum_by_row(rows: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """int64 sums of ``values`` per row ``0..n-1``: ``bincount`` (float64) while every
    sum is exact in a double, else ``np.add.at`` in int64."""
    values = np.asarray(values, dtype=np.int64)
    if not len(values):
        return np.zeros(n, dtype=np.int64)
    if int(np.abs(values).sum(dtype=np.float64)) < 2**53:
        return np.rint(np.bincount(rows, weights=values, minlength=n)).astype(np.int64)
    out = np.zeros(n, dtype=np.int64)  # pragma: no cover - over 104 days of GPU time
    np.add.at(out, rows, values)  # pragma: no cover
    return out  # pragma: no cover


def _formula_keys(ranges: pd.DataFrame) -> pd.Series:
    """The name :func:`op_flops` looks formulas up by, per range.

    Kineto and ``emit_nvtx`` ranges are named ``aten::x``; ranges that
    :func:`perfguard.instrument` names by module path (``/model/fc/linear``)
    carry the aten op in ``op_type`` and their shapes in the payload.
    """
    name = ranges["name"].astype(object)
    by_type = ~name.str.contains("::", regex=False, na=False) & ranges["input_shapes"].notna()
    by_type &= ranges["op_type"].notna()
    return name.where(~by_type, "aten::" + ranges["op_type"].astype(str))


def gpu_keys(trace: Trace) -> tuple[pd.DataFrame, list[str]]:
    """Peak-table key per ``(rank, device_id)``, and one note per unknown GPU saying why."""
    dev = trace.devices.drop_duplicates(["rank", "device_id"])
    keys, notes = [], []
    for name, mem in zip(dev["name"], dev["memory_bytes"], strict=True):
        m = None if pd.isna(mem) else int(mem)
        key = match_gpu(name, m) if isinstance(name, str) else None
        keys.append(key)
        if key is None:
            notes.append(f"FLOP efficiency left empty for GPU {name!r}: {why_unknown(name)}")
    out = pd.DataFrame(
        {"rank": dev["rank"], "device_id": dev["device_id"], "gpu": pd.Series(keys, dtype=object)},
        copy=False,
    )
    return out, sorted(set(notes))


def range_flops(trace: Trace) -> pd.DataFrame | None:
    """``flops, bytes, compute_dtype, flop_formula`` of every range (rows aligned with
    ``trace.ranges``), counted once up the op tree; None when no op range has shapes
    (every formula needs them: ``emit_nvtx`` without ``record_shapes``, annotations)."""
    r = trace.ranges
    shaped = (r["kind"] == "op").to_numpy(bool) & r["input_shapes"].notna().to_numpy(bool)
    by_range = _range_flops(r, shaped) if shaped.any() else None
    if "xla_flops" in r and r["xla_flops"].notna().any():
        by_range = _with_xla_flops(r, by_range)
    if "tf_facts" in r and r["tf_facts"].notna().any():
        by_range = _with_tf_costs(r, by_range)
    return by_range


def _with_tf_costs(r: pd.DataFrame, by_range: pd.DataFrame | None) -> pd.DataFrame:
    """TensorFlow graph ops (XSpace) costed from their graph's shapes
    (:mod:`perfguard.analysis.flops.tensorflow`), once per distinct (type, facts); leaves
    under the step, nothing to count twice."""
    out = pd.DataFrame(_no_flops(len(r)), index=r.index) if by_range is None else by_range
    rows = np.flatnonzero(r["tf_facts"].notna().to_numpy(bool))
    kind = r["op_type"].astype(object).to_numpy()[rows]
    facts = r["tf_facts"].astype(object).to_numpy()[rows]
    codes, pairs = pd.factorize(
        pd.Series([f"{k}\x1f{f}" for k, f in zip(kind, facts, strict=True)])
    )
    costs = [tf_op_cost(*p.split("\x1f", 1)) for p in pairs]
    known = np.array([c is not None for c in costs] + [False])[codes]
    rows, codes = rows[known], codes[known]
    if not len(rows):
        return out
    columns = {
        "flops": np.array([c.flops if c and c.flops is not None else np.nan for c in costs]),
        "bytes": np.array([c.bytes if c and c.bytes is not None else np.nan for c in costs]),
    }
    for col, values in columns.items():
        v = out[col].to_numpy(np.float64, na_value=np.nan).copy()
        v[rows] = values[codes]
        kept = np.where(np.isnan(v), NONE, v if col == "flops" else np.rint(v))
        out[col] = pd.array(kept, dtype="Float64" if col == "flops" else "Int64")
    for col, attr in (("compute_dtype", "compute_dtype"), ("flop_formula", "formula")):
        text = out[col].astype(object).to_numpy().copy()
        text[rows] = np.array([getattr(c, attr, None) for c in costs], dtype=object)[codes]
        if col == "compute_dtype":
            text[rows] = _every_dtype(r["name"].astype(object).to_numpy()[rows], text[rows])
        out[col] = coded_text(text)
    return out


def _every_dtype(names: np.ndarray, dtypes: np.ndarray) -> np.ndarray:
    """Each TF op's dtypes as those of every call of its name (``fp32, int64``): one name
    is several nodes (:mod:`perfguard.trace.tf_names`: Adam's ``Add`` of fp32 moments and of
    its int64 step), and the executor runs them in no fixed order, so the first call's
    dtype, which an op's dtypes are, would change between runs of the same step."""
    frame = pd.DataFrame({"n": names, "d": dtypes}).dropna()
    every = frame.groupby("n")["d"].agg(lambda d: ", ".join(sorted(set(d))))
    return pd.Series(names, dtype=object).map(every).to_numpy(dtype=object)


def _with_xla_flops(r: pd.DataFrame, by_range: pd.DataFrame | None) -> pd.DataFrame:
    """XLA ops (XSpace) carry their FLOPs from the module's HLO, not from shapes: those
    rows take them as they are (leaves under the step: nothing to count twice)."""
    out = pd.DataFrame(_no_flops(len(r)), index=r.index) if by_range is None else by_range
    xla = r["xla_flops"].to_numpy(np.float64)
    has = ~np.isnan(xla)
    flops = out["flops"].to_numpy(np.float64, na_value=np.nan).copy()
    flops[has] = xla[has]
    out["flops"] = pd.array(np.where(np.isnan(flops), NONE, flops), dtype="Float64")
    formula = out["flop_formula"].astype(object).to_numpy().copy()
    formula[has] = "xla_hlo"
    out["flop_formula"] = coded_text(formula)
    return out


def add_flops(
    trace: Trace,
    acts: pd.DataFrame,
    inst: pd.DataFrame,
    by_range: pd.DataFrame | None,
) -> list[str]:
    """Add ``flops, bytes, compute_dtype, flop_formula, gpu, peak_flops`` to ``inst``
    (in place); returns notes (e.g. why a GPU's peak is unknown), each said once.
    ``by_range`` is :func:`range_flops` of the trace.

    FLOPs are computed per range from its shapes, then counted at one level
    of the op tree (:func:`count_once`), so ``aten::linear`` and the
    ``aten::addmm`` inside it are not both counted. The peak is that of the
    GPU the instance's first kernel ran on, on the Tensor Core path when
    the instance used TC (after :func:`add_tensor_cores`).
    """
    if by_range is not None:
        # the range of each instance by position (-1, so NA, for unassociated work)
        r = trace.ranges
        at = instance_rows(r["range_id"].to_numpy(np.int64), inst["instance"].to_numpy(np.int64))
        for col in by_range.columns:
            inst[col] = pd.api.extensions.take(by_range[col].array, at, allow_fill=True)
    else:  # nothing to cost: empty columns, without a per-range table to look up
        for col, values in _no_flops(len(inst)).items():
            inst[col] = values

    devices, notes = gpu_keys(trace)
    inst["gpu"] = coded_text(_first_kernel_gpu(acts, inst, devices))
    none = np.ones(len(inst), dtype=bool)
    peak = pd.Series(pd.arrays.FloatingArray(np.zeros(len(inst)), none), index=inst.index)
    tc = (
        inst["uses_tc"].fillna(False).astype(bool)
        if "uses_tc" in inst
        else pd.Series(False, index=inst.index)
    )
    for key in inst["gpu"].dropna().unique():
        rows = inst["gpu"] == key
        sub = peak_flops_series(key, inst.loc[rows, "compute_dtype"], tc[rows])
        peak[rows] = sub
    inst["peak_flops"] = peak
    return notes


def _no_flops(n: int) -> dict[str, ExtensionArray]:
    """The FLOP columns of ``n`` rows with nothing known (all NA)."""
    return {
        "flops": pd.arrays.FloatingArray(np.zeros(n), np.ones(n, dtype=bool)),
        "bytes": pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)),
        "compute_dtype": coded_text(np.full(n, None, dtype=object)),
        "flop_formula": coded_text(np.full(n, None, dtype=object)),
    }


def _range_flops(r: pd.DataFrame, shaped: np.ndarray) -> pd.DataFrame:
    """:func:`range_flops` of the ranges ``r``, costing the ``shaped`` ones."""
    by_range = pd.DataFrame(_no_flops(len(r)), index=r.index, copy=False)
    sub = r[shaped]
    frame = pd.DataFrame(
        {
            "name": _formula_keys(sub),
            "input_shapes": sub["input_shapes"],
            "dtypes": sub["dtypes"],
            "concrete_inputs": sub["concrete_inputs"] if "concrete_inputs" in sub else None,
        },
        copy=False,
    )
    cost = op_flops(frame).reindex(r.index)
    flops = count_once(cost["flops"], r["parent_id"], r["range_id"], cost["family"])
    nbytes = count_once(
        cost["bytes"].astype("Float64"), r["parent_id"], r["range_id"], cost["family"]
    )
    by_range["flops"] = flops.astype("Float64")
    by_range["bytes"] = nbytes.round().astype("Int64")
    by_range["compute_dtype"] = coded_text(cost["compute_dtype"].to_numpy(dtype=object))
    by_range["flop_formula"] = coded_text(cost["flop_formula"].to_numpy(dtype=object))
    return by_range


def _first_kernel_gpu(acts: pd.DataFrame, inst: pd.DataFrame, devices: pd.DataFrame) -> np.ndarray:
    """Peak-table key of the GPU each instance's first kernel ran on (NaN without one).

    Only the few distinct ``(rank, device_id)`` pairs are matched against ``devices``.
    """
    gpu = np.full(len(inst), np.nan, dtype=object)
    kernel = np.flatnonzero((acts["activity"] == "kernel").to_numpy(bool))
    rows = activity_rows(acts, inst)[kernel]
    owned = rows >= 0
    kernel, rows = kernel[owned], rows[owned]
    if not len(rows):
        return gpu
    at, first = unique_first(rows)  # each instance row and its first kernel
    kernel = kernel[first]
    pairs = pd.DataFrame({c: acts[c].to_numpy()[kernel] for c in ("rank", "device_id")}, copy=False)
    (code,) = group_codes(pairs)  # 0..k-1 over the distinct pairs
    _, rep = unique_first(code)
    key = pairs.iloc[rep].merge(devices, on=["rank", "device_id"], how="left")["gpu"]
    gpu[at] = key.to_numpy(dtype=object)[code]
    return gpu
