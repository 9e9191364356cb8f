"""Fuzz `perfguard analyze` with mutated real captures.

    python benchmarks/fuzz.py --cases 200                      # a quick run, seed 0
    nice -n 10 python benchmarks/fuzz.py --cases 10000 --jobs 2 --log fuzz.jsonl
    python benchmarks/fuzz.py --start 5000 --cases 1000 --log part2.jsonl   # one chunk
    python benchmarks/fuzz.py --summarize part1.jsonl part2.jsonl

Each case takes one real fixture (``shared/fixtures/nsys/*.sqlite`` and
``shared/fixtures/kineto/*.json.gz``, or ``$PERFGUARD_FIXTURES``), applies one
mutation (see :data:`SQLITE_MUTATIONS` / :data:`KINETO_MUTATIONS`) and runs
``perfguard analyze`` on it in a forked child of this process (perfguard
imported once, so a case costs its analysis, not an interpreter start), under
an address-space limit (``resource.setrlimit``) and a wall-clock limit. Case
``i`` of seed ``s`` is always the same mutation of the same fixture, so a run
can be split into chunks (``--start``) and any case replayed (``--replay``).

Each case is classified:

* ``error`` (fine): a typed one-line error, exit 2;
* ``report`` (fine): a clean report that passes :func:`check_reports` (no
  negative time, no utilization over 100 %, no non-finite number);
* ``bad-report`` (bug): exit 0 with an impossible figure;
* ``untyped`` (bug): exit 3, an exception perfguard did not type;
* ``crash`` (bug): killed by a signal, or any other exit status;
* ``timeout`` (bug): over ``--slow`` CPU seconds (CPU, not wall: the machine
  may be shared), killed at ``--kill`` CPU seconds or ``--wall-kill`` wall seconds;
* ``memory`` (bug): out of memory (the address-space limit, or a peak RSS
  over ``--max-rss-mb`` above the forked child's starting size).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import hashlib
import io
import json
import math
import os
import random
import resource
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

BUGS = ("untyped", "crash", "timeout", "memory", "bad-report")
#: NVTX push/pop event type (nsys)
_NVTX_PUSH = 59


def fixtures_dir() -> Path:
    env = os.environ.get("PERFGUARD_FIXTURES")
    if env and Path(env).is_dir():
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"


def fixture_files(root: Path | None = None, max_mb: float | None = None) -> list[Path]:
    """The fixtures to mutate (those up to ``max_mb`` MB when given: a quick run)."""
    root = root or fixtures_dir()
    files = sorted(root.glob("nsys/*.sqlite")) + sorted(root.glob("kineto/*.json.gz"))
    return [f for f in files if max_mb is None or f.stat().st_size <= max_mb * 2**20]


# --------------------------------------------------------------------------- SQLite mutations

#: tables whose damage the nsys reader must survive
_KEY_TABLES = (
    "StringIds",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "TARGET_INFO_GPU",
    "TARGET_INFO_CUDA_GPU",
    "ThreadNames",
    "META_DATA_EXPORT",
)
#: key columns per table
_KEY_COLUMNS = {
    "StringIds": ("id", "value"),
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start",
        "end",
        "correlationId",
        "globalPid",
        "demangledName",
        "shortName",
        "deviceId",
        "streamId",
        "gridX",
        "blockX",
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "correlationId", "globalTid", "nameId"),
    "NVTX_EVENTS": ("start", "end", "globalTid", "text", "textId", "eventType", "domainId"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "correlationId", "bytes", "copyKind"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "correlationId", "bytes"),
    "TARGET_INFO_GPU": ("id", "name", "smCount"),
    "ThreadNames": ("nameId", "globalTid"),
}
_TIMED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)
_HUGE = (2**31, 2**32 + 7, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), -(2**31))
_WRONG = ("'abc'", "''", "1.5", "X'00ff'", "'12x'", "-0.0", "'\u00e9\u6f22'")


def _tables(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info('{table}')")]


def _pick_table(db: sqlite3.Connection, rng: random.Random, want: Iterable[str]) -> str | None:
    have = set(_tables(db))
    options = [t for t in want if t in have]
    return rng.choice(options) if options else None


def _pick_column(db: sqlite3.Connection, rng: random.Random, table: str) -> str | None:
    cols = [c for c in _KEY_COLUMNS.get(table, ()) if c in _columns(db, table)]
    return rng.choice(cols) if cols else None


def _some_rows(rng: random.Random) -> str:
    """A WHERE clause picking a random share of the rows (one row up to all)."""
    return rng.choice(
        ["rowid = (SELECT min(rowid) FROM {t})", "rowid % 7 = 3", "rowid % 2 = 0", "1"]
    )


def _sql_update(
    db: sqlite3.Connection,
    rng: random.Random,
    values: Callable[[str], str],
    tables: Iterable[str] = _KEY_COLUMNS,
) -> str:
    table = _pick_table(db, rng, tables)
    if table is None:
        return "no table"
    col = _pick_column(db, rng, table)
    if col is None:
        return f"{table}: no column"
    where = _some_rows(rng).format(t=table)
    value = values(col)
    db.execute(f'UPDATE "{table}" SET "{col}" = {value} WHERE {where}')
    return f"{table}.{col} = {value} where {where}"


def sq_drop_table(db: sqlite3.Connection, rng: random.Random) -> str:
    t = _pick_table(db, rng, _KEY_TABLES)
    if t:
        db.execute(f'DROP TABLE "{t}"')
    return f"drop {t}"


def sq_rename_table(db: sqlite3.Connection, rng: random.Random) -> str:
    t = _pick_table(db, rng, _KEY_TABLES)
    if t:
        db.execute(f'ALTER TABLE "{t}" RENAME TO "{t}_old"')
    return f"rename {t}"


def _alter_column(db: sqlite3.Connection, rng: random.Random, drop: bool) -> str:
    """Drop (when SQLite allows: not indexed, not a key) or rename a key column."""
    t = _pick_table(db, rng, _KEY_COLUMNS)
    c = _pick_column(db, rng, t) if t else None
    if c is None:
        return "no column"
    if drop:
        try:
            db.execute(f'ALTER TABLE "{t}" DROP COLUMN "{c}"')
            return f"drop {t}.{c}"
        except sqlite3.OperationalError:
            pass
    db.execute(f'ALTER TABLE "{t}" RENAME COLUMN "{c}" TO "{c}Renamed"')
    return f"rename {t}.{c}" + (" (drop refused)" if drop else "")


def sq_drop_column(db: sqlite3.Connection, rng: random.Random) -> str:
    return _alter_column(db, rng, drop=True)


def sq_rename_column(db: sqlite3.Connection, rng: random.Random) -> str:
    return _alter_column(db, rng, drop=False)


def sq_null(db: sqlite3.Connection, rng: random.Random) -> str:
    return _sql_update(db, rng, lambda c: "NULL")


def sq_wrong_type(db: sqlite3.Connection, rng: random.Random) -> str:
    return _sql_update(db, rng, lambda c: rng.choice(_WRONG))


def sq_end_before_start(db: sqlite3.Connection, rng: random.Random) -> str:
    t = _pick_table(db, rng, _TIMED)
    if t is None:
        return "no timed table"
    where = _some_rows(rng).format(t=t)
    gap = rng.choice([1, 1000, 10**9])
    db.execute(f'UPDATE "{t}" SET "end" = start - {gap} WHERE {where}')
    return f"{t}: end = start - {gap} where {where}"


def sq_huge(db: sqlite3.Connection, rng: random.Random) -> str:
    return _sql_update(db, rng, lambda c: str(rng.choice(_HUGE)))


def sq_huge_string_id(db: sqlite3.Connection, rng: random.Random) -> str:
    """A string id of 2^31 (or more): a table sized by the largest id would be 17 GB."""
    big = rng.choice([2**31, 2**40, 2**62])
    if rng.random() < 0.5 and "StringIds" in _tables(db):
        db.execute(f"INSERT OR REPLACE INTO StringIds (id, value) VALUES ({big}, 'huge id')")
        return f"StringIds row with id {big}"
    refs = {
        "CUPTI_ACTIVITY_KIND_KERNEL": "demangledName",
        "CUPTI_ACTIVITY_KIND_RUNTIME": "nameId",
        "NVTX_EVENTS": "textId",
        "ThreadNames": "nameId",
    }
    t = _pick_table(db, rng, refs)
    if t is None or refs[t] not in _columns(db, t):
        return "no reference column"
    db.execute(f'UPDATE "{t}" SET "{refs[t]}" = {big} WHERE rowid % 5 = 1')
    return f"{t}.{refs[t]} = {big}"


def sq_unclosed(db: sqlite3.Connection, rng: random.Random) -> str:
    """NVTX ranges without an end: existing ones, or thousands of pushes never popped."""
    if "NVTX_EVENTS" in _tables(db) and rng.random() < 0.4:
        where = _some_rows(rng).format(t="NVTX_EVENTS")
        db.execute(f"UPDATE NVTX_EVENTS SET end = NULL WHERE {where}")
        return f"NVTX end = NULL where {where}"
    n = rng.choice([100, 5000, 20000])
    if "NVTX_EVENTS" not in _tables(db):
        db.execute(
            "CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER,"
            " eventType INTEGER NOT NULL, text TEXT, globalTid INTEGER, textId INTEGER,"
            " domainId INTEGER, endGlobalTid INTEGER)"
        )
    t0 = 0
    for table in _TIMED:
        if table in _tables(db) and "start" in _columns(db, table):
            (lo,) = db.execute(f'SELECT min(start) FROM "{table}"').fetchone()
            if isinstance(lo, int):
                t0 = lo
                break
    (gtid,) = (
        db.execute("SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1").fetchone()
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in _tables(db)
        and "globalTid" in _columns(db, "CUPTI_ACTIVITY_KIND_RUNTIME")
        else (0,)
    )
    cols = set(_columns(db, "NVTX_EVENTS"))
    names = ["start", "eventType"] + [c for c in ("text", "globalTid") if c in cols]
    rows = [(t0 + 1000 * i, _NVTX_PUSH, f"open {i}", gtid)[: len(names)] for i in range(n)]
    db.executemany(
        f"INSERT INTO NVTX_EVENTS ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
        rows,
    )
    return f"{n} unclosed pushes"


def sq_empty_strings(db: sqlite3.Connection, rng: random.Random) -> str:
    if "StringIds" in _tables(db):
        db.execute("DELETE FROM StringIds")
    if rng.random() < 0.5 and "CUPTI_ACTIVITY_KIND_MEMCPY" in _tables(db):
        db.execute("DROP TABLE CUPTI_ACTIVITY_KIND_MEMCPY")
        return "empty StringIds, no memcpy"
    return "empty StringIds"


def sq_bad_text(db: sqlite3.Connection, rng: random.Random) -> str:
    """Names that are not text: integers, blobs, invalid UTF-8 (a lone surrogate)."""
    value = rng.choice(
        [
            "12345",
            "X'ffff'",
            "CAST(X'eda080' AS TEXT)",
            "CAST(X'c3' AS TEXT)",
            "'a\"b''c'",
            "char(0)",
            "4.5",
        ]
    )
    t = _pick_table(db, rng, ("StringIds", "NVTX_EVENTS", "TARGET_INFO_GPU"))
    col = {"StringIds": "value", "NVTX_EVENTS": "text", "TARGET_INFO_GPU": "name"}.get(t or "")
    if t is None or col not in _columns(db, t):
        return "no text column"
    where = _some_rows(rng).format(t=t)
    db.execute(f'UPDATE "{t}" SET "{col}" = {value} WHERE {where}')
    return f"{t}.{col} = {value} where {where}"


SQLITE_MUTATIONS: dict[str, Callable[[sqlite3.Connection, random.Random], str]] = {
    "drop_table": sq_drop_table,
    "rename_table": sq_rename_table,
    "drop_column": sq_drop_column,
    "rename_column": sq_rename_column,
    "null": sq_null,
    "wrong_type": sq_wrong_type,
    "end_before_start": sq_end_before_start,
    "huge": sq_huge,
    "huge_string_id": sq_huge_string_id,
    "unclosed": sq_unclosed,
    "empty_strings": sq_empty_strings,
    "bad_text": sq_bad_text,
}
#: byte-level mutations that apply to either format
BYTE_MUTATIONS = ("bitflip", "truncate")


def _flip_bits(data: bytes, rng: random.Random, skip: int = 0) -> tuple[bytes, str]:
    buf = bytearray(data)
    n = rng.choice([1, 4, 32])
    for _ in range(n):
        i = rng.randrange(min(skip, len(buf) - 1), len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf), f"{n} bits flipped"


def _truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    cut = int(len(data) * rng.random())
    return data[:cut], f"cut at {cut} of {len(data)} bytes"


def mutate_sqlite(src: Path, dst: Path, kind: str, rng: random.Random) -> str:
    if kind in BYTE_MUTATIONS:
        data = src.read_bytes()
        out, what = _flip_bits(data, rng, skip=100) if kind == "bitflip" else _truncate(data, rng)
        dst.write_bytes(out)
        return what
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    db = sqlite3.connect(dst)
    try:
        with db:
            return SQLITE_MUTATIONS[kind](db, rng)
    finally:
        db.close()


# --------------------------------------------------------------------------- Kineto mutations

_EVENT_KEYS = ("ts", "dur", "name", "ph", "pid", "tid", "cat", "args")
_ARG_KEYS = ("correlation", "External id", "device", "stream", "Input Dims")


def _gpu_or_any(events: list, rng: random.Random) -> list[dict]:
    """A random share of the events that are dicts."""
    pool = [e for e in events if isinstance(e, dict)]
    share = rng.choice([1, 0.1, 1.0])
    if share == 1:
        return [rng.choice(pool)] if pool else []
    return [e for e in pool if rng.random() < share]


def kj_drop_key(doc: dict, rng: random.Random) -> str:
    if rng.random() < 0.3:
        doc["traceEventz"] = doc.pop("traceEvents", [])
        return "traceEvents renamed"
    key = rng.choice(_EVENT_KEYS)
    hit = _gpu_or_any(doc.get("traceEvents", []), rng)
    for e in hit:
        e.pop(key, None)
    return f"{key} dropped from {len(hit)} events"


def _set_field(doc: dict, rng: random.Random, value: object) -> str:
    """Set one event (or ``args``) key to ``value`` in a random share of the events."""
    key = rng.choice(_EVENT_KEYS + _ARG_KEYS)
    hit = _gpu_or_any(doc.get("traceEvents", []), rng)
    for e in hit:
        if key not in _ARG_KEYS:
            e[key] = value
        elif isinstance(e.get("args"), dict):
            e["args"][key] = value
    return f"{key} = {value!r} in {len(hit)} events"


def kj_null(doc: dict, rng: random.Random) -> str:
    return _set_field(doc, rng, None)


def kj_wrong_type(doc: dict, rng: random.Random) -> str:
    return _set_field(doc, rng, rng.choice(["abc", "", 1.5, [], {}, True, 123, "12"]))


def kj_end_before_start(doc: dict, rng: random.Random) -> str:
    hit = [e for e in _gpu_or_any(doc.get("traceEvents", []), rng) if "dur" in e]
    for e in hit:
        e["dur"] = -abs(e["dur"] if isinstance(e["dur"], (int, float)) else 1) - 1
    return f"negative dur in {len(hit)} events"


def kj_huge(doc: dict, rng: random.Random) -> str:
    key = rng.choice(["ts", "dur", "pid", "tid"])
    value = rng.choice([2**63, 2**63 - 1, -(2**63), 1e30, 1e300, 2**62, 2**70])
    hit = _gpu_or_any(doc.get("traceEvents", []), rng)
    for e in hit:
        e[key] = value
    return f"{key} = {value} in {len(hit)} events"


def kj_unclosed(doc: dict, rng: random.Random) -> str:
    """``B`` events without their ``E``: thousands of ranges that never close."""
    events = doc.setdefault("traceEvents", [])
    ops = [e for e in events if isinstance(e, dict) and e.get("cat") == "cpu_op"]
    t0 = min((e["ts"] for e in ops if isinstance(e.get("ts"), (int, float))), default=0)
    pid, tid = (ops[0].get("pid", 1), ops[0].get("tid", 1)) if ops else (1, 1)
    n = rng.choice([100, 5000, 20000])
    events.extend(
        {
            "ph": "B",
            "cat": "user_annotation",
            "name": f"open {i}",
            "pid": pid,
            "tid": tid,
            "ts": t0 + i,
        }
        for i in range(n)
    )
    return f"{n} unclosed B events"


def kj_bad_names(doc: dict, rng: random.Random) -> str:
    value = rng.choice([123, 4.5, None, ["x"], {"a": 1}, "\ud800", "a\udfffb", "x\x00y"])
    hit = _gpu_or_any(doc.get("traceEvents", []), rng)
    for e in hit:
        e["name"] = value
    return f"name = {value!r} in {len(hit)} events"


KINETO_MUTATIONS: dict[str, Callable[[dict, random.Random], str]] = {
    "drop_key": kj_drop_key,
    "null": kj_null,
    "wrong_type": kj_wrong_type,
    "end_before_start": kj_end_before_start,
    "huge": kj_huge,
    "unclosed": kj_unclosed,
    "bad_names": kj_bad_names,
}
#: text-level mutations of the JSON
KINETO_TEXT = ("unescaped_quote", "nan", "bad_gzip")


def _unescaped_quote(text: str, rng: random.Random) -> tuple[str, str]:
    """A ``"`` inside a name, as torch writes some C++ names unescaped."""
    at = [i for i in range(len(text)) if text.startswith('"name": "', i)][:5000]
    n = rng.choice([1, 10])
    out = text
    for i in sorted(rng.sample(at, min(n, len(at))), reverse=True):
        j = i + len('"name": "')
        out = out[:j] + 'operator"' + out[j:]
    return out, f"{min(n, len(at))} unescaped quotes"


def mutate_kineto(src: Path, dst: Path, kind: str, rng: random.Random) -> str:
    raw = gzip.decompress(src.read_bytes())
    if kind == "bad_gzip":
        comp = bytearray(src.read_bytes())
        if rng.random() < 0.5:
            dst.write_bytes(bytes(comp[: rng.randrange(10, len(comp))]))
            return "gzip stream cut"
        for _ in range(8):
            i = rng.randrange(10, len(comp))
            comp[i] ^= 0xFF
        dst.write_bytes(bytes(comp))
        return "gzip bytes flipped"
    if kind in BYTE_MUTATIONS:
        out, what = _flip_bits(raw, rng) if kind == "bitflip" else _truncate(raw, rng)
        dst.write_bytes(gzip.compress(out, compresslevel=1))
        return what
    text = raw.decode("utf-8", "surrogatepass")
    if kind == "unescaped_quote":
        text, what = _unescaped_quote(text, rng)
    elif kind == "nan":
        text, n = text.replace('"dur": 1,', '"dur": NaN,'), text.count('"dur": 1,')
        what = f"{n} dur = NaN"
    else:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            doc = {"traceEvents": doc}
        what = KINETO_MUTATIONS[kind](doc, rng)
        text = json.dumps(doc)  # lone surrogates become \\udXXX escapes: valid JSON text
    dst.write_bytes(gzip.compress(text.encode("utf-8", "surrogatepass"), compresslevel=1))
    return what


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    index: int
    fixture: str
    kind: str
    what: str = ""
    outcome: str = ""
    rc: int | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    input_mb: float = 0.0
    message: str = ""


def plan(index: int, seed: int, files: list[Path]) -> tuple[Path, str, random.Random]:
    """The fixture, mutation kind and random stream of case ``index`` (deterministic)."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    # fixtures and kinds in turn (any run of cases covers them all evenly), the details
    # of each mutation from the case's own random stream
    src = files[index % len(files)]
    if src.suffix == ".sqlite":
        kinds = list(SQLITE_MUTATIONS) + list(BYTE_MUTATIONS)
    else:
        kinds = list(KINETO_MUTATIONS) + list(KINETO_TEXT) + list(BYTE_MUTATIONS)
    return src, kinds[(index // len(files) + seed) % len(kinds)], rng


def make_case(index: int, seed: int, files: list[Path], work: Path) -> tuple[Case, Path]:
    src, kind, rng = plan(index, seed, files)
    ext = ".sqlite" if src.suffix == ".sqlite" else ".json.gz"
    dst = work / f"case{index}{ext}"
    mutate = mutate_sqlite if ext == ".sqlite" else mutate_kineto
    try:
        what = mutate(src, dst, kind, rng)
    except (sqlite3.Error, ValueError) as exc:  # the mutation itself did not apply
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o644)
        what = f"mutation failed ({type(exc).__name__}: {exc}); original copy"
    case = Case(index, src.name, kind, what, input_mb=dst.stat().st_size / 2**20)
    return case, dst


# --------------------------------------------------------------------------- running


def _child(capture: Path, out_dir: Path, log: Path, mem_bytes: int, kill_s: float) -> None:
    """In the forked child: limits, then the CLI. Never returns."""
    rc = 99
    try:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        # CPU seconds, not wall: SIGXCPU's default action ends us
        resource.setrlimit(resource.RLIMIT_CPU, (int(kill_s), int(kill_s) + 5))
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), errors="backslashreplace")
        sys.stderr = sys.stdout
        from perfguard.cli import main

        rc = main(
            [
                "analyze",
                "-d",
                str(capture),
                "--output-path",
                str(out_dir),
                "--formats",
                "csv,json",
                "--reports",
                "all",
            ]
        )
    except MemoryError:
        rc = 98
    except BaseException as exc:  # noqa: BLE001 - anything escaping the CLI is a bug
        try:
            print(f"escaped the CLI: {type(exc).__name__}: {exc}")
        except BaseException:  # noqa: BLE001
            pass
        rc = 97
    finally:
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(rc)


def run_case(case: Case, capture: Path, work: Path, opts: argparse.Namespace) -> Case:
    out_dir = work / f"out{case.index}"
    log = work / f"log{case.index}.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(capture, out_dir, log, opts.mem_limit_mb << 20, opts.kill)
    status, usage = 0, None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > opts.wall_kill:  # stuck without using CPU: force it
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.005)
    case.seconds = round(time.monotonic() - t0, 3)
    assert usage is not None
    case.peak_rss_mb = round(usage.ru_maxrss / 1024, 1)
    case.cpu_seconds = round(usage.ru_utime + usage.ru_stime, 3)
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    case.message = (lines[-1] if lines else "")[:300]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        case.rc = -sig
        case.outcome = "timeout" if sig in (signal.SIGXCPU, signal.SIGKILL) else "crash"
        case.message = f"killed by signal {signal.Signals(sig).name}"
    else:
        case.rc = os.WEXITSTATUS(status)
        case.outcome = _classify(case, text, out_dir)
    # CPU time, not wall time: on a shared machine the wall clock measures the neighbours
    if case.outcome in ("report", "error") and case.cpu_seconds > opts.slow:
        case.outcome = "timeout"
        case.message = f"took {case.cpu_seconds:.1f} CPU s (limit {opts.slow} s); " + case.message
    if (
        case.outcome in ("report", "error")
        and case.peak_rss_mb - opts.base_rss_mb > opts.max_rss_mb
    ):
        case.outcome = "memory"
        case.message = f"peak RSS {case.peak_rss_mb:.0f} MB; " + case.message
    shutil.rmtree(out_dir, ignore_errors=True)
    log.unlink(missing_ok=True)
    return case


def _classify(case: Case, text: str, out_dir: Path) -> str:
    if case.rc == 98 or "not enough memory" in text or "MemoryError" in text:
        return "memory"
    if case.rc == 2:
        return "error" if "error:" in text else "crash"
    if case.rc == 3:
        return "untyped"
    if case.rc != 0:
        return "crash"
    problems = check_reports(out_dir)
    if problems:
        case.message = "; ".join(problems[:3])
        return "bad-report"
    return "report"


# --------------------------------------------------------------------------- report checks

#: a figure in a column (or summary metric) with one of these in its name is checked
_TIME_WORDS = ("(ns)", "time")
_PCT_LIMITED = ("utilization",)


def _check_value(label: str, value: object, where: str, problems: list[str]) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, str):
        if not _numeric_label(label):  # an id or a name that happens to parse ("1e5")
            return
        try:
            number = float(value)
        except ValueError:
            return
    elif isinstance(value, (int, float)):
        number = float(value)
    else:
        return
    low = label.lower()
    if not math.isfinite(number):
        problems.append(f"{where}: {label} = {value} (not finite)")
    elif any(w in low for w in _TIME_WORDS) and number < 0:
        problems.append(f"{where}: {label} = {value} (negative time)")
    elif any(w in low for w in _PCT_LIMITED) and number > 100 + 1e-9:
        problems.append(f"{where}: {label} = {value} (utilization over 100 %)")


def _numeric_label(label: str) -> bool:
    low = label.lower()
    return any(w in low for w in (*_TIME_WORDS, *_PCT_LIMITED, "(%)", "no.", "count", "flop"))


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite JSON number {name}")


def check_reports(out_dir: Path) -> list[str]:
    """Impossible figures in the CSV and JSON reports of ``out_dir``, one line each."""
    problems: list[str] = []
    for path in sorted(out_dir.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        if not rows:
            continue
        header, body = rows[0], rows[1:]
        if header == ["Metric", "Value"]:
            for metric, value in body:
                if _numeric_label(metric) and value:
                    _check_value(metric, value, path.name, problems)
            continue
        for row in body:
            for label, value in zip(header, row, strict=False):
                if value and _numeric_label(label):
                    _check_value(label, value, path.name, problems)
    for path in sorted(out_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
        except ValueError as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        records = doc if isinstance(doc, list) else [doc]
        for rec in records:
            if isinstance(rec, dict):
                for label, value in rec.items():
                    _check_value(str(label), value, path.name, problems)
    return problems


# --------------------------------------------------------------------------- driver


def _base_rss_mb() -> float:
    """This process's RSS: a forked child starts there."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run(opts: argparse.Namespace, emit: Callable[[Case], None] | None = None) -> list[Case]:
    """Run cases ``opts.start`` .. ``opts.start + opts.cases - 1`` of ``opts.seed``."""
    import perfguard.analysis  # noqa: F401  (imported once here, shared by every child)
    import perfguard.cli  # noqa: F401
    import perfguard.report.writer  # noqa: F401
    import perfguard.trace  # noqa: F401

    if opts.split:  # every plain Kineto capture through the two-process reader
        from perfguard.trace import kineto_split, kineto_stream

        kineto_split.SPLIT_BYTES = 0
        kineto_stream.PIECE_BYTES = 1 << 20
    files = fixture_files(max_mb=opts.max_input_mb)
    if not files:
        raise SystemExit(f"no fixtures under {fixtures_dir()}")
    opts.base_rss_mb = _base_rss_mb()
    indices = list(opts.replay) if opts.replay else range(opts.start, opts.start + opts.cases)
    results = []
    with tempfile.TemporaryDirectory(prefix="perfguard-fuzz-") as tmp:
        work = Path(tmp)
        for i in indices:
            case, capture = make_case(i, opts.seed, files, work)
            if opts.split and capture.name.endswith(".json.gz") and case.kind != "bad_gzip":
                plain = capture.with_suffix("")  # x.json.gz -> x.json
                plain.write_bytes(gzip.decompress(capture.read_bytes()))
                capture.unlink()
                capture = plain
            if opts.keep_failures:
                kept = Path(opts.keep_failures) / capture.name
            run_case(case, capture, work, opts)
            if opts.keep_failures and case.outcome in BUGS:
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(capture, kept)
            capture.unlink(missing_ok=True)
            results.append(case)
            if emit:
                emit(case)
    return results


def summarize(cases: list[Case]) -> str:
    """Counts per outcome, per mutation kind, and one example of each bug."""
    lines = []
    by = collections.Counter(c.outcome for c in cases)
    lines.append(f"{len(cases)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
    bugs = sum(by[b] for b in BUGS)
    lines.append(f"bugs: {bugs}")
    for label, secs in (
        ("wall s", sorted(c.seconds for c in cases)),
        ("CPU s", sorted(c.cpu_seconds for c in cases)),
    ):
        if secs:
            lines.append(
                f"{label}: median {secs[len(secs) // 2]:.2f}, "
                f"p99 {secs[int(len(secs) * 0.99)]:.2f}, max {secs[-1]:.2f}"
            )
    if cases:
        worst = max(cases, key=lambda c: c.peak_rss_mb)
        lines.append(
            f"peak RSS: max {worst.peak_rss_mb:.0f} MB (case {worst.index}, {worst.kind}, "
            f"input {worst.input_mb:.1f} MB)"
        )
    fmt = collections.defaultdict(collections.Counter)
    for c in cases:
        family = "nsys" if c.fixture.endswith(".sqlite") else "kineto"
        fmt[(family, c.kind)][c.outcome] += 1
    lines.append("per mutation kind:")
    for (family, kind), counts in sorted(fmt.items()):
        lines.append(
            f"  {family:6} {kind:18} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
    examples: dict[tuple[str, str], Case] = {}
    for c in cases:
        if c.outcome in BUGS:
            examples.setdefault((c.outcome, c.kind), c)
    if examples:
        lines.append("examples:")
        for (outcome, kind), c in sorted(examples.items()):
            lines.append(f"  [{outcome}] case {c.index} {c.fixture} {kind} ({c.what}): {c.message}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--start", type=int, default=0, help="first case index (for chunks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replay", type=int, nargs="*", help="run only these case indices")
    p.add_argument(
        "--slow", type=float, default=10.0, help="CPU seconds over which a case is a bug"
    )
    p.add_argument(
        "--kill", type=float, default=30.0, help="CPU seconds after which it is killed (a timeout)"
    )
    p.add_argument(
        "--wall-kill", type=float, default=900.0, help="wall seconds after which it is killed"
    )
    p.add_argument("--mem-limit-mb", type=int, default=6144, help="address-space limit")
    p.add_argument(
        "--max-rss-mb",
        type=float,
        default=1536.0,
        help="peak RSS growth over the fork's start that counts as a blow-up",
    )
    p.add_argument(
        "--max-input-mb", type=float, help="mutate only the fixtures up to this size (a quick run)"
    )
    p.add_argument("--log", help="append one JSON line per case here")
    p.add_argument("--keep-failures", help="copy the captures of bugs to this folder")
    p.add_argument("--summarize", nargs="*", help="summarize these JSONL logs and exit")
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--split",
        action="store_true",
        help="write Kineto cases as plain JSON and read every one with two processes "
        "(kineto_split), in 1 MiB pieces",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    if opts.summarize:
        cases = [Case(**json.loads(ln)) for f in opts.summarize for ln in open(f) if ln.strip()]
        print(summarize(cases))
        return 0
    log = open(opts.log, "a") if opts.log else None  # noqa: SIM115

    def emit(case: Case) -> None:
        if log:
            log.write(json.dumps(asdict(case)) + "\n")
            log.flush()
        if not opts.quiet and case.outcome in BUGS:
            print(
                f"[{case.outcome}] case {case.index} {case.fixture} {case.kind} ({case.what}): "
                f"{case.message}",
                flush=True,
            )

    cases = run(opts, emit)
    print(summarize(cases))
    return 1 if any(c.outcome in BUGS for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
