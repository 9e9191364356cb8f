"""A baseline store on a PostgreSQL server, selected by a ``postgresql://`` URL.

The store lives in the connection's current schema (the first of its
``search_path``, normally ``public``; pick another with the libpq option
``?options=-csearch_path%3Dperfguard``). The database must exist; the
tables are created, and brought forward, by the same migrations as a SQLite
file (:mod:`.schema`). Each migration step and each run is one transaction;
PostgreSQL's DDL is transactional, so a failed migration leaves the store as
it was and no backup copy is needed. Writers that read before they write
(schema upgrades, imports, prunes) hold a transaction-level advisory lock;
``save_run`` writers take one keyed by their commit and dirty flag (a save
replaces that commit's earlier run, or joins its run group's run, saved by jobs on
other hosts), so saves of different commits do not wait for each other.

psycopg 3 is imported only here, so a SQLite-only install never needs it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from perfguard.baseline.db import Database, one_line
from perfguard.errors import BaselineError

#: seconds to wait for the server before giving up (unless the URL sets connect_timeout)
CONNECT_TIMEOUT_S = 10
#: key of the advisory lock exclusive writers of a store take (one per database)
LOCK_KEY = zlib.crc32(b"perfguard-baseline-store")


def display_url(url: str) -> str:
    """``url`` with any password replaced by ``***``: what messages name the store by."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    query = parts.query
    if query:
        pairs = [(k, "***" if k == "password" else v) for k, v in parse_qsl(query, True)]
        query = urlencode(pairs, safe="/:%=-")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class PostgresDatabase(Database):
    """One psycopg 3 connection (autocommit; transactions are explicit) to the store's server."""

    dialect = "postgresql"

    def __init__(self, url: str, *, create: bool) -> None:
        self.name = display_url(url)
        self._conn: Any = None
        try:
            import psycopg
        except ImportError:
            raise BaselineError(
                f"{self.name}: a PostgreSQL store needs psycopg 3: "
                "pip install 'perfguard[postgresql]'"
            ) from None
        self._psycopg = psycopg
        try:
            params = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise BaselineError(f"{self.name}: bad store URL: {one_line(exc)}") from None
        extra: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in params:
            extra["application_name"] = "perfguard"
        try:
            self._conn = psycopg.connect(url, **extra)
        except psycopg.Error as exc:
            raise BaselineError(f"{self.name}: cannot connect: {one_line(exc)}") from None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        # the store's SQL uses ``?``; psycopg wants ``%s`` (and a literal % doubled)
        sql = sql.replace("%", "%%").replace("?", "%s")
        return self.conn.execute(sql, tuple(params), prepare=False)

    def insert_rows(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        """COPY: the fastest way rows get into PostgreSQL, one round trip per table."""
        cols = ", ".join(f'"{c}"' for c in columns)
        with self.conn.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def ids_in(self, column: str) -> str:
        return f"{column} = ANY(?)"

    def ids_param(self, ids: Iterable[int]) -> Any:
        return [int(i) for i in ids]

    def json_number(self, column: str, key: str) -> str:
        return f"(({column})::jsonb ->> '{key}')::double precision"

    def tables(self) -> list[str]:
        # pg_tables, not information_schema: it lists tables this role may not read, too
        rows = self.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
        return sorted(r[0] for r in rows)

    def is_retryable(self, exc: BaseException) -> bool:
        errors = self._psycopg.errors
        return isinstance(
            exc, (errors.SerializationFailure, errors.DeadlockDetected, errors.LockNotAvailable)
        )

    @contextmanager
    def guard(self) -> Iterator[None]:
        psycopg = self._psycopg
        try:
            yield
        except psycopg.errors.SyntaxError:
            raise  # our bug, not the server's
        except psycopg.Error as exc:
            msg = one_line(getattr(exc.diag, "message_primary", None) or exc)
            if isinstance(exc, psycopg.errors.InsufficientPrivilege):
                raise BaselineError(f"{self.name}: permission denied: {msg}") from None
            if isinstance(exc, psycopg.OperationalError) and self.conn.closed:
                raise BaselineError(f"{self.name}: lost the server: {msg}") from None
            raise BaselineError(f"{self.name}: cannot use the baseline store: {msg}") from None

    def lock_key(self, key: str) -> None:
        digest = hashlib.sha256(f"perfguard-save:{key}".encode()).digest()
        lock = int.from_bytes(digest[:8], "big", signed=True)
        self.execute("SELECT pg_advisory_xact_lock(?)", (lock,))

    @contextmanager
    def write(self, *, exclusive: bool = False, key: str | None = None) -> Iterator[None]:
        with self.conn.transaction():
            if exclusive:
                self.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_KEY,))
            if key is not None:  # one lock per key: saves of other commits do not wait
                self.lock_key(key)
            yield

    @contextmanager
    def read(self) -> Iterator[None]:
        if self.conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
            yield  # inside a write: it sees its own rows
            return
        with self.conn.transaction():
            self.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield
