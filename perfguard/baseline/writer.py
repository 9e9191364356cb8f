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
    #: the records were added to the run another job of the same run group saved
    joined: bool = False


@dataclass(frozen=True)
class Imported:
    """What :meth:`Writer.import_file` did with one export file."""

    #: every run of the file, in file order (an existing run's id where it was skipped)
    run_ids: tuple[int, ...]
    #: the runs it added
    added: tuple[int, ...]
    #: test records it added (to added runs, and to joined ones)
    tests: int
    #: runs of a run group whose records went into the group's run already here
    joined: tuple[int, ...] = ()

    @property
    def present(self) -> int:
        """Runs of the file skipped as already in the store (same commit, time, host; or a
        group's run holding every test of theirs)."""
        return len(self.run_ids) - len(self.added) - len(self.joined)


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


def _commit_key(run: RunInfo) -> str:
    """The lock key of the writers of ``run``'s commit (and dirty flag)."""
    return f"{run.commit} {int(bool(run.dirty))}"


def _machine_kind(fp: Fingerprint) -> str:
    """A fingerprint less its host: what the jobs of one run group must share to be one run."""
    return json.dumps({**fp.to_dict(), "host": None}, sort_keys=True)


def _environment_json(env: Environment) -> str | None:
    return json.dumps(env.to_dict(), sort_keys=True) if not env.empty else None


#: what adding one run did: its id here, "added" | "joined" | "present", records added
Added = tuple[int, str, int]


def _imported(done: list[Added]) -> Imported:
    """What adding runs did, from each run's :data:`Added`."""
    return Imported(
        run_ids=tuple(run_id for run_id, _, _ in done),
        added=tuple(run_id for run_id, how, _ in done if how == "added"),
        tests=sum(n for _, _, n in done),
        joined=tuple(run_id for run_id, how, _ in done if how == "joined"),
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
        several times). Writers of one commit wait for each other (a lock per
        commit), so two of them leave exactly one run.

        A run with a ``group`` (the CI run whose jobs are a suite's shards) joins the run
        of its commit, dirty flag, group and machine kind (the fingerprint less the host:
        a pool's runners differ in name only) when there is one: its records are added to
        that run, so N shards saved one after another or at once are one run for
        history, baseline lookup and publish (:attr:`SavedRun.joined`). The run keeps the
        first job's time and host. With ``replace=False`` a group run that already holds
        one of these tests is not joined (that test is measured twice on purpose).
        """
        nodeids = [r.nodeid for r in records]
        if len(set(nodeids)) != len(nodeids):
            dup = next(n for n in nodeids if nodeids.count(n) > 1)
            raise ValueError(f"two records for test {dup!r} in one run")
        frames = {
            table: [conform_frame(table, getattr(r, table)) for r in records]
            for table in FRAME_TABLES
        }  # before the transaction: a frame that cannot be stored fails without a lock held

        # one lock per commit: a grouped save's run is shared by jobs on other hosts
        key = _commit_key(run) if replace or run.group else None

        def write() -> SavedRun:
            with self._write("save a run", key=key):
                replaced = self._supersede(run, nodeids) if replace else (0, [])
                joined = self._group_run(run, nodeids) if run.group is not None else None
                if joined is None:
                    run_id = self._insert_run(run, records, frames=frames)
                else:
                    run_id = joined
                    self._insert_records(run_id, records, frames)
            return SavedRun(run_id, replaced[0], tuple(replaced[1]), joined=joined is not None)

        return self.db.retry(write)

    def _group_run(self, run: RunInfo, nodeids: Sequence[str]) -> int | None:
        """The stored run ``run`` joins: same commit, dirty flag, group and machine kind (the
        fingerprint less its host), first saved first; None when there is none, or when
        it already holds one of ``nodeids`` (an append-mode save: both are kept)."""
        rows = self.db.execute(
            'SELECT run_id, fingerprint FROM runs WHERE "commit" = ? AND dirty = ? '
            "AND run_group = ? ORDER BY run_id",
            (run.commit, int(bool(run.dirty)), run.group),
        ).fetchall()
        kind = _machine_kind(run.fingerprint)
        for run_id, fp in rows:
            if _machine_kind(Fingerprint.from_dict(json.loads(fp))) != kind:
                continue
            held = self.db.query("SELECT nodeid FROM tests WHERE run_id = ?", (int(run_id),))
            if set(held["nodeid"]) & set(nodeids):
                return None
            return int(run_id)
        return None

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
        if run.group is not None:  # the group's run, saved by a job on another host
            joined = self._group_run(run, ())
            if joined is not None:
                held = db.query(
                    "SELECT test_id, run_id, nodeid FROM tests WHERE run_id = ?", (joined,)
                )
                old = pd.concat([old, held], ignore_index=True).drop_duplicates("test_id")
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

    def _insert_records(
        self,
        run_id: int,
        records: Sequence[TestRecord],
        frames: dict[str, list[pd.DataFrame]] | None = None,
    ) -> None:
        """Add ``records`` to stored run ``run_id`` (none of its tests may be there yet)."""
        if not records:
            return
        db = self.db
        db.insert_rows(
            "tests",
            ("run_id", "nodeid", "metric", "meta"),
            [(run_id, r.nodeid, r.metric, meta_json(r.meta)) for r in records],
        )
        wanted = {r.nodeid for r in records}
        ids = {
            n: i
            for n, i in db.execute("SELECT nodeid, test_id FROM tests WHERE run_id=?", (run_id,))
            if n in wanted
        }
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
            "run_group": run.group,
        }
        cols = ", ".join(f'"{c}"' for c in row)
        marks = ", ".join("?" * len(row))
        (run_id,) = db.execute(
            f"INSERT INTO runs ({cols}) VALUES ({marks}) RETURNING run_id", list(row.values())
        ).fetchone()
        run_id = int(run_id)
        self._insert_records(run_id, records, frames)
        return run_id

    # ----------------------------------------------------------------- adding runs
    def import_file(self, src: str | os.PathLike[str]) -> Imported:
        """Add the runs and acceptances of an export in one transaction (a bad file adds
        nothing: :func:`~perfguard.baseline.export.read_export`); a run already here (same
        commit, time, host) is skipped. Says what it added and what it skipped."""
        parsed, accepted = read_export(src)
        return _imported(self._add_runs(lambda: iter(parsed), accepted))

    def add_runs(self, runs: Sequence[tuple[RunInfo, list[TestRecord]]]) -> Imported:
        """Add runs made outside a perfguard session (pytest-benchmark's saved files,
        :mod:`perfguard.baseline.import_benchmark`) in one transaction, each unless a run
        of the same commit, time and host is here already: importing twice adds nothing."""
        return _imported(self._add_runs(lambda: ((info, r, None) for info, r in runs)))

    def copy_from(self, reader: Reader, accepted: Acceptances) -> Imported:
        """Copy every run another store's ``reader`` holds, and its ``accepted``, into
        this store, losslessly (records, run info, the perfguard version that saved it), in
        one transaction; a run already here (same commit, time, host) is skipped, so a copy
        can be repeated. A run of a run group joins the group's run here (same commit,
        dirty flag, group and machine kind: a shard's store merged into another's), adding
        the tests that run does not hold yet."""

        def source() -> Iterator[ExportedRun]:
            versions = reader.runs().set_index("run_id")["perfguard_version"]
            for run_id, version in versions.items():
                info, records = reader.load_run(int(cast(int, run_id)))
                yield info, list(records.values()), version

        return _imported(self._add_runs(source, accepted.rows()))

    def _add_runs(
        self,
        runs: Callable[[], Iterator[ExportedRun]],
        acceptances: Sequence[dict[str, Any]] = (),
    ) -> list[Added]:
        """Add the runs ``runs()`` gives that are not here yet, and the acceptances, in one
        transaction: what was done with each run (:data:`Added`)."""

        def write() -> list[Added]:
            out: list[Added] = []
            with self._write("add runs", exclusive=True):  # exclusive: two imports add once
                self.accepted.add_missing(acceptances)
                for info, records, version in runs():
                    if info.group is not None:  # saves of this commit may be joining it now
                        self.db.lock_key(_commit_key(info))
                    group = self._group_run(info, ()) if info.group is not None else None
                    if group is not None:  # a shard of a run already here: its new tests
                        held = set(
                            self.db.query("SELECT nodeid FROM tests WHERE run_id = ?", (group,))[
                                "nodeid"
                            ]
                        )
                        new = [r for r in records if r.nodeid not in held]
                        self._insert_records(group, new)
                        out.append((group, "joined" if new else "present", len(new)))
                        continue
                    existing = self.db.execute(
                        'SELECT run_id FROM runs WHERE "commit"=? AND time=? '
                        "AND host IS NOT DISTINCT FROM ? ORDER BY run_id LIMIT 1",
                        (info.commit, info.time, info.fingerprint.host),
                    ).fetchone()
                    if existing is not None:
                        out.append((int(existing[0]), "present", 0))
                    else:
                        run_id = self._insert_run(info, records, version)
                        out.append((run_id, "added", len(records)))
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
