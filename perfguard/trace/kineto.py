"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip'd.

Three schema generations are handled (see ``shared/reference/kineto_and_hta.md``):

* modern (2023+): lower-case categories, ``ac2g`` flows, float ``ts`` with
  ns decimals;
* 2022: ``async_cpu_to_gpu`` flows;
* legacy (2021): ``Operator/Runtime/Kernel/Memcpy/Memset`` categories,
  string ``tid`` (``"stream 7"``), lower-case ``external id``.

Kernels are joined to their launching call on ``correlation`` (flows are
not needed and are incomplete in real traces). A GPU event carries the
device as its pid, so the launching process is taken from that call.

The event array is decoded piece by piece into typed structs
(:mod:`perfguard.trace.kineto_stream`), and each piece is turned into the
tables' columns at once (:class:`_Columns`), so no dict per event is ever
built and memory follows the output, not the file. Torch's own JSON bugs
are repaired there, each with a line in ``Trace.notes``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, eq
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionArray

from perfguard.arrays import factorize
from perfguard.errors import TraceError
from perfguard.trace.call_sites import first_user_frame
from perfguard.trace.compiled import expand_compiled
from perfguard.trace.environments import from_kineto
from perfguard.trace.kineto_sidecar import apply_sidecar
from perfguard.trace.kineto_split import read_split, split_worthwhile
from perfguard.trace.kineto_stream import (
    ARG_KEYS,
    NA_INT,
    Args,
    Event,
    Fallback,
    read_plain,
    stream_events,
)
from perfguard.trace.model import (
    NO_CORRELATION,
    Trace,
    checked_rank,
    concat_tables,
    merged_environment,
)
from perfguard.trace.names import is_backward_name, is_iteration_name, op_type_of
from perfguard.trace.ranges import finalize_ranges
from perfguard.trace.site_pass import apply_sites, read_sites, site_details

#: Legacy (2021) category names -> modern ones.
LEGACY_CATEGORIES = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Python": "python_function",
    "User annotation": "user_annotation",
}
RANGE_CATEGORIES = ("cpu_op", "user_annotation")
API_CATEGORIES = ("cuda_runtime", "cuda_driver")
MEMOP_CATEGORIES = ("gpu_memcpy", "gpu_memset")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)


def _check_plain(path: Path, data: Any) -> list[dict[str, Any]]:
    """The event list of a trace parsed by :func:`read_plain`; errors name the file."""
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(path, "JSON is not a Kineto/Chrome trace (no traceEvents list)")
    events = data["traceEvents"]
    if not events:
        raise TraceError(path, "trace holds no events (traceEvents is empty)")
    bad = next((i for i, e in enumerate(events) if not isinstance(e, dict)), None)
    if bad is not None:
        raise TraceError(
            path,
            f"not a valid trace: traceEvents[{bad}] is not an event object "
            f"(a JSON {_JSON_TYPES.get(type(events[bad]), 'value')})",
        )
    return events


_JSON_TYPES = {int: "number", float: "number", str: "string", list: "array", bool: "boolean"}
_JSON_TYPES[type(None)] = "null"

#: exceptions that malformed event data (wrong types, absurd values) raises in :func:`_read`
_MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError)


def _rank_of(path: Path, value: Any) -> int:
    """``distributedInfo.rank`` (or a rank from the file name) as an int, or TraceError."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TraceError(path, f"distributedInfo.rank is not an integer ({value!r})")
    try:
        rank = int(value)
    except ValueError:
        raise TraceError(path, f"distributedInfo.rank is not an integer ({value!r})") from None
    return checked_rank(path, rank)


def _dist_info(data: dict[str, Any]) -> dict[str, Any]:
    info = data.get("distributedInfo")
    return info if isinstance(info, dict) else {}


def _read_checked(path: Path, rank: int | None, rank_default: int = 0) -> tuple[Trace, int]:
    """:func:`_read`, with malformed event data reported as a TraceError naming the file."""
    try:
        return _read(path, rank, rank_default)
    except _MALFORMED as exc:
        problem = " ".join(str(exc).split())[:200]
        raise TraceError(
            path, f"malformed trace: unexpected event data ({type(exc).__name__}: {problem})"
        ) from exc


def read_kineto(path: str | Path, rank: int | None = None) -> Trace:
    """Read one Kineto trace file. ``rank`` overrides ``distributedInfo.rank``."""
    return _read_checked(Path(path), rank)[0]


def read_kineto_dir(path: str | Path) -> Trace:
    """Read a directory of per-rank Kineto files into one Trace with a ``rank`` column."""
    path = Path(path)
    try:
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
        )
    except OSError as exc:
        raise TraceError(path, f"cannot list directory ({exc.strerror or exc})") from None
    if not files:
        raise TraceError(path, "directory holds no .json or .json.gz trace files")
    traces: list[Trace] = []
    ranks: list[int] = []
    for i, f in enumerate(files):
        m = _RANK_IN_NAME.search(f.name)
        tr, r = _read_checked(f, None, int(m.group(1)) if m else i)
        if r in ranks:
            other = files[ranks.index(r)].name
            raise TraceError(f, f"rank {r} appears twice in {path} (also in {other})")
        ranks.append(r)
        traces.append(tr)
    merged = {
        t: concat_tables([getattr(tr, t) for tr in traces])
        for t in ("ranges", "api_calls", "kernels", "memops", "devices", "threads")
    }
    offset = np.cumsum([0] + [len(tr.ranges) for tr in traces[:-1]])
    parts = []
    for tr, off in zip(traces, offset, strict=True):
        parent = tr.ranges["parent_id"]
        parts.append(np.where(parent >= 0, parent + off, parent))
    merged["ranges"]["range_id"] = np.arange(len(merged["ranges"]), dtype=np.int64)
    if parts:
        merged["ranges"]["parent_id"] = np.concatenate(parts)
    meta = dict(traces[0].meta)
    meta.update(path=str(path), ranks=sorted(ranks), files=[str(f) for f in files])
    notes = [f"{f.name}: {n}" for f, tr in zip(files, traces, strict=True) for n in tr.notes]
    return Trace(meta=meta, notes=notes, environment=merged_environment(traces), **merged)


#: |time| in µs above which ns overflow int64 (~292 years; epoch µs today are ~1.7e15)
_MAX_US = 9.2e15


def _check_times(path: Path, x: pd.DataFrame) -> None:
    """Every GPU/CPU event needs a finite ``ts`` (and ``dur`` when given) in µs."""
    for field, required in (("ts", True), ("dur", False)):
        v = pd.to_numeric(x[field], errors="coerce").to_numpy(np.float64)
        present = x[field].notna().to_numpy() if not required else np.ones(len(x), bool)
        with np.errstate(invalid="ignore"):
            bad = present & ~(np.abs(v) < _MAX_US)  # NaN, inf, non-numbers, absurd values
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            ev = x.iloc[i]
            value = ev[field]
            value = value.item() if isinstance(value, np.generic) else value
            missing = value is None or value != value  # absent or NaN
            has = f"no {field}" if missing else f"{field} {value!r}, not a time in µs"
            raise TraceError(
                path,
                f"malformed trace: event {x.index[i]} ({ev['cat']} {str(ev['name'])[:60]!r}) "
                f"has {has}",
            )


def _us_to_ns(values: pd.Series) -> np.ndarray:
    """Kineto µs (int epoch µs, or float with ns decimals) -> int64 ns, exactly."""
    v = pd.to_numeric(values, errors="coerce")
    if v.isna().any():
        v = v.fillna(0)
    if pd.api.types.is_integer_dtype(v.dtype):
        return v.to_numpy(np.int64) * 1000
    f = v.to_numpy(np.float64)
    whole = np.floor(f)
    return whole.astype(np.int64) * 1000 + np.rint((f - whole) * 1000).astype(np.int64)


def _int_column(s: pd.Series, default: int) -> np.ndarray:
    """Numbers or numeric strings (``"stream 7"`` -> 7) as int64.

    Numbers convert in one C pass; only values that are not numbers are
    searched for digits, once per distinct text (legacy string tids repeat).
    """
    if s.dtype == object:
        num = pd.to_numeric(s, errors="coerce")
        text = (num.isna() & s.notna()).to_numpy()
        if text.any():
            codes, uniques = factorize(s[text].astype(str))
            digits = pd.Series(uniques, dtype=object).str.extract(r"(-?\d+)")[0]
            found = pd.to_numeric(digits, errors="coerce").to_numpy(np.float64)
            num = num.astype(np.float64)
            num[text] = found[codes]
        s = num
    return pd.to_numeric(s, errors="coerce").fillna(default).astype(np.int64).to_numpy()


def _args_frame(args: pd.Series) -> pd.DataFrame:
    """The ``args`` the reader uses, one column per :class:`Args` field (:data:`ARG_KEYS`)."""
    records = [a if isinstance(a, dict) else {} for a in args]
    frame = pd.DataFrame.from_records(records, columns=list(ARG_KEYS.values()), index=args.index)
    frame.columns = list(ARG_KEYS)
    return frame


#: event fields the reader uses, in :class:`Event` and in the plain reader's records
_FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur"]
KNOWN_CATEGORIES = RANGE_CATEGORIES + API_CATEGORIES + ("kernel",) + MEMOP_CATEGORIES
#: the tables' columns read from an event's ``args``, in each table's column order, after
#: the event's own (times, ids, name): ``(table, column, Args field, kind)``. Kinds: ``int``
#: (nullable Int64), ``xyz`` (``[x, y, z]``: three nullable columns ``column_x/_y/_z``),
#: ``json`` (compact JSON text), ``site`` (the call stack's innermost user frame). Both
#: readers' events go through this one table (:meth:`_Columns._build`).
_ARG_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("kernels", "grid", "grid", "xyz"),
    ("kernels", "block", "block", "xyz"),
    ("kernels", "registers", "registers", "int"),
    ("kernels", "shared_mem", "shared_memory", "int"),
    ("kernels", "graph_id", "graph_id", "int"),
    ("memops", "bytes", "bytes", "int"),
    ("memops", "graph_id", "graph_id", "int"),
    ("ranges", "seq", "seq", "int"),
    ("ranges", "input_shapes", "input_dims", "json"),
    ("ranges", "dtypes", "input_type", "json"),
    ("ranges", "concrete_inputs", "concrete", "json"),
    ("ranges", "call_site", "call_stack", "site"),
)


@dataclass(frozen=True)
class _Kept:
    """One piece's kept events, each field a column: ``code`` is the table each goes to
    (:data:`_TABLE_OF_CATEGORY`), times in ns, ids as int64, names one object each."""

    code: np.ndarray
    start: np.ndarray
    end: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    name: np.ndarray
    correlation_id: np.ndarray


class _ArgColumns(Protocol):
    """The ``args`` of one piece's kept events, a field at a time (:data:`_ARG_COLUMNS`)."""

    def subset(self, mask: np.ndarray) -> _ArgColumns:
        """The events where ``mask`` is true."""
        ...

    def column(self, field: str, kind: str, absent: int = NA_INT) -> np.ndarray:
        """Field ``field`` (an :class:`Args` field) of every event as ``kind`` says: int64
        with ``absent`` for a missing value, (n, 3) int64, JSON text or None, the user's
        line or None."""
        ...


class _StructArgs:
    """``args`` as decoded :class:`Args` structs (the streaming reader): typed already,
    each field read in one C-level pass."""

    def __init__(self, args: list[Args]) -> None:
        self.args = args

    def subset(self, mask: np.ndarray) -> _StructArgs:
        return _StructArgs(list(compress(self.args, mask)))

    def column(self, field: str, kind: str, absent: int = NA_INT) -> np.ndarray:
        get = attrgetter(field)
        if kind == "int":
            return _int_field(get, self.args, absent)
        values = list(map(get, self.args))
        if kind == "xyz":
            return _triples(values)
        if kind == "json":
            return _raw_json_text(values)
        if not any(values):  # no call stack (with_stack=False): skip the parsing
            return np.full(len(values), None, dtype=object)
        return _call_sites(pd.Series(values, dtype=object))


class _FrameArgs:
    """``args`` as a frame of any JSON values (the plain reader: one column per
    :class:`Args` field, :func:`_args_frame`), turned into the same columns."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def subset(self, mask: np.ndarray) -> _FrameArgs:
        return _FrameArgs(self.frame[mask])

    def column(self, field: str, kind: str, absent: int = NA_INT) -> np.ndarray:
        s = self.frame[field]
        if kind == "int":
            return _int_column(s, absent)
        if kind == "xyz":
            return np.stack([_triple(s, i) for i in range(3)], axis=1)
        if kind == "json":
            return _json_text(s).to_numpy()
        return _call_sites(s)


def _call_sites(stacks: pd.Series) -> np.ndarray:
    """Each call stack's innermost frame in the user's code; None without a stack."""
    stack = stacks.where(stacks.notna() & (stacks != ""), None)
    if stack.notna().any():  # with_stack=True
        stack = first_user_frame(stack)
    return stack.to_numpy(dtype=object)


#: events per piece when the plain reader's dicts are turned into columns
_PLAIN_PIECE = 200_000


class _Columns:
    """The reader's tables, built piece by piece from decoded events.

    Only the events the tables keep (``X`` events of known categories, and
    ``thread_name`` metadata) are turned into columns; numbers become numpy
    columns per piece, and each distinct name is held once.
    """

    def __init__(self, path: Path):
        self.path = path
        self.parts: dict[str, list[pd.DataFrame]] = {
            t: [] for t in ("api", "kernels", "memops", "ranges", "threads")
        }
        self.cats: dict[Any, None] = {}  # distinct categories (renamed), in order seen
        self.legacy = False
        self.any_known = False
        self.n = 0  # events so far: the index of the next one
        self.names: dict[Any, Any] = {}  # one object per distinct name
        self.not_text = 0  # names that were not strings

    # -- input

    def add_structs(self, events: list[Event]) -> None:
        """One piece of typed :class:`Event` structs (the streaming reader).

        Each field becomes a numpy column in one C-level pass
        (``np.fromiter(map(attrgetter(...)))``); categories are looked up once
        per distinct value, and the kept events are picked with
        ``itertools.compress``: no Python code runs per event.
        """
        n = len(events)
        if not n:
            return
        phs = list(map(_PH, events))
        cats = list(map(_CAT, events))
        seen = dict.fromkeys(cats)  # distinct categories, in order of appearance
        self.legacy |= any(c in LEGACY_CATEGORIES for c in seen)
        renamed = {c: LEGACY_CATEGORIES.get(c, c) if isinstance(c, str) else c for c in seen}
        self.cats.update(dict.fromkeys(renamed.values()))
        code_of = {c: _TABLE_OF_CATEGORY.get(r, -1) for c, r in renamed.items()}
        code = np.fromiter(map(code_of.__getitem__, cats), np.int8, n)
        del cats
        known = code >= 0
        self.any_known |= bool(known.any())
        keep = np.fromiter(map(eq, phs, repeat("X")), bool, n) & known
        if "M" in set(phs):  # metadata events are few: their names are looked at alone
            meta = compress(events, np.fromiter(map(eq, phs, repeat("M")), bool, n))
            t = [e for e in meta if e.name == "thread_name"]
            if t:
                self.parts["threads"].append(
                    pd.DataFrame(
                        {
                            "pid": [e.pid for e in t],
                            "tid": [e.tid for e in t],
                            "name": [e.args.name for e in t],
                        },
                        dtype=object,
                    )
                )
        del phs
        if keep.any():
            self._add_structs(
                list(compress(events, keep)), code[keep], np.flatnonzero(keep) + self.n
            )
        self.n += n

    def _add_structs(self, ev: list[Event], code: np.ndarray, index: np.ndarray) -> None:
        """Columns of the kept events ``ev``; ``code``: each one's table
        (:data:`_TABLE_OF_CATEGORY`)."""
        k = len(ev)
        ts = _float_field(_TS, ev)  # None -> NaN
        dur = _float_field(_DUR, ev)
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(ts) < _MAX_US) | (np.abs(dur) >= _MAX_US)
        if bad.any():  # the plain check words the error
            cat = [LEGACY_CATEGORIES.get(c, c) for c in map(_CAT, ev)]
            x = pd.DataFrame(
                {"cat": cat, "name": list(map(_NAME, ev)), "ts": ts, "dur": dur}, index=index
            )
            _check_times(self.path, x)
        start = _float_us_to_ns(ts)
        end = start + _float_us_to_ns(np.nan_to_num(dur, nan=0.0))
        del ts, dur
        names = self.names
        args = _StructArgs(list(map(_ARGS_OF, ev)))
        kept = _Kept(
            code=code,
            start=start,
            end=end,
            pid=_int_pass(_PID, ev, -1),
            tid=_int_pass(_TID, ev, -1),
            name=np.fromiter(map(names.setdefault, map(_NAME, ev), map(_NAME, ev)), object, k),
            correlation_id=args.column("correlation", "int", NO_CORRELATION),
        )
        self._build(kept, args)

    def _build(self, ev: _Kept, args: _ArgColumns) -> None:
        """The one table builder: each kept event's row in its table (``ev.code``), the
        event's own fields and, per :data:`_ARG_COLUMNS`, the fields of its ``args``."""
        for table, which in _TABLE_CODES:
            mask = (ev.code >= _CPU_OP) if table == "ranges" else (ev.code == which)
            i = np.flatnonzero(mask)
            if not len(i):
                continue
            a = args.subset(mask)
            cols: dict[str, np.ndarray | ExtensionArray] = {"start": ev.start[i], "end": ev.end[i]}
            if table in ("api", "ranges"):
                cols.update(pid=ev.pid[i], tid=ev.tid[i])
            if table != "ranges":
                cols["correlation_id"] = ev.correlation_id[i]
            if table in ("kernels", "memops"):  # its device and stream, else its pid and tid
                dev, stream = a.column("device", "int"), a.column("stream", "int")
                cols["device_id"] = np.where(dev != NA_INT, dev, ev.pid[i])
                cols["stream_id"] = np.where(stream != NA_INT, stream, ev.tid[i])
            cols["name"] = ev.name[i]
            if table == "ranges":
                cols["category"] = np.asarray(_TABLE_CATEGORY, dtype=object)[ev.code[i]]
            for t, column, field, kind in _ARG_COLUMNS:
                if t != table:
                    continue
                values = a.column(field, kind)
                if kind == "xyz":
                    for col, axis in enumerate("xyz"):
                        cols[f"{column}_{axis}"] = _nullable(values[:, col])
                else:
                    cols[column] = _nullable(values) if kind == "int" else values
            self.parts[table].append(pd.DataFrame(cols))

    def add_dicts(self, events: list[dict[str, Any]]) -> None:
        """Events parsed by the plain reader (the fallback), a piece at a time."""
        for lo in range(0, len(events), _PLAIN_PIECE):
            piece = events[lo : lo + _PLAIN_PIECE]
            ev = pd.DataFrame.from_records(piece, columns=_FIELDS + ["args"])
            ev.index += self.n
            names_of = partial(_names_at, ev)
            keep, threads, cat = self._select(ev["ph"].to_numpy(object), ev["cat"], names_of)
            x = ev[keep].drop(columns=["ph"]).assign(cat=cat[keep])
            m = ev[threads]
            names = pd.DataFrame.from_records(
                [a if isinstance(a, dict) else {} for a in m["args"]], columns=["name"]
            )
            th = pd.DataFrame(
                {
                    "pid": m["pid"].to_numpy(object),
                    "tid": m["tid"].to_numpy(object),
                    "name": names["name"].to_numpy(object),
                },
                dtype=object,
            )
            self._add(x.drop(columns=["args"]), _args_frame(x["args"]), th)
            self.n += len(ev)

    def _select(
        self, ph: np.ndarray, cat: Any, names_of: Callable[[np.ndarray], Any]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(kept X events, thread_name events, categories renamed), noting categories seen."""
        # categories repeat: renamed once per distinct value, not per event
        codes, uniques = pd.factorize(np.asarray(cat, dtype=object), use_na_sentinel=False)
        distinct = pd.Series(uniques, dtype=object)
        self.legacy |= bool(distinct.isin(list(LEGACY_CATEGORIES)).any())
        renamed = distinct.replace(LEGACY_CATEGORIES)
        self.cats.update(dict.fromkeys(renamed))
        known_d = renamed.isin(KNOWN_CATEGORIES).to_numpy()
        known = known_d[codes]
        self.any_known |= bool(known.any())
        keep = (ph == "X") & known
        threads = ph == "M"
        if threads.any():  # metadata events are few: their names are looked at alone
            m = np.flatnonzero(threads)
            threads[m] = np.asarray(pd.Series(names_of(m), dtype=object) == "thread_name")
        return keep, threads, renamed.to_numpy(dtype=object)[codes]

    def _shared_names(self, names: pd.Series) -> np.ndarray:
        """Names with one object per distinct name across pieces; non-strings as text."""
        codes, uniques = pd.factorize(names)
        u = np.empty(len(uniques) + 1, dtype=object)
        for i, v in enumerate(uniques):  # once per distinct name of the piece
            if not isinstance(v, str):
                self.not_text += int((codes == i).sum())
                v = json.dumps(v) if isinstance(v, (int, float, bool)) else str(v)
            u[i] = self.names.setdefault(v, v)
        u[-1] = None  # codes of missing names are -1
        return u[codes]

    def _add(self, x: pd.DataFrame, a: pd.DataFrame, th: pd.DataFrame) -> None:
        """Turn one piece's kept events (``x``, ``a``: their args) into table columns."""
        if len(th):
            self.parts["threads"].append(th)
        if not len(x):
            return
        _check_times(self.path, x)
        start = _us_to_ns(x["ts"])
        args = _FrameArgs(a)
        kept = _Kept(
            code=x["cat"].map(_TABLE_OF_CATEGORY).to_numpy(np.int8),
            start=start,
            end=start + _us_to_ns(x["dur"].fillna(0)),
            pid=_int_column(x["pid"], -1),
            tid=_int_column(x["tid"], -1),
            name=self._shared_names(x["name"]),
            correlation_id=args.column("correlation", "int", NO_CORRELATION),
        )
        self._build(kept, args)

    # -- two processes (:mod:`perfguard.trace.kineto_split`)

    def take_parts(self) -> dict[str, list[pd.DataFrame]]:
        """The tables' pieces so far, handed over (this object keeps none)."""
        parts = self.parts
        self.parts = {t: [] for t in parts}
        return parts

    def absorb_parts(self, parts: dict[str, list[pd.DataFrame]]) -> None:
        """Append pieces that come after this object's (read by another process)."""
        for table, pieces in parts.items():
            self.parts[table].extend(pieces)

    def state(self) -> dict[str, Any]:
        """What this object learnt of the file beyond its tables."""
        return {
            "cats": list(self.cats),
            "legacy": self.legacy,
            "any_known": self.any_known,
            "n": self.n,
            "not_text": self.not_text,
        }

    def absorb_state(self, state: dict[str, Any]) -> None:
        """Merge the :meth:`state` of the object that read the rest of the file."""
        self.cats.update(dict.fromkeys(state["cats"]))
        self.legacy |= state["legacy"]
        self.any_known |= state["any_known"]
        self.n += state["n"]
        self.not_text += state["not_text"]

    # -- output

    def table(self, name: str, columns: list[str]) -> pd.DataFrame:
        parts = self.parts[name]
        if not parts:
            return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


_PH, _CAT, _NAME, _PID, _TID, _TS, _DUR, _ARGS_OF = map(attrgetter, _FIELDS + ["args"])
#: the table an event goes to, by (modern) category; its ``category`` column by code
_TABLE_CATEGORY = ("api", "kernel", "memop", *RANGE_CATEGORIES)
_API, _KERNEL, _MEMOP, _CPU_OP = 0, 1, 2, 3
#: the tables in the order :meth:`_Columns._build` fills them, with their code (ranges:
#: every code from ``_CPU_OP`` on)
_TABLE_CODES = (("api", _API), ("kernels", _KERNEL), ("memops", _MEMOP), ("ranges", _CPU_OP))
_TABLE_OF_CATEGORY = {
    **dict.fromkeys(API_CATEGORIES, _API),
    "kernel": _KERNEL,
    **dict.fromkeys(MEMOP_CATEGORIES, _MEMOP),
    **{c: _CPU_OP + i for i, c in enumerate(RANGE_CATEGORIES)},
}


def _names_at(ev: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The ``name`` of the events at ``rows`` of a piece of the plain reader's events."""
    return ev["name"].to_numpy(object)[rows]


def _float_us_to_ns(f: np.ndarray) -> np.ndarray:
    """µs as float64 (exact for integers below 2**53) -> int64 ns, as :func:`_us_to_ns`."""
    whole = np.floor(f)
    return whole.astype(np.int64) * 1000 + np.rint((f - whole) * 1000).astype(np.int64)


def _float_field(get: Callable[[Any], Any], objs: list[Any]) -> np.ndarray:
    """A float field of every struct as float64 in one pass, ``None`` as NaN."""
    try:
        return np.fromiter(map(get, objs), np.float64, len(objs))
    except TypeError:  # None among them
        return np.array(list(map(get, objs)), dtype=np.float64)


def _int_pass(get: Callable[[Any], Any], objs: list[Any], default: int) -> np.ndarray:
    """An id field (``pid``/``tid``) as int64 in one pass; text ids the slow way."""
    try:
        return np.fromiter(map(get, objs), np.int64, len(objs))
    except (TypeError, ValueError, OverflowError):
        return _int_column(pd.Series(list(map(get, objs)), dtype=object), default)


def _int_field(get: Callable[[Any], Any], objs: Any, absent: int = NA_INT) -> np.ndarray:
    """An int field of every struct as int64, ``null`` (a repaired NaN) as ``absent``."""
    values = list(map(get, objs))
    try:
        return np.fromiter(values, np.int64, len(values))
    except TypeError:  # None among them: only in a repaired file
        return pd.Series(values, dtype=object).fillna(absent).to_numpy(np.int64)


def _triples(values: list[Any]) -> np.ndarray:
    """``[x, y, z]`` per struct as an (n, 3) int64 array, ``null`` as absent."""
    try:
        return np.array(values, dtype=np.int64).reshape(len(values), 3)
    except (TypeError, ValueError):  # None among them: only in a repaired file
        na = (NA_INT, NA_INT, NA_INT)
        return np.array([na if v is None else v for v in values], dtype=np.int64)


def _nullable(v: np.ndarray) -> pd.arrays.IntegerArray:
    """int64 with :data:`NA_INT` for "absent" -> a nullable Int64 column."""
    return pd.arrays.IntegerArray(v, v == NA_INT)


def _raw_json_text(raws: list[Any]) -> np.ndarray:
    """Raw JSON values (``b""`` when absent) -> compact JSON text, parsed once per distinct text."""
    if not any(map(len, raws)):  # nothing recorded (no record_shapes): skip the hashing
        return np.full(len(raws), None, dtype=object)
    return _json_text(pd.Series(list(map(bytes, raws)), dtype=object)).to_numpy()


def _decode(path: Path) -> tuple[_Columns, dict[str, Any], list[str]]:
    """Stream the file into columns; the plain reader when the streaming one declines."""
    cols = _Columns(path)
    try:
        if split_worthwhile(path):
            top, notes = read_split(path, cols, _Columns)
        else:
            top, notes = stream_events(path, cols.add_structs)
    except Fallback:
        data = read_plain(path)
        cols = _Columns(path)
        cols.add_dicts(_check_plain(path, data))
        return cols, data, []
    if cols.n == 0:
        raise TraceError(path, "trace holds no events (traceEvents is empty)")
    return cols, top, notes


def _read(path: Path, rank: int | None, rank_default: int = 0) -> tuple[Trace, int]:
    cols, data, notes = _decode(path)
    if not cols.any_known:
        seen = [c for c in cols.cats if c is not None and c == c]
        found = ", ".join(sorted(map(str, seen))[:8]) or "none"
        raise TraceError(
            path, f"no PyTorch profiler events in this trace (categories seen: {found})"
        )
    if rank is None:
        rank = _rank_of(path, _dist_info(data).get("rank", rank_default))
    api_calls = cols.table("api", ["start", "end", "pid", "tid", "correlation_id", "name"])
    launcher = (
        api_calls[api_calls["correlation_id"] != NO_CORRELATION]
        .drop_duplicates("correlation_id")
        .set_index("correlation_id")["pid"]
    )
    gpu_cols = ["start", "end", "correlation_id", "device_id", "stream_id", "name"]
    kernels = cols.table("kernels", gpu_cols)
    kernels["pid"] = _launching_pid(kernels, launcher)
    kernels["short_name"] = _short_names(kernels["name"])
    memops = cols.table("memops", gpu_cols)
    memops["pid"] = _launching_pid(memops, launcher)
    memops["kind"] = memops["name"].str.replace(r"\s*\(.*\)$", "", regex=True)
    ranges = apply_sidecar(path, cols.table("ranges", _RANGE_COLUMNS), notes)
    site_pass = read_sites(path, notes)  # the call-site pass's exact lines, where it ran
    if site_pass is not None:
        ranges = apply_sites(ranges, site_pass, notes)
    ranges = _ranges(ranges)
    for df in (api_calls, kernels, memops, ranges):
        df["rank"] = rank
    ranges, compiled_notes = expand_compiled(ranges)
    notes.extend(compiled_notes)
    if cols.not_text:
        notes.append(f"{cols.not_text} event name(s) were not text (e.g. a number); read as text")
    unknown = int((ranges["name"] == "unknown").sum())
    if unknown:
        notes.append(
            f"{unknown} op(s) are named 'unknown': torch writes that in place of a "
            "record_function name with non-ASCII or control characters, whose real name is "
            "not in the file"
        )
    trace = Trace(
        ranges=finalize_ranges(ranges),
        api_calls=api_calls,
        kernels=kernels,
        memops=memops,
        devices=_devices(data, rank),
        threads=_threads(cols.table("threads", ["pid", "tid", "name"]), rank),
        meta=_meta(path, data, set(cols.cats), cols.legacy)
        | (
            {"site_details": site_details(site_pass), "line_runs": site_pass.lines}
            if site_pass is not None
            else {}
        ),
        notes=notes,
        environment=from_kineto(data),
    )
    return trace, rank


def _launching_pid(g: pd.DataFrame, launcher: pd.Series) -> np.ndarray:
    """The pid of the runtime call with the GPU event's correlation id, or -1."""
    return g["correlation_id"].map(launcher).fillna(-1).astype(np.int64).to_numpy()


def _triple(s: pd.Series, i: int) -> np.ndarray:
    """Element ``i`` of ``[x, y, z]`` lists (grid, block) as int64; :data:`NA_INT` where
    absent."""
    if s.dtype != object or not len(s):
        return np.full(len(s), NA_INT, dtype=np.int64)
    return _int_column(pd.to_numeric(s.str[i], errors="coerce"), NA_INT)


def _short_names(names: pd.Series) -> pd.Series:
    """``void ns::kernel<T>(args)`` -> ``kernel`` (computed per distinct name)."""
    codes, uniques = pd.factorize(names.fillna(""))
    u = pd.Series(uniques, dtype="object")
    base = u.str.replace(r"^void\s+", "", regex=True).str.replace(r"\(.*$", "", regex=True)
    # drop template arguments, then namespaces
    base = base.str.replace(r"<.*>", "", regex=True).str.split("::").str[-1].str.strip()
    base = base.where(base != "", u)
    return pd.Series(base.to_numpy(dtype=object)[codes], index=names.index, dtype="object")


#: the ranges table's columns as :class:`_Columns` builds them
_RANGE_COLUMNS = [
    "start",
    "end",
    "pid",
    "tid",
    "name",
    "category",
    "seq",
    "input_shapes",
    "dtypes",
    "concrete_inputs",
    "call_site",
]


def _ranges(r: pd.DataFrame) -> pd.DataFrame:
    names = r["name"].astype(object)
    r["kind"] = np.where(is_iteration_name(names), "iteration", "op").astype(object)
    r["source"] = "kineto"
    r["op_type"] = op_type_of(names)
    r["bprop"] = is_backward_name(names).to_numpy(dtype=bool)
    r["seq"] = pd.to_numeric(r["seq"], errors="coerce").astype("Int64")
    return r


def _json_text(s: pd.Series) -> pd.Series:
    """Lists (shapes, dtypes) as compact JSON text, so tables stay flat.

    The streaming reader hands over each value's raw JSON bytes (``b""`` when
    absent): each distinct text is parsed and re-written once.
    """
    out = pd.Series(None, index=s.index, dtype="object")
    if not len(s):
        return out
    if isinstance(s.iloc[0], bytes):
        codes, uniques = pd.factorize(s)
        text = np.array(
            [
                json.dumps(v, separators=(",", ":"))
                if (v := json.loads(u) if u else None) is not None
                else None
                for u in uniques
            ]
            + [None],
            dtype=object,
        )
        return pd.Series(text[codes], index=s.index, dtype="object")
    ok = s.notna()
    if ok.any():
        out[ok] = [json.dumps(v, separators=(",", ":")) for v in s[ok]]
    return out


def _devices(data: dict[str, Any], rank: int) -> pd.DataFrame:
    props = data.get("deviceProperties") or []
    df = pd.DataFrame.from_records(
        [p for p in props if isinstance(p, dict)],
        columns=["id", "name", "numSms", "totalGlobalMem", "computeMajor", "computeMinor"],
    )
    cc = (
        df["computeMajor"].astype("Int64").astype(str)
        + "."
        + df["computeMinor"].astype("Int64").astype(str)
    )
    return pd.DataFrame(
        {
            "rank": rank,
            "device_id": df["id"],
            "name": df["name"],
            "sm_count": df["numSms"],
            "memory_bytes": df["totalGlobalMem"],
            "compute_capability": cc.where(df["computeMajor"].notna(), None),
        },
        copy=False,
    )


def _threads(m: pd.DataFrame, rank: int) -> pd.DataFrame:
    pid = pd.to_numeric(m["pid"], errors="coerce")
    tid = pd.to_numeric(m["tid"], errors="coerce")
    ok = pid.notna() & tid.notna()
    return pd.DataFrame(
        {"rank": rank, "pid": pid[ok], "tid": tid[ok], "name": m["name"][ok]}, copy=False
    ).astype({"pid": np.int64, "tid": np.int64})


def _meta(path: Path, data: dict[str, Any], cats: set[Any], legacy: bool) -> dict[str, Any]:
    if legacy:
        schema = "legacy-2021"
    elif "async_cpu_to_gpu" in cats:
        schema = "2022"
    else:
        schema = "modern"
    meta: dict[str, Any] = {
        "format": "kineto-json",
        "path": str(path),
        "version": schema,
        "schema_version": data.get("schemaVersion"),
    }
    for key in ("cuda_runtime_version", "cuda_driver_version", "cupti_version"):
        if key in data:
            meta[key] = data[key]
    info = data.get("distributedInfo")
    if isinstance(info, dict):
        meta["distributed"] = {k: info.get(k) for k in ("backend", "rank", "world_size")}
    return meta
