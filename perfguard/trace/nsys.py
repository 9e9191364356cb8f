"""Reader for Nsight Systems SQLite exports (``nsys export --type sqlite``).

Facts this relies on (see ``shared/reference/nsys_schema.md``):

* tables that received no rows are not created: a missing table is empty;
* the version lives in ``META_DATA_EXPORT`` (2023.3+), ``EXPORT_META_DATA``
  (2022.1-2023.1) or nowhere (older: inferred from install paths);
* ``globalTid`` = HW:8 | VM:8 | PID:24 | TID:24 bits; ``globalPid`` is the
  same with the TID bits cleared;
* correlation ids are unique only within a process, so every join carries
  the pid;
* with CUDA backtraces every API call has a second row (``eventClass`` 67):
  only classes 0 (runtime) and 1 (driver) are kept;
* NVTX ranges are event types 59/70 (push/pop) and 60/71 (start/end); the
  name is ``text`` or the registered string ``textId``; domains are
  declared by event type 75 rows, per process;
* columns are selected by name: tools append columns and newer schemas add
  them.
"""

from __future__ import annotations

import itertools
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.environment import Environment
from perfguard.errors import TraceError
from perfguard.trace.environments import from_nsys
from perfguard.trace.gpu_ranges import Launches, RangeFilter, filter_finalized, keep_mask
from perfguard.trace.model import (
    KERNEL_GEOMETRY,
    NO_CORRELATION,
    RANGE_KIND,
    Trace,
    categorical,
)
from perfguard.trace.names import is_iteration_name, op_type_of, parse_range_names
from perfguard.trace.pyprof import MODULE_MARKER, TRACE_MARKER, apply_markers
from perfguard.trace.ranges import finalize_ranges
from perfguard.trace.sanity import last_timestamp, repair_times

NVTX_PUSH_POP = (59, 70)
NVTX_START_END = (60, 71)
NVTX_DOMAIN_CREATE = 75
#: ``eventClass`` of CUDA runtime and driver API rows (67 = backtrace duplicate).
API_EVENT_CLASSES = (0, 1)
#: ``copyKind`` values (nsys ENUM_CUDA_MEMCPY_OPER).
COPY_KINDS = {
    0: "Memcpy Unknown",
    1: "Memcpy HtoD",
    2: "Memcpy DtoH",
    3: "Memcpy HtoA",
    4: "Memcpy AtoH",
    5: "Memcpy AtoA",
    6: "Memcpy AtoD",
    7: "Memcpy DtoA",
    8: "Memcpy DtoD",
    9: "Memcpy HtoH",
    10: "Memcpy PtoP",
    11: "Memcpy HtoD (UVM)",
    12: "Memcpy DtoH (UVM)",
    13: "Memcpy DtoD (UVM)",
}
#: the name of a kernel whose name id is not in StringIds
UNKNOWN_KERNEL = "<unknown kernel>"
_INSTALL_VERSION = re.compile(r"nsight-systems[-/ ](?:cli/)?(\d{4}\.\d+\.\d+)", re.I)
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: rows per bulk read (bounds the text SQLite builds for one read)
_CHUNK_ROWS = 1 << 20
#: threads that run bulk reads
_READERS = 2


def is_sqlite(path: Path) -> bool:
    """True when the file starts with the SQLite header."""
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == _SQLITE_MAGIC
    except OSError:
        return False


class _Db:
    """A read-only export with the table/column lookups the reader needs.

    Each thread queries through its own connection; bulk reads run their
    queries on a small pool of threads (SQLite releases the GIL while it
    works), so reading overlaps the parsing of what was read.
    """

    def __init__(self, path: Path, lenient: bool = False) -> None:
        self.path = path
        #: decode text that is not valid UTF-8 with replacement characters (slower)
        self.lenient = lenient
        self.uri = path.resolve().as_uri() + "?mode=ro"
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        try:
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except sqlite3.DatabaseError:
            self.close()
            raise
        self.tables = {r[0] for r in rows}
        self._cols: dict[str, dict[str, str]] = {}

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # used by this thread only; closed by :meth:`close` once every thread is done
            conn = sqlite3.connect(self.uri, uri=True, check_same_thread=False)
            if self.lenient:
                conn.text_factory = _lenient_text
            with self._lock:
                self._conns.append(conn)
            conn.execute("PRAGMA query_only = 1")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for conn in self._conns:
            conn.close()

    def _fetch_one(self, sql: str) -> tuple[Any, ...]:
        return self.conn.execute(sql).fetchone()

    def _prefetch(self, queries: list[str]) -> Generator[tuple[Any, ...], None, None]:
        """Results of single-row ``queries`` in order, at most two running ahead."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(_READERS, thread_name_prefix="perfguard-db")
        pending: deque[Future[tuple[Any, ...]]] = deque()
        todo = iter(queries)
        try:
            for sql in itertools.islice(todo, _READERS):
                pending.append(self._pool.submit(self._fetch_one, sql))
            while pending:
                result = pending.popleft().result()
                for sql in itertools.islice(todo, 1):
                    pending.append(self._pool.submit(self._fetch_one, sql))
                yield result
        finally:
            for fut in pending:
                fut.cancel()
            for fut in pending:
                if not fut.cancelled():
                    fut.exception()  # let it finish; its error is not ours to raise

    def columns(self, table: str) -> dict[str, str]:
        """``table``'s columns and their declared types."""
        if table not in self._cols:
            rows = self.conn.execute(f"PRAGMA table_info('{table}')").fetchall()
            self._cols[table] = {r[1]: str(r[2] or "") for r in rows}
        return self._cols[table]

    def text_affinity(self, table: str, col: str) -> bool:
        """Whether SQLite gives ``col`` TEXT affinity (its rules 1-2 on the declared
        type): a value stored there is then text, NULL or a blob, never a number."""
        declared = self.columns(table).get(col, "").upper()
        return "INT" not in declared and any(k in declared for k in ("CHAR", "CLOB", "TEXT"))

    def has(self, table: str, *cols: str) -> bool:
        return table in self.tables and all(c in self.columns(table) for c in cols)

    def ints(self, sql: str, ncols: int) -> np.ndarray:
        """Run a query whose columns are all integers (NULLs coalesced in SQL)."""
        cur = self.conn.execute(sql)
        flat = np.fromiter(itertools.chain.from_iterable(cur), dtype=np.int64)
        return flat.reshape(-1, ncols)

    def _chunks(self, table: str, where: str) -> list[str] | None:
        """``WHERE`` clauses that split ``table`` into rowid ranges, in rowid order."""
        try:
            # two queries: SQLite answers a lone min() or max() of the rowid from the
            # b-tree's ends, but scans the whole table for both in one SELECT
            (lo,) = self.conn.execute(f"SELECT min(rowid) FROM {table}").fetchone()
            (hi,) = self.conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()
        except sqlite3.OperationalError:  # a table without rowid
            return None
        cond = f" AND ({where})" if where else ""
        if lo is None:
            return [f"WHERE 0{cond}"]
        if hi - lo < 16 * _CHUNK_ROWS:  # dense rowids (the usual case): equal rowid ranges
            bounds = list(range(lo, hi + 1, _CHUNK_ROWS))
        else:  # sparse or damaged rowids: a chunk boundary every _CHUNK_ROWS rows
            n = self.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            bounds = [lo] + [
                self.conn.execute(
                    f"SELECT rowid FROM {table} ORDER BY rowid LIMIT 1 OFFSET {k}"
                ).fetchone()[0]
                for k in range(_CHUNK_ROWS, n, _CHUNK_ROWS)
            ]
        ends = [b - 1 for b in bounds[1:]] + [hi]
        return [f"WHERE rowid BETWEEN {a} AND {b}{cond}" for a, b in zip(bounds, ends, strict=True)]

    def read(
        self,
        table: str,
        ints: list[str],
        texts: tuple[str, ...] = (),
        where: str = "",
        text_filter: Callable[[str], str] | None = None,
    ) -> tuple[list[np.ndarray], list[TextCodes]]:
        """Integer and text expressions over the rows of ``table``, in rowid order.

        Returns one int64 array per expression of ``ints`` and, per expression
        of ``texts``, its non-NULL values (the caller knows which rows have
        one) as codes into the distinct values (:class:`TextCodes`: each
        chunk's values are coded as they arrive, so a million repeated names
        are never a million Python strings at once). SQLite writes each column
        of a chunk of rows as one text (``group_concat``) that numpy parses or
        Python splits: several times faster than a Python tuple per row.
        Anything but a clean list of integers (a NULL, a real, text) falls
        back to :meth:`ints`, which raises as it always did. ``text_filter`` rewrites each chunk's
        NUL-separated text at once before it is split (one pass over the
        bytes instead of a Python call per value).
        """
        chunks = self._chunks(table, where)
        aggs = [f"group_concat({e})" for e in ints] + [f"group_concat({e}, char(0))" for e in texts]
        int_parts: list[list[np.ndarray]] = [[] for _ in ints]
        text_parts = [TextCodes() for _ in texts]
        queries = [f"SELECT count(*), {', '.join(aggs)} FROM {table} {c}" for c in chunks or []]
        results = self._prefetch(queries)
        for n, *values in results:
            parsed = [_parse_ints(v, int(n)) for v in values[: len(ints)]]
            cols = [c for c in parsed if c is not None]
            if len(cols) < len(parsed):
                results.close()
                chunks = None
                break
            for part, col in zip(int_parts, cols, strict=True):
                part.append(col)
            for coded, text in zip(text_parts, values[len(ints) :], strict=True):
                if text is not None:
                    text = str(text)
                    coded.add((text_filter(text) if text_filter else text).split("\0"))
        if chunks is None:
            cond = f" WHERE {where}" if where else ""
            a = self.ints(f"SELECT {', '.join(ints)} FROM {table}{cond}", len(ints))
            cond = f"{cond} AND" if where else " WHERE"
            sql = f"SELECT {{e}} FROM {table}{cond} {{e}} IS NOT NULL"
            text_parts = [TextCodes.of([r[0] for r in self.rows(sql.format(e=e))]) for e in texts]
            return [np.ascontiguousarray(a[:, i]) for i in range(len(ints))], text_parts
        arrays = [np.concatenate(p) if len(p) != 1 else p[0] for p in int_parts]
        return arrays, text_parts

    def int_columns(self, table: str, exprs: list[str], where: str = "") -> list[np.ndarray]:
        """Integer expressions over the rows of ``table`` (see :meth:`read`)."""
        return self.read(table, exprs, (), where)[0]

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql).fetchall()


class TextCodes:
    """A text column as codes into its distinct values, in order of first appearance
    (what ``pd.factorize`` gives), built chunk by chunk."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self._parts: list[np.ndarray] = []

    @classmethod
    def of(cls, values: list[Any]) -> TextCodes:
        out = cls()
        out.add(values)
        return out

    def add(self, values: list[Any]) -> None:
        """Code one chunk's values: a dict lookup each, each distinct value hashed in once."""
        index = self.index
        for v in dict.fromkeys(values):
            index.setdefault(v, len(index))
        self._parts.append(np.fromiter(map(index.__getitem__, values), np.int64, len(values)))

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    @property
    def codes(self) -> np.ndarray:
        return np.concatenate(self._parts) if self._parts else np.zeros(0, dtype=np.int64)

    @property
    def values(self) -> np.ndarray:
        return np.array(list(self.index), dtype=object)


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _parse_ints(text: object, n: int) -> np.ndarray | None:
    """``"1,-2,3"`` -> int64 array of length ``n``; None when it is anything else."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if not isinstance(text, str):
        return None
    try:
        values = np.fromstring(text, dtype=np.int64, sep=",")
    except ValueError:  # a real, text, or an empty value
        return None
    return values if len(values) == n else None


def _col(db: _Db, table: str, col: str, default: str = "NULL") -> str:
    return col if col in db.columns(table) else default


def read_nsys(path: str | Path, range_filter: RangeFilter | None = None) -> Trace:
    """Read an nsys SQLite export into a :class:`Trace`.

    ``range_filter`` keeps only the NVTX ranges that enclose GPU work (see
    :mod:`perfguard.trace.gpu_ranges`); by default every range is kept.
    Raises :class:`TraceError` when the file is not an nsys export or is
    damaged.
    """
    path = Path(path)
    try:
        return _read_file(path, lenient=False, range_filter=range_filter)
    except _Undecodable:
        # text that is not UTF-8 (a damaged name): read again, replacing the bad bytes
        return _read_file(path, lenient=True, range_filter=range_filter)


class _Undecodable(Exception):
    """SQLite text that is not valid UTF-8."""


def _read_file(path: Path, lenient: bool, range_filter: RangeFilter | None = None) -> Trace:
    try:
        db = _Db(path, lenient)
    except sqlite3.DatabaseError as exc:
        raise TraceError(path, f"cannot open as SQLite ({exc})") from None
    try:
        if "StringIds" not in db.tables:
            raise TraceError(path, "SQLite file is not an nsys export (no StringIds table)")
        return _read(db, range_filter)
    except sqlite3.OperationalError as exc:
        if "decode" in str(exc) and not lenient:
            raise _Undecodable from None
        raise TraceError(path, f"damaged or truncated SQLite export ({exc})") from None
    except sqlite3.DatabaseError as exc:
        raise TraceError(path, f"damaged or truncated SQLite export ({exc})") from None
    finally:
        db.close()


def _read(db: _Db, range_filter: RangeFilter | None = None) -> Trace:
    strings = _strings(db)
    launches: Future[Launches | None] = Future()
    select = _selector(range_filter, launches) if range_filter is not None else None
    # NVTX, the largest table, is read on a thread of its own while this one reads the rest
    with ThreadPoolExecutor(1, thread_name_prefix="perfguard-nvtx") as pool:
        nvtx = pool.submit(_nvtx_ranges, db, strings, select)
        try:
            api = _api_calls(db, strings)
            kernels = _kernels(db, strings)
            memops = _memops(db)
            if range_filter is not None:  # the NVTX thread waits for them to select ranges
                launches.set_result(Launches.of(api, [kernels, memops]))
        finally:
            if not launches.done():  # failed before: the NVTX thread must not wait forever
                launches.set_result(None)
            ranges, done, selected = nvtx.result()
    tables, notes = repair_times(
        {"ranges": ranges, "api_calls": api, "kernels": kernels, "memops": memops}, db.path
    )
    api, kernels, memops = tables["api_calls"], tables["kernels"], tables["memops"]
    if not done:
        ranges = _close_unclosed(tables["ranges"], api, kernels, memops, notes=notes)
        ranges = finalize_ranges(ranges)
    ranges = apply_markers(ranges)  # PyProf/DLProf markers: wrappers folded into their ops
    found = launches.result()
    if range_filter is not None and not selected and found is not None:
        ranges = filter_finalized(ranges, found, range_filter.keep_names)
    return Trace(
        ranges=ranges,
        api_calls=api,
        kernels=kernels,
        memops=memops,
        devices=_devices(db),
        threads=_threads(db, strings),
        meta=_meta(db, strings),
        notes=notes,
        environment=_environment(db),
    )


def _selector(range_filter: RangeFilter, launches: Future[Launches | None]) -> _Select:
    """The NVTX thread's test of which ranges enclose GPU work (``--gpu-ranges-only``);
    it answers None (keep all, filter after the markers are folded) for a capture with
    PyProf/DLProf markers, whose wrappers name bprop ops after fprop ops."""

    def select(cols: dict[str, np.ndarray], names: pd.Series, codes: np.ndarray) -> Any:
        found = launches.result()
        text = names.fillna("").astype(str)
        if found is None or text.str.startswith((TRACE_MARKER, MODULE_MARKER)).any():
            return None
        keep = range_filter.keep_names
        named = names.isin(keep).to_numpy(dtype=bool)[codes] if keep else None
        return keep_mask(found, cols, named)

    return select


def _close_unclosed(
    ranges: pd.DataFrame, *others: pd.DataFrame, notes: list[str] | None = None
) -> pd.DataFrame:
    """Close ranges without an end at the capture's last timestamp (as nsys's
    reports do), in one pass.

    Their true extent is unknown, so only the outermost unclosed op range of each
    thread stays an op (a capture stopped inside ``train``: it still owns
    what ran in it); the others become ``async`` ranges, which never nest or own
    kernels. Otherwise a program that pushed 19k ranges and never popped them
    would nest 19k deep, and every op name below would repeat the whole chain
    (quadratic time, memory and report size).
    """
    missing = ranges["end"].isna().to_numpy(dtype=bool)
    if not missing.any():
        ranges["end"] = ranges["end"].astype(np.int64)
        return ranges
    last = last_timestamp(ranges, *others)
    ranges["end"] = ranges["end"].fillna(last).astype(np.int64)
    cand = np.flatnonzero(missing & (ranges["kind"] == "op").to_numpy(dtype=bool))
    sub = ranges.iloc[cand][["pid", "tid", "start"]]
    outer = sub.sort_values("start", kind="stable").drop_duplicates(["pid", "tid"]).index
    demote = np.setdiff1d(cand, outer.to_numpy())
    if len(demote):
        kind = ranges["kind"].copy()
        kind.iloc[demote] = "async"
        ranges["kind"] = kind
    if notes is not None:
        notes.append(
            f"{int(missing.sum()):,} NVTX ranges were never closed: closed at the capture's end "
            f"({last:,} ns)"
            + (
                f"; {len(demote):,} of them nested in another unclosed range of their thread "
                "are kept out of the op tree (their extent is unknown)"
                if len(demote)
                else ""
            )
        )
    return ranges


class _Strings:
    """StringIds as a vectorised id -> text lookup.

    A dense table indexed by id when the ids are dense (always, in a real
    export); a sorted-id search when they are not, so one damaged id of 2^31
    costs nothing instead of a 17 GB table. Unknown and negative ids give None.
    """

    def __init__(self, ids: np.ndarray, values: np.ndarray) -> None:
        keep = ids >= 0
        ids, values = ids[keep], values[keep]
        values = np.asarray([_text(v) for v in values], dtype=object)
        self.dense = not len(ids) or int(ids.max()) < 4 * len(ids) + (1 << 16)
        if self.dense:
            self.table = np.full(int(ids.max()) + 1 if len(ids) else 1, None, dtype=object)
            self.table[ids] = values
        else:
            order = np.argsort(ids, kind="stable")
            self.ids, self.table = ids[order], values[order]

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(len(ids), None, dtype=object)
        if self.dense:
            ok = (ids >= 0) & (ids < len(self.table))
            out[ok] = self.table[ids[ok]]
            return out
        pos = np.clip(np.searchsorted(self.ids, ids), 0, max(len(self.ids) - 1, 0))
        ok = self.ids[pos] == ids if len(self.ids) else np.zeros(len(ids), dtype=bool)
        out[ok] = self.table[pos[ok]]
        return out


def _text(value: object) -> str | None:
    """A name as text: an export may hold an integer or a blob where text belongs."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _strings(db: _Db) -> _Strings:
    rows = db.rows("SELECT id, value FROM StringIds WHERE typeof(id) = 'integer'")
    if not rows:
        return _Strings(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))
    ids, values = zip(*rows, strict=True)
    return _Strings(np.asarray(ids, dtype=np.int64), np.asarray(values, dtype=object))


def _split_tid(gtid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF


def _api_calls(db: _Db, strings: _Strings) -> pd.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not db.has(t, "start", "end", "correlationId", "nameId"):
        return pd.DataFrame()
    where = ""
    if "eventClass" in db.columns(t):
        where = f"eventClass IN {API_EVENT_CLASSES}"
    start, end, gtid, corr, name_id = db.int_columns(
        t,
        [
            "start",
            "end",
            "coalesce(globalTid, 0)",
            f"coalesce(correlationId, {NO_CORRELATION})",
            "nameId",
        ],
        where,
    )
    pid, tid = _split_tid(gtid)
    # one lookup and one regex per distinct name id, not per call
    codes, ids = pd.factorize(name_id)
    names = _categorical_strings(pd.Series(strings(ids), dtype="object"))
    return pd.DataFrame(
        {
            "start": start,
            "end": end,
            "pid": pid,
            "tid": tid,
            "correlation_id": corr,
            "name": pd.Series(names.to_numpy(dtype=object)[codes], dtype="object"),
        },
        copy=False,
    )


def _categorical_strings(s: pd.Series) -> pd.Series:
    """Strip CUDA API version suffixes once per distinct name (``_v7000``)."""
    codes, uniques = pd.factorize(s.fillna(""))
    clean = pd.Series(uniques, dtype="object").str.replace(r"_v\d+$", "", regex=True)
    return pd.Series(clean.to_numpy(dtype=object)[codes], index=s.index, dtype="object")


#: Kernel columns packed several to one integer in SQL, as ``(column, bits)`` per
#: packed value, low bits first. SQLite's cost is per value written out, so 16
#: columns read as 8 take about half the time. A row whose values do not fit the
#: bits (or are NULL) packs to -1, and then the table is read unpacked.
_KERNEL_PACKS = (
    (("device_id", 20), ("stream_id", 32)),
    (("name_id", 31), ("short_id", 32)),
    (("grid_x", 31), ("grid_y", 16), ("grid_z", 16)),
    (("block_x", 11), ("block_y", 11), ("block_z", 7), ("registers", 9), ("shared_mem", 24)),
)


def _kernels(db: _Db, strings: _Strings) -> pd.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not db.has(t, "start", "end", "demangledName"):
        return pd.DataFrame()
    c = lambda col, d="0": _col(db, t, col, d)  # noqa: E731
    smem = f"coalesce({c('staticSharedMemory')}, 0) + coalesce({c('dynamicSharedMemory')}, 0)"
    plain = {
        "device_id": f"coalesce({c('deviceId')}, 0)",
        "stream_id": f"coalesce({c('streamId')}, 0)",
        "name_id": "demangledName",
        "short_id": f"coalesce({c('shortName', '-1')}, -1) + 1",
        "grid_x": c("gridX"),
        "grid_y": c("gridY"),
        "grid_z": c("gridZ"),
        "block_x": c("blockX"),
        "block_y": c("blockY"),
        "block_z": c("blockZ"),
        "registers": c("registersPerThread"),
        "shared_mem": smem,
    }
    head = [
        "start",
        "end",
        f"coalesce({c('correlationId', str(NO_CORRELATION))}, {NO_CORRELATION})",
        f"coalesce({c('globalPid')}, 0)",
    ]
    a = db.int_columns(t, head + [_pack_sql(pack, plain) for pack in _KERNEL_PACKS])
    if all((v >= 0).all() for v in a[len(head) :]):
        cols = dict(zip(head, a[: len(head)], strict=True))
        for pack, packed in zip(_KERNEL_PACKS, a[len(head) :], strict=True):
            shift = 0
            for field, bits in pack:
                cols[field] = (packed >> shift) & ((1 << bits) - 1)
                shift += bits
    else:  # a value beyond its bits (or NULL): read the columns one by one
        a = db.int_columns(t, head + list(plain.values()))
        cols = dict(zip(head + list(plain), a, strict=True))
    pid, _ = _split_tid(cols[head[3]])
    name = strings(cols["name_id"])
    unknown = pd.isna(name)
    if unknown.any():  # a name id StringIds does not hold (a damaged export)
        name[unknown] = UNKNOWN_KERNEL
    short = strings(cols["short_id"] - 1)
    short = np.where(pd.isna(short), name, short)
    df = pd.DataFrame(
        {
            "start": cols["start"],
            "end": cols["end"],
            "device_id": cols["device_id"],
            "stream_id": cols["stream_id"],
            "correlation_id": cols[head[2]],
            "pid": pid,
            "name": name,
            "short_name": short,
        },
        copy=False,
    )
    for col in KERNEL_GEOMETRY:
        df[col] = cols[col]
    return df


def _pack_sql(pack: tuple[tuple[str, int], ...], plain: dict[str, str]) -> str:
    """SQL for one packed value of :data:`_KERNEL_PACKS` (-1 when a value does not fit)."""
    fits, terms, shift = [], [], 0
    for name, bits in pack:
        expr = f"({plain[name]})"
        fits.append(f"{expr} BETWEEN 0 AND {(1 << bits) - 1}")
        terms.append(f"{expr} * {1 << shift}")
        shift += bits
    return f"CASE WHEN {' AND '.join(fits)} THEN {' + '.join(terms)} ELSE -1 END"


def _memops(db: _Db) -> pd.DataFrame:
    parts = []
    for t, kind_sql in (
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "copyKind"),
        ("CUPTI_ACTIVITY_KIND_MEMSET", "-1"),
    ):
        if not db.has(t, "start", "end"):
            continue
        c = lambda col, d="0", t=t: _col(db, t, col, d)  # noqa: E731
        if kind_sql == "copyKind":
            kind_sql = f"coalesce({c('copyKind')}, 0)"
        a = db.int_columns(
            t,
            [
                "start",
                "end",
                f"coalesce({c('deviceId')}, 0)",
                f"coalesce({c('streamId')}, 0)",
                f"coalesce({c('correlationId', str(NO_CORRELATION))}, {NO_CORRELATION})",
                f"coalesce({c('globalPid')}, 0)",
                f"coalesce({c('bytes')}, 0)",
                kind_sql,
            ],
        )
        pid, _ = _split_tid(a[5])
        kind = pd.Series(a[7]).map(COPY_KINDS).fillna("Memset").to_numpy(dtype=object)
        parts.append(
            pd.DataFrame(
                {
                    "start": a[0],
                    "end": a[1],
                    "device_id": a[2],
                    "stream_id": a[3],
                    "correlation_id": a[4],
                    "pid": pid,
                    "bytes": a[6],
                    "kind": kind,
                },
                copy=False,
            )
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


#: ``select(columns, distinct names, name codes)``: which ranges to keep, None for all
_Select = Callable[[dict[str, np.ndarray], pd.Series, np.ndarray], "np.ndarray | None"]


def _nvtx_ranges(
    db: _Db, strings: _Strings, select: _Select | None = None
) -> tuple[pd.DataFrame, bool, bool]:
    """The NVTX ranges, finalized unless some are unterminated or end before they
    start (then :func:`_read` repairs them first): ``(ranges, finalized, selected)``,
    ``selected`` when ``select`` chose the rows."""
    ranges, selected = _ranges(db, strings, select)
    end = ranges["end"]
    if end.isna().any() or (end < ranges["start"]).any():
        return ranges, False, selected
    ranges["end"] = end.astype(np.int64)
    return finalize_ranges(ranges), True, selected


def _ranges(db: _Db, strings: _Strings, select: _Select | None = None) -> tuple[pd.DataFrame, bool]:
    t = "NVTX_EVENTS"
    if not db.has(t, "start", "eventType"):
        return pd.DataFrame({"start": [], "end": []}), False
    types = NVTX_PUSH_POP + NVTX_START_END
    text = _col(db, t, "text")
    text_id = _col(db, t, "textId", "-1")
    end_gtid = _col(db, t, "endGlobalTid")
    # a number in the text column needs the row-by-row read: tested only where the
    # declared type lets one be stored (0.5 CPU s at 4.8M ranges); a blob reads the same
    # either way (group_concat gives its bytes, decoded as the row-by-row read does)
    numbers = (
        "" if db.text_affinity(t, "text") else f" + 512 * (typeof({text}) NOT IN ('text', 'null'))"
    )
    # cheap per-row expressions, packed into one integer: SQLite spends its time on
    # each value it writes out, so fewer columns read faster
    flags = (
        f"eventType + 128 * ({text} IS NULL) + 256 * (end IS NULL){numbers}"
        f" + 1024 * coalesce({end_gtid} != coalesce(globalTid, 0), 0)"
        f" + 2048 * (coalesce({text_id}, -1) + 1)"
    )
    # one pass over the table: ranges and domain declarations together
    where = f"eventType IN {types + (NVTX_DOMAIN_CREATE,)}"
    cols, (texts,) = db.read(
        t,
        ["start", "coalesce(end, 0)", "coalesce(globalTid, 0)", flags],
        (text,),
        where,
        text_filter=_strip_op_ids,
    )
    start, end_v, gtid_v, flag = cols
    etype = flag & 127
    has_text = (flag & 128) == 0
    if len(texts) == int(has_text.sum()) and not (flag & 512).any():
        text_codes, text_names = texts.codes, texts.values
    else:
        # a value that is not text, or text holding a NUL: read it row by row
        rows = db.rows(f"SELECT {text} FROM {t} WHERE {where} AND {text} IS NOT NULL")
        text_codes, text_names = pd.factorize(np.asarray([_text(r[0]) for r in rows], object))
    del texts
    is_range = etype != NVTX_DOMAIN_CREATE
    if not is_range.all():
        start, end_v, gtid_v, flag, etype = (
            c[is_range] for c in (start, end_v, gtid_v, flag, etype)
        )
        # the domains' names out: codes and names as if only the ranges had been read
        text_codes, used = pd.factorize(text_codes[is_range[has_text]])
        text_names = np.asarray(text_names, dtype=object)[used]
        has_text = has_text[is_range]
    n = len(start)
    if not n:
        return pd.DataFrame({"start": [], "end": []}), False
    pid, tid = _split_tid(gtid_v)
    cross_thread = (flag & 1024) != 0
    tid_ref = (flag >> 11) - 1
    codes, raw = _name_codes(text_codes, text_names, tid_ref, has_text, strings)
    parsed = parse_range_names(pd.Series(raw, dtype="object"))
    iteration = is_iteration_name(parsed["name"]).to_numpy(dtype=bool)[codes]

    domains = _domains(db, strings) if (~is_range).any() else None
    if domains is not None and len(domains):
        (dom,) = db.int_columns(t, [f"coalesce({_col(db, t, 'domainId', '0')}, 0)"], where)
        domain = (
            pd.DataFrame({"pid": pid, "domain_id": dom[is_range]}, copy=False)
            .merge(domains, on=["pid", "domain_id"], how="left")["domain"]
            .astype("object")
            .to_numpy(dtype=object)
        )
    else:  # none declared: all NaN (built below, with the rows kept)
        domain = None
    kind = np.where(cross_thread, 1, 0)
    kind[iteration & ~cross_thread] = 2
    seen = {
        "pid": pid,
        "tid": tid,
        "start": start,
        "end": end_v,
        "is_op": kind == 0,
        "open": (flag & 256) != 0,
    }
    keep = select(seen, parsed["name"], codes) if select is not None else None
    if keep is not None and not keep.all():  # only the kept rows are built
        kept = np.flatnonzero(keep)
        start, end_v, pid, tid, flag, etype, codes, kind = (
            c[kept] for c in (start, end_v, pid, tid, flag, etype, codes, kind)
        )
        domain = domain[kept] if domain is not None else None
    # typed as object now (the frame would scan every row to type it: 0.4 s at 5M);
    # the columns nothing fills share it
    missing = _all_nan(len(codes))
    end = pd.arrays.IntegerArray(end_v, (flag & 256) != 0)
    start_end = (~np.isin(etype, NVTX_PUSH_POP)).astype(np.int8)  # a code of _SOURCES
    ranges = pd.DataFrame(
        {
            "start": start,
            "end": end,
            "pid": pid,
            "tid": tid,
            "name": _take(parsed["name"], codes),
            "domain": domain if domain is not None else missing,
            "category": pd.Categorical.from_codes(np.zeros(len(codes), np.int8), dtype=_NVTX),
            "kind": pd.Categorical.from_codes(kind, dtype=RANGE_KIND),  # op, async, iteration
            "source": pd.Categorical.from_codes(start_end, dtype=_SOURCES),
            "op_type": _take(op_type_of(parsed["name"]), codes),
            "bprop": parsed["bprop"].to_numpy(dtype=bool)[codes],
            "seq": parsed["seq"].array.take(codes),
            # shapes and perfguard.instrument's payload: dtypes, scalar arguments, the
            # user's call site
            **_payload(parsed, codes, missing),
        },
        copy=False,
    )
    return ranges, keep is not None


#: ``source`` of an NVTX range, by its event type (lexical order, as text sorts)
_SOURCES = pd.CategoricalDtype(["nvtx:push_pop", "nvtx:start_end"])
_NVTX = pd.CategoricalDtype(["nvtx"])


def _all_nan(n: int) -> pd.Categorical:
    """A coded text column of ``n`` missing values (one per read, shared by the
    columns nothing fills)."""
    return categorical(np.full(n, -1, dtype=np.int8), [])


#: the columns a range name may carry beyond its own name (:func:`parse_range_names`)
_PAYLOAD = ("input_shapes", "dtypes", "concrete_inputs", "call_site")


def _payload(parsed: pd.DataFrame, codes: np.ndarray, missing: pd.Categorical) -> dict[str, Any]:
    """The payload columns of the ranges named by ``codes``. A column no name fills
    (``emit_nvtx`` without shapes, annotations: all of them) is ``missing``, the
    ranges' all-missing column (``domain`` without declared domains): one array
    for all of them, without a take of the distinct values per column."""
    out: dict[str, Any] = {}
    for col in _PAYLOAD:
        values = parsed[col]
        # the same values as a take would give: NaN (floats) in every distinct name
        if len(values) and values.map(lambda v: isinstance(v, float) and v != v).all():
            out[col] = missing
        else:
            out[col] = _take(values, codes)
    return out


def _take(values: Any, codes: np.ndarray) -> pd.Categorical:
    """``values[codes]`` as coded text (the model's type for text): built from the
    codes, never an object per row (36 MiB a column at 4.8M ranges)."""
    return categorical(codes, np.asarray(values, dtype=object))


#: a trailing ``, op_id = N`` (PyTorch emit_nvtx numbers every call)
_OP_ID_SUFFIX = re.compile(r"(?<!\n), op_id = [0-9]*\Z")
#: the same suffix at the end of every NUL-separated name of a chunk; the look-behind
#: variant only where some name holds a newline right before the suffix
_OP_ID_JOINED = re.compile(r", op_id = [0-9]*(?=\x00|\Z)")
_OP_ID_JOINED_EXACT = re.compile(r"(?<!\n), op_id = [0-9]*(?=\x00|\Z)")


def _strip_op_ids(joined: str) -> str:
    """Drop a trailing ``, op_id = N`` (:data:`_OP_ID_SUFFIX`) from every
    NUL-separated name of ``joined``, in one C pass over the text.

    PyTorch's ``emit_nvtx`` numbers every call, so without this every name
    is distinct; with it, names repeat and Python sees far fewer distinct
    ones. One regex substitution over the joined chunk is twice as fast as
    the byte-array walk it replaced (0.25 vs 0.47 s per million names).
    """
    exact = "\n, op_id = " in joined  # rare: the suffix after a newline is kept
    return (_OP_ID_JOINED_EXACT if exact else _OP_ID_JOINED).sub("", joined)


def _name_codes(
    text_codes: np.ndarray,
    text_names: np.ndarray,
    ref: np.ndarray,
    has_text: np.ndarray,
    strings: _Strings,
) -> tuple[np.ndarray, np.ndarray]:
    """Range names as codes into distinct raw names: ``(codes, names)``.

    The rows where ``has_text`` name themselves (``text_names[text_codes]``);
    the other rows name a registered string (``ref``). A trailing ``, op_id = N``
    is dropped from each distinct name first, so PyTorch's per-call names collapse into a few:
    :func:`parse_range_names` gives the same result with or without it (it
    strips everything from its first ``, key =`` field, and ``op_id`` is not
    read; the suffix is kept after a newline, where ``$`` would differ), and
    it then parses each name once.
    """
    ref_codes, refs = pd.factorize(ref[~has_text])
    names = pd.Series(np.concatenate([text_names, strings(refs)]), dtype="object")
    is_str = names.map(type).to_numpy() == str  # noqa: E721 - elementwise, an object array
    short = names.to_numpy(dtype=object).copy()
    short[is_str] = [_OP_ID_SUFFIX.sub("", v, count=1) for v in short[is_str]]
    collapse, distinct = pd.factorize(short, use_na_sentinel=False)
    codes = np.empty(len(has_text), dtype=np.int64)
    codes[has_text] = text_codes
    codes[~has_text] = ref_codes + len(text_names)
    return collapse[codes], np.asarray(distinct, dtype=object)


def _domains(db: _Db, strings: _Strings) -> pd.DataFrame:
    """Declared NVTX domains: ``pid, domain_id, domain`` (ids are per process)."""
    t = "NVTX_EVENTS"
    text = _col(db, t, "text")
    text_id = _col(db, t, "textId", "-1")
    domain_id = _col(db, t, "domainId", "0")
    rows = db.rows(
        f"SELECT coalesce(globalTid, 0), coalesce({domain_id}, 0), {text},"
        f" coalesce({text_id}, -1) FROM {t} WHERE eventType = {NVTX_DOMAIN_CREATE}"
    )
    df = pd.DataFrame(rows, columns=["gtid", "domain_id", "text", "text_id"])
    registered = pd.Series(strings(df["text_id"].to_numpy(np.int64)), dtype="object")
    df["domain"] = df["text"].where(df["text"].notna(), registered)
    df["pid"] = _split_tid(df["gtid"].to_numpy(np.int64))[0]
    df["domain_id"] = df["domain_id"].astype(np.int64)
    return df.drop_duplicates(["pid", "domain_id"], keep="last")[["pid", "domain_id", "domain"]]


def _devices(db: _Db) -> pd.DataFrame:
    t = "TARGET_INFO_GPU"
    id_col = "id" if db.has(t, "id") else ("deviceId" if db.has(t, "deviceId") else None)
    if id_col is not None and db.has(t, "name"):
        c = lambda col: _col(db, t, col)  # noqa: E731
        rows = db.rows(
            f"SELECT {id_col}, name, {c('smCount')}, {c('totalMemory')}, {c('computeMajor')},"
            f" {c('computeMinor')} FROM {t}"
        )
    elif db.has("TARGET_INFO_CUDA_GPU", "deviceId", "name"):
        t = "TARGET_INFO_CUDA_GPU"
        c = lambda col: _col(db, t, col)  # noqa: E731
        rows = db.rows(
            f"SELECT deviceId, name, {c('smCount')}, {c('globalMemorySize')},"
            f" {c('computeCapabilityMajor')}, {c('computeCapabilityMinor')} FROM {t}"
        )
    else:
        return pd.DataFrame()
    df = pd.DataFrame(rows, columns=["device_id", "name", "sm_count", "memory_bytes", "ma", "mi"])
    df["name"] = pd.Series([_text(v) for v in df["name"]], index=df.index, dtype=object)
    df = df.drop_duplicates("device_id")
    cc = df["ma"].astype("Int64").astype(str) + "." + df["mi"].astype("Int64").astype(str)
    df["compute_capability"] = cc.where(df["ma"].notna(), None)
    df["rank"] = 0
    return df.sort_values("device_id")


def _threads(db: _Db, strings: _Strings) -> pd.DataFrame:
    if not db.has("ThreadNames", "nameId", "globalTid"):
        return pd.DataFrame()
    a = db.ints("SELECT coalesce(globalTid, 0), nameId FROM ThreadNames", 2)
    pid, tid = _split_tid(a[:, 0])
    df = pd.DataFrame({"pid": pid, "tid": tid, "name": strings(a[:, 1]), "rank": 0}, copy=False)
    return df.drop_duplicates(["pid", "tid"], keep="last")


def _meta(db: _Db, strings: _Strings) -> dict[str, Any]:
    meta: dict[str, Any] = {"format": "nsys-sqlite", "path": str(db.path)}
    kv: dict[str, str] = {}
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if db.has(t, "name", "value"):
            kv.update({str(k): str(v) for k, v in db.rows(f"SELECT name, value FROM {t}")})
    if "EXPORT_PRODUCT_VERSION" in kv:
        meta["version"] = kv["EXPORT_PRODUCT_VERSION"]
        meta["version_source"] = "export metadata"
    else:
        meta["version"] = _infer_version(db)
        meta["version_source"] = "inferred from install paths" if meta["version"] else "unknown"
    if "EXPORT_SCHEMA_VERSION" in kv:
        meta["schema_version"] = kv["EXPORT_SCHEMA_VERSION"]
    if db.has("META_DATA_CAPTURE", "name", "value"):
        cap = db.rows(
            "SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_0:COMMAND'"
            " OR name LIKE 'PROCESS_0:ARGUMENT_%' ORDER BY rowid"
        )
        if cap:
            meta["command"] = " ".join(str(v) for _, v in cap)
    return meta


def _environment(db: _Db) -> Environment:
    """The driver, its CUDA version, the CPU and the GPUs' max SM clock
    (:func:`perfguard.trace.environments.from_nsys`); a table this export lacks is empty."""
    system: dict[str, str] = {}
    if db.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
        wanted = "('NvDriverVersion', 'CudaDriverVersion', 'CpuDescription')"
        system = {
            str(k): str(v)
            for k, v in db.rows(
                f"SELECT name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name IN {wanted}"
            )
        }
    clocks: list[Any] = []
    if db.has("TARGET_INFO_GPU", "clockRate"):
        id_col = "id" if db.has("TARGET_INFO_GPU", "id") else "rowid"
        clocks = [c for (c,) in db.rows(f"SELECT clockRate FROM TARGET_INFO_GPU ORDER BY {id_col}")]
    return from_nsys(system, clocks)


def _infer_version(db: _Db) -> str | None:
    """Exports before 2022.1 have no version table: read it off install paths."""
    if db.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
        for (value,) in db.rows(
            "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'TargetInstallDir'"
        ):
            m = _INSTALL_VERSION.search(str(value))
            if m:
                return m.group(1)
    for (value,) in db.rows(
        "SELECT value FROM StringIds WHERE value LIKE '%nsight-systems%' LIMIT 50"
    ):
        m = _INSTALL_VERSION.search(str(value))
        if m:
            return m.group(1)
    return None
