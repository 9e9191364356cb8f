"""The store's queries: runs, records, one test's history and tables, the tests it holds.

A :class:`Reader` shares the store's open :class:`~perfguard.baseline.db.Database`
and only reads it. Every row read back is decoded here, once: a value no record
can hold (text in a number column, a commit that is not text, a fingerprint that
is not JSON, a metric perfguard never writes) is a
:class:`~perfguard.errors.DamagedStoreError`, never a row silently dropped.
Frames are read back with one query per table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pandas as pd

from perfguard.baseline.db import Database
from perfguard.baseline.frames import FRAME_TYPES, conform_frame, impossible, text_in_numbers
from perfguard.baseline.record import (
    MACHINE_EVIDENCE,
    METRICS,
    Fingerprint,
    RunInfo,
    TestRecord,
    run_levels_of,
    timing_mask,
)
from perfguard.baseline.schema import FINGERPRINT_COLUMNS
from perfguard.environment import Environment
from perfguard.errors import BaselineError

__all__ = ["FRAME_TABLES", "Reader"]

#: record frame -> table (same names); child tables of ``tests``
FRAME_TABLES = tuple(FRAME_TYPES)


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


class Reader:
    """The queries of one open store (``store.reader``); it never writes."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        return self.db.query(sql, params)

    # ----------------------------------------------------------------- decoding
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

    # ----------------------------------------------------------------- runs
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
                'SELECT "commit", branch, dirty, time, fingerprint, environment, run_group '
                "FROM runs WHERE run_id=?",
                (int(run_id),),
            ).fetchone()
        if row is None:
            raise BaselineError(f"{self.db.name}: no run {run_id}")
        commit, branch, dirty, when, fp, env, group = row
        with self.db.decoding(f"run {run_id}"):
            return RunInfo(
                commit,
                branch,
                bool(dirty),
                when,
                Fingerprint.from_dict(json.loads(fp)),
                Environment.from_dict(json.loads(env)) if env else Environment(),
                group=group if isinstance(group, str) else None,
            )

    def run_version(self, run_id: int) -> str | None:
        """The perfguard version that saved run ``run_id`` (an export keeps it)."""
        with self.db.guard():
            row = self.db.execute(
                "SELECT perfguard_version FROM runs WHERE run_id=?", (int(run_id),)
            ).fetchone()
        if row is None:
            raise BaselineError(f"{self.db.name}: no run {run_id}")
        return cast(str | None, row[0])

    # ----------------------------------------------------------------- records
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

    def metas(self, run_id: int) -> dict[str, dict[str, Any]]:
        """Each test's ``meta`` in a run, by nodeid, without its tables: what
        ``--perfguard-changed`` reads of the baseline run before any test runs."""
        df = self._query("SELECT nodeid, meta FROM tests WHERE run_id = ?", [int(run_id)])
        self._texts(df, "tests", "nodeid")
        out = {}
        for nodeid, meta in zip(df["nodeid"], df["meta"], strict=True):
            with self.db.decoding(f"the meta of {nodeid} in run {run_id}"):
                out[str(nodeid)] = dict(json.loads(meta))
        return out

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

    # ----------------------------------------------------------------- one test
    def history(
        self, nodeid: str, *, fingerprint: Fingerprint | None = None, limit: int = 50
    ) -> pd.DataFrame:
        """The test's primary-metric level per run (:func:`run_levels_of`) over its latest
        ``limit`` runs, oldest first.

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
                cand = cand[
                    [
                        fingerprint.incompatibility(fp) is None
                        and fingerprint.timing_incompatibility(fp) is None
                        for fp in fps
                    ]
                ]
            cand = cand.head(max(int(limit), 0)).iloc[::-1].reset_index(drop=True)
            self._metrics(cand["metric"])
            samples = self._query(
                'SELECT test_id, "round", gpu_time_ns, wall_time_ns, cpu_time_ns, profiled '
                "FROM samples "
                f"WHERE {self.db.ids_in('test_id')}",
                [self.db.ids_param(cand["test_id"])],
            )
        self._frame("samples", samples.drop(columns="test_id"))
        metric_of = samples["test_id"].map(cand.set_index("test_id")["metric"])
        value = pd.Series(np.nan, index=samples.index)
        for metric, col in METRICS.items():
            mask = (metric_of == metric).to_numpy()
            value[mask] = samples.loc[mask, col].astype(np.float64)
        value[~timing_mask(samples, metric_of, by="test_id")] = np.nan
        stats = run_levels_of(samples["test_id"], samples["round"], value, metric_of)
        counts = value.dropna().groupby(samples["test_id"]).size()
        out = cand[["run_id", "commit", "time", "metric"]].copy()
        out["median_ns"] = cand["test_id"].map(stats["level"]).astype(np.float64)
        out["n"] = cand["test_id"].map(counts).fillna(0).astype(np.int64)
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

    def durations(self, commit: str) -> dict[str, float]:
        """Seconds each test's timed steps took in the latest run of ``commit`` that holds it
        (the sum of its samples' wall time, every round): the weights ``--perfguard-shard``
        balances its parts by. Tests without samples are left out."""
        df = self._query(
            """SELECT t.nodeid, SUM(s.wall_time_ns) AS ns FROM tests t
               JOIN samples s ON s.test_id = t.test_id
               WHERE t.test_id IN (SELECT max(t2.test_id) FROM tests t2 JOIN runs r
                                   ON r.run_id = t2.run_id WHERE r."commit" = ?
                                   GROUP BY t2.nodeid)
               GROUP BY t.nodeid""",
            [commit],
        )
        self._texts(df, "tests", "nodeid")
        return {
            str(n): float(ns) / 1e9
            for n, ns in zip(df["nodeid"], df["ns"], strict=True)
            if ns is not None and ns == ns and ns > 0
        }

    def nodeids(self) -> list[str]:
        """Every test with a record in the store, sorted."""
        names = self._texts(self._query("SELECT DISTINCT nodeid FROM tests"), "tests", "nodeid")
        return sorted(names["nodeid"].tolist())

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
