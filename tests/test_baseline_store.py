"""The baseline store on real SQLite files and a real PostgreSQL server, with records
made from real captures.

Every test that is not about one engine runs on both (the ``backend``
parameter): a SQLite file in a temp dir, and a fresh database on the
session's throwaway PostgreSQL cluster (``postgres_server``). Records come
from ``record_from_analysis`` on the shared fixtures; what the store returns
is checked against those records (frames equal after the documented dtype
conversion, values equal before it) and against figures computed here with
numpy and plain sqlite3 / psycopg. Concurrency is 8 real processes writing
to one store; migration starts from a real store rewound to the v1 shape;
bad files are real foreign, corrupt and truncated files; bad servers are a
wrong URL, a stopped server and a role without rights.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal
from store_writers import run_writers

from perfguard.analysis import analyze
from perfguard.baseline import Fingerprint, RunInfo, TestRecord, record_from_analysis
from perfguard.baseline import db as db_mod
from perfguard.baseline import store as store_mod
from perfguard.baseline.frames import FRAME_TYPES, conform_frame, conform_record
from perfguard.baseline.record import METRICS
from perfguard.baseline.schema import FINGERPRINT_COLUMNS, SCHEMA_VERSION, _v1_initial
from perfguard.baseline.store import Store
from perfguard.commands.baseline import DEFAULT_STORE as CLI_DEFAULT_STORE
from perfguard.compare import units
from perfguard.errors import BaselineError

REPO = Path(__file__).resolve().parents[1]
FRAMES = tuple(FRAME_TYPES)
CAPTURES = {
    "h200": "nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite",
    "cloverleaf": "nsys/nsys2024.5.1_cloverleaf_no-nvtx-rows_a100x4.sqlite",
    "bert": "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
    "a100": "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz",
}
H100 = Fingerprint(gpu_name="NVIDIA H100", gpu_count=1, backend="torch", host="ci-1", cpu="x")
A100 = Fingerprint(gpu_name="NVIDIA A100", gpu_count=1, backend="torch", host="ci-2", cpu="x")


@pytest.fixture(scope="module")
def records(fixture_file, cached_trace) -> dict[str, TestRecord]:
    """One real record per capture; ``bert`` as a wall-time record with harness wall times."""
    out = {}
    for key, rel in CAPTURES.items():
        analysis = analyze(cached_trace(fixture_file(rel)))
        kwargs = {}
        if key == "bert":
            n = len(analysis.iterations)
            kwargs = {"metric": "wall_time", "wall_times_ns": np.arange(n) * 7 + 1_000_003}
        out[key] = record_from_analysis(
            f"tests/test_models.py::test_{key}[cuda]",
            analysis,
            meta={"iterations": 3, "tolerance": 0.05, "capture": rel, "note": key},
            **kwargs,
        )
    return out


def run(commit: str, when: str, fp: Fingerprint = H100, **kw) -> RunInfo:
    return RunInfo(
        commit=commit,
        branch=kw.get("branch", "main"),
        dirty=kw.get("dirty", False),
        time=when,
        fingerprint=fp,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def new_store(backend, tmp_path, request):
    """``new_store(name)``: where a new, empty store goes (a file path, or a new database's URL)."""
    if backend == "sqlite":
        return lambda name="s.db": tmp_path / name
    server = request.getfixturevalue("postgres_server")
    return lambda name=None: server.new_database()


def sql(location: Path | str, statement: str, params: tuple = ()) -> list[tuple]:
    """Rows of ``statement`` on the store's database, read without perfguard."""
    if isinstance(location, Path):
        with sqlite3.connect(location) as conn:
            rows = conn.execute(statement, params).fetchall()
        conn.close()
        return rows
    import psycopg

    with psycopg.connect(location, autocommit=True) as conn:
        cur = conn.execute(statement.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []


def count(location: Path | str, table: str) -> int:
    return sql(location, f"SELECT count(*) FROM {table}")[0][0]


def plain(frame: pd.DataFrame) -> list[list[object]]:
    """Rows as Python values, any missing value as None: compares values, not dtypes."""
    obj = frame.reset_index(drop=True).astype(object)
    return obj.where(frame.reset_index(drop=True).notna(), None).values.tolist()


def assert_same_record(loaded: TestRecord, original: TestRecord) -> None:
    assert loaded.nodeid == original.nodeid and loaded.metric == original.metric
    assert loaded.meta == original.meta
    for name in FRAMES:
        got, sent = getattr(loaded, name), getattr(original, name)
        assert_frame_equal(got, conform_frame(name, sent))
        assert plain(got) == plain(sent[list(FRAME_TYPES[name])]), name  # no value changed


# ------------------------------------------------------------------ round trip


def test_round_trip_of_real_records_is_exact(tmp_path, records, new_store, backend):
    path = tmp_path / "baselines" / "perfguard.db" if backend == "sqlite" else new_store()
    info = run("a" * 40, "2024-05-01T10:00:00+00:00", branch=None, dirty=True)
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        run_id = store.save_run(info, list(records.values()))
        loaded_info, loaded = store.load_run(run_id)
        assert loaded_info == info
        assert sorted(loaded) == sorted(r.nodeid for r in records.values())
        for rec in records.values():
            assert_same_record(loaded[rec.nodeid], rec)
            assert_same_record(store.load_test(run_id, rec.nodeid), rec)
            np.testing.assert_array_equal(loaded[rec.nodeid].values(), rec.values())
        assert store.load_test(run_id, "tests/x.py::absent") is None
        with pytest.raises(BaselineError, match=r"no run 999$"):
            store.load_test(999, "x")
    # the rows are in the database as plain values, one row per frame row (checked without
    # perfguard); the folder of a SQLite store was created
    assert count(path, "runs") == 1 and count(path, "tests") == len(records)
    for name in FRAMES:
        assert count(path, name) == sum(len(getattr(r, name)) for r in records.values())
    total = sql(path, "SELECT sum(gpu_time_total) FROM ops")[0][0]
    assert total == sum(int(r.ops["gpu_time_total"].sum()) for r in records.values())
    if backend == "sqlite":
        assert sql(path, "PRAGMA journal_mode")[0][0] == "wal"


def test_a_failing_save_leaves_nothing_behind(records, new_store):
    good = records["a100"]
    bad_ops = good.op_samples.assign(calls="many")  # cannot be an INTEGER column
    bad = TestRecord("tests/t.py::bad", "gpu_time", good.samples, bad_ops, good.ops, good.kernels)
    path = new_store()
    with Store(path) as store:
        with pytest.raises(ValueError):
            store.save_run(run("1" * 40, "2024-01-01T00:00:00Z"), [good, bad])
        with pytest.raises(ValueError, match="two records for test"):
            store.save_run(run("1" * 40, "2024-01-01T00:00:00Z"), [good, good])
        assert store.runs().empty
    for table in ("runs", "tests", *FRAMES):
        assert count(path, table) == 0, table


def test_conform_record_keeps_every_value(records):
    for rec in records.values():
        conformed = conform_record(rec)
        for name in FRAMES:
            frame = getattr(conformed, name)
            assert list(frame.columns) == list(FRAME_TYPES[name])
            assert plain(frame) == plain(getattr(rec, name)[list(FRAME_TYPES[name])])
        assert conformed.ops["tc_eligible"].dtype == "boolean"
        assert conformed.samples["gpu_time_ns"].dtype == np.int64


def test_runs_history_and_medians(records, new_store):
    a100, bert = records["a100"], records["bert"]
    with Store(new_store()) as store:
        ids = [
            store.save_run(run(str(i) * 40, f"2024-05-0{i + 1}T00:00:00+00:00"), [a100, bert])
            for i in range(4)
        ]
        other = store.save_run(run("f" * 40, "2024-05-09T00:00:00+00:00", A100), [a100])
        runs = store.runs()
        assert runs["run_id"].tolist() == [*ids, other]
        assert runs["n_tests"].tolist() == [2, 2, 2, 2, 1]
        assert runs["gpu_name"].tolist() == ["NVIDIA H100"] * 4 + ["NVIDIA A100"]
        assert runs["fingerprint"].iloc[-1] == A100
        assert store.runs(commit="2" * 12)["run_id"].tolist() == [ids[2]]

        hist = store.history(a100.nodeid)
        assert hist.columns.tolist() == ["run_id", "commit", "time", "metric", "median_ns", "n"]
        assert hist["run_id"].tolist() == [*ids, other]  # oldest first
        assert (hist["median_ns"] == float(np.median(a100.samples["gpu_time_ns"]))).all()
        assert (hist["n"] == len(a100.samples)).all()
        assert store.history(a100.nodeid, fingerprint=H100)["run_id"].tolist() == ids
        assert store.history(a100.nodeid, fingerprint=A100)["run_id"].tolist() == [other]
        assert store.history(a100.nodeid, limit=2)["run_id"].tolist() == [ids[3], other]
        wall = store.history(bert.nodeid)
        assert (wall["metric"] == "wall_time").all()
        assert wall["median_ns"].iloc[0] == float(np.median(bert.samples["wall_time_ns"]))
        assert store.history("tests/none.py::nothing").empty


# ------------------------------------------------------------------ JSON export / import


def test_export_import_round_trip_is_idempotent_and_diffable(tmp_path, records, new_store):
    src = new_store("a.db")
    with Store(src) as store:
        first = store.save_run(run("1" * 40, "2024-01-01T00:00:00+00:00"), list(records.values()))
        store.save_run(run("2" * 40, "2024-01-02T00:00:00+00:00", A100), [records["a100"]])
        assert store.export_json(tmp_path / "a.json") == 2
        assert store.export_json(tmp_path / "one.json", [first]) == 1
    text = (tmp_path / "a.json").read_text()
    doc = json.loads(text)  # valid JSON: no NaN
    assert [r["run"]["commit"] for r in doc["runs"]] == ["1" * 40, "2" * 40]
    kernels = doc["runs"][0]["tests"][records["a100"].nodeid]["kernels"]
    assert len(kernels) == len(records["a100"].kernels)
    # one row per line: a changed kernel is one changed line
    assert sum(1 for line in text.splitlines() if '"kernel_name": ' in line) == sum(
        len(r.kernels) for r in records.values()
    ) + len(records["a100"].kernels)

    dst = new_store("b.db")
    with Store(dst) as store:
        ids = store.import_json(tmp_path / "a.json")
        assert store.import_json(tmp_path / "a.json") == ids  # nothing duplicated
        assert store.import_json(tmp_path / "one.json") == ids[:1]
        assert len(store.runs()) == 2
        info, loaded = store.load_run(ids[0])
        assert info.commit == "1" * 40
        for rec in records.values():
            assert_same_record(loaded[rec.nodeid], rec)
        store.export_json(tmp_path / "b.json")
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "a.json").read_bytes()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not JSON"),
        ('{"format": "something-else"}', "not a perfguard baseline export"),
        (
            '{"format": "perfguard-baseline-export", "schema_version": 99, "runs": []}',
            "export schema version 99",
        ),
        (
            '{"format": "perfguard-baseline-export", "schema_version": 2, "runs": [{"run": {}}]}',
            "run #1 is malformed: KeyError",
        ),
    ],
)
def test_import_of_a_bad_file_adds_nothing(tmp_path, content, problem, new_store):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with Store(new_store()) as store:
        store.save_run(run("1" * 40, "2024-01-01T00:00:00+00:00"), [])
        with pytest.raises(BaselineError) as err:
            store.import_json(bad)
        assert len(store.runs()) == 1
    msg = str(err.value)
    assert msg.startswith(f"{bad}: ") and problem in msg and "\n" not in msg


# ------------------------------------------------------------------ prune


def test_prune_by_count_age_and_commit(records, new_store):
    rec = records["bert"]
    path = new_store()
    with Store(path) as store:
        h100 = [
            store.save_run(run(str(i) * 40, f"2024-03-{i + 1:02d}T00:00:00Z"), [rec])
            for i in range(5)
        ]
        a100 = store.save_run(run("a" * 40, "2024-01-01T00:00:00Z", A100), [rec])
        now = pd.Timestamp("2024-03-10T00:00:00Z")
        with pytest.raises(BaselineError, match="prune needs"):
            store.prune()
        # keep_last is per machine: the lone, oldest A100 run stays
        assert store.prune(keep_last=3) == 2
        assert store.runs()["run_id"].tolist() == [a100, *h100[2:]]
        # 2024-03-03 is 7 days before `now`; 2024-01-01 is long before
        assert store.prune(older_than_days=7.5, now=now) == 1
        assert store.runs()["run_id"].tolist() == [*h100[2:]]
        assert store.prune(commits=["4" * 8]) == 1
        assert store.runs()["run_id"].tolist() == h100[2:4]
        assert store.prune(keep_last=5) == 0
    assert count(path, "tests") == 2
    for name in FRAMES:
        assert count(path, name) == 2 * len(getattr(rec, name))


# ------------------------------------------------------------------ concurrency


def test_concurrent_writers_lose_duplicate_and_corrupt_nothing(tmp_path, records, new_store):
    recs = [records["a100"], records["bert"]]
    path = new_store("shared.db")
    n_workers, n_runs = 4, 10
    ids = run_writers(tmp_path, path, recs, n_workers, n_runs)
    assert len(ids) == len(set(ids)) == n_workers * n_runs
    if isinstance(path, Path):
        assert sql(path, "PRAGMA integrity_check")[0][0] == "ok"
        assert sql(path, "PRAGMA foreign_key_check") == []
    assert count(path, "runs") == n_workers * n_runs
    assert sql(path, 'SELECT count(DISTINCT "commit" || host) FROM runs')[0][0] == len(ids)
    assert count(path, "tests") == n_workers * n_runs * len(recs)
    for name in FRAMES:
        assert count(path, name) == n_workers * n_runs * sum(len(getattr(r, name)) for r in recs)
    with Store(path) as store:
        runs = store.runs()
        assert sorted(runs["run_id"]) == sorted(ids)
        assert sorted(runs["host"].value_counts().tolist()) == [n_runs] * n_workers
        for run_id in runs["run_id"].iloc[:: n_runs - 1]:  # a few, from different workers
            _, loaded = store.load_run(int(run_id))
            for rec in recs:
                assert_same_record(loaded[rec.nodeid], rec)


KILLED = """
import sys, time
from pathlib import Path
from perfguard.baseline import db, pg
from perfguard.baseline.record import Fingerprint, RunInfo
import pickle
from perfguard.baseline.store import open_store

store, recs, flag = sys.argv[1:]
records = pickle.loads(Path(recs).read_bytes())
with open_store(store) as s:
    s.save_run(RunInfo("1" * 40, "main", False, "2024-01-01T00:00:00Z", Fingerprint()), records)
    real = type(s.db).insert_rows
    def insert_rows(self, table, columns, rows):
        real(self, table, columns, rows)
        if table == "op_samples":  # the run row, its tests and samples are written: stop here
            Path(flag).touch()
            time.sleep(600)
    type(s.db).insert_rows = insert_rows
    s.save_run(RunInfo("2" * 40, "main", False, "2024-01-02T00:00:00Z", Fingerprint()), records)
"""


def test_a_writer_killed_during_save_run_leaves_no_partial_run(tmp_path, records, new_store):
    recs = [records["a100"], records["bert"]]
    path = new_store()
    (tmp_path / "recs.pkl").write_bytes(pickle.dumps(recs))
    (tmp_path / "killed.py").write_text(KILLED)
    flag = tmp_path / "inside-save-run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(tmp_path / "killed.py"),
            str(path),
            str(tmp_path / "recs.pkl"),
            str(flag),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert flag.exists(), proc.stderr.read() if proc.poll() is not None else "no flag"
    proc.send_signal(signal.SIGKILL)  # mid-transaction: rows of run 2 written, not committed
    proc.communicate(timeout=60)
    time.sleep(0.5)  # the server notices the closed connection and rolls back
    with Store(path, create=False) as store:
        runs = store.runs()
        assert runs["commit"].tolist() == ["1" * 40]  # run 1 whole, nothing of run 2
        # the store takes the next run at once: no lock is left behind by the dead writer
        again = store.save_run(run("3" * 40, "2024-01-03T00:00:00Z"), recs)
        _, loaded = store.load_run(again)
        for rec in recs:
            assert_same_record(loaded[rec.nodeid], rec)
    assert count(path, "runs") == 2 and count(path, "tests") == 2 * len(recs)
    for name in FRAMES:
        assert count(path, name) == 2 * sum(len(getattr(r, name)) for r in recs), name
    if isinstance(path, Path):
        assert sql(path, "PRAGMA integrity_check")[0][0] == "ok"


def test_a_locked_store_is_retried_then_refused_in_one_line(tmp_path, records, monkeypatch):
    monkeypatch.setattr(db_mod, "BUSY_TIMEOUT_MS", 50)
    path = tmp_path / "s.db"
    Store(path).close()
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    release = threading.Timer(0.6, lambda: blocker.execute("COMMIT"))
    with Store(path) as store:
        # the clock is read before the timer starts, so the 0.6 s wait lies inside the span
        # however long this thread is held off the CPU between the two statements
        started = time.monotonic()
        release.start()
        run_id = store.save_run(run("1" * 40, "2024-01-01T00:00:00Z"), [records["bert"]])
        assert time.monotonic() - started >= 0.5  # it waited for the lock, then wrote
        assert store.load_test(run_id, records["bert"].nodeid) is not None
        release.join()
        monkeypatch.setattr(db_mod, "LOCK_BUDGET_S", 0.3)
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(BaselineError) as err:
            store.save_run(run("2" * 40, "2024-01-02T00:00:00Z"), [])
        blocker.execute("ROLLBACK")
    blocker.close()
    assert str(err.value).startswith(f"{path}: store is locked") and "\n" not in str(err.value)
    assert count(path, "runs") == 1


# ------------------------------------------------------------------ schema versions


def _schema(location: Path | str) -> dict[str, list[str]]:
    """Tables and their columns, in order, read without perfguard."""
    if isinstance(location, Path):
        q = "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        tables = [r[0] for r in sql(location, q)]
        return {t: [c[1] for c in sql(location, f"PRAGMA table_info({t})")] for t in sorted(tables)}
    rows = sql(
        location,
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position",
    )
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def rewind_to_v1(location: Path | str) -> None:
    """What a v1 store looked like: no kernels table, fingerprint only as JSON, no
    per-iteration CPU time (v3), no rounds, dtypes or counters (v4), no profiled flag (v5),
    no acceptances (v6), no Callgrind functions (v7), no environment (v8), no run group (v9)."""
    statements = [
        "ALTER TABLE runs DROP COLUMN run_group",
        "ALTER TABLE runs DROP COLUMN environment",
        "DROP TABLE functions",
        "DROP TABLE acceptances",
        "ALTER TABLE samples DROP COLUMN profiled",
        "ALTER TABLE samples DROP COLUMN round",
        "ALTER TABLE ops DROP COLUMN dtypes",
        "DROP TABLE counters",
        "ALTER TABLE samples DROP COLUMN cpu_time_ns",
        "DROP TABLE kernels",
        "DROP INDEX runs_commit",
        *(f'ALTER TABLE runs DROP COLUMN "{col}"' for col in FINGERPRINT_COLUMNS),
        "UPDATE meta SET value='1' WHERE key='schema_version'",
    ]
    if isinstance(location, Path):
        with sqlite3.connect(location, isolation_level=None) as conn:
            for statement in statements:
                conn.execute(statement)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        return
    import psycopg

    with psycopg.connect(location) as conn, conn.transaction():
        for statement in statements:
            conn.execute(statement)


def fresh_v1(location: Path | str) -> None:
    """An empty store built by the frozen v1 migration alone."""
    db = store_mod.open_database(location, create=True)
    try:
        with db.write():
            _v1_initial(db)
    finally:
        db.close()


def test_v1_store_is_migrated_in_place_and_keeps_every_row(tmp_path, records, new_store):
    path = new_store("perfguard.db")
    recs = list(records.values())
    with Store(path) as store:
        ids = [
            store.save_run(run(f"{i:040x}", f"2024-01-0{i + 1}T00:00:00Z", fp), recs)
            for i, fp in enumerate([H100, A100, H100])
        ]
    rewind_to_v1(path)
    # the rewound store has exactly the shape the frozen v1 migration creates
    fresh = new_store("fresh.db")
    fresh_v1(fresh)
    assert _schema(path) == _schema(fresh)
    before = {t: count(path, t) for t in _schema(path)}

    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        runs = store.runs()
        assert runs["run_id"].tolist() == ids
        # the new columns are filled from the JSON every v1 run carried
        assert runs["gpu_name"].tolist() == ["NVIDIA H100", "NVIDIA A100", "NVIDIA H100"]
        assert runs["host"].tolist() == ["ci-1", "ci-2", "ci-1"]
        assert runs["gpu_count"].tolist() == [1, 1, 1]
        _, loaded = store.load_run(ids[1])
        for rec in recs:  # everything v1 kept is still there; v1 had no kernel rows
            got = loaded[rec.nodeid]
            for name in ("samples", "op_samples", "ops"):
                want = conform_frame(name, getattr(rec, name))
                if name == "ops":  # v1 had no dtypes (v4): they come back missing
                    want["dtypes"] = conform_frame("ops", want.drop(columns="dtypes"))["dtypes"]
                assert_frame_equal(getattr(got, name), want)
            assert got.kernels.empty and got.counters.empty
        new = store.save_run(run("9" * 40, "2024-02-01T00:00:00Z"), recs)
        assert_same_record(store.load_test(new, recs[-1].nodeid), recs[-1])
    for table, n in before.items():
        if table != "meta":
            got = count(path, table)
            assert got == n + (
                1
                if table == "runs"
                else len(recs)
                if table == "tests"
                else sum(len(getattr(r, table)) for r in recs)
            )
    if not isinstance(path, Path):
        return  # a PostgreSQL migration is one transaction: no backup copy
    backup = tmp_path / "perfguard.db.v1.bak"
    with sqlite3.connect(backup) as conn:  # the pre-migration copy, complete
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            "1",
        )
        assert {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in before
        } == before
    conn.close()


def _one_line_error(path: Path, action) -> str:
    with pytest.raises(BaselineError) as err:
        action()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    return msg


def test_newer_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "s.db"
    Store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE meta SET value='{SCHEMA_VERSION + 1}' WHERE key='schema_version'")
    conn.close()
    data = path.read_bytes()
    msg = _one_line_error(path, lambda: Store(path))
    assert f"schema version {SCHEMA_VERSION + 1} is newer" in msg and "upgrade perfguard" in msg
    assert path.read_bytes() == data


def test_foreign_sqlite_file_is_refused_untouched(tmp_path, fixture_file):
    path = tmp_path / "report.sqlite"
    shutil.copy(fixture_file(CAPTURES["h200"]), path)
    data = path.read_bytes()
    msg = _one_line_error(path, lambda: Store(path))
    assert "not a perfguard baseline store" in msg
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.sqlite"]  # no -wal, no .bak


def _opened_and_read(path: Path) -> None:
    with Store(path, create=False) as store:
        for run_id in store.runs()["run_id"]:
            store.load_run(int(run_id))
            store.history("x")


def test_corrupt_and_truncated_stores_fail_in_one_line(tmp_path, records):
    good = tmp_path / "good.db"
    with Store(good) as store:
        for i in range(3):
            store.save_run(run(f"{i:040x}", f"2024-01-0{i + 1}T00:00:00Z"), [records["a100"]])
    data = good.read_bytes()
    assert not (tmp_path / "good.db-wal").exists()  # checkpointed on close: all in the file

    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(data[: len(data) // 2])
    msg = _one_line_error(truncated, lambda: _opened_and_read(truncated))
    assert "malformed" in msg or "not a database" in msg

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not SQLite at all" * 100)
    assert "not an SQLite database" in _one_line_error(garbage, lambda: Store(garbage))

    header = tmp_path / "header.db"
    header.write_bytes(b"\0" * 100 + data[100:])
    assert "not an SQLite database" in _one_line_error(header, lambda: Store(header))

    missing = tmp_path / "missing.db"
    assert "no baseline store here" in _one_line_error(
        missing, lambda: Store(missing, create=False)
    )
    assert not missing.exists()
    folder = tmp_path / "folder.db"
    folder.mkdir()
    assert "is a directory" in _one_line_error(folder, lambda: Store(folder))
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty file is a new store when creating
    with Store(empty) as store:
        assert store.schema_version == SCHEMA_VERSION and store.runs().empty


# ------------------------------------------------------------------ CLI


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfguard", "baseline", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_cli_subcommands(tmp_path, records):
    assert CLI_DEFAULT_STORE == str(store_mod.DEFAULT_STORE)
    path = tmp_path / "s.db"
    bert, a100 = records["bert"], records["a100"]
    with Store(path) as store:
        first = store.save_run(run("ab" * 20, "2024-01-01T00:00:00Z", dirty=True), [bert, a100])
        store.save_run(run("cd" * 20, "2024-01-02T00:00:00Z", A100, branch=None), [a100])

    listed = cli("list", "--store", path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["run_id", "commit", "branch", "dirty"]
    assert lines[1].split()[:4] == [str(first), "ab" * 6, "main", "yes"]
    assert "(detached)" in lines[2] and "NVIDIA A100 [torch] @ ci-2" in lines[2]

    shown = cli("show", first, "--store", path)
    assert shown.returncode == 0, shown.stderr
    assert f"commit {'ab' * 20} (dirty)" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if line.startswith(a100.nodeid))
    median = np.median(a100.samples["gpu_time_ns"])
    assert f" {units.format_ns(median)} " in row and " gpu_time " in row  # the one formatter
    shown_ms = float(row.split(" gpu_time ")[1].split()[1])  # '3 51.6 ms ...': count, median
    assert abs(shown_ms - median / 1e6) <= 0.0005 * median / 1e6 + 0.05

    out = tmp_path / "export.json"
    assert cli("export", "-o", out, "--store", path).returncode == 0
    assert len(json.loads(out.read_text())["runs"]) == 2
    other = tmp_path / "other.db"
    imported = cli("import", out, "--store", other)
    assert imported.returncode == 0 and "imported 2 run(s)" in imported.stdout
    again = cli("import", out, "--store", other)
    assert "imported 0 run(s)" in again.stdout and "2 already present" in again.stdout

    pruned = cli("prune", "--keep-last", "0", "--store", other)
    assert pruned.returncode == 0 and "pruned 2 run(s)" in pruned.stdout
    assert count(other, "runs") == 0

    for args, problem in (
        (("show", 77, "--store", path), f"{path}: no run 77"),
        (("prune", "--older-than", "-1", "--store", path), "must be a finite number >= 0"),
    ):
        res = cli(*args)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and problem in res.stderr, res.stderr
    assert count(path, "runs") == 2


def test_cli_refuses_a_missing_store_and_a_prune_without_criteria(tmp_path, capsys):
    from perfguard.cli import main

    assert main(["baseline", "list", "--store", str(tmp_path / "none.db")]) == 2
    assert (
        capsys.readouterr().err
        == f"perfguard: error: {tmp_path / 'none.db'}: no baseline store here\n"
    )
    assert not (tmp_path / "none.db").exists()
    Store(tmp_path / "s.db").close()
    with pytest.raises(SystemExit) as exit_:
        main(["baseline", "prune", "--store", str(tmp_path / "s.db")])
    assert exit_.value.code == 2
    assert "give at least one of --keep-last, --older-than, --commit" in capsys.readouterr().err


def test_metric_names_match_sample_columns():
    # the store reads the primary metric column through METRICS; a new metric needs a column
    assert set(METRICS.values()) <= set(FRAME_TYPES["samples"])


# ------------------------------------------------------------------ PostgreSQL: bad servers


def test_newer_schema_on_a_server_is_refused_and_left_alone(postgres_server):
    url = postgres_server.new_database()
    Store(url).close()
    sql(url, f"UPDATE meta SET value='{SCHEMA_VERSION + 1}' WHERE key='schema_version'")
    before = _schema(url)
    with pytest.raises(BaselineError) as err:
        Store(url)
    msg = str(err.value)
    assert msg.startswith(f"{url}: ") and "\n" not in msg
    assert f"schema version {SCHEMA_VERSION + 1} is newer" in msg
    assert _schema(url) == before
    assert sql(url, "SELECT value FROM meta WHERE key='schema_version'") == [
        (str(SCHEMA_VERSION + 1),)
    ]


def _refused(location: str, action, shown: str | None = None) -> str:
    with pytest.raises(BaselineError) as err:
        action()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{shown or location}: "), msg
    return msg


def test_bad_urls_a_stopped_server_and_missing_rights_fail_in_one_line(postgres_server, tmp_path):
    server = postgres_server
    # a database of another application: refused, untouched
    other = server.new_database()
    sql(other, "CREATE TABLE users (id int)")
    msg = _refused(other, lambda: Store(other))
    assert "not a perfguard baseline store (a PostgreSQL schema with tables users)" in msg
    assert _schema(other) == {"users": ["id"]}
    # an empty database is not a store to read
    empty = server.new_database()
    assert "no tables in this database" in _refused(empty, lambda: Store(empty, create=False))
    assert _schema(empty) == {}
    # no such database, no server there, a malformed URL, an unknown scheme
    missing = server.url("no_such_db")
    assert 'database "no_such_db" does not exist' in _refused(missing, lambda: Store(missing))
    down = f"postgresql://postgres@/x?host={tmp_path}"
    assert "cannot connect" in _refused(down, lambda: Store(down))
    bad = "postgresql://postgres@/x?hots=/tmp"
    assert "bad store URL" in _refused(bad, lambda: Store(bad))
    mysql = "mysql://root@localhost/x"
    assert "unknown store URL scheme 'mysql'" in _refused(mysql, lambda: Store(mysql))
    # a password never shows in a message
    secret = f"postgresql://postgres:hunter2@/x?host={tmp_path}"
    shown = f"postgresql://postgres:***@/x?host={tmp_path}"
    assert "hunter2" not in _refused(secret, lambda: Store(secret), shown)

    # a role that may read but not write, and may not create tables
    store_url = server.new_database()
    with Store(store_url) as store:
        store.save_run(run("1" * 40, "2024-01-01T00:00:00Z"), [])
    server.admin("DROP ROLE IF EXISTS reader; CREATE ROLE reader LOGIN")
    dbname = urlsplit(store_url).path.lstrip("/")
    server.admin("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader", dbname)
    as_reader = server.url(dbname, user="reader")
    with Store(as_reader, create=False) as store:
        assert len(store.runs()) == 1
        msg = _refused(as_reader, lambda: store.save_run(run("2" * 40, "2024-01-02Z"), []))
        assert "permission denied" in msg
    new_db = urlsplit(server.new_database()).path.lstrip("/")
    server.admin("REVOKE CREATE ON SCHEMA public FROM PUBLIC", new_db)
    no_create = server.url(new_db, user="reader")
    assert "permission denied" in _refused(no_create, lambda: Store(no_create))
    hidden = urlsplit(server.new_database()).path.lstrip("/")
    Store(server.url(hidden)).close()
    no_read = server.url(hidden, user="reader")
    assert "permission denied" in _refused(no_read, lambda: Store(no_read, create=False))
    assert count(store_url, "runs") == 1


def test_migrate_copies_a_sqlite_store_to_a_server_losslessly(tmp_path, records, postgres_server):
    src = tmp_path / "perfguard.db"
    recs = list(records.values())
    with Store(src) as store:
        for i, fp in enumerate([H100, A100, H100]):
            store.save_run(run(f"{i:040x}", f"2024-01-0{i + 1}T00:00:00Z", fp), recs)
        store.save_run(run("e" * 40, "2024-01-09T00:00:00Z", branch=None, dirty=True), [])
    url = postgres_server.new_database()
    done = cli("migrate", "--store", src, "--to", url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"copied 4 run(s) from {src} to {url}"
    again = cli("migrate", "--store", src, "--to", url)
    assert again.stdout.strip().endswith(f"copied 0 run(s) from {src} to {url}; 4 already there")
    for table in ("runs", "tests", *FRAMES):
        assert count(url, table) == count(src, table), table
    with Store(src) as a, Store(url) as b:
        runs_a, runs_b = a.runs(), b.runs()
        cols = ["commit", "branch", "dirty", "time", "perfguard_version", "n_tests", "fingerprint"]
        assert runs_a[cols].equals(runs_b[cols])
        for id_a, id_b in zip(runs_a["run_id"], runs_b["run_id"], strict=True):
            info_a, loaded_a = a.load_run(int(id_a))
            info_b, loaded_b = b.load_run(int(id_b))
            assert info_a == info_b and sorted(loaded_a) == sorted(loaded_b)
            for nodeid, rec in loaded_a.items():
                assert_same_record(loaded_b[nodeid], rec)
        a.export_json(tmp_path / "a.json")
        b.export_json(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    listed = cli("list", "--store", url)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 5


def test_the_environment_is_kept_with_the_run_and_through_exports(new_store, records, tmp_path):
    """A run's environment (real values: the H100 report of tests/data/nvidia_smi and the
    Kineto H100 capture's libraries) comes back from load, runs(), an export and a copy;
    a run saved without one reads as nothing known."""
    from perfguard.environment import Environment

    env = Environment(driver="535.161.08", power_limit="700 W", ecc="on", cudnn="9.1.0.70")
    rec = [records["bert"]]
    with Store(new_store()) as store:
        with_env = store.save_run(
            replace(run("a" * 40, "2024-01-01T00:00:00Z"), environment=env), rec
        )
        without = store.save_run(run("b" * 40, "2024-01-02T00:00:00Z"), rec)
        assert store.run_info(with_env).environment == env
        assert store.load_run(without)[0].environment.empty
        envs = store.runs().set_index("run_id")["environment"]
        assert envs[with_env] == env and envs[without].empty
        assert store.runs_with_test(rec[0].nodeid)["environment"].tolist() == [env, Environment()]
        store.export_json(tmp_path / "export.json")
    doc = json.loads((tmp_path / "export.json").read_text())
    assert [r["run"].get("environment") for r in doc["runs"]] == [env.to_dict(), None]
    with Store(tmp_path / "imported.db") as other:
        other.import_json(tmp_path / "export.json")
        first = int(other.runs()["run_id"].iloc[0])
        assert other.run_info(first).environment == env
