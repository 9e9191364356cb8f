"""A damaged store checked (``perfguard baseline check``) and what can still be read of it
copied into a new one (``perfguard baseline recover``).

SQLite keeps no checksum of a page's values: its own checks (``PRAGMA
integrity_check``) find a page whose structure is broken, not a number
changed inside a cell. :func:`value_problems` adds what perfguard knows of
its own values: a number column holding text, a negative time or count, an
infinite float, a fingerprint or meta that is not JSON, a metric no
perfguard writes (the rows the store's readers refuse, found here by SQL
over whole tables rather than per record read).

:func:`recover` reads the damaged file table by table in rowid order and
steps over what cannot be read (a row fetch that fails is followed by a
search for the next rowid SQLite can reach), then keeps whole records only:
a frame table stores each run's rows in test order, so the rows lost
between two readable ones can only belong to the tests from the one before
to the one after, and those test records are dropped with the rest of their
rows, as are rows whose run or test was lost and records holding an
impossible value. What it kept and lost is counted per table. The copy is
built at the damaged store's schema version and then migrated, so an older
store is recovered too. Python's ``sqlite3`` has no ``.recover``; this needs
no sqlite3 program.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfguard.baseline.db import Database, integrity_problems, is_url, one_line
from perfguard.baseline.frames import FRAME_TYPES, NON_NEGATIVE
from perfguard.baseline.record import METRICS
from perfguard.baseline.schema import (
    APPLICATION_ID,
    FORMAT,
    MIGRATIONS,
    SCHEMA_VERSION,
    tables_at,
)
from perfguard.baseline.store import Store, open_database
from perfguard.errors import BaselineError, DamagedStoreError

__all__ = ["Check", "Recovery", "check", "recover", "value_problems"]

#: tables copied by recover, parents first (``meta`` is written anew)
COPIED = ("runs", "tests", *FRAME_TYPES, "acceptances")
#: rows read per query while copying
CHUNK = 20_000
#: problems listed in full (the rest counted)
SHOWN = 20

#: SQLite storage classes each record column kind may hold (NULL aside)
_STORAGE = {
    "int": "'integer'",
    "nullable_int": "'integer'",
    "bool": "'integer'",
    "float": "'integer', 'real'",
    "str": "'text'",
}


def _bad_rows(dialect: str) -> dict[str, str]:
    """Per table, the SQL condition a row no perfguard writes meets (see module docstring)."""
    sqlite = dialect == "sqlite"
    out = {}
    for table, columns in FRAME_TYPES.items():
        conds = [f'"{c}" < 0' for c in NON_NEGATIVE[table]]
        if sqlite:
            conds += [f"typeof(\"{c}\") NOT IN ({_STORAGE[k]}, 'null')" for c, k in columns.items()]
            conds += [
                f'abs("{c}") > 1.7976931348623157e308' for c, k in columns.items() if k == "float"
            ]
        out[table] = " OR ".join(conds) if conds else "0 = 1"
    metrics = ", ".join(f"'{m}'" for m in METRICS)
    out["tests"] = f"metric NOT IN ({metrics})"
    if sqlite:
        out["tests"] += " OR NOT json_valid(meta) OR json_type(meta) != 'object'"
        out["runs"] = (
            "NOT json_valid(fingerprint) OR json_type(fingerprint) != 'object' "
            "OR (environment IS NOT NULL AND NOT json_valid(environment)) "
            "OR typeof(dirty) != 'integer'"
        )
    return out


def value_problems(db: Database) -> dict[str, int]:
    """Rows per table holding a value no perfguard writes (none: an empty dict)."""
    out = {}
    present = set(db.tables())
    for table, where in _bad_rows(db.dialect).items():
        if table in present:
            with db.guard():
                (n,) = db.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()
            if n:
                out[table] = int(n)
    return out


@dataclass
class Check:
    """What ``perfguard baseline check`` found."""

    name: str
    #: the engine's own structural check (SQLite's integrity_check), one line each
    structure: list[str] = field(default_factory=list)
    #: table -> rows holding an impossible value
    values: dict[str, int] = field(default_factory=dict)
    #: table -> rows (None where it could not be counted)
    rows: dict[str, int | None] = field(default_factory=dict)
    #: meta.schema_version (None where it cannot be read)
    schema: int | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.structure and not self.values


def check(location: str | os.PathLike[str]) -> Check:
    """The whole store checked: SQLite's ``integrity_check`` (every page, and every index
    against its table) and :func:`value_problems`; a server store gets the value checks
    only (its pages are the server's). A store that cannot be opened at all is the usual
    one-line BaselineError."""
    start = time.perf_counter()
    db = open_database(location, create=False)
    try:
        result = Check(db.name)
        if db.dialect == "sqlite":
            result.structure = _structure(db)
        result.schema = _stored_schema(db)
        if result.schema is not None and result.schema <= SCHEMA_VERSION:
            with db.guard():
                have = set(db.tables())
            result.structure += [
                f"table {t} is missing (schema v{result.schema} has it)"
                for t in sorted(tables_at(result.schema) - have)
            ]
        if not result.structure and (result.schema or 0) <= SCHEMA_VERSION:
            result.values = value_problems(db)  # a newer schema's values are not ours to judge
        for table in db.tables():
            try:
                with db.guard():
                    (n,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
                result.rows[table] = int(n)
            except BaselineError:
                result.rows[table] = None
    finally:
        db.close()
    result.seconds = time.perf_counter() - start
    return result


def _structure(db: Database) -> list[str]:
    """SQLite's own check's findings. A damage bad enough stops ``integrity_check`` itself
    ("malformed") before it lists anything; then the cheaper ``quick_check``, which may
    list a few problems before it meets the same page, and else each table on its own."""
    for pragma in ("integrity_check(100)", "quick_check(100)", "quick_check(6)"):
        try:
            with db.guard():
                return integrity_problems(db.execute(f"PRAGMA {pragma}").fetchall())
        except DamagedStoreError:
            continue
    with db.guard():
        tables = db.tables()
    found = []
    for table in tables:
        try:
            with db.guard():
                found += integrity_problems(db.execute(f"PRAGMA quick_check({table})").fetchall())
        except DamagedStoreError:
            found.append(f"table {table}: cannot be checked, SQLite finds it malformed")
    return found or ["the check itself fails: the store is malformed"]


def _stored_schema(db: Database) -> int | None:
    """The store's schema version; BaselineError for a database that is not perfguard's."""
    try:
        with db.guard():
            kv = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except BaselineError as exc:
        if "no such table" in str(exc) or "does not exist" in str(exc):
            raise BaselineError(f"{db.name}: not a perfguard baseline store (no meta)") from None
        return None  # damaged: the structure check says where
    if kv.get("format") != FORMAT:
        raise BaselineError(f"{db.name}: not a perfguard baseline store")
    try:
        return int(kv["schema_version"])
    except (KeyError, ValueError):
        return None


# --------------------------------------------------------------------------- recover


@dataclass
class Recovery:
    """What ``perfguard baseline recover`` copied: rows per table kept and lost."""

    source: str
    dest: str
    #: table -> rows the source held (None where it could not be counted)
    before: dict[str, int | None] = field(default_factory=dict)
    #: table -> rows the new store holds
    kept: dict[str, int] = field(default_factory=dict)
    #: table -> rowid ranges (after, before) that could not be read
    unreadable: dict[str, list[tuple[int | None, int | None]]] = field(default_factory=dict)
    #: test records dropped because a row of theirs was unreadable or impossible
    incomplete_tests: int = 0
    #: rows dropped for an impossible value (before their records went too)
    impossible: dict[str, int] = field(default_factory=dict)

    def lost(self, table: str) -> int | None:
        before = self.before.get(table)
        return None if before is None else max(before - self.kept.get(table, 0), 0)

    @property
    def complete(self) -> bool:
        return all(self.lost(t) == 0 for t in self.kept) and not any(self.unreadable.values())


class _Target:
    """A raw connection as a migration's :class:`~perfguard.baseline.schema.SchemaTarget`."""

    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self.conn.execute(sql, params)


def _damaged(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, (sqlite3.ProgrammingError, sqlite3.NotSupportedError)
    )


def _source_version(conn: sqlite3.Connection) -> int:
    """The damaged store's schema version; the current one where meta cannot be read."""
    try:
        kv = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError:
        return SCHEMA_VERSION
    if kv.get("format") not in (None, FORMAT):
        raise BaselineError("not a perfguard baseline store (its meta names another format)")
    try:
        return int(kv.get("schema_version", SCHEMA_VERSION))
    except ValueError:
        return SCHEMA_VERSION


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})").fetchall()]


def _first_from(conn: sqlite3.Connection, table: str, rowid: int) -> int | None | bool:
    """The first rowid >= ``rowid`` SQLite can reach (None: no row there), or False when
    the way there is damaged."""
    try:
        row = conn.execute(
            f"SELECT rowid FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1", (rowid,)
        ).fetchone()
    except sqlite3.DatabaseError as exc:
        if not _damaged(exc):
            raise
        return False
    return None if row is None else int(row[0])


def _resume(conn: sqlite3.Connection, table: str, last: int) -> int | None:
    """The first readable rowid after the damage that follows ``last`` (None: none left):
    growing steps until one is reachable, then a bisection back to the first that is."""
    top = 2**63 - 1
    step, bad = 1, last
    while True:
        probe = min(last + step, top)
        found = _first_from(conn, table, probe)
        if found is not False:
            break
        bad = probe
        if probe == top:
            return None
        step *= 2
    good = probe  # reachable from here; bad: not
    while good - bad > 1:
        mid = (bad + good) // 2
        if _first_from(conn, table, mid) is False:
            bad = mid
        else:
            good = mid
    found = _first_from(conn, table, good)
    return None if found is False else found


def _read_rows(
    conn: sqlite3.Connection, table: str, cols: list[str], lost: list[tuple[Any, Any]]
) -> Iterator[list[tuple[Any, ...]]]:
    """Chunks of (rowid, *cols) rows in rowid order, stepping over what cannot be read;
    each stretch stepped over goes to ``lost`` as (rowid before, rowid after)."""
    names = ", ".join(f'"{c}"' for c in cols)
    sql = f"SELECT rowid, {names} FROM {table} WHERE rowid >= ? ORDER BY rowid"
    start: int | None = -(2**63)
    last: int | None = None  # the last row read
    while start is not None:
        chunk: list[tuple[Any, ...]] = []
        read_here = False
        try:
            for row in conn.execute(sql, (start,)):
                chunk.append(row)
                read_here = True
                if len(chunk) >= CHUNK:
                    yield chunk
                    last, chunk = int(chunk[-1][0]), []
            if chunk:
                yield chunk
            return
        except sqlite3.DatabaseError as exc:
            if not _damaged(exc):
                raise
            if chunk:
                yield chunk
                last = int(chunk[-1][0])
            # past the last row read here, or past ``start`` itself when even it failed
            after = _resume(conn, table, last if read_here and last is not None else start)
            lost.append((last, after))
            start = after


def _count(conn: sqlite3.Connection, table: str) -> int | None:
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.DatabaseError:
        return None


def recover(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Recovery:
    """Copy every readable, whole record of the SQLite store ``src`` into a new store
    ``dest`` (module docstring); the source is only read."""
    if is_url(src) or is_url(dest):
        raise BaselineError(
            f"{src}: recover copies a SQLite file into a new one; a PostgreSQL server's "
            "damage is its own (pg_amcheck), restore it from a dump"
        )
    src, dest = Path(src), Path(dest)
    if not src.is_file():
        raise BaselineError(f"{src}: no baseline store here")
    if dest.exists():
        raise BaselineError(f"{dest}: already exists; recover writes a new store only")
    try:
        source = sqlite3.connect(f"file:{src.resolve()}?mode=ro", uri=True)
        source.execute("SELECT 1").fetchone()
    except sqlite3.Error as exc:
        raise BaselineError(f"{src}: cannot open: {one_line(exc)}") from None
    out = Recovery(str(src), str(dest))
    try:
        try:
            version = _source_version(source)
            present = {
                str(r[0])
                for r in source.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        except sqlite3.DatabaseError as exc:
            raise BaselineError(
                f"{src}: cannot recover anything: its list of tables cannot be read "
                f"({one_line(exc)}); restore it from git or a .bak copy"
            ) from None
        except BaselineError as exc:
            raise BaselineError(f"{src}: {exc}") from None
        if version > SCHEMA_VERSION:
            raise BaselineError(
                f"{src}: store schema version {version} is newer than this perfguard "
                f"supports ({SCHEMA_VERSION}); recover it with a newer perfguard"
            )
        _copy(source, dest, version, present, out)
    finally:
        source.close()
    with Store(dest) as store:  # brought to the current schema; nothing to keep of the copy
        store.close()
    for old in dest.parent.glob(f"{dest.name}.v*.bak"):
        old.unlink()
    return out


def _copy(
    source: sqlite3.Connection, dest: Path, version: int, present: set[str], out: Recovery
) -> None:
    """The copy itself: ``dest`` built at ``version``, every readable row copied with its
    ids, then what is not whole removed (module docstring)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(dest), isolation_level=None)
    try:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("BEGIN")
        target = _Target(conn)
        for number, migrate in MIGRATIONS:
            if number <= version:
                migrate(target)
        conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
        incomplete: set[tuple[int, int]] = set()  # test_id ranges whose rows were not all read
        for table in COPIED:
            if table not in present or table not in _tables(conn):
                continue
            out.before[table] = _count(source, table)
            cols = [c for c in _columns(conn, table) if c in set(_columns(source, table))]
            lost: list[tuple[Any, Any]] = []
            names = ", ".join(["rowid", *(f'"{c}"' for c in cols)])
            marks = ", ".join("?" * (len(cols) + 1))
            test_at = cols.index("test_id") + 1 if table in FRAME_TYPES else None
            edges: list[tuple[int, Any]] = []  # (rowid, test_id) of each chunk's ends
            for chunk in _read_rows(source, table, cols, lost):
                conn.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", chunk)
                if test_at is not None:
                    edges += [(int(r[0]), r[test_at]) for r in (chunk[0], chunk[-1])]
            out.unreadable[table] = lost
            if test_at is not None:
                incomplete |= {_tests_around(edges, before, after) for before, after in lost}
        _drop_what_is_not_whole(conn, incomplete, out)
        conn.execute("COMMIT")
        for table in COPIED:
            if table in out.before:
                out.kept[table] = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except BaseException:
        conn.close()
        dest.unlink(missing_ok=True)
        raise
    conn.close()


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _tests_around(
    edges: list[tuple[int, Any]], before: int | None, after: int | None
) -> tuple[int, int]:
    """The test_ids whose rows a stretch stepped over (rowids ``before`` < r < ``after``)
    may have held: from the last row read before it to the first read after it (rows are
    stored in test order), unbounded where there is no such row or its test_id is not an
    integer (then it is dropped as impossible anyway)."""
    low, high = -(2**63), 2**63 - 1
    if before is not None:
        ids = [t for r, t in edges if r <= before and isinstance(t, int)]
        low = ids[-1] if ids else low
    if after is not None:
        ids = [t for r, t in edges if r >= after and isinstance(t, int)]
        high = ids[0] if ids else high
    return low, high


def _drop_what_is_not_whole(
    conn: sqlite3.Connection, incomplete: set[tuple[int, int]], out: Recovery
) -> None:
    """Remove, in the copy: rows with an impossible value and the test records that hold
    them, test records some of whose rows were not read, then every row whose run or test
    is gone."""
    dropped: set[int] = set()
    frames = [t for t in FRAME_TYPES if t in _tables(conn)]
    for table, where in _bad_rows("sqlite").items():
        if table not in _tables(conn):
            continue
        (n,) = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()
        if not n:
            continue
        out.impossible[table] = int(n)
        if table in FRAME_TYPES or table == "tests":
            ids = conn.execute(f"SELECT DISTINCT test_id FROM {table} WHERE {where}")
            dropped |= {int(r[0]) for r in ids if isinstance(r[0], int)}
        conn.execute(f"DELETE FROM {table} WHERE {where}")
    for low, high in incomplete:
        ids = conn.execute("SELECT test_id FROM tests WHERE test_id BETWEEN ? AND ?", (low, high))
        dropped |= {int(r[0]) for r in ids}
    if dropped:
        ids_json = json.dumps(sorted(dropped))
        conn.execute(
            "DELETE FROM tests WHERE test_id IN (SELECT value FROM json_each(?))", (ids_json,)
        )
    out.incomplete_tests = len(dropped)
    conn.execute("DELETE FROM tests WHERE run_id NOT IN (SELECT run_id FROM runs)")
    for table in frames:
        conn.execute(f"DELETE FROM {table} WHERE test_id NOT IN (SELECT test_id FROM tests)")
