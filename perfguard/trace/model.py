"""The Trace model: one set of pandas tables whatever the capture format.

Readers fill the columns their format has and leave the rest empty, with the
same names and dtypes, so analysis code never branches on the source format.
All times are int64 nanoseconds on one clock per rank.

Columns beyond DESIGN.md, and why:

* ``rank`` on every event table: a directory of per-rank Kineto files becomes
  one Trace; timestamps of different ranks are not comparable.
* ``pid`` on kernels and memops: a correlation id is unique only within one
  process (nsys ``globalPid``; Kineto resolves it from the launching call).
* ``kind`` on ranges: ``op`` (an NVTX range or framework op that can own
  kernels), ``iteration`` (``ProfilerStep#N`` or ``perfguard.iteration``, an
  iteration marker, never an op) or ``async`` (a start/end range closed on
  another thread, which cannot nest); a categorical (:data:`RANGE_KIND`).
* ``category`` on ranges: the Kineto category (``cpu_op``,
  ``user_annotation``) or ``nvtx``.
* ``concrete_inputs`` on ranges: the scalar arguments of an op (stride,
  padding, dilation, groups, ...; Kineto ``Concrete Inputs``) as JSON text,
  aligned with ``input_shapes``/``dtypes``: FLOPs of a convolution need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: ``ranges.kind``: a categorical, since every analysis step asks "is it an op?"
#: of millions of ranges (a code compare instead of a string compare each time).
RANGE_KIND = pd.CategoricalDtype(["op", "async", "iteration"])

#: A text column with a handful of distinct values (``category``, ``source``,
#: ``direction`` of ranges): stored as a categorical, a 1-byte code a row instead
#: of an 8-byte pointer (110 MiB less at 4.8M ``emit_nvtx`` ranges); readers may
#: hand over plain text, :func:`conform` codes it.
CODED_TEXT = pd.CategoricalDtype()
#: ``ranges.direction`` as :func:`perfguard.trace.ranges.finalize_ranges` codes it
DIRECTIONS = pd.CategoricalDtype(["bprop", "fprop"])

#: ``kernels``' launch geometry columns (only the kernel report reads them)
KERNEL_GEOMETRY = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers",
                   "shared_mem")  # fmt: skip

#: Column name -> dtype for every table of the model.
SCHEMA: dict[str, dict[str, Any]] = {
    "ranges": {
        "range_id": "int64",
        "name": "object",
        "start": "int64",
        "end": "int64",
        "rank": "int64",
        "pid": "int64",
        "tid": "int64",
        "depth": "int64",
        "parent_id": "int64",
        "domain": "object",
        "category": CODED_TEXT,
        "kind": RANGE_KIND,
        "source": CODED_TEXT,
        "op_type": "object",
        "direction": CODED_TEXT,
        "seq": "Int64",
        "input_shapes": "object",
        "dtypes": "object",
        "concrete_inputs": "object",
        "call_site": "object",
    },
    "api_calls": {
        "start": "int64",
        "end": "int64",
        "rank": "int64",
        "pid": "int64",
        "tid": "int64",
        "correlation_id": "int64",
        "name": "object",
    },
    "kernels": {
        "start": "int64",
        "end": "int64",
        "rank": "int64",
        "pid": "int64",
        "device_id": "int64",
        "stream_id": "int64",
        "correlation_id": "int64",
        "name": "object",
        "short_name": "object",
        "grid_x": "Int64",
        "grid_y": "Int64",
        "grid_z": "Int64",
        "block_x": "Int64",
        "block_y": "Int64",
        "block_z": "Int64",
        "registers": "Int64",
        "shared_mem": "Int64",
    },
    "memops": {
        "start": "int64",
        "end": "int64",
        "rank": "int64",
        "pid": "int64",
        "device_id": "int64",
        "stream_id": "int64",
        "correlation_id": "int64",
        "kind": "object",
        "bytes": "Int64",
    },
    "devices": {
        "rank": "int64",
        "device_id": "int64",
        "name": "object",
        "sm_count": "Int64",
        "memory_bytes": "Int64",
        "compute_capability": "object",
    },
    "threads": {"rank": "int64", "pid": "int64", "tid": "int64", "name": "object"},
}

#: ``parent_id`` of a top-level range.
NO_PARENT = -1
#: ``correlation_id`` of an event that has none.
NO_CORRELATION = -1


def empty_table(table: str) -> pd.DataFrame:
    """An empty DataFrame with the model's columns and dtypes for ``table``."""
    cols = SCHEMA[table]
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in cols.items()})


def conform(table: str, df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with exactly the model's columns for ``table``, in order.

    Missing columns are added empty (NA, or "" for text), extra columns are
    dropped, dtypes are coerced. Integer columns that must not be missing are
    checked by the readers before this point.
    """
    cols = SCHEMA[table]
    out = {}
    n = len(df)
    for col, dtype in cols.items():
        if col in df.columns:
            s = df[col]
        elif dtype == "object":
            s = pd.Series([None] * n, index=df.index, dtype="object")
        elif dtype == "int64":
            s = pd.Series(np.zeros(n, dtype=np.int64), index=df.index)
        else:
            s = pd.Series(pd.NA, index=df.index, dtype=dtype)
        if dtype is CODED_TEXT:
            if not isinstance(s.dtype, pd.CategoricalDtype):
                s = s.astype(CODED_TEXT)
        elif isinstance(dtype, pd.CategoricalDtype):
            if not (isinstance(s.dtype, pd.CategoricalDtype) and s.dtype == dtype):
                s = s.astype(dtype)
        elif dtype != "object" and str(s.dtype) != dtype:
            s = s.astype(dtype)
        out[col] = s
    # no copy: readers hand over freshly built columns (a copy of a 5M-range table is seconds)
    return pd.DataFrame(out, copy=False).reset_index(drop=True)


@dataclass
class Trace:
    """A capture read into fixed tables (see :data:`SCHEMA`).

    ``meta`` holds ``format`` (``nsys-sqlite`` or ``kineto-json``),
    ``version``, ``path`` and whatever else the capture records (driver,
    CUDA, capture command, ...). ``notes`` holds one line per thing the
    reader repaired, dropped or clamped in the capture (a truncated tail, an
    unclosed range, a negative duration): the analysis and the reports
    show them, so a repaired capture is never silently taken at face value.
    """

    ranges: pd.DataFrame = field(default_factory=lambda: empty_table("ranges"))
    api_calls: pd.DataFrame = field(default_factory=lambda: empty_table("api_calls"))
    kernels: pd.DataFrame = field(default_factory=lambda: empty_table("kernels"))
    memops: pd.DataFrame = field(default_factory=lambda: empty_table("memops"))
    devices: pd.DataFrame = field(default_factory=lambda: empty_table("devices"))
    threads: pd.DataFrame = field(default_factory=lambda: empty_table("threads"))
    meta: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for table in SCHEMA:
            setattr(self, table, conform(table, getattr(self, table)))

    def __repr__(self) -> str:
        sizes = ", ".join(f"{t}={len(getattr(self, t))}" for t in SCHEMA)
        return f"Trace({self.meta.get('format', '?')} {self.meta.get('version', '?')}: {sizes})"
