"""Deterministic counters per op and recorded iteration: the evidence of the gates.

A timing needs statistics because it varies from run to run; these do not:
an op's calls, kernel launches, FLOPs and bytes (from shapes), memcpy count
and bytes, host-device synchronisations, for the same code and the same
inputs, are the same numbers in every iteration of every run on any
machine. So the verdict compares them exactly (DESIGN.md "Verdicts"), on a
CPU-only runner too, where they are the main gate.

Synchronisations are counted two ways, both per op:

* ``syncs``: CUDA API calls that block the host until the device is done
  (:data:`SYNC_APIS`), attributed to the innermost op range that made them,
  as kernels are attributed through their launch;
* ``host_reads``: framework ops that read a device value on the host
  (:data:`HOST_READ_OPS`: ``.item()``, ``bool(tensor)``, ``nonzero``): on a
  GPU each one is a sync; on a CPU-only capture this is how a sync that a
  change adds is seen before it reaches a GPU.

Only the analysis layer's tables are read; the output is long-form so a new
counter is a new value of ``counter``, not a new column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.analysis import Analysis
from perfguard.analysis.attribution import enclosing_op

#: the columns of :func:`op_counters`' result
COUNTER_COLUMNS = ("op_id", "op_name", "iteration", "counter", "value")
#: counter names, in the order reports list them
COUNTERS = (
    "calls",
    "kernels",
    "flops",
    "bytes",
    "memcpy",
    "memcpy_bytes",
    "syncs",
    "host_reads",
)
#: CUDA runtime/driver calls that block the host until device work finishes
#: (the ``*Async`` copies do not; a plain ``cudaMemcpy`` to or from pageable memory does)
SYNC_APIS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cudaMemcpy3D",
    "cudaMemcpyFromSymbol",
    "cudaMemcpyToSymbol",
    "cudaMemset",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuMemcpyDtoH",
    "cuMemcpyHtoD",
    "cuMemcpy",
)
#: A graph compiler (TensorFlow's Grappler, XLA) decides how many ops and kernels a step
#: runs: a fusion makes three ops one, with the same work. Where a capture's ops are the
#: compiler's (:data:`COMPILED_FORMATS`; the record's ``meta[COMPILED_OPS]``), a fall of these
#: counters is not an improvement (a rise still regresses: more dispatches for the same code)
REWRITE_VARIANT = ("calls", "kernels")
#: ... and these move between ops as the fusion moves the work (``Relu`` holding the GEMM it
#: fused), while the step's total stays: per op they gate only when the total moved too
REWRITE_SPLIT = ("flops", "bytes")
#: the capture formats whose ops a graph compiler chose (XSpace: TensorFlow, JAX)
COMPILED_FORMATS = ("xplane", "xprof-json")
#: the record meta key that says its ops are a graph compiler's
COMPILED_OPS = "compiled_ops"
#: framework ops (leaf names) that read a tensor's value on the host
HOST_READ_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::equal")


def _api_base(names: pd.Series) -> pd.Series:
    """``cudaMemcpy_v3020`` -> ``cudaMemcpy`` (nsys appends the API version)."""
    return names.astype(str).str.replace(r"_v\d+$", "", regex=True)


def op_counters(analysis: Analysis) -> pd.DataFrame:
    """One row per (op, recorded iteration, counter) with a non-zero value.

    Columns :data:`COUNTER_COLUMNS`; ``iteration`` is the analysis's
    iteration number, ``value`` a float (FLOPs and bytes can pass 2**53 only
    in sums, which the caller forms). Only op instances inside an iteration
    count: set-up and warm-up work is not the measured code. FLOPs and
    bytes rows exist only where the op's shapes gave a figure.
    """
    inst = analysis.instances
    inst = inst[inst["iteration"].notna()]
    parts: list[pd.DataFrame] = []
    if len(inst):
        base = pd.DataFrame(
            {
                "op_id": inst["op_id"].astype(object).to_numpy(),
                "op_name": inst["op_name"].astype(object).to_numpy(),
                "iteration": inst["iteration"].to_numpy(dtype=np.int64),
            }
        )
        leaf = inst["name"].astype(object).to_numpy()
        columns = {
            "calls": np.ones(len(inst)),
            "kernels": inst["kernel_count"].to_numpy(dtype=np.float64, na_value=0.0),
            "flops": inst["flops"].to_numpy(dtype=np.float64, na_value=np.nan),
            "bytes": inst["bytes"].to_numpy(dtype=np.float64, na_value=np.nan),
            "host_reads": np.isin(leaf, HOST_READ_OPS).astype(np.float64),
        }
        for name, values in columns.items():
            parts.append(base.assign(counter=name, value=values))
    parts.append(_memcpy(analysis))
    parts.append(_syncs(analysis))
    parts = [p for p in parts if len(p)]
    out = pd.concat(parts, ignore_index=True) if parts else None
    if out is None or not len(out):
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COUNTER_COLUMNS})
    out = out[np.isfinite(out["value"].to_numpy()) & (out["value"].to_numpy() != 0)]
    g = out.groupby(["op_id", "iteration", "counter"], sort=True, observed=True)
    summed = g.agg(op_name=("op_name", "first"), value=("value", "sum")).reset_index()
    return summed[list(COUNTER_COLUMNS)].reset_index(drop=True)


def _memcpy(analysis: Analysis) -> pd.DataFrame:
    acts = analysis.activities
    if not len(acts):
        return pd.DataFrame()
    is_copy = (acts["activity"] == "memop").to_numpy() & (
        acts["name"].astype(str).str.contains("memcpy", case=False).to_numpy()
    )
    acts = acts[is_copy & acts["iteration"].notna().to_numpy()]
    if not len(acts):
        return pd.DataFrame()
    base = pd.DataFrame(
        {
            "op_id": acts["op_id"].astype(object).to_numpy(),
            "op_name": acts["op_name"].astype(object).to_numpy(),
            "iteration": acts["iteration"].to_numpy(dtype=np.int64),
        }
    )
    nbytes = acts["bytes"].to_numpy(dtype=np.float64, na_value=np.nan)
    return pd.concat(
        [
            base.assign(counter="memcpy", value=1.0),
            base.assign(counter="memcpy_bytes", value=nbytes),
        ],
        ignore_index=True,
    )


def _syncs(analysis: Analysis) -> pd.DataFrame:
    """Blocking API calls inside recorded iterations, each owned by its enclosing op."""
    api = analysis.trace.api_calls
    if not len(api):
        return pd.DataFrame()
    api = api[_api_base(api["name"]).isin(SYNC_APIS).to_numpy()]
    if not len(api):
        return pd.DataFrame()
    range_id = enclosing_op(
        analysis.trace,
        api["rank"].to_numpy(),
        api["pid"].to_numpy(),
        api["tid"].to_numpy(dtype=np.int64),
        api["start"].to_numpy(dtype=np.int64),
    )
    inst = analysis.instances
    owned = pd.Series(np.arange(len(inst)), index=inst["instance"].to_numpy())
    row = owned.reindex(range_id).to_numpy()
    keep = ~np.isnan(row)
    if not keep.any():
        return pd.DataFrame()
    rows = inst.iloc[row[keep].astype(np.int64)]
    rows = rows[rows["iteration"].notna()]
    return pd.DataFrame(
        {
            "op_id": rows["op_id"].astype(object).to_numpy(),
            "op_name": rows["op_name"].astype(object).to_numpy(),
            "iteration": rows["iteration"].to_numpy(dtype=np.int64),
            "counter": "syncs",
            "value": 1.0,
        }
    )
