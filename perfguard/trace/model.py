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
* ``graph_id`` on kernels and memops: the CUDA graph a replayed activity ran in
  (Kineto ``graph id``, CUPTI's ``graphId``), NA for work launched on its own:
  its launching call is ``cudaGraphLaunch``, not the op that recorded it.
* ``concrete_inputs`` on ranges: the scalar arguments of an op (stride,
  padding, dilation, groups, ...; Kineto ``Concrete Inputs``) as JSON text,
  aligned with ``input_shapes``/``dtypes``: FLOPs of a convolution need them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.arrays import factorize
from perfguard.environment import Environment
from perfguard.errors import TraceError

#: ``ranges.kind``: a categorical, since every analysis step asks "is it an op?"
#: of millions of ranges (a code compare instead of a string compare each time).
RANGE_KIND = pd.CategoricalDtype(["op", "async", "iteration"])

#: Every text column of the event tables (names, domains, op types, shapes,
#: directions, ...): a categorical, a 1-2 byte code a row instead of an 8-byte
#: pointer, since a capture repeats a few thousand distinct strings millions of
#: times (110 MiB less for three columns at 4.8M ``emit_nvtx`` ranges). Readers
#: may hand over plain text; :func:`conform` codes it, categories in lexical
#: order, as text sorts.
CODED_TEXT = pd.CategoricalDtype()
#: Row numbers and depths the readers and the analysis number themselves (range
#: ids, parents, depths, kernel and instance rows, op keys, counts) and ranks
#: (a process's place in its job, under its world size): 4 bytes a row (a table
#: of 2^31 rows would not fit in memory). A rank past 32 bits is no rank: the
#: readers refuse it, naming the file (:func:`checked_rank`). Other values a
#: capture states (times, device/process/thread/stream ids, correlation ids,
#: launch geometry) stay int64: a damaged capture may hold any 64-bit number
#: there, and its other figures are still worth reporting.
INDEX = "int32"


#: ``ranges.direction`` as :func:`perfguard.trace.ranges.finalize_ranges` codes it
DIRECTIONS = pd.CategoricalDtype(["bprop", "fprop"])

#: ``kernels``' launch geometry columns (only the kernel report reads them)
KERNEL_GEOMETRY = (
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
    "registers",
    "shared_mem",
)

#: Column name -> dtype for every table of the model.
SCHEMA: dict[str, dict[str, Any]] = {
    "ranges": {
        "range_id": INDEX,
        "name": CODED_TEXT,
        "start": "int64",
        "end": "int64",
        "rank": INDEX,
        "pid": "int64",
        "tid": "int64",
        "depth": INDEX,
        "parent_id": INDEX,
        "domain": CODED_TEXT,
        "category": CODED_TEXT,
        "kind": RANGE_KIND,
        "source": CODED_TEXT,
        "op_type": CODED_TEXT,
        "direction": CODED_TEXT,
        "seq": "Int64",
        "input_shapes": CODED_TEXT,
        "dtypes": CODED_TEXT,
        "concrete_inputs": CODED_TEXT,
        "call_site": CODED_TEXT,
    },
    "api_calls": {
        "start": "int64",
        "end": "int64",
        "rank": INDEX,
        "pid": "int64",
        "tid": "int64",
        "correlation_id": "int64",
        "name": CODED_TEXT,
    },
    "kernels": {
        "start": "int64",
        "end": "int64",
        "rank": INDEX,
        "pid": "int64",
        "device_id": "int64",
        "stream_id": "int64",
        "correlation_id": "int64",
        "name": CODED_TEXT,
        "short_name": CODED_TEXT,
        "grid_x": "Int64",
        "grid_y": "Int64",
        "grid_z": "Int64",
        "block_x": "Int64",
        "block_y": "Int64",
        "block_z": "Int64",
        "registers": "Int64",
        "shared_mem": "Int64",
        "graph_id": "Int64",
    },
    "memops": {
        "start": "int64",
        "end": "int64",
        "rank": INDEX,
        "pid": "int64",
        "device_id": "int64",
        "stream_id": "int64",
        "correlation_id": "int64",
        "kind": CODED_TEXT,
        "bytes": "Int64",
        "graph_id": "Int64",
    },
    "devices": {
        "rank": INDEX,
        "device_id": "int64",
        "name": "object",
        "sm_count": "Int64",
        "memory_bytes": "Int64",
        "compute_capability": "object",
    },
    "threads": {"rank": INDEX, "pid": "int64", "tid": "int64", "name": "object"},
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
        elif dtype in ("int64", INDEX):
            s = pd.Series(np.zeros(n, dtype=dtype), index=df.index)
        else:
            s = pd.Series(pd.NA, index=df.index, dtype=dtype)
        if dtype is CODED_TEXT:
            if not isinstance(s.dtype, pd.CategoricalDtype):
                s = pd.Series(coded_text(s), index=s.index)
        elif isinstance(dtype, pd.CategoricalDtype):
            if not (isinstance(s.dtype, pd.CategoricalDtype) and s.dtype == dtype):
                s = s.astype(dtype)
        elif dtype == INDEX and str(s.dtype) != dtype:
            s = _narrowed(s, dtype, f"{table}.{col}")
        elif dtype != "object" and str(s.dtype) != dtype:
            s = s.astype(dtype)
        out[col] = s
    # no copy: readers hand over freshly built columns (a copy of a 5M-range table is seconds)
    return pd.DataFrame(out, copy=False).reset_index(drop=True)


def coded_text(values: pd.Series | np.ndarray) -> pd.Categorical:
    """Text as :data:`CODED_TEXT` gives it, the same as ``astype("category")``;
    several times faster on a column that repeats a few strings millions of
    times (rows are grouped by object identity first,
    :func:`perfguard.arrays.factorize`)."""
    return categorical(*factorize(values))


def categorical(codes: np.ndarray, uniques: np.ndarray | list[Any]) -> pd.Categorical:
    """Codes into ``uniques`` (-1: missing) as :data:`CODED_TEXT`: equal values one
    category, the categories in lexical order, as text sorts."""
    codes = np.asarray(codes)
    uniques = np.asarray(uniques, dtype=object)
    same, values = pd.factorize(uniques)  # equal strings given as separate entries
    values = np.asarray(values, dtype=object)
    try:
        order = np.argsort(values, kind="stable")
    except TypeError:  # text mixed with numbers (a hostile capture): pandas orders it
        taken = uniques[np.clip(codes, 0, None)] if len(uniques) else np.full(len(codes), None)
        taken[codes < 0] = None
        return pd.Categorical(taken)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    new_code = np.where(same >= 0, rank[np.clip(same, 0, None)], -1) if len(same) else same
    if not (new_code == np.arange(len(new_code))).all():
        codes = np.append(new_code, -1)[codes]  # a missing value's -1 indexes the last entry
    return pd.Categorical.from_codes(codes, categories=pd.Index(values[order]))


def concat_tables(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat`` of tables, rows renumbered, that keeps coded text coded.

    pandas turns categorical columns whose categories differ into millions of
    objects; here their categories are united (in lexical order) first.
    """
    frames = list(frames)
    for col in dict.fromkeys(c for f in frames for c in f.columns):
        parts = [f[col] for f in frames if col in f.columns]
        dtypes = {p.dtype for p in parts}
        if len(dtypes) > 1 and all(isinstance(d, pd.CategoricalDtype) for d in dtypes):
            union = _united(p.array for p in parts)
            frames = [
                f.assign(**{col: f[col].cat.set_categories(union)}) if col in f.columns else f
                for f in frames
            ]
    return pd.concat(frames, ignore_index=True)


def concat_coded(parts: list[pd.Categorical]) -> pd.Categorical:
    """Coded text one after the other, the categories united in lexical order."""
    union = _united(parts)
    codes = [p.set_categories(union).codes for p in parts]
    return pd.Categorical.from_codes(np.concatenate(codes), categories=union)


def _united(parts: Iterable[pd.Categorical]) -> pd.Index:
    """The categories of ``parts`` together, in lexical order, typed as
    :func:`categorical` types them (by their values)."""
    values = {v for p in parts for v in p.categories}
    return pd.Index(np.array(sorted(values, key=_text_order), dtype=object))


def fill_text(a: pd.Series, b: pd.Series) -> pd.Series:
    """``a.fillna(b)`` for text, coded or not: ``a``'s value, or ``b``'s where ``a``
    has none; coded text stays coded (pandas refuses to fill a categorical from
    another with other categories)."""
    if not (isinstance(a.dtype, pd.CategoricalDtype) or isinstance(b.dtype, pd.CategoricalDtype)):
        return a.fillna(b)
    parts = [s.array if isinstance(s.dtype, pd.CategoricalDtype) else coded_text(s) for s in (a, b)]
    union = _united(parts)
    codes_a, codes_b = (p.set_categories(union).codes for p in parts)
    codes = np.where(codes_a >= 0, codes_a, codes_b)
    return pd.Series(pd.Categorical.from_codes(codes, categories=union), index=a.index)


def with_category(s: pd.Series, value: str) -> pd.Series:
    """``s`` able to hold ``value``: coded text gains it as a category (in lexical
    order), so ``fillna(value)`` and ``where(cond, value)`` work on it as on plain
    text; any other column is returned as it is."""
    if not isinstance(s.dtype, pd.CategoricalDtype) or value in s.cat.categories:
        return s
    return s.cat.set_categories(sorted([*s.cat.categories, value], key=_text_order))


def _text_order(value: Any) -> tuple[bool, Any]:
    return (not isinstance(value, str), value if isinstance(value, str) else repr(value))


def _narrowed(s: pd.Series, dtype: str, where: str) -> pd.Series:
    """``s`` as the 32-bit ``dtype``; a value outside 32 bits raises
    :class:`OverflowError` naming the column instead of wrapping around."""
    if len(s):
        lo, hi = s.min(), s.max()
        if lo < -(2**31) or hi >= 2**31:
            raise OverflowError(f"{where} holds {lo if lo < -(2**31) else hi}, outside 32 bits")
    return s.astype(np.dtype(dtype))


def checked_rank(path: str | Path, rank: int) -> int:
    """``rank``, or a :class:`perfguard.TraceError` naming ``path`` when it is past
    32 bits (:data:`INDEX`): no process has that place in a job."""
    if not -(2**31) <= rank < 2**31:
        raise TraceError(path, f"rank {rank} is past 32 bits: no process has that place in a job")
    return rank


@dataclass
class Trace:
    """A capture read into fixed tables (see :data:`SCHEMA`).

    ``meta`` holds ``format`` (``nsys-sqlite`` or ``kineto-json``),
    ``version``, ``path`` and whatever else the capture records (driver,
    CUDA, capture command, ...). ``notes`` holds one line per thing the
    reader repaired, dropped or clamped in the capture (a truncated tail, an
    unclosed range, a negative duration): the analysis and the reports
    show them, so a repaired capture is never silently taken at face value.
    ``environment``: the driver, clocks and library versions the capture records
    (:mod:`perfguard.trace.environments`); unknown fields are empty.
    """

    ranges: pd.DataFrame = field(default_factory=lambda: empty_table("ranges"))
    api_calls: pd.DataFrame = field(default_factory=lambda: empty_table("api_calls"))
    kernels: pd.DataFrame = field(default_factory=lambda: empty_table("kernels"))
    memops: pd.DataFrame = field(default_factory=lambda: empty_table("memops"))
    devices: pd.DataFrame = field(default_factory=lambda: empty_table("devices"))
    threads: pd.DataFrame = field(default_factory=lambda: empty_table("threads"))
    meta: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    environment: Environment = field(default_factory=Environment)

    def __post_init__(self) -> None:
        for table in SCHEMA:
            setattr(self, table, conform(table, getattr(self, table)))

    def __repr__(self) -> str:
        sizes = ", ".join(f"{t}={len(getattr(self, t))}" for t in SCHEMA)
        return f"Trace({self.meta.get('format', '?')} {self.meta.get('version', '?')}: {sizes})"


def merged_environment(traces: Iterable[Trace]) -> Environment:
    """The environment of traces merged into one (ranks): the first's, each field it does
    not know taken from the next that does."""
    envs = [t.environment for t in traces]
    return envs[0].filled_from(*envs[1:]) if envs else Environment()
