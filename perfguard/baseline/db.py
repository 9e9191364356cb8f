"""The store's connection to its database: a SQLite file, or a PostgreSQL server (:mod:`.pg`).

:class:`~perfguard.baseline.store.Store` holds the store's logic once, in
SQL both dialects run; this module holds what differs between the two
engines: how to connect, how a write transaction takes its lock, which
errors mean "try again", how rows are bulk-inserted, how a list of ids is
passed, and how an engine error becomes a one-line
:class:`~perfguard.errors.BaselineError` naming the store. SQL is written
with ``?`` placeholders; a backend rewrites them for its driver.

Damage is found here, once, for every reader and writer: every statement
and every row fetched goes through :meth:`Database.execute`, and an engine
error that means the data is damaged (SQLite: a malformed page, not a
database, text that is not UTF-8; PostgreSQL: data or index corruption)
becomes a :class:`~perfguard.errors.DamagedStoreError` there, whoever asked.
A SQLite file up to :data:`CHECK_ON_OPEN_BYTES` is also checked whole
(``PRAGMA integrity_check``) when opened, and any file (``quick_check``)
before its first write,
so a damage no query happens to step on is found before anything is shown
or written.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from perfguard.baseline.schema import APPLICATION_ID
from perfguard.errors import BaselineError, DamagedStoreError

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5_000
#: total time a write keeps retrying a locked store before giving up
LOCK_BUDGET_S = 60.0

#: a SQLite store up to this size (file and WAL) is checked whole when opened (``PRAGMA
#: integrity_check``: every page, and every index against its table, since a flipped key
#: in an index page passes ``quick_check`` and hides its rows from a lookup): ~6.2 ms a MB
#: from the page cache (0.86 s for a 138 MB store of benchmarks/publish_scale.py), so at
#: most ~0.15 s. A larger one gets ``quick_check`` (2.4 ms a MB: 0.33 s at 138 MB, ~3.4 s
#: at 1.4 GB) before its first write only; its reads find the damage on the pages they read
CHECK_ON_OPEN_BYTES = 24 * 2**20
#: SQLite's primary result codes that mean the file's content is damaged
_SQLITE_DAMAGE_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
#: ... and the messages that say so where the driver gives no code (Python < 3.11)
_SQLITE_DAMAGE_WORDS = ("malformed", "not a database", "corrupt", "could not decode to utf-8")

#: URL schemes that select the PostgreSQL backend
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names a server store (a PostgreSQL URL) rather than a file."""
    return isinstance(location, str) and location.lower().startswith(POSTGRES_SCHEMES)


class Database:
    """One connection to the store's database; subclasses speak one engine."""

    dialect: str
    #: how messages name the store (a path, or a URL without its password)
    name: str
    #: why this store cannot be written here (a read-only file system, a file or folder
    #: without write permission), or None: it is readable, and every write is refused
    read_only: str | None = None

    _conn: Any = None

    @property
    def conn(self) -> Any:
        """The driver's connection; BaselineError once closed."""
        if self._conn is None:
            raise BaselineError(f"{self.name}: store is closed")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------- damage
    def damage_of(self, exc: BaseException) -> str | None:
        """What ``exc`` says is damaged in the store's data (one line), or None when it
        is another kind of error (locked, permission, our SQL)."""
        return None

    def damaged(self, detail: str) -> DamagedStoreError:
        """The one-line error for a damaged store: what was found, and what to do."""
        return DamagedStoreError(f"{self.name}: the store is damaged ({detail}); {self.remedy()}")

    def remedy(self) -> str:
        return "restore it from a backup or a dump"

    @contextmanager
    def decoding(self, what: str) -> Iterator[None]:
        """Rows read from the store turned into objects: a value that cannot be what its
        column holds (a fingerprint that is not JSON, a number stored as text, a negative
        time: :func:`~perfguard.baseline.frames.impossible`) is damage too, said as one
        line naming ``what`` rather than a crash."""
        try:
            yield
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            detail = one_line(exc)[:200]
            raise self.damaged(f"{what}: {type(exc).__name__}: {detail}") from None

    def verify(self, full: bool = False) -> None:
        """Check the whole store's structure once (the engine's own check; ``full``: its
        indexes against their tables too), before its first write; DamagedStoreError
        naming what failed. None by default: a server checks its own pages."""

    def open_check(self) -> None:
        """What :meth:`verify` costs little enough to run at every open."""

    # ------------------------------------------------------------- engine specifics
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run ``sql``; a cursor whose rows are fetched under the same damage check."""
        raise NotImplementedError

    def insert_rows(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        """Append ``rows`` (plain Python values) to ``table`` inside the open transaction."""
        raise NotImplementedError

    def ids_in(self, column: str) -> str:
        """SQL ``column IN <the ids given as one parameter>`` (see :meth:`ids_param`)."""
        raise NotImplementedError

    def ids_param(self, ids: Iterable[int]) -> Any:
        raise NotImplementedError

    def json_number(self, column: str, key: str) -> str:
        """SQL of the number under top-level ``key`` of the JSON text ``column`` (NULL when
        absent or null): a few figures of a record's ``meta`` without reading it whole."""
        raise NotImplementedError

    def tables(self) -> list[str]:
        """Names of the tables in the store's namespace, sorted."""
        raise NotImplementedError

    def foreign_marker_ok(self) -> bool:
        """Whether the engine-level mark (SQLite's application_id) allows a perfguard store."""
        return True

    def mark_new(self) -> None:
        """Mark a store being created as perfguard's at the engine level, if it can be."""

    def finish_open(self) -> None:
        """Engine settings for a store whose schema is up to date (none by default)."""

    def backup(self, version: int) -> str | None:
        """Keep a copy of the store before migrating it from ``version``; where, or None."""
        return None

    def detach(self) -> None:
        """Go on with a private in-memory copy of the store (to migrate a read-only one
        without writing it); BaselineError where the engine cannot."""
        raise BaselineError(
            f"{self.name}: the store needs a schema upgrade but is read-only "
            f"({self.read_only}); open it once with write access to upgrade it"
        )

    def is_retryable(self, exc: BaseException) -> bool:
        raise NotImplementedError

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Turn the engine's errors about the store into one-line BaselineErrors naming it."""
        raise NotImplementedError
        yield  # pragma: no cover

    @contextmanager
    def write(self, *, exclusive: bool = False, key: str | None = None) -> Iterator[None]:
        """One write transaction. ``exclusive``: no other exclusive writer at the same time
        (schema upgrades, imports and prunes read before they write). ``key``: no other
        writer with the same key at the same time (a save replacing one commit's run)."""
        raise NotImplementedError
        yield  # pragma: no cover

    def lock_key(self, key: str) -> None:
        """Inside a write: wait for, then hold to its end, ``write(key=key)``'s lock too (an
        import joining a run that keyed saves write). SQLite's writers are all exclusive."""

    @contextmanager
    def read(self) -> Iterator[None]:
        """A consistent snapshot for a read of several queries."""
        raise NotImplementedError
        yield  # pragma: no cover

    # ------------------------------------------------------------- shared
    def query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Rows of ``sql`` as a DataFrame (columns named as the query names them)."""
        with self.guard():
            cur = self.execute(sql, params)
            rows = cur.fetchall()
            columns = [d[0] for d in cur.description]
        return pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)

    def retry(self, action: Callable[[], T]) -> T:
        """Run ``action`` again, with growing randomised pauses, while the engine says
        another writer is in the way (SQLite: locked; PostgreSQL: serialization, deadlock)."""
        deadline = time.monotonic() + LOCK_BUDGET_S
        pause = 0.05
        while True:
            with self.guard():
                try:
                    return action()
                except Exception as exc:
                    if not self.is_retryable(exc) or time.monotonic() + pause > deadline:
                        raise
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 2.0)


# --------------------------------------------------------------------------- SQLite


#: the first bytes of every SQLite 3 database file (sqlite.org/fileformat.html, 1.3.1)
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _not_sqlite(path: Path) -> bool:
    """A non-empty file whose header is not SQLite's (an empty file is a new store)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError:
        return False  # unreadable: the open says why
    return bool(head) and head != _SQLITE_MAGIC


def integrity_problems(rows: Iterable[Sequence[Any]]) -> list[str]:
    """The problems ``PRAGMA quick_check`` / ``integrity_check`` rows name (none: "ok"),
    one line each, without SQLite's ``*** in database main ***`` headings."""
    lines = (line.strip() for row in rows for line in str(row[0]).splitlines())
    return [line for line in lines if line and line != "ok" and not line.startswith("***")]


class _Rows:
    """A SQLite cursor whose fetches turn a damaged page met mid-scan into
    :class:`DamagedStoreError` (SQLite reads a page only when a row needs it)."""

    __slots__ = ("_cur", "_db")

    def __init__(self, db: SQLiteDatabase, cur: sqlite3.Cursor) -> None:
        self._db, self._cur = db, cur

    @property
    def description(self) -> Any:
        return self._cur.description

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def fetchone(self) -> Any:
        with self._db.damage_check():
            return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        with self._db.damage_check():
            return self._cur.fetchall()

    def fetchmany(self, size: int) -> list[Any]:
        with self._db.damage_check():
            return self._cur.fetchmany(size)

    def __iter__(self) -> Iterator[Any]:
        with self._db.damage_check():
            yield from self._cur  # ~3 % over the bare cursor on 2.5M rows streamed


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


def _read_only_reason(path: Path) -> str | None:
    """Why ``path`` (a store file, or the folder a new one goes in) cannot be written
    by this process, or None. Checked with ``access(2)``, which sees a read-only mount
    even for root; SQLite also needs the folder, for its journal and WAL files."""
    folder = path if path.is_dir() else path.parent
    try:
        if hasattr(os, "statvfs") and os.statvfs(path).f_flag & os.ST_RDONLY:  # not on Windows
            return "on a read-only file system"
    except OSError:
        pass
    if not path.is_dir() and not os.access(path, os.W_OK):
        return "the file is not writable"
    if not os.access(folder, os.W_OK):
        return f"its folder {folder} is not writable"
    return None


def _read_only_uri(path: Path) -> str:
    """The SQLite URI that reads ``path`` without writing it or anything beside it.

    ``mode=ro`` alone still creates the ``-wal`` and ``-shm`` files of a WAL store
    (and fails where the folder is read-only), so without a ``-wal`` file (no writer
    has the store open) it is opened ``immutable``: read as a file nobody changes,
    with no locks and no side files. With one, a writer may be at work: plain
    ``mode=ro`` reads through its WAL.
    """
    quoted = urllib.parse.quote(str(path.resolve()), safe="/")
    wal = path.with_name(path.name + "-wal")
    return f"file:{quoted}?mode=ro" + ("" if wal.exists() else "&immutable=1")


class SQLiteDatabase(Database):
    """A store in one SQLite file, written in WAL mode by ``BEGIN IMMEDIATE`` transactions.

    Several pytest workers (xdist) and CI jobs write to the same file: every
    write takes the write lock up front (no upgrade deadlock), with a busy
    timeout and a retry with backoff when SQLite still reports it locked.
    """

    dialect = "sqlite"

    def __init__(self, path: str | os.PathLike[str], *, create: bool) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self._conn: sqlite3.Connection | None = None
        if self.path.is_dir():
            raise BaselineError(f"{self.path}: is a directory, not a baseline store file")
        if _not_sqlite(self.path):  # the wrong file named, not a damaged store: a usage error
            raise BaselineError(f"{self.path}: not a baseline store (not an SQLite database)")
        #: the store was copied into memory to be read through a migration
        self.in_memory = False
        target: str = str(self.path)
        uri = False
        if not self.path.exists():
            if not create:
                raise BaselineError(f"{self.path}: no baseline store here")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BaselineError(f"{self.path}: cannot create the store folder: {exc}") from None
            folder = _read_only_reason(self.path.parent)
            if folder is not None:
                raise BaselineError(f"{self.path}: cannot create the store: {folder}")
        else:
            self.read_only = _read_only_reason(self.path)
            if self.read_only is not None:
                target, uri = _read_only_uri(self.path), True
        try:
            self._conn = sqlite3.connect(
                target, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, uri=uri
            )
        except sqlite3.Error as exc:
            raise BaselineError(f"{self.path}: cannot open: {one_line(exc)}") from None
        #: the whole-store check passed on this connection
        self.checked = False
        with self.guard():
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

    @property
    def conn(self) -> sqlite3.Connection:
        return super().conn

    def damage_of(self, exc: BaseException) -> str | None:
        if not isinstance(exc, sqlite3.DatabaseError) or isinstance(
            exc, (sqlite3.ProgrammingError, sqlite3.NotSupportedError)
        ):
            return None
        msg = one_line(exc)
        code = getattr(exc, "sqlite_errorcode", None)
        if (code is not None and code & 0xFF in _SQLITE_DAMAGE_CODES) or any(
            w in msg.lower() for w in _SQLITE_DAMAGE_WORDS
        ):
            return msg[:200]  # a text that is not UTF-8 is quoted: keep the line short
        return None

    def remedy(self) -> str:
        return (
            f"'perfguard baseline check --store {self.name}' says what is wrong, "
            f"'perfguard baseline recover {self.name} NEW.db' copies what can still be read "
            "into a new store (or restore it from git or a .bak copy)"
        )

    @contextmanager
    def damage_check(self) -> Iterator[None]:
        """Let every error through but a damaged store's, which becomes DamagedStoreError."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            detail = self.damage_of(exc)
            if detail is None:
                raise
            raise self.damaged(detail) from None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        with self.damage_check():
            return _Rows(self, self.conn.execute(sql, tuple(params)))

    def insert_rows(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        cols = ", ".join(f'"{c}"' for c in columns)
        marks = ", ".join("?" * len(columns))
        with self.damage_check():
            self.conn.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)

    def verify(self, full: bool = False) -> None:
        """``PRAGMA quick_check`` (every page of every table and index read and its
        structure checked), or with ``full`` ``integrity_check`` (each index against its
        table too), once per connection."""
        if self.checked:
            return
        pragma = "integrity_check" if full else "quick_check"
        # no guard: a locked store stays the driver's error, for the caller's retry
        found = integrity_problems(self.execute(f"PRAGMA {pragma}(6)").fetchall())
        if found:
            more = f", and {len(found) - 1} more problem(s)" if len(found) > 1 else ""
            raise self.damaged(f"{pragma}: {found[0][:200]}{more}")
        self.checked = True

    def open_check(self) -> None:
        if self.in_memory:
            return
        size = sum(
            p.stat().st_size
            for p in (self.path, self.path.with_name(self.path.name + "-wal"))
            if p.exists()
        )
        if size <= CHECK_ON_OPEN_BYTES:
            self.verify(full=True)

    def ids_in(self, column: str) -> str:
        return f"{column} IN (SELECT value FROM json_each(?))"

    def ids_param(self, ids: Iterable[int]) -> Any:
        return json.dumps([int(i) for i in ids])

    def json_number(self, column: str, key: str) -> str:
        return f"CAST(json_extract({column}, '$.{key}') AS REAL)"

    def tables(self) -> list[str]:
        rows = self.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        return sorted(r[0] for r in rows)

    def foreign_marker_ok(self) -> bool:
        return self.execute("PRAGMA application_id").fetchone()[0] in (0, APPLICATION_ID)

    def mark_new(self) -> None:
        self.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def finish_open(self) -> None:
        """WAL mode (readers never block the writer) and foreign keys, once the schema is there.
        A read-only store is left in the mode it has: switching would write it."""
        if self.read_only is None and (
            self.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"
        ):
            self.retry(lambda: self.execute("PRAGMA journal_mode=WAL"))
        self.execute("PRAGMA foreign_keys = ON")

    def detach(self) -> None:
        """Copy the read-only file into memory (SQLite's backup API, one consistent
        snapshot) and go on there: a migration then changes only the copy."""
        memory = sqlite3.connect(":memory:", isolation_level=None)
        try:
            with self.guard():
                self.conn.backup(memory)
        except BaseException:
            memory.close()
            raise
        self.conn.close()
        self._conn = memory
        self.in_memory = True

    def backup(self, version: int) -> str | None:
        """Copy the store as it is (a consistent snapshot) to ``<name>.v<N>.bak``."""
        if self.in_memory:
            return None  # the file itself is never written: nothing to keep a copy of
        dest = self.path.with_name(f"{self.path.name}.v{version}.bak")
        n = 1
        while dest.exists():  # an earlier backup of the same version is kept too
            n += 1
            dest = self.path.with_name(f"{self.path.name}.v{version}-{n}.bak")
        # a second connection reads while ours holds the write lock: a backup through the
        # writing connection itself would wait for its own transaction forever
        source = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000)
        target = sqlite3.connect(str(dest))
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        return str(dest)

    def is_retryable(self, exc: BaseException) -> bool:
        return _is_locked(exc)

    @contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except (sqlite3.ProgrammingError, sqlite3.NotSupportedError):
            raise  # our bug, not the file's
        except sqlite3.DatabaseError as exc:
            msg = one_line(exc)
            if _is_locked(exc):
                raise BaselineError(
                    f"{self.name}: store is locked by another writer ({msg})"
                ) from None
            detail = self.damage_of(exc)
            if detail is not None:
                raise self.damaged(detail) from None
            raise BaselineError(f"{self.name}: cannot use the baseline store: {msg}") from None

    def _end(self, conn: sqlite3.Connection) -> None:
        """Roll back what a failed body began, keeping the body's error: a damaged page
        may fail the ROLLBACK too, which must not hide why."""
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    @contextmanager
    def write(self, *, exclusive: bool = False, key: str | None = None) -> Iterator[None]:
        self.verify()  # never write into a damaged file: a new run would sit beside the hole
        conn = self.conn  # BEGIN IMMEDIATE: every SQLite writer is exclusive
        self.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.execute("COMMIT")
        except BaseException:
            self._end(conn)  # also after a failed COMMIT, so a retry starts clean
            raise

    @contextmanager
    def read(self) -> Iterator[None]:
        conn = self.conn
        if conn.in_transaction:  # already inside a write: it sees its own snapshot
            yield
            return
        self.execute("BEGIN")  # deferred: the snapshot is taken at the first read
        try:
            yield
        except BaseException:
            self._end(conn)
            raise
        if conn.in_transaction:
            with self.guard():
                self.execute("COMMIT")
