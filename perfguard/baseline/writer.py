"""The store's writes: a session's run saved, runs imported or copied, runs pruned.

A :class:`Writer` shares the store's open :class:`~perfguard.baseline.db.Database`.
Every run is written in one transaction, so a run is in the store whole or not at
all, whatever happens to the writer; frames are written with one bulk insert per
table per run (all records concatenated). A store opened read-only refuses every
write with one line saying why.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pandas as pd

from perfguard import __version__
from perfguard.baseline.accept import Acceptances
from perfguard.baseline.db import Database
from perfguard.baseline.export import ExportedRun, meta_json, read_export
from perfguard.baseline.frames import FRAME_TYPES, conform_frame
from perfguard.baseline.reader import FRAME_TABLES, Reader
from perfguard.baseline.record import Fingerprint, RunInfo, TestRecord
from perfguard.baseline.schema import FINGERPRINT_COLUMNS
from perfguard.environment import Environment
from perfguard.errors import BaselineError

__all__ = ["Imported", "SavedRun", "Writer"]


@dataclass(frozen=True)
class SavedRun:
    """What :meth:`Writer.save` did: the new run, and what it replaced."""

    run_id: int
    #: test records of earlier runs (same commit and fingerprint) this run replaced
    replaced_tests: int = 0
    #: those earlier runs (deleted where no test of theirs is left)
    replaced_runs: tuple[int, ...] = ()


@dataclass(frozen=True)
class Imported:
    """What :meth:`Writer.import_file` did with one export file."""

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


def _fingerprint_json(fp: Fingerprint) -> str:
    return json.dumps(fp.to_dict(), sort_keys=True)


def _environment_json(env: Environment) -> str | None:
    return json.dumps(env.to_dict(), sort_keys=True) if not env.empty else None


def _imported(done: list[tuple[int, bool]], tests: Sequence[int]) -> Imported:
    """What adding runs did: ``done`` is (run_id, added) per run, ``tests`` its record counts."""
    return Imported(
        run_ids=tuple(run_id for run_id, _ in done),
        added=tuple(run_id for run_id, new in done if new),
        tests=sum(n for n, (_, new) in zip(tests, done, strict=True) if new),
    )


class Writer:
    """The writes of one open store (``store.writer``); acceptances imported with runs go
    through ``accepted`` in the same transaction."""

    def __init__(self, db: Database, accepted: Acceptances) -> None:
        self.db = db
        self.accepted = accepted

    def _write(self, what: str, *, exclusive: bool = False, key: str | None = None) -> Any:
        """One write transaction; a one-line BaselineError on a read-only store."""
        if self.db.read_only is not None:
            raise BaselineError(
                f"{self.db.name}: cannot {what}: the store is read-only ({self.db.read_only})"
            )
        return self.db.write(exclusive=exclusive, key=key)

    # ----------------------------------------------------------------- saving
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
                replaced = self._supersede(run, nodeids) if replace else (0, [])
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
            [(run_id, r.nodeid, r.metric, meta_json(r.meta)) for r in records],
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

    # ----------------------------------------------------------------- adding runs
    def import_file(self, src: str | os.PathLike[str]) -> Imported:
        """Add the runs and acceptances of an export in one transaction (a bad file adds
        nothing: :func:`~perfguard.baseline.export.read_export`); a run already here (same
        commit, time, host) is skipped. Says what it added and what it skipped."""
        parsed, accepted = read_export(src)
        done = self._add_runs(lambda: iter(parsed), accepted)
        return _imported(done, [len(p[1]) for p in parsed])

    def add_runs(self, runs: Sequence[tuple[RunInfo, list[TestRecord]]]) -> Imported:
        """Add runs made outside a perfguard session (pytest-benchmark's saved files,
        :mod:`perfguard.baseline.import_benchmark`) in one transaction, each unless a run
        of the same commit, time and host is here already: importing twice adds nothing."""
        done = self._add_runs(lambda: ((info, records, None) for info, records in runs))
        return _imported(done, [len(r[1]) for r in runs])

    def copy_from(self, reader: Reader, accepted: Acceptances) -> tuple[int, int]:
        """Copy every run another store's ``reader`` holds, and its ``accepted``, into
        this store, losslessly (records, run info, the perfguard version that saved it), in
        one transaction; a run already here (same commit, time, host) is skipped, so a copy
        can be repeated. Returns (added, skipped)."""

        def source() -> Iterator[ExportedRun]:
            versions = reader.runs().set_index("run_id")["perfguard_version"]
            for run_id, version in versions.items():
                info, records = reader.load_run(int(cast(int, run_id)))
                yield info, list(records.values()), version

        added = [new for _, new in self._add_runs(source, accepted.rows())]
        return sum(added), len(added) - sum(added)

    def _add_runs(
        self,
        runs: Callable[[], Iterator[ExportedRun]],
        acceptances: Sequence[dict[str, Any]] = (),
    ) -> list[tuple[int, bool]]:
        """Add the runs ``runs()`` gives that are not here yet, and the acceptances, in one
        transaction: (run_id, whether it was added) for each run."""

        def write() -> list[tuple[int, bool]]:
            out = []
            with self._write("add runs", exclusive=True):  # exclusive: two imports add once
                self.accepted.add_missing(acceptances)
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
        name = self.db.name
        if keep_last is None and older_than_days is None and not commits:
            raise BaselineError(f"{name}: prune needs keep_last, older_than_days or commits")
        if keep_last is not None and keep_last < 0:
            raise BaselineError(f"{name}: keep_last must be >= 0, got {keep_last}")
        if older_than_days is not None and (
            not math.isfinite(older_than_days) or older_than_days < 0
        ):
            raise BaselineError(f"{name}: older_than_days must be >= 0, got {older_than_days}")

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
