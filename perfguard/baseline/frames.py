"""Column types of the :class:`~perfguard.baseline.record.TestRecord` tables.

A record's DataFrames come out of the analysis with whatever dtypes the
trace reader produced (a flag column that is all missing is float64, a
string column may be ``object`` or ``str``). The store needs one fixed
type per column to write SQLite columns and to give the compare layer the
same dtypes whether a record was just measured or loaded from disk; this
module declares those types and converts a frame to them without losing a
value. ``conform_record(r)`` is exactly what ``Store.load_test`` returns
for ``r``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from perfguard.analysis.instructions import FUNCTION_COLUMNS
from perfguard.baseline.record import (
    COUNTER_COLUMNS,
    KERNEL_COLUMNS,
    OP_COLUMNS,
    OP_SAMPLE_COLUMNS,
    SAMPLE_COLUMNS,
    TestRecord,
)

Kind = Literal["int", "nullable_int", "float", "bool", "str"]

#: the record frames by attribute name: column -> kind
FRAME_TYPES: dict[str, dict[str, Kind]] = {
    "samples": {
        "iteration": "int",
        "gpu_time_ns": "int",
        "wall_time_ns": "int",
        "cpu_time_ns": "nullable_int",
        "round": "int",
        "profiled": "bool",
    },
    "op_samples": {
        "op_id": "str",
        "iteration": "int",
        "calls": "int",
        "gpu_time_ns": "int",
        "cpu_time_ns": "int",
    },
    "ops": {
        "op_id": "str",
        "op_name": "str",
        "direction": "str",
        "op_type": "str",
        "calls": "int",
        "kernel_count": "int",
        "cpu_time_total": "int",
        "gpu_time_total": "int",
        "tc_eligible": "bool",
        "using_tc": "bool",
        "tc_utilization": "float",
        "flops": "float",
        "bytes": "nullable_int",
        "flop_efficiency": "float",
        "dtypes": "str",
    },
    "kernels": {
        "op_id": "str",
        "op_name": "str",
        "kernel_name": "str",
        "calls": "int",
        "gpu_time_total": "int",
        "uses_tc": "bool",
    },
    "counters": {
        "op_id": "str",
        "op_name": "str",
        "counter": "str",
        "value": "float",
        "stable": "bool",
    },
    "functions": {
        "function": "str",
        "object": "str",
        "op": "str",
        "ir": "float",
        "ir_inclusive": "float",
        "est_cycles": "float",
    },
}

#: what a column a frame lacks holds (else missing): a sample of a record made before
#: timing rounds existed was captured
DEFAULTS: dict[tuple[str, str], object] = {("samples", "profiled"): True}

assert tuple(FRAME_TYPES["samples"]) == SAMPLE_COLUMNS
assert tuple(FRAME_TYPES["op_samples"]) == OP_SAMPLE_COLUMNS
assert tuple(FRAME_TYPES["ops"]) == OP_COLUMNS
assert tuple(FRAME_TYPES["kernels"]) == KERNEL_COLUMNS
assert tuple(FRAME_TYPES["counters"]) == COUNTER_COLUMNS
assert tuple(FRAME_TYPES["functions"]) == FUNCTION_COLUMNS

#: columns no measurement makes negative (times, counts): a negative one read back is damage
NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "samples": ("gpu_time_ns", "wall_time_ns", "cpu_time_ns"),
    "op_samples": ("calls", "gpu_time_ns", "cpu_time_ns"),
    "ops": ("calls", "kernel_count", "cpu_time_total", "gpu_time_total", "bytes"),
    "kernels": ("calls", "gpu_time_total"),
    "counters": (),
    "functions": (),
}
assert NON_NEGATIVE.keys() == FRAME_TYPES.keys()

#: SQLite column type of each kind
SQL_TYPES: dict[Kind, str] = {
    "int": "INTEGER",
    "nullable_int": "INTEGER",
    "float": "REAL",
    "bool": "INTEGER",
    "str": "TEXT",
}

#: pandas' default string dtype (``str`` on pandas 3, ``object`` before)
_STR_DTYPE = pd.Series(["x"]).dtype


def _convert(values: pd.Series, kind: Kind) -> pd.Series:
    if kind == "str":
        obj = values.astype(object)
        return obj.where(obj.notna(), None).astype(_STR_DTYPE)
    if kind == "bool":
        obj = values.astype(object)
        return obj.where(obj.notna(), None).astype("boolean")
    if kind == "float":
        return pd.to_numeric(values, errors="raise").astype("Float64").astype(np.float64)
    nums = pd.to_numeric(values, errors="raise").astype("Int64")
    if kind == "int" and not nums.isna().any():
        return nums.astype(np.int64)
    return nums


def conform_frame(name: str, frame: pd.DataFrame | None) -> pd.DataFrame:
    """``frame`` with exactly the contract columns of record table ``name``, in the fixed dtypes.

    Missing columns become all-missing (or their :data:`DEFAULTS`); extra columns are dropped (the
    contract does not carry them). The index becomes 0..n-1, row order kept.
    Required integer columns that hold a missing value become ``Int64``
    rather than losing it.
    """
    types = FRAME_TYPES[name]
    if frame is None:
        frame = pd.DataFrame()
    frame = frame.reset_index(drop=True)
    out = {}
    for col, kind in types.items():
        missing = DEFAULTS.get((name, col), pd.NA)
        values = frame[col] if col in frame else pd.Series([missing] * len(frame), dtype=object)
        out[col] = _convert(values, kind).reset_index(drop=True)
    return pd.DataFrame(out, index=pd.RangeIndex(len(frame)))


def text_in_numbers(name: str, rows: pd.DataFrame) -> str | None:
    """A number column of table ``name`` that holds text or bytes as read from the store
    (SQLite keeps what it is given: ``'NaN'`` would read as a missing value), or None.
    Only columns the driver could not read as numbers (object dtype) are looked at."""
    for col, kind in FRAME_TYPES[name].items():
        if kind != "str" and col in rows and rows[col].dtype == object:
            text = rows[col].map(lambda v: isinstance(v, (str, bytes)))
            if bool(text.any()):
                return f"{name}.{col} holds text ({str(rows[col][text].iloc[0])[:40]!r})"
    return None


def impossible(name: str, frame: pd.DataFrame) -> str | None:
    """What no stored record of table ``name`` can hold, in a frame read back from the store
    (conformed): a negative time or count, an infinite number; None when nothing is."""
    for col in NON_NEGATIVE[name]:
        if col in frame and bool((frame[col] < 0).any()):
            return f"{name}.{col} holds a negative value ({frame[col].min()})"
    for col, kind in FRAME_TYPES[name].items():
        if kind == "float" and col in frame and bool(np.isinf(frame[col].to_numpy()).any()):
            return f"{name}.{col} holds an infinite value"
    return None


def conform_record(record: TestRecord) -> TestRecord:
    """A copy of ``record`` with every frame in the fixed column types (:func:`conform_frame`)."""
    frames: dict[str, Any] = {
        name: conform_frame(name, getattr(record, name)) for name in FRAME_TYPES
    }
    return replace(record, **frames, meta=dict(record.meta))
