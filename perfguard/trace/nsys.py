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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.errors import TraceError
from perfguard.trace.model import NO_CORRELATION, Trace
from perfguard.trace.names import is_iteration_name, op_type_of, parse_range_names
from perfguard.trace.ranges import finalize_ranges

NVTX_PUSH_POP = (59, 70)
NVTX_START_END = (60, 71)
NVTX_DOMAIN_CREATE = 75
#: ``eventClass`` of CUDA runtime and driver API rows (67 = backtrace duplicate).
API_EVENT_CLASSES = (0, 1)
#: ``copyKind`` values (nsys ENUM_CUDA_MEMCPY_OPER).
COPY_KINDS = {
    0: "Memcpy Unknown", 1: "Memcpy HtoD", 2: "Memcpy DtoH", 3: "Memcpy HtoA",
    4: "Memcpy AtoH", 5: "Memcpy AtoA", 6: "Memcpy AtoD", 7: "Memcpy DtoA",
    8: "Memcpy DtoD", 9: "Memcpy HtoH", 10: "Memcpy PtoP", 11: "Memcpy HtoD (UVM)",
    12: "Memcpy DtoH (UVM)", 13: "Memcpy DtoD (UVM)",
}  # fmt: skip
_INSTALL_VERSION = re.compile(r"nsight-systems[-/ ](?:cli/)?(\d{4}\.\d+\.\d+)", re.I)
_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: Path) -> bool:
    """True when the file starts with the SQLite header."""
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == _SQLITE_MAGIC
    except OSError:
        return False


class _Db:
    """A read-only export with the table/column lookups the reader needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        uri = path.resolve().as_uri() + "?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True)
        self.conn.execute("PRAGMA query_only = 1")
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        self.tables = {r[0] for r in rows}
        self._cols: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._cols:
            rows = self.conn.execute(f"PRAGMA table_info('{table}')").fetchall()
            self._cols[table] = {r[1] for r in rows}
        return self._cols[table]

    def has(self, table: str, *cols: str) -> bool:
        return table in self.tables and all(c in self.columns(table) for c in cols)

    def ints(self, sql: str, ncols: int) -> np.ndarray:
        """Run a query whose columns are all integers (NULLs coalesced in SQL)."""
        cur = self.conn.execute(sql)
        flat = np.fromiter(itertools.chain.from_iterable(cur), dtype=np.int64)
        return flat.reshape(-1, ncols)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql).fetchall()


def _col(db: _Db, table: str, col: str, default: str = "NULL") -> str:
    return col if col in db.columns(table) else default


def read_nsys(path: str | Path) -> Trace:
    """Read an nsys SQLite export into a :class:`Trace`.

    Raises :class:`TraceError` when the file is not an nsys export or is
    damaged.
    """
    path = Path(path)
    try:
        db = _Db(path)
    except sqlite3.DatabaseError as exc:
        raise TraceError(path, f"cannot open as SQLite ({exc})") from None
    try:
        if "StringIds" not in db.tables:
            raise TraceError(path, "SQLite file is not an nsys export (no StringIds table)")
        return _read(db)
    except sqlite3.DatabaseError as exc:
        raise TraceError(path, f"damaged or truncated SQLite export ({exc})") from None
    finally:
        db.conn.close()


def _read(db: _Db) -> Trace:
    strings = _strings(db)
    api = _api_calls(db, strings)
    kernels = _kernels(db, strings)
    memops = _memops(db)
    ranges = _ranges(db, strings)
    if ranges["end"].isna().any():
        # unterminated ranges run to the last timestamp of the capture (as nsys's reports do)
        last = max(
            [int(t["end"].max()) for t in (api, kernels, memops) if len(t)]
            + [int(ranges["start"].max())]
        )
        ranges["end"] = ranges["end"].fillna(last)
    ranges["end"] = ranges["end"].astype(np.int64)
    ranges = finalize_ranges(ranges)
    return Trace(
        ranges=ranges,
        api_calls=api,
        kernels=kernels,
        memops=memops,
        devices=_devices(db),
        threads=_threads(db, strings),
        meta=_meta(db, strings),
    )


class _Strings:
    """StringIds as a vectorised id -> text lookup."""

    def __init__(self, ids: np.ndarray, values: np.ndarray) -> None:
        size = int(ids.max()) + 1 if len(ids) else 1
        self.table = np.full(size, None, dtype=object)
        self.table[ids] = values

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < len(self.table))
        out = np.full(len(ids), None, dtype=object)
        out[ok] = self.table[ids[ok]]
        return out


def _strings(db: _Db) -> _Strings:
    rows = db.rows("SELECT id, value FROM StringIds")
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
        where = f"WHERE eventClass IN {API_EVENT_CLASSES}"
    a = db.ints(
        f"SELECT start, end, coalesce(globalTid, 0), coalesce(correlationId, {NO_CORRELATION}),"
        f" nameId FROM {t} {where}",
        5,
    )
    pid, tid = _split_tid(a[:, 2])
    names = pd.Series(strings(a[:, 4]), dtype="object")
    return pd.DataFrame(
        {
            "start": a[:, 0], "end": a[:, 1], "pid": pid, "tid": tid,
            "correlation_id": a[:, 3], "name": _categorical_strings(names),
        }
    )  # fmt: skip


def _categorical_strings(s: pd.Series) -> pd.Series:
    """Strip CUDA API version suffixes once per distinct name (``_v7000``)."""
    codes, uniques = pd.factorize(s.fillna(""))
    clean = pd.Series(uniques, dtype="object").str.replace(r"_v\d+$", "", regex=True)
    return pd.Series(clean.to_numpy(dtype=object)[codes], index=s.index, dtype="object")


def _kernels(db: _Db, strings: _Strings) -> pd.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not db.has(t, "start", "end", "demangledName"):
        return pd.DataFrame()
    c = lambda col, d="0": _col(db, t, col, d)  # noqa: E731
    smem = f"coalesce({c('staticSharedMemory')}, 0) + coalesce({c('dynamicSharedMemory')}, 0)"
    a = db.ints(
        f"SELECT start, end, coalesce({c('deviceId')}, 0), coalesce({c('streamId')}, 0),"
        f" coalesce({c('correlationId', str(NO_CORRELATION))}, {NO_CORRELATION}),"
        f" coalesce({c('globalPid')}, 0), demangledName, coalesce({c('shortName', '-1')}, -1),"
        f" {c('gridX')}, {c('gridY')}, {c('gridZ')}, {c('blockX')}, {c('blockY')},"
        f" {c('blockZ')}, {c('registersPerThread')}, {smem} FROM {t}",
        16,
    )
    pid, _ = _split_tid(a[:, 5])
    name = strings(a[:, 6])
    short = strings(a[:, 7])
    short = np.where(pd.isna(short), name, short)
    df = pd.DataFrame(
        {
            "start": a[:, 0], "end": a[:, 1], "device_id": a[:, 2], "stream_id": a[:, 3],
            "correlation_id": a[:, 4], "pid": pid, "name": name, "short_name": short,
        }
    )  # fmt: skip
    for i, col in enumerate(
        ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers", "shared_mem"]
    ):
        df[col] = a[:, 8 + i]
    return df


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
        a = db.ints(
            f"SELECT start, end, coalesce({c('deviceId')}, 0), coalesce({c('streamId')}, 0),"
            f" coalesce({c('correlationId', str(NO_CORRELATION))}, {NO_CORRELATION}),"
            f" coalesce({c('globalPid')}, 0), coalesce({c('bytes')}, 0), {kind_sql} FROM {t}",
            8,
        )
        pid, _ = _split_tid(a[:, 5])
        kind = pd.Series(a[:, 7]).map(COPY_KINDS).fillna("Memset").to_numpy(dtype=object)
        parts.append(
            pd.DataFrame(
                {
                    "start": a[:, 0],
                    "end": a[:, 1],
                    "device_id": a[:, 2],
                    "stream_id": a[:, 3],
                    "correlation_id": a[:, 4],
                    "pid": pid,
                    "bytes": a[:, 6],
                    "kind": kind,
                }
            )  # fmt: skip
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _ranges(db: _Db, strings: _Strings) -> pd.DataFrame:
    t = "NVTX_EVENTS"
    if not db.has(t, "start", "eventType"):
        return pd.DataFrame({"start": [], "end": []})
    types = NVTX_PUSH_POP + NVTX_START_END
    text = _col(db, t, "text")
    text_id = _col(db, t, "textId", "-1")
    domain_id = _col(db, t, "domainId", "0")
    end_gtid = _col(db, t, "endGlobalTid")
    rows = db.rows(
        f"SELECT start, end, coalesce(globalTid, 0), coalesce({domain_id}, 0),"
        f" coalesce({end_gtid}, -1), coalesce({text_id}, -1), eventType, {text}"
        f" FROM {t} WHERE eventType IN {types}"
    )
    if not rows:
        return pd.DataFrame({"start": [], "end": []})
    cols = list(zip(*rows, strict=True))
    ints = np.asarray(cols[2:7], dtype=np.int64).T
    gtid, dom, end_gtid_v, tid_ref, etype = (ints[:, i] for i in range(5))
    text_v = pd.Series(cols[7], dtype="object")
    raw = text_v.where(text_v.notna(), pd.Series(strings(tid_ref), dtype="object"))
    pid, tid = _split_tid(gtid)
    parsed = parse_range_names(raw)
    domains = _domains(db, strings)
    domain = (
        pd.DataFrame({"pid": pid, "domain_id": dom})
        .merge(domains, on=["pid", "domain_id"], how="left")["domain"]
        .astype("object")
    )
    cross_thread = (end_gtid_v >= 0) & (end_gtid_v != gtid)
    start = np.asarray(cols[0], dtype=np.int64)
    end = pd.array(list(cols[1]), dtype="Int64")
    kind = np.where(cross_thread, "async", "op").astype(object)
    kind[is_iteration_name(parsed["name"]).to_numpy() & ~cross_thread] = "iteration"
    return pd.DataFrame(
        {
            "start": start,
            "end": end,
            "pid": pid,
            "tid": tid,
            "name": parsed["name"].to_numpy(dtype=object),
            "domain": domain.to_numpy(dtype=object),
            "category": "nvtx",
            "kind": kind,
            "source": np.where(np.isin(etype, NVTX_PUSH_POP), "nvtx:push_pop", "nvtx:start_end"),
            "op_type": op_type_of(parsed["name"]).to_numpy(dtype=object),
            "bprop": parsed["bprop"].to_numpy(dtype=bool),
            "seq": parsed["seq"].to_numpy(),
            "input_shapes": parsed["input_shapes"].to_numpy(dtype=object),
        }
    )


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
    df = pd.DataFrame({"pid": pid, "tid": tid, "name": strings(a[:, 1]), "rank": 0})
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
