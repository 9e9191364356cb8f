"""The baseline store: runs and their test records in one SQLite file.

Several pytest workers (xdist) and CI jobs write to the same file, so every
write is one ``BEGIN IMMEDIATE`` transaction in WAL mode with a busy timeout
and a retry with backoff when SQLite still reports the file locked. The
schema is versioned (``meta.schema_version``) and brought forward by an
ordered list of migrations; before migrating an existing store the file is
copied to ``<name>.v<N>.bak``, and no migration drops data. A file that is
not a perfguard store, or one written by a newer perfguard, is refused with
a one-line :class:`~perfguard.errors.BaselineError` and never modified.

Frames are written with sqlite-utils ``insert_all`` (one call per table per
run, all records concatenated) and read back with one query per table.
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import sqlite_utils

from perfguard.baseline.frames import FRAME_TYPES, conform_frame
from perfguard.baseline.record import METRICS, Fingerprint, RunInfo, TestRecord
from perfguard.baseline.schema import (
    APPLICATION_ID,
    FINGERPRINT_COLUMNS,
    FORMAT,
    MIGRATIONS,
    SCHEMA_VERSION,
)
from perfguard.errors import BaselineError

__all__ = ["DEFAULT_STORE", "SCHEMA_VERSION", "Store"]

#: where the plugin and the CLI keep the store, relative to the project root
DEFAULT_STORE = Path("baselines") / "perfguard.db"

#: ``format`` of the JSON files export_json writes
EXPORT_FORMAT = "perfguard-baseline-export"

BUSY_TIMEOUT_MS = 5_000
#: total time a write keeps retrying a locked store before giving up
LOCK_BUDGET_S = 60.0

T = TypeVar("T")


#: record frame -> table (same names); child tables of ``tests``
FRAME_TABLES = tuple(FRAME_TYPES)


# --------------------------------------------------------------------------- helpers


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Plain Python rows for sqlite3 (missing values as None, numpy scalars unboxed)."""
    obj = frame.astype(object)
    return obj.where(frame.notna(), None).to_dict("records")


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


def _meta_json(meta: dict[str, Any]) -> str:
    # default=str: a marker setting that is a Path or an enum is kept as text, not refused
    return json.dumps(meta, sort_keys=True, default=str)


class Store:
    """A perfguard baseline store at ``path`` (created, with its folder, when ``create``).

    Use as a context manager or call :meth:`close`. Every public method
    raises :class:`BaselineError` (one line naming the file) for a store it
    cannot use: not SQLite, not perfguard's, newer schema, corrupt, locked
    past the retry budget.
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(path)
        self._db: sqlite_utils.Database | None = None
        if self.path.is_dir():
            raise BaselineError(f"{self.path}: is a directory, not a baseline store file")
        if not self.path.exists():
            if not create:
                raise BaselineError(f"{self.path}: no baseline store here")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BaselineError(f"{self.path}: cannot create the store folder: {exc}") from None
        try:
            conn = sqlite3.connect(
                str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise BaselineError(f"{self.path}: cannot open: {_one_line(exc)}") from None
        try:
            with self._guard():
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                self._db = sqlite_utils.Database(conn)
                self._open(create)
        except BaseException:
            conn.close()
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
            self._db.conn.close()
            self._db = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise BaselineError(f"{self.path}: store is closed")
        return self._db.conn

    @property
    def schema_version(self) -> int:
        with self._guard():
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0])

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # ----------------------------------------------------------------- opening
    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn SQLite's errors about the file into one-line BaselineErrors naming it."""
        try:
            yield
        except (sqlite3.ProgrammingError, sqlite3.NotSupportedError):
            raise  # our bug, not the file's
        except sqlite3.DatabaseError as exc:
            msg = _one_line(exc)
            if _is_locked(exc):
                raise BaselineError(
                    f"{self.path}: store is locked by another writer ({msg})"
                ) from None
            hint = ""
            if "not a database" in msg or "malformed" in msg or "corrupt" in msg:
                hint = " (corrupt or truncated? restore it from git or a .bak copy)"
            raise BaselineError(
                f"{self.path}: cannot use the baseline store: {msg}{hint}"
            ) from None

    def _tables(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        return sorted(r[0] for r in rows)

    def _stored_version(self) -> int:
        """The file's schema version: 0 for an empty file; refuses foreign or newer files."""
        tables = self._tables()
        if not tables:
            return 0
        app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
        fmt = version = None
        if "meta" in tables and app_id in (0, APPLICATION_ID):
            try:
                kv = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
            except sqlite3.OperationalError:
                kv = {}
            fmt, version = kv.get("format"), kv.get("schema_version")
        if fmt != FORMAT or version is None:
            shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
            raise BaselineError(
                f"{self.path}: not a perfguard baseline store (an SQLite file with tables {shown})"
            )
        try:
            number = int(version)
        except ValueError:
            raise BaselineError(f"{self.path}: bad schema_version {version!r} in meta") from None
        if number > SCHEMA_VERSION:
            raise BaselineError(
                f"{self.path}: store schema version {number} is newer than this perfguard "
                f"supports ({SCHEMA_VERSION}); upgrade perfguard to use it"
            )
        return number

    def _open(self, create: bool) -> None:
        version = self._stored_version()  # read-only: a foreign file is never touched
        if version == 0 and not create:
            raise BaselineError(f"{self.path}: empty file, not a baseline store")
        if version < SCHEMA_VERSION:
            self._retry(self._upgrade)
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                self._retry(lambda: self.conn.execute("PRAGMA journal_mode=WAL"))
            except BaselineError:
                if os.access(self.path, os.W_OK):
                    raise  # a read-only store is still readable without WAL
        self.conn.execute("PRAGMA foreign_keys = ON")

    def _upgrade(self) -> None:
        """Create or migrate the schema under the write lock (another process may be first)."""
        with self._write():
            version = self._stored_version()
            if version == SCHEMA_VERSION:
                return
            if version > 0:
                self._backup(version)
            else:
                self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            for target, migrate in MIGRATIONS:
                if target > version:
                    migrate(self.conn)
                    self.conn.execute(
                        "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(target),)
                    )

    def _backup(self, version: int) -> Path:
        """Copy the store as it is (a consistent snapshot) to ``<name>.v<N>.bak``."""
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
        return dest

    # ----------------------------------------------------------------- writing
    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction, taking the write lock up front (no upgrade deadlock)."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # also after a failed COMMIT, so a retry starts clean
                conn.execute("ROLLBACK")
            raise

    def _retry(self, action: Callable[[], T]) -> T:
        """Run ``action`` again, with growing randomised pauses, while SQLite says locked."""
        deadline = time.monotonic() + LOCK_BUDGET_S
        pause = 0.05
        while True:
            try:
                with self._guard():
                    try:
                        return action()
                    except sqlite3.OperationalError as exc:
                        if not _is_locked(exc) or time.monotonic() + pause > deadline:
                            raise
            except BaselineError:
                raise
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 2.0)

    def save_run(self, run: RunInfo, records: Sequence[TestRecord]) -> int:
        """Store ``run`` and its test records in one transaction; returns the new run_id."""
        nodeids = [r.nodeid for r in records]
        if len(set(nodeids)) != len(nodeids):
            dup = next(n for n in nodeids if nodeids.count(n) > 1)
            raise ValueError(f"two records for test {dup!r} in one run")

        def write() -> int:
            with self._write():
                return self._insert_run(run, records)

        return self._retry(write)

    def _insert_run(
        self, run: RunInfo, records: Sequence[TestRecord], version: str | None = None
    ) -> int:
        from perfguard import __version__

        db = self._db
        assert db is not None
        fp = run.fingerprint
        row = {
            "commit": run.commit,
            "branch": run.branch,
            "dirty": int(bool(run.dirty)),
            "time": run.time,
            "fingerprint": _fingerprint_json(fp),
            "perfguard_version": version or __version__,
            **{name: getattr(fp, name) for name in FINGERPRINT_COLUMNS},
        }
        run_id = int(db["runs"].insert(row).last_pk)
        if not records:
            return run_id
        db["tests"].insert_all(
            {
                "run_id": run_id,
                "nodeid": r.nodeid,
                "metric": r.metric,
                "meta": _meta_json(r.meta),
            }
            for r in records
        )
        ids = dict(self.conn.execute("SELECT nodeid, test_id FROM tests WHERE run_id=?", (run_id,)))
        for table in FRAME_TABLES:
            parts = [
                conform_frame(table, getattr(r, table)).assign(test_id=ids[r.nodeid])
                for r in records
            ]
            frame = pd.concat(parts, ignore_index=True)
            if len(frame):
                db[table].insert_all(_rows(frame), batch_size=500)
        return run_id

    # ----------------------------------------------------------------- reading
    def _query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        with self._guard():
            return pd.read_sql_query(sql, self.conn, params=list(params))

    def runs(self, commit: str | None = None) -> pd.DataFrame:
        """All runs (or those whose commit starts with ``commit``), oldest first.

        Columns: run_id, commit, branch, dirty, time, the fingerprint fields,
        perfguard_version, n_tests, and ``fingerprint`` (a Fingerprint object).
        """
        where, params = "", []
        if commit:
            where, params = 'WHERE substr(r."commit", 1, ?) = ?', [len(commit), commit]
        cols = ", ".join(f'r."{c}"' for c in FINGERPRINT_COLUMNS)
        df = self._query(
            f"""SELECT r.run_id, r."commit", r.branch, r.dirty, r.time, {cols},
                       r.perfguard_version, r.fingerprint,
                       (SELECT count(*) FROM tests t WHERE t.run_id = r.run_id) AS n_tests
                FROM runs r {where} ORDER BY r.time, r.run_id""",
            params,
        )
        df["dirty"] = df["dirty"].astype(bool)
        df["fingerprint"] = [Fingerprint.from_dict(json.loads(s)) for s in df["fingerprint"]]
        order = ["run_id", "commit", "branch", "dirty", "time", *FINGERPRINT_COLUMNS]
        return df[[*order, "perfguard_version", "n_tests", "fingerprint"]]

    def run_info(self, run_id: int) -> RunInfo:
        """The :class:`RunInfo` of one run; BaselineError if there is no such run."""
        with self._guard():
            row = self.conn.execute(
                'SELECT "commit", branch, dirty, time, fingerprint FROM runs WHERE run_id=?',
                (int(run_id),),
            ).fetchone()
        if row is None:
            raise BaselineError(f"{self.path}: no run {run_id}")
        commit, branch, dirty, when, fp = row
        return RunInfo(commit, branch, bool(dirty), when, Fingerprint.from_dict(json.loads(fp)))

    def load_run(self, run_id: int) -> tuple[RunInfo, dict[str, TestRecord]]:
        """A run and its records by nodeid (frames in the types of :mod:`.frames`)."""
        info = self.run_info(run_id)
        return info, self._load_tests("t.run_id = ?", [int(run_id)])

    def load_test(self, run_id: int, nodeid: str) -> TestRecord | None:
        """One test's record in a run, or None when that run did not record it."""
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
        ids = json.dumps([int(i) for i in tests["test_id"]])
        frames: dict[str, dict[int, pd.DataFrame]] = {}
        for table in FRAME_TABLES:
            cols = ", ".join(f'"{c}"' for c in FRAME_TYPES[table])
            with self._guard():
                df = pd.read_sql_query(
                    f"SELECT test_id, {cols} FROM {table} "
                    "WHERE test_id IN (SELECT value FROM json_each(?)) ORDER BY test_id, rowid",
                    self.conn,
                    params=[ids],
                    dtype_backend="numpy_nullable",
                )
            frames[table] = {int(k): g.drop(columns="test_id") for k, g in df.groupby("test_id")}
        out = {}
        for tid, nodeid, metric, meta in tests.itertuples(index=False):
            parts = {t: conform_frame(t, frames[t].get(int(tid))) for t in FRAME_TABLES}
            out[nodeid] = TestRecord(nodeid, metric, meta=json.loads(meta), **parts)
        return out

    def history(
        self, nodeid: str, *, fingerprint: Fingerprint | None = None, limit: int = 50
    ) -> pd.DataFrame:
        """The test's primary-metric median per run over its latest ``limit`` runs, oldest first.

        With ``fingerprint``, only runs comparable with it count. Columns:
        run_id, commit, time, metric, median_ns, n (samples in the run).
        """
        cand = self._query(
            """SELECT t.test_id, r.run_id, r."commit", r.time, t.metric, r.fingerprint
               FROM tests t JOIN runs r ON r.run_id = t.run_id WHERE t.nodeid = ?
               ORDER BY r.time DESC, r.run_id DESC""",
            [nodeid],
        )
        if fingerprint is not None and len(cand):
            fps = [Fingerprint.from_dict(json.loads(s)) for s in cand["fingerprint"]]
            cand = cand[[fingerprint.incompatibility(fp) is None for fp in fps]]
        cand = cand.head(max(int(limit), 0)).iloc[::-1].reset_index(drop=True)
        ids = json.dumps([int(i) for i in cand["test_id"]])
        samples = self._query(
            "SELECT test_id, gpu_time_ns, wall_time_ns, cpu_time_ns FROM samples "
            "WHERE test_id IN (SELECT value FROM json_each(?))",
            [ids],
        )
        metric_of = samples["test_id"].map(cand.set_index("test_id")["metric"])
        value = pd.Series(np.nan, index=samples.index)
        for metric, col in METRICS.items():
            mask = (metric_of == metric).to_numpy()
            value[mask] = samples.loc[mask, col].astype(np.float64)
        stats = value.groupby(samples["test_id"]).agg(["median", "count"])
        out = cand[["run_id", "commit", "time", "metric"]].copy()
        out["median_ns"] = cand["test_id"].map(stats["median"]).astype(np.float64)
        out["n"] = cand["test_id"].map(stats["count"]).fillna(0).astype(np.int64)
        out["run_id"] = out["run_id"].astype(np.int64)
        return out

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
            with self._guard():
                (version,) = self.conn.execute(
                    "SELECT perfguard_version FROM runs WHERE run_id=?", (int(run_id),)
                ).fetchone()
            tests = {
                nodeid: {
                    "metric": r.metric,
                    "meta": json.loads(_meta_json(r.meta)),
                    **{t: _rows(getattr(r, t)) for t in FRAME_TABLES},
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
        parsed = [self._parse_export_run(src, i, e) for i, e in enumerate(doc.get("runs") or [])]

        def write() -> list[int]:
            ids = []
            with self._write():
                for info, records, version in parsed:
                    existing = self.conn.execute(
                        'SELECT run_id FROM runs WHERE "commit"=? AND time=? AND host IS ? '
                        "ORDER BY run_id LIMIT 1",
                        (info.commit, info.time, info.fingerprint.host),
                    ).fetchone()
                    if existing is not None:
                        ids.append(int(existing[0]))
                    else:
                        ids.append(self._insert_run(info, records, version))
            return ids

        return self._retry(write)

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
            raise BaselineError(f"{self.path}: prune needs keep_last, older_than_days or commits")
        if keep_last is not None and keep_last < 0:
            raise BaselineError(f"{self.path}: keep_last must be >= 0, got {keep_last}")
        if older_than_days is not None and (
            not math.isfinite(older_than_days) or older_than_days < 0
        ):
            raise BaselineError(f"{self.path}: older_than_days must be >= 0, got {older_than_days}")

        def write() -> int:
            with self._write():
                runs = pd.read_sql_query(
                    'SELECT run_id, "commit", time, host, gpu_name, gpu_count, backend FROM runs',
                    self.conn,
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
                ids = json.dumps([int(i) for i in runs.loc[doomed, "run_id"]])
                sub = "SELECT test_id FROM tests WHERE run_id IN (SELECT value FROM json_each(?))"
                for table in FRAME_TABLES:
                    self.conn.execute(f"DELETE FROM {table} WHERE test_id IN ({sub})", (ids,))
                self.conn.execute(
                    "DELETE FROM tests WHERE run_id IN (SELECT value FROM json_each(?))", (ids,)
                )
                cur = self.conn.execute(
                    "DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(?))", (ids,)
                )
                return int(cur.rowcount)

        return self._retry(write)
