"""The baseline store: runs and their test records, in a SQLite file or on a PostgreSQL server.

``open_store(location)`` (or ``Store(location)``) picks the backend: a
``postgresql://`` URL is a server (:mod:`.pg`), anything else a SQLite file
(:mod:`.db`), the embedded default. The logic is written once, in SQL both
engines run; how each engine locks, retries, bulk-inserts and reports errors
lives in its backend.

:class:`Store` opens the database, brings its schema forward and closes it; the
work is done by three parts sharing that one connection, one concern each:
``store.reader`` (:class:`~.reader.Reader`: runs, records, a test's history and
tables), ``store.writer`` (:class:`~.writer.Writer`: saving a run, importing,
copying, pruning; every run in one transaction, so a run is in the store whole
or not at all) and ``store.accepted`` (:class:`~.accept.Acceptances`). The JSON
export is :mod:`.export`. The store's own methods of the same names (``runs``,
``save``, ``accept``, ...) hand over to the part, so a user's ``with Store(path) as
store: store.runs()`` keeps working; perfguard's own code calls the parts.

The schema is versioned (``meta.schema_version``) and brought forward by an
ordered list of migrations (:mod:`.schema`), the same on both engines;
before migrating an existing SQLite file it is copied to
``<name>.v<N>.bak`` (a PostgreSQL migration is one transaction instead), and
no migration drops data. A file or database that is not a perfguard store,
or one written by a newer perfguard, is refused with a one-line
:class:`~perfguard.errors.BaselineError` and never modified.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from perfguard.baseline.accept import Acceptances
from perfguard.baseline.db import Database, SQLiteDatabase, is_url
from perfguard.baseline.export import EXPORT_FORMAT, write_export
from perfguard.baseline.pg import PostgresDatabase
from perfguard.baseline.reader import Reader
from perfguard.baseline.record import RunInfo, TestRecord
from perfguard.baseline.schema import FORMAT, MIGRATIONS, SCHEMA_VERSION, tables_at
from perfguard.baseline.writer import Imported, SavedRun, Writer
from perfguard.errors import BaselineError, DamagedStoreError

__all__ = [
    "DEFAULT_STORE",
    "EXPORT_FORMAT",
    "SCHEMA_VERSION",
    "Imported",
    "SavedRun",
    "Store",
    "open_store",
]

#: where the plugin and the CLI keep the store, relative to the project root
DEFAULT_STORE = Path("baselines") / "perfguard.db"


def open_store(location: str | os.PathLike[str], *, create: bool = True) -> Store:
    """The store at ``location``: a ``postgresql://`` URL, or a SQLite file path.

    ``create``: make the store (a SQLite file and its folder, or the tables
    in an existing PostgreSQL database) when there is none yet; without it a
    missing store is a BaselineError.
    """
    return Store(location, create=create)


def store_location(text: str | os.PathLike[str]) -> str | Path:
    """A store option's value as :func:`open_store` takes it: a URL as given, else a Path."""
    return str(text) if is_url(text) else Path(text)


def open_database(location: str | os.PathLike[str], *, create: bool) -> Database:
    """The backend ``location`` selects: a PostgreSQL URL, else a SQLite file path."""
    if is_url(location):
        return PostgresDatabase(str(location), create=create)
    if isinstance(location, str) and "://" in location:
        scheme = location.split("://", 1)[0]
        raise BaselineError(
            f"{location}: unknown store URL scheme {scheme!r}; use a file path or "
            "postgresql://user@host/dbname"
        )
    return SQLiteDatabase(location, create=create)


class Store:
    """A perfguard baseline store at ``location`` (created, with its folder, when ``create``).

    Use as a context manager or call :meth:`close`. The work is done by
    ``reader``, ``writer`` and ``accepted`` (module docstring); every public method
    raises :class:`BaselineError` (one line naming the store) for a store it
    cannot use: not SQLite or not reachable, not perfguard's, newer schema,
    corrupt, locked past the retry budget, not permitted.
    """

    def __init__(self, location: str | os.PathLike[str], *, create: bool = True) -> None:
        self._db: Database | None = None
        db = open_database(location, create=create)
        #: the SQLite file, or None for a server store
        self.path: Path | None = getattr(db, "path", None)
        #: how messages name the store (a path, or the URL without its password)
        self.name = db.name
        self.dialect = db.dialect
        try:
            self._db = db
            self._open(create)
        except BaseException:
            db.close()
            self._db = None
            raise
        #: the queries (runs, records, a test's history and tables)
        self.reader = Reader(db)
        #: the acceptances: recorded, listed, carried by imports and copies
        self.accepted = Acceptances(db)
        #: the writes: saving a run, importing, copying, pruning
        self.writer = Writer(db, self.accepted)
        # the parts' methods under the names the store has always had
        self.save, self.import_file = self.writer.save, self.writer.import_file
        self.add_runs, self.prune = self.writer.add_runs, self.writer.prune
        self.runs, self.run_info = self.reader.runs, self.reader.run_info
        self.load_run, self.load_test = self.reader.load_run, self.reader.load_test
        self.history, self.machine_evidence = self.reader.history, self.reader.machine_evidence
        self.runs_with_test, self.nodeids = self.reader.runs_with_test, self.reader.nodeids
        self.test_rows = self.reader.test_rows
        self.accept, self.acceptances = self.accepted.record, self.accepted.table

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> Database:
        if self._db is None:
            raise BaselineError(f"{self.name}: store is closed")
        return self._db

    @property
    def schema_version(self) -> int:
        with self.db.guard():
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0])

    def __repr__(self) -> str:
        return f"Store({self.name!r})"

    # ----------------------------------------------------------------- opening
    def _stored_version(self) -> int:
        """The store's schema version: 0 for an empty one; refuses foreign or newer ones."""
        db = self.db
        with db.guard():
            tables = db.tables()
        if not tables:
            return 0
        fmt = version = None
        with db.guard():
            marker_ok = db.foreign_marker_ok()
        if "meta" in tables and marker_ok:
            try:
                with db.guard():
                    kv = dict(db.execute("SELECT key, value FROM meta").fetchall())
            except DamagedStoreError:
                raise  # perfguard's store, damaged: not a foreign file
            except BaselineError as exc:
                if "permission denied" in str(exc):
                    raise  # a store this role may not read, not a foreign one
                kv = {}
            fmt, version = kv.get("format"), kv.get("schema_version")
        if fmt != FORMAT or version is None:
            shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
            what = "an SQLite file" if db.dialect == "sqlite" else "a PostgreSQL schema"
            raise BaselineError(
                f"{self.name}: not a perfguard baseline store ({what} with tables {shown})"
            )
        try:
            number = int(version)
        except ValueError:
            raise BaselineError(f"{self.name}: bad schema_version {version!r} in meta") from None
        if number > SCHEMA_VERSION:
            raise BaselineError(
                f"{self.name}: store schema version {number} is newer than this perfguard "
                f"supports ({SCHEMA_VERSION}); upgrade perfguard to use it"
            )
        missing = sorted(tables_at(number) - set(tables))
        if missing:
            raise db.damaged(f"schema v{number} without its table(s) {', '.join(missing)}")
        return number

    def _open(self, create: bool) -> None:
        version = self._stored_version()  # read-only: a foreign store is never touched
        with self.db.guard():
            self.db.open_check()  # a small store is read whole or refused
        if version == 0 and not create:
            what = "empty file" if self.dialect == "sqlite" else "no tables in this database"
            raise BaselineError(f"{self.name}: {what}, not a baseline store")
        if version < SCHEMA_VERSION:
            if self.db.read_only is not None:
                # upgrade a private copy: the file is read (compare), never written
                self.db.detach()
            self.db.retry(self._upgrade)
        with self.db.guard():
            self.db.finish_open()

    def _upgrade(self) -> None:
        """Create or migrate the schema under the write lock (another process may be first)."""
        db = self.db
        with db.write(exclusive=True):
            version = self._stored_version()
            if version == SCHEMA_VERSION:
                return
            if version > 0:
                db.backup(version)
            else:
                db.mark_new()
            for target, migrate in MIGRATIONS:
                if target > version:
                    migrate(db)
                    db.execute(
                        "INSERT INTO meta VALUES ('schema_version', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (str(target),),
                    )

    @property
    def read_only(self) -> str | None:
        """Why this store cannot be written here (it is still read), or None."""
        return self.db.read_only

    # ----------------------------------------------------------------- the parts' methods
    # The names below (and those bound in __init__) are the store's methods from before it
    # had parts, kept for users' scripts; perfguard's own code calls the parts.
    def save_run(self, run: RunInfo, records: Sequence[TestRecord], *, replace: bool = True) -> int:
        """:meth:`Writer.save`, returning only the new run_id."""
        return self.writer.save(run, records, replace=replace).run_id

    def import_json(self, src: str | os.PathLike[str]) -> list[int]:
        """:meth:`Writer.import_file`, returning the run_id of every run in the file, in
        file order."""
        return list(self.writer.import_file(src).run_ids)

    def copy_from(self, other: Store) -> Imported:
        """:meth:`Writer.copy_from`: every run and acceptance of ``other`` (a run group's
        runs joined); what it added, joined and skipped."""
        return self.writer.copy_from(other.reader, other.accepted)

    def export_json(
        self, dest: str | os.PathLike[str], run_ids: Sequence[int] | None = None
    ) -> int:
        """:func:`~.export.write_export`: runs (default: all) and acceptances to one JSON file
        meant for review in git; returns the run count."""
        return write_export(self.reader, self.accepted, dest, run_ids)
