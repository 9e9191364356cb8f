"""The baseline store: runs and their test records, in a SQLite file or on a PostgreSQL server.

``open_store(location)`` (or ``Store(location)``) picks the backend: a
``postgresql://`` URL is a server (:mod:`.pg`), anything else a SQLite file
(:mod:`.db`), the embedded default. The logic here is written once, in SQL
both engines run; how each engine locks, retries, bulk-inserts and reports
errors lives in its backend. Every run is written in one transaction, so a
run is in the store whole or not at all, whatever happens to the writer.

The schema is versioned (``meta.schema_version``) and brought forward by an
ordered list of migrations (:mod:`.schema`), the same on both engines;
before migrating an existing SQLite file it is copied to
``<name>.v<N>.bak`` (a PostgreSQL migration is one transaction instead), and
no migration drops data. A file or database that is not a perfguard store,
or one written by a newer perfguard, is refused with a one-line
:class:`~perfguard.errors.BaselineError` and never modified.

Frames are written with one bulk insert per table per run (all records
concatenated) and read back with one query per table.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from perfguard.baseline.db import Database, SQLiteDatabase, is_url, one_line
from perfguard.baseline.frames import FRAME_TYPES, conform_frame, impossible, text_in_numbers
from perfguard.baseline.record import (
    MACHINE_EVIDENCE,
    METRICS,
    Fingerprint,
    RunInfo,
    TestRecord,
    timing_mask,
)
from perfguard.baseline.schema import (
    FINGERPRINT_COLUMNS,
    FORMAT,
    MIGRATIONS,
    SCHEMA_VERSION,
    tables_at,
)
from perfguard.environment import Environment
from perfguard.errors import BaselineError, DamagedStoreError

__all__ = ["DEFAULT_STORE", "SCHEMA_VERSION", "Imported", "SavedRun", "Store", "open_store"]

#: where the plugin and the CLI keep the store, relative to the project root
DEFAULT_STORE = Path("baselines") / "perfguard.db"

#: ``format`` of the JSON files export_json writes
EXPORT_FORMAT = "perfguard-baseline-export"

#: record frame -> table (same names); child tables of ``tests``
FRAME_TABLES = tuple(FRAME_TYPES)
#: frames an export writes only when a record has rows (older exports stay byte-identical)
OPTIONAL_FRAMES = ("functions",)

_one_line = one_line


# --------------------------------------------------------------------------- helpers


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Plain Python rows (missing values as None, numpy scalars unboxed)."""
    obj = frame.astype(object)
    return cast(list[dict[str, Any]], obj.where(frame.notna(), None).to_dict("records"))


def _db_rows(name: str, frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Rows of a conformed record frame as the store's columns hold them (flags as 0/1)."""
    kinds = {"test_id": "int", **FRAME_TYPES[name]}
    columns = []
    for col in frame.columns:
        values = frame[col].astype(object).tolist()
        missing = frame[col].isna().to_numpy()
        cast = int if kinds[col] in ("int", "nullable_int", "bool") else None
        columns.append(
            [None if m else (cast(v) if cast else v) for v, m in zip(values, missing, strict=True)]
        )
    return list(zip(*columns, strict=True))


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


def _dumps(obj: Any, level: int = 0) -> str:
    """JSON with sorted keys, indented, but a table row (flat object) on one line.

    One row per line is what makes an export reviewable in a diff: a
    changed kernel or op is one changed line that names it.
    """
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(obj, dict) and obj and not all(_scalar(v) for v in obj.values()):
        items = [
            f"{inner}{json.dumps(str(k))}: {_dumps(v, level + 1)}" for k, v in sorted(obj.items())
        ]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list) and obj and not all(_scalar(v) for v in obj):
        items = [inner + _dumps(v, level + 1) for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(obj, sort_keys=True, allow_nan=False)


def _fingerprint_json(fp: Fingerprint) -> str:
    return json.dumps(fp.to_dict(), sort_keys=True)


def _environment_json(env: Environment) -> str | None:
    return json.dumps(env.to_dict(), sort_keys=True) if not env.empty else None


def _environments(texts: pd.Series) -> pd.Series:
    """The ``environment`` column as :class:`Environment` objects (NULL: nothing known)."""
    return pd.Series(
        [
            Environment.from_dict(json.loads(t)) if isinstance(t, str) and t else Environment()
            for t in texts
        ],
        index=texts.index,
        dtype=object,
    )


def _meta_json(meta: dict[str, Any]) -> str:
    # default=str: a marker setting that is a Path or an enum is kept as text, not refused
    return json.dumps(meta, sort_keys=True, default=str)


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
        from perfguard.baseline.pg import PostgresDatabase

        return PostgresDatabase(str(location), create=create)
    if isinstance(location, str) and "://" in location:
        scheme = location.split("://", 1)[0]
        raise BaselineError(
            f"{location}: unknown store URL scheme {scheme!r}; use a file path or "
            "postgresql://user@host/dbname"
        )
    return SQLiteDatabase(location, create=create)


@dataclass(frozen=True)
class SavedRun:
    """What :meth:`Store.save` did: the new run, and what it replaced."""

    run_id: int
    #: test records of earlier runs (same commit and fingerprint) this run replaced
    replaced_tests: int = 0
    #: those earlier runs (deleted where no test of theirs is left)
    replaced_runs: tuple[int, ...] = ()


@dataclass(frozen=True)
class Imported:
    """What :meth:`Store.import_file` did with one export file."""

    #: every run of the file, in file order (an existing run's id where it was skipped)
    run_ids: tuple[int, ...]
    #: the runs it added
    added: tuple[int, ...]
    #: test records of the added runs
    tests: int

    @property
    def present(self) -> int:
        """Runs of the file skipped as already in the store (same commit, time, host)."""
        return len(self.run_ids) - len(self.added)


class Store:
    """A perfguard baseline store at ``location`` (created, with its folder, when ``create``).

    Use as a context manager or call :meth:`close`. Every public method
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

    # ----------------------------------------------------------------- writing
    @property
    def read_only(self) -> str | None:
        """Why this store cannot be written here (it is still read), or None."""
        return self.db.read_only

    def _write(self, what: str, *, exclusive: bool = False, key: str | None = None) -> Any:
        """One write transaction; a one-line BaselineError on a read-only store."""
        if self.db.read_only is not None:
            raise BaselineError(
                f"{self.name}: cannot {what}: the store is read-only ({self.db.read_only})"
            )
        return self.db.write(exclusive=exclusive, key=key)

    def save_run(self, run: RunInfo, records: Sequence[TestRecord], *, replace: bool = True) -> int:
        """Store ``run`` and its test records in one transaction; returns the new run_id
        (see :meth:`save` for ``replace``)."""
        return self.save(run, records, replace=replace).run_id

    def save(
        self, run: RunInfo, records: Sequence[TestRecord], *, replace: bool = True
    ) -> SavedRun:
        """Store ``run`` and its records in one transaction.

        ``replace`` (the default): one run per commit and machine. The records
        of these tests that earlier runs of the same commit (and dirty flag)
        with the same fingerprint hold are deleted in the same transaction (and a run left
        with no test goes too), so a re-run CI job or a re-saved local run
        stands instead of the earlier one rather than beside it: the verdict
        pools every stored run of the baseline commit and reads history as one
        level per run, where an accidental duplicate would count twice.
        ``replace=False`` keeps both (measuring a baseline commit on purpose
        several times). Replacing writers of one commit and fingerprint wait for
        each other (a lock per key), so two of them leave exactly one run.
        """
        nodeids = [r.nodeid for r in records]
        if len(set(nodeids)) != len(nodeids):
            dup = next(n for n in nodeids if nodeids.count(n) > 1)
            raise ValueError(f"two records for test {dup!r} in one run")
        frames = {
            table: [conform_frame(table, getattr(r, table)) for r in records]
            for table in FRAME_TABLES
        }  # before the transaction: a frame that cannot be stored fails without a lock held

        same_run = f"{run.commit} {int(bool(run.dirty))} {_fingerprint_json(run.fingerprint)}"
        key = same_run if replace else None

        def write() -> SavedRun:
            with self._write("save a run", key=key):
                replaced = self._supersede(run, nodeids) if replace else (0, ())
                run_id = self._insert_run(run, records, frames=frames)
            return SavedRun(run_id, replaced[0], tuple(replaced[1]))

        return self.db.retry(write)

    def _supersede(self, run: RunInfo, nodeids: Sequence[str]) -> tuple[int, list[int]]:
        """Delete the records of ``nodeids`` in earlier runs of ``run``'s commit, dirty flag
        and exact fingerprint, then those runs if empty; (records deleted, run ids touched).
        A dirty tree's run measured other code than the commit's: neither replaces the other."""
        db = self.db
        key = (run.commit, int(bool(run.dirty)), _fingerprint_json(run.fingerprint))
        old = db.query(
            """SELECT t.test_id, t.run_id, t.nodeid FROM tests t JOIN runs r
               ON r.run_id = t.run_id WHERE r."commit" = ? AND r.dirty = ? AND r.fingerprint = ?""",
            key,
        )
        old = old[old["nodeid"].isin(set(nodeids))]
        if len(old):
            ids = db.ids_param(old["test_id"])
            for table in FRAME_TABLES:
                db.execute(f"DELETE FROM {table} WHERE {db.ids_in('test_id')}", (ids,))
            db.execute(f"DELETE FROM tests WHERE {db.ids_in('test_id')}", (ids,))
        db.execute(
            """DELETE FROM runs WHERE "commit" = ? AND dirty = ? AND fingerprint = ? AND NOT EXISTS
               (SELECT 1 FROM tests t WHERE t.run_id = runs.run_id)""",
            key,
        )
        return len(old), sorted({int(i) for i in old["run_id"]})

    def _insert_run(
        self,
        run: RunInfo,
        records: Sequence[TestRecord],
        version: str | None = None,
        *,
        frames: dict[str, list[pd.DataFrame]] | None = None,
    ) -> int:
        from perfguard import __version__

        db = self.db
        fp = run.fingerprint
        row = {
            "commit": run.commit,
            "branch": run.branch,
            "dirty": int(bool(run.dirty)),
            "time": run.time,
            "fingerprint": _fingerprint_json(fp),
            "perfguard_version": version or __version__,
            **{name: getattr(fp, name) for name in FINGERPRINT_COLUMNS},
            "environment": _environment_json(run.environment),
        }
        cols = ", ".join(f'"{c}"' for c in row)
        marks = ", ".join("?" * len(row))
        (run_id,) = db.execute(
            f"INSERT INTO runs ({cols}) VALUES ({marks}) RETURNING run_id", list(row.values())
        ).fetchone()
        run_id = int(run_id)
        if not records:
            return run_id
        db.insert_rows(
            "tests",
            ("run_id", "nodeid", "metric", "meta"),
            [(run_id, r.nodeid, r.metric, _meta_json(r.meta)) for r in records],
        )
        ids = dict(db.execute("SELECT nodeid, test_id FROM tests WHERE run_id=?", (run_id,)))
        for table in FRAME_TABLES:
            parts = (frames or {}).get(table) or [
                conform_frame(table, getattr(r, table)) for r in records
            ]
            frame = pd.concat(
                [p.assign(test_id=ids[r.nodeid]) for p, r in zip(parts, records, strict=True)],
                ignore_index=True,
            )
            if len(frame):
                columns = ["test_id", *FRAME_TYPES[table]]
                db.insert_rows(table, columns, _db_rows(table, frame[columns]))
        return run_id

    # ----------------------------------------------------------------- reading
    def _query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        return self.db.query(sql, params)

    def _frame(self, table: str, rows: pd.DataFrame | None) -> pd.DataFrame:
        """Rows of record table ``table`` read back, in the record's types; a value no
        record holds (text in a number column, a negative time) is a damaged store."""
        bad = None if rows is None else text_in_numbers(table, rows)
        if bad is not None:
            raise self.db.damaged(bad)
        with self.db.decoding(f"table {table}"):
            frame = conform_frame(table, rows)
            bad = impossible(table, frame)
        if bad is not None:
            raise self.db.damaged(bad)
        return frame

    def _texts(self, df: pd.DataFrame, table: str, *columns: str) -> pd.DataFrame:
        """``df`` whose text ``columns`` hold text (or NULL): a damaged page can make a
        commit or a test id a number, which would sort and print as something else."""
        for col in columns:
            values = df[col]
            wrong = values.notna() & ~values.map(lambda v: isinstance(v, str))
            if bool(wrong.any()):
                raise self.db.damaged(f"{table}.{col} holds a value that is not text")
        return df

    def _metrics(self, metrics: pd.Series) -> None:
        """Every record's metric is one perfguard writes: else its rows would be dropped
        as another metric's, and a history shown without them."""
        unknown = sorted(set(metrics.dropna().astype(str)) - set(METRICS))
        if unknown or metrics.isna().any():
            shown = repr(unknown[0]) if unknown else "NULL"
            raise self.db.damaged(f"tests.metric: unknown metric {shown}")

    def _fingerprints(self, texts: pd.Series) -> pd.Series:
        with self.db.decoding("runs.fingerprint"):
            fps = [Fingerprint.from_dict(json.loads(s)) for s in texts]
        return pd.Series(fps, index=texts.index, dtype=object)

    def runs(self, commit: str | None = None) -> pd.DataFrame:
        """All runs (or those whose commit starts with ``commit``), oldest first.

        Columns: run_id, commit, branch, dirty, time, the fingerprint fields,
        perfguard_version, n_tests, and ``fingerprint`` (a Fingerprint object).
        """
        where, params = "", []
        if commit:
            where, params = 'WHERE substr(r."commit", 1, length(?)) = ?', [commit, commit]
        cols = ", ".join(f'r."{c}"' for c in FINGERPRINT_COLUMNS)
        df = self._query(
            f"""SELECT r.run_id, r."commit", r.branch, r.dirty, r.time, {cols},
                       r.perfguard_version, r.fingerprint, r.environment,
                       (SELECT count(*) FROM tests t WHERE t.run_id = r.run_id) AS n_tests
                FROM runs r {where} ORDER BY r.time, r.run_id""",
            params,
        )
        self._texts(df, "runs", "commit", "time", "branch")
        with self.db.decoding("table runs"):
            df["dirty"] = df["dirty"].astype(bool)
            df["n_tests"] = df["n_tests"].astype(np.int64)
            df["run_id"] = df["run_id"].astype(np.int64)
            df["environment"] = _environments(df["environment"])
        df["fingerprint"] = self._fingerprints(df["fingerprint"])
        order = ["run_id", "commit", "branch", "dirty", "time", *FINGERPRINT_COLUMNS]
        return df[[*order, "perfguard_version", "n_tests", "fingerprint", "environment"]]

    def run_info(self, run_id: int) -> RunInfo:
        """The :class:`RunInfo` of one run; BaselineError if there is no such run."""
        with self.db.guard():
            row = self.db.execute(
                'SELECT "commit", branch, dirty, time, fingerprint, environment FROM runs '
                "WHERE run_id=?",
                (int(run_id),),
            ).fetchone()
        if row is None:
            raise BaselineError(f"{self.name}: no run {run_id}")
        commit, branch, dirty, when, fp, env = row
        with self.db.decoding(f"run {run_id}"):
            return RunInfo(
                commit, branch, bool(dirty), when, Fingerprint.from_dict(json.loads(fp)),
                Environment.from_dict(json.loads(env)) if env else Environment(),
            )  # fmt: skip

    def load_run(self, run_id: int) -> tuple[RunInfo, dict[str, TestRecord]]:
        """A run and its records by nodeid (frames in the types of :mod:`.frames`)."""
        with self.db.read():
            info = self.run_info(run_id)
            return info, self._load_tests("t.run_id = ?", [int(run_id)])

    def load_test(self, run_id: int, nodeid: str) -> TestRecord | None:
        """One test's record in a run, or None when that run did not record it."""
        with self.db.read():
            self.run_info(run_id)  # a missing run is an error, a missing test is not
            found = self._load_tests("t.run_id = ? AND t.nodeid = ?", [int(run_id), nodeid])
        return found.get(nodeid)

    def _load_tests(self, where: str, params: list[Any]) -> dict[str, TestRecord]:
        tests = self._query(
            f"SELECT t.test_id, t.nodeid, t.metric, t.meta FROM tests t WHERE {where} "
            "ORDER BY t.test_id",
            params,
        )
        if tests.empty:
            return {}
        ids = self.db.ids_param(tests["test_id"])
        frames: dict[str, dict[int, pd.DataFrame]] = {}
        for table in FRAME_TABLES:
            cols = ", ".join(f'"{c}"' for c in FRAME_TYPES[table])
            df = self._query(
                f"SELECT test_id, {cols} FROM {table} "
                f"WHERE {self.db.ids_in('test_id')} ORDER BY test_id, rowid",
                [ids],
            )
            frames[table] = {
                int(cast(int, k)): g.drop(columns="test_id") for k, g in df.groupby("test_id")
            }
        out = {}
        for tid, nodeid, metric, meta in tests.itertuples(index=False):
            parts = {t: self._frame(t, frames[t].get(int(tid))) for t in FRAME_TABLES}
            with self.db.decoding(f"test record {tid}"):
                if metric not in METRICS:
                    raise ValueError(f"unknown metric {metric!r}")
                out[nodeid] = TestRecord(nodeid, metric, meta=dict(json.loads(meta)), **parts)
        return out

    def history(
        self, nodeid: str, *, fingerprint: Fingerprint | None = None, limit: int = 50
    ) -> pd.DataFrame:
        """The test's primary-metric median per run over its latest ``limit`` runs, oldest first.

        With ``fingerprint``, only runs comparable with it count. Columns:
        run_id, commit, time, metric, median_ns, n (samples in the run).
        """
        with self.db.read():
            cand = self._query(
                """SELECT t.test_id, r.run_id, r."commit", r.time, t.metric, r.fingerprint
                   FROM tests t JOIN runs r ON r.run_id = t.run_id WHERE t.nodeid = ?
                   ORDER BY r.time DESC, r.run_id DESC""",
                [nodeid],
            )
            if fingerprint is not None and len(cand):  # timings measured alike: -n too
                fps = self._fingerprints(cand["fingerprint"])
                cand = cand[[fingerprint.incompatibility(fp) is None
                             and fingerprint.timing_incompatibility(fp) is None
                             for fp in fps]]  # fmt: skip
            cand = cand.head(max(int(limit), 0)).iloc[::-1].reset_index(drop=True)
            self._metrics(cand["metric"])
            samples = self._query(
                "SELECT test_id, gpu_time_ns, wall_time_ns, cpu_time_ns, profiled FROM samples "
                f"WHERE {self.db.ids_in('test_id')}",
                [self.db.ids_param(cand["test_id"])],
            )
        self._frame("samples", samples.drop(columns="test_id"))
        metric_of = samples["test_id"].map(cand.set_index("test_id")["metric"])
        value = pd.Series(np.nan, index=samples.index)
        for metric, col in METRICS.items():
            mask = (metric_of == metric).to_numpy()
            value[mask] = samples.loc[mask, col].astype(np.float64)
        value = value[timing_mask(samples, metric_of, by="test_id")]
        stats = value.groupby(samples["test_id"].loc[value.index]).agg(["median", "count"])
        out = cand[["run_id", "commit", "time", "metric"]].copy()
        out["median_ns"] = cand["test_id"].map(stats["median"]).astype(np.float64)
        out["n"] = cand["test_id"].map(stats["count"]).fillna(0).astype(np.int64)
        out["run_id"] = out["run_id"].astype(np.int64)
        return out

    def machine_evidence(self, nodeid: str) -> pd.DataFrame:
        """What each stored run of ``nodeid`` saw of the machine: run_id and a float column
        per :data:`~perfguard.baseline.record.MACHINE_EVIDENCE` figure (NaN where a run did
        not keep it), read from the records' ``meta`` in SQL."""
        figures = ", ".join(f"{self.db.json_number('meta', k)} AS {k}" for k in MACHINE_EVIDENCE)
        df = self._query(f"SELECT run_id, {figures} FROM tests WHERE nodeid = ?", [nodeid])
        df["run_id"] = df["run_id"].astype(np.int64)
        for k in MACHINE_EVIDENCE:
            df[k] = pd.to_numeric(df[k], errors="coerce").astype(np.float64)
        return df

    def runs_with_test(self, nodeid: str) -> pd.DataFrame:
        """The runs that recorded ``nodeid``: run_id, commit, dirty, time, ``fingerprint`` (a
        Fingerprint object) and ``environment`` (an Environment), oldest first (a partial save
        holds only some tests)."""
        df = self._query(
            """SELECT r.run_id, r."commit", r.dirty, r.time, r.fingerprint, r.environment
               FROM runs r JOIN tests t ON t.run_id = r.run_id WHERE t.nodeid = ?
               ORDER BY r.time, r.run_id""",
            [nodeid],
        )
        self._texts(df, "runs", "commit", "time")
        with self.db.decoding("table runs"):
            df["run_id"] = df["run_id"].astype(np.int64)
            df["dirty"] = df["dirty"].astype(bool)
            df["environment"] = _environments(df["environment"])
        df["fingerprint"] = self._fingerprints(df["fingerprint"])
        return df

    def nodeids(self) -> list[str]:
        """Every test with a record in the store, sorted."""
        names = self._texts(self._query("SELECT DISTINCT nodeid FROM tests"), "tests", "nodeid")
        return sorted(names["nodeid"].tolist())

    # ----------------------------------------------------------------- acceptances
    def accept(
        self,
        nodeid: str,
        commit: str,
        reason: str,
        *,
        time: str | None = None,
        author: str | None = None,
    ) -> int:
        """Record that ``nodeid``'s level at ``commit`` (a full sha) is intended: runs of
        that commit and its descendants are compared with runs since it only
        (:mod:`perfguard.baseline.accept`). Returns the acceptance's id."""
        from datetime import datetime, timezone

        reason = " ".join(str(reason).split())
        if not reason:
            raise BaselineError(f"{self.name}: an acceptance needs a reason")
        if not nodeid:
            raise BaselineError(f"{self.name}: an acceptance needs a test node id")
        when = time or datetime.now(timezone.utc).isoformat(timespec="seconds")

        def write() -> int:
            with self.db.write():
                (new,) = self.db.execute(
                    'INSERT INTO acceptances (nodeid, "commit", reason, time, author) '
                    "VALUES (?, ?, ?, ?, ?) RETURNING acceptance_id",
                    (nodeid, commit, reason, when, author),
                ).fetchone()
                return int(new)

        return self.db.retry(write)

    def acceptances(self, nodeid: str | None = None) -> pd.DataFrame:
        """Recorded acceptances (of ``nodeid``, or all), oldest first. Columns:
        acceptance_id, nodeid, commit, reason, time, author."""
        where, params = ("WHERE nodeid = ?", [nodeid]) if nodeid else ("", [])
        df = self._query(
            f'SELECT acceptance_id, nodeid, "commit", reason, time, author FROM acceptances '
            f"{where} ORDER BY time, acceptance_id",
            params,
        )
        df["acceptance_id"] = df["acceptance_id"].astype(np.int64)
        return df

    def _add_acceptances(self, rows: list[dict[str, Any]]) -> int:
        """Add acceptances not here yet (same test, commit and time) inside the open
        transaction; returns how many were added."""
        added = 0
        for a in rows:
            found = self.db.execute(
                'SELECT 1 FROM acceptances WHERE nodeid=? AND "commit"=? AND time=?',
                (a["nodeid"], a["commit"], a["time"]),
            ).fetchone()
            if found is None:
                self.db.execute(
                    'INSERT INTO acceptances (nodeid, "commit", reason, time, author) '
                    "VALUES (?, ?, ?, ?, ?)",
                    (a["nodeid"], a["commit"], a["reason"], a["time"], a.get("author")),
                )
                added += 1
        return added

    def test_rows(
        self, nodeid: str, table: str, run_ids: Sequence[int] | None = None
    ) -> pd.DataFrame:
        """One record table of a test across all its stored runs (or those of ``run_ids``),
        in one query.

        Columns: run_id, metric (the record's primary metric), then the
        table's columns (:data:`~perfguard.baseline.frames.FRAME_TYPES`), rows
        in run order and stored order within a run. What history views read
        instead of loading every record whole.
        """
        if table not in FRAME_TYPES:
            raise ValueError(f"unknown record table {table!r}")
        cols = ", ".join(f'x."{c}"' for c in FRAME_TYPES[table])
        where, params = "t.nodeid = ?", [nodeid]
        if run_ids is not None:
            where += f" AND {self.db.ids_in('t.run_id')}"
            params.append(self.db.ids_param(run_ids))
        df = self._query(
            f"""SELECT t.run_id, t.metric, {cols} FROM {table} x
                JOIN tests t ON t.test_id = x.test_id
                WHERE {where} ORDER BY t.run_id, x.rowid""",
            params,
        )
        self._metrics(df["metric"])
        return pd.concat(
            [df[["run_id", "metric"]], self._frame(table, df.drop(columns=["run_id", "metric"]))],
            axis=1,
        )

    # ----------------------------------------------------------------- JSON
    def export_json(
        self, dest: str | os.PathLike[str], run_ids: Sequence[int] | None = None
    ) -> int:
        """Write runs (default: all) to one JSON file meant for review in git; returns the count.

        Sorted keys, indented, runs ordered by time, no store-specific ids, so
        re-exporting an unchanged store gives the same bytes.
        """
        from perfguard import __version__

        if run_ids is None:
            run_ids = [int(i) for i in self.runs()["run_id"]]
        exported = []
        for run_id in run_ids:
            info, records = self.load_run(run_id)
            with self.db.guard():
                (version,) = self.db.execute(
                    "SELECT perfguard_version FROM runs WHERE run_id=?", (int(run_id),)
                ).fetchone()
            tests = {
                nodeid: {
                    "metric": r.metric,
                    "meta": json.loads(_meta_json(r.meta)),
                    **{
                        t: _rows(getattr(r, t))
                        for t in FRAME_TABLES
                        if t not in OPTIONAL_FRAMES or len(getattr(r, t))
                    },
                }
                for nodeid, r in records.items()
            }
            exported.append({"run": info.to_dict(), "perfguard_version": version, "tests": tests})
        exported.sort(
            key=lambda e: (e["run"]["time"], e["run"]["commit"], e["run"]["fingerprint"]["host"])
        )
        doc = {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "exported_by": f"perfguard {__version__}",
            "runs": exported,
        }
        accepted = self._acceptance_rows()
        if accepted:  # only when there are some: older exports stay byte-identical
            doc["acceptances"] = accepted
        text = _dumps(doc) + "\n"
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, dest)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise BaselineError(f"{dest}: cannot write the export: {exc.strerror or exc}") from None
        return len(exported)

    def import_json(self, src: str | os.PathLike[str]) -> list[int]:
        """Add the runs of an export; a run already here (same commit, time, host) is not
        added again. Returns the run_id of every run in the file, in file order.
        All runs are added in one transaction: a bad file adds nothing.
        """
        return list(self.import_file(src).run_ids)

    def import_file(self, src: str | os.PathLike[str]) -> Imported:
        """:meth:`import_json`, saying what it did: the runs added (and their test records)
        and the runs skipped as already here. A file that cannot be imported (unreadable,
        not JSON, not an export, a newer schema, a malformed run) is one BaselineError
        naming it, and adds nothing."""
        src = Path(src)
        try:
            doc = json.loads(src.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineError(
                f"{src}: cannot read: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        except json.JSONDecodeError as exc:
            raise BaselineError(f"{src}: not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise BaselineError(f"{src}: not a perfguard baseline export")
        if not isinstance(doc.get("schema_version"), int) or doc["schema_version"] > SCHEMA_VERSION:
            raise BaselineError(
                f"{src}: export schema version {doc.get('schema_version')!r} is not one this "
                f"perfguard reads (<= {SCHEMA_VERSION})"
            )
        runs = doc.get("runs")
        if runs is not None and not isinstance(runs, list):
            raise BaselineError(f"{src}: 'runs' is not a list")
        parsed = [self._parse_export_run(src, i, e) for i, e in enumerate(runs or [])]
        accepted = doc.get("acceptances") or []
        keys = ("nodeid", "commit", "reason", "time")
        if not isinstance(accepted, list) or not all(
            isinstance(a, dict) and all(isinstance(a.get(k), str) for k in keys) for a in accepted
        ):
            raise BaselineError(f"{src}: acceptances are malformed (each needs {', '.join(keys)})")
        done = self._add_runs(lambda: iter(parsed), accepted)
        return Imported(
            run_ids=tuple(run_id for run_id, _ in done),
            added=tuple(run_id for run_id, new in done if new),
            tests=sum(len(p[1]) for p, (_, new) in zip(parsed, done, strict=True) if new),
        )

    def add_runs(self, runs: Sequence[tuple[RunInfo, list[TestRecord]]]) -> Imported:
        """Add runs made outside a perfguard session (pytest-benchmark's saved files,
        :mod:`perfguard.baseline.import_benchmark`) in one transaction, each unless a run
        of the same commit, time and host is here already: importing twice adds nothing."""
        done = self._add_runs(lambda: ((info, records, None) for info, records in runs))
        return Imported(
            run_ids=tuple(run_id for run_id, _ in done),
            added=tuple(run_id for run_id, new in done if new),
            tests=sum(len(r[1]) for r, (_, new) in zip(runs, done, strict=True) if new),
        )

    def copy_from(self, other: Store) -> tuple[int, int]:
        """Copy every run of ``other`` into this store, losslessly (records, run info, the
        perfguard version that saved it), in one transaction; a run already here (same
        commit, time, host) is skipped, so a copy can be repeated. Returns (added, skipped).
        """

        def source() -> Iterator[tuple[RunInfo, list[TestRecord], str | None]]:
            versions = other.runs().set_index("run_id")["perfguard_version"]
            for run_id, version in versions.items():
                info, records = other.load_run(int(cast(int, run_id)))
                yield info, list(records.values()), version

        added = [new for _, new in self._add_runs(source, other._acceptance_rows())]
        return sum(added), len(added) - sum(added)

    def _acceptance_rows(self) -> list[dict[str, Any]]:
        """Every acceptance as a plain row without the store's id (exports, copies)."""
        rows = self.acceptances().drop(columns="acceptance_id")
        return _rows(rows.sort_values(["time", "nodeid", "commit"], kind="stable"))

    def _add_runs(
        self,
        runs: Callable[[], Iterator[tuple[RunInfo, list[TestRecord], str | None]]],
        acceptances: Sequence[dict[str, Any]] = (),
    ) -> list[tuple[int, bool]]:
        """Add the runs ``runs()`` gives that are not here yet, and the acceptances, in one
        transaction: (run_id, whether it was added) for each run."""

        def write() -> list[tuple[int, bool]]:
            out = []
            with self._write("add runs", exclusive=True):  # exclusive: two imports add once
                self._add_acceptances(list(acceptances))
                for info, records, version in runs():
                    existing = self.db.execute(
                        'SELECT run_id FROM runs WHERE "commit"=? AND time=? '
                        "AND host IS NOT DISTINCT FROM ? ORDER BY run_id LIMIT 1",
                        (info.commit, info.time, info.fingerprint.host),
                    ).fetchone()
                    if existing is not None:
                        out.append((int(existing[0]), False))
                    else:
                        out.append((self._insert_run(info, records, version), True))
            return out

        return self.db.retry(write)

    @staticmethod
    def _parse_export_run(
        src: Path, index: int, entry: Any
    ) -> tuple[RunInfo, list[TestRecord], str | None]:
        try:
            info = RunInfo.from_dict(entry["run"])
            records = []
            for nodeid, t in sorted(entry.get("tests", {}).items()):
                frames = {
                    name: conform_frame(name, pd.DataFrame.from_records(t.get(name) or []))
                    for name in FRAME_TABLES
                }
                if t["metric"] not in METRICS:
                    raise ValueError(f"unknown metric {t['metric']!r}")
                records.append(
                    TestRecord(nodeid, t["metric"], meta=dict(t.get("meta") or {}), **frames)
                )
            return info, records, entry.get("perfguard_version")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BaselineError(
                f"{src}: run #{index + 1} is malformed: {type(exc).__name__}: {_one_line(exc)}"
            ) from None

    # ----------------------------------------------------------------- pruning
    def prune(
        self,
        keep_last: int | None = None,
        older_than_days: float | None = None,
        commits: Sequence[str] | None = None,
        *,
        now: pd.Timestamp | None = None,
    ) -> int:
        """Delete runs; returns how many. A run goes when any criterion selects it.

        * ``keep_last``: keep the N most recent runs of each machine (host, GPU
          model and count, backend), so one busy machine cannot push out the
          only baselines of another;
        * ``older_than_days``: runs measured more than that many days before
          ``now`` (a run whose time cannot be parsed is kept);
        * ``commits``: runs of these commits (full or abbreviated shas).
        """
        if keep_last is None and older_than_days is None and not commits:
            raise BaselineError(f"{self.name}: prune needs keep_last, older_than_days or commits")
        if keep_last is not None and keep_last < 0:
            raise BaselineError(f"{self.name}: keep_last must be >= 0, got {keep_last}")
        if older_than_days is not None and (
            not math.isfinite(older_than_days) or older_than_days < 0
        ):
            raise BaselineError(f"{self.name}: older_than_days must be >= 0, got {older_than_days}")

        def write() -> int:
            db = self.db
            with self._write("prune runs", exclusive=True):
                runs = db.query(
                    'SELECT run_id, "commit", time, host, gpu_name, gpu_count, backend FROM runs'
                )
                doomed = pd.Series(False, index=runs.index)
                if keep_last is not None and len(runs):
                    ordered = runs.sort_values(["time", "run_id"], ascending=False)
                    machine = ["host", "gpu_name", "gpu_count", "backend"]
                    rank = ordered.fillna({c: "" for c in machine}).groupby(machine).cumcount()
                    doomed |= rank.reindex(runs.index) >= keep_last
                if older_than_days is not None and len(runs):
                    when = pd.to_datetime(runs["time"], utc=True, errors="coerce", format="ISO8601")
                    cutoff = (now or pd.Timestamp.now(tz="UTC")) - pd.Timedelta(
                        days=older_than_days
                    )
                    doomed |= (when < cutoff).fillna(False)
                for prefix in commits or ():
                    doomed |= runs["commit"].str.startswith(prefix.strip().lower())
                ids = db.ids_param(runs.loc[doomed, "run_id"])
                sub = f"SELECT test_id FROM tests WHERE {db.ids_in('run_id')}"
                for table in FRAME_TABLES:
                    db.execute(f"DELETE FROM {table} WHERE test_id IN ({sub})", (ids,))
                db.execute(f"DELETE FROM tests WHERE {db.ids_in('run_id')}", (ids,))
                cur = db.execute(f"DELETE FROM runs WHERE {db.ids_in('run_id')}", (ids,))
                return int(cur.rowcount)

        return self.db.retry(write)
