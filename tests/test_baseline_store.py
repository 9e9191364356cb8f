"""The baseline store on real SQLite files with records made from real captures.

Records come from ``record_from_analysis`` on the shared fixtures; what the
store returns is checked against those records (frames equal after the
documented dtype conversion, values equal before it) and against figures
computed here with numpy and plain sqlite3. Concurrency is 8 real
processes writing to one file; migration starts from a real store rewound
to the v1 shape; bad files are real foreign, corrupt and truncated files.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from perfguard.analysis import analyze
from perfguard.baseline import Fingerprint, RunInfo, TestRecord, record_from_analysis
from perfguard.baseline import store as store_mod
from perfguard.baseline.frames import FRAME_TYPES, conform_frame, conform_record
from perfguard.baseline.record import METRICS
from perfguard.baseline.schema import FINGERPRINT_COLUMNS, SCHEMA_VERSION, _v1_initial
from perfguard.baseline.store import Store
from perfguard.commands.baseline import DEFAULT_STORE as CLI_DEFAULT_STORE
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


def count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


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


def test_round_trip_of_real_records_is_exact(tmp_path, records):
    path = tmp_path / "baselines" / "perfguard.db"  # the folder is created
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
    # the rows are in SQLite as plain values, one row per frame row (checked without perfguard)
    assert count(path, "runs") == 1 and count(path, "tests") == len(records)
    for name in FRAMES:
        assert count(path, name) == sum(len(getattr(r, name)) for r in records.values())
    with sqlite3.connect(path) as conn:
        total = conn.execute("SELECT sum(gpu_time_total) FROM ops").fetchone()[0]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert total == sum(int(r.ops["gpu_time_total"].sum()) for r in records.values())


def test_a_failing_save_leaves_nothing_behind(tmp_path, records):
    good = records["a100"]
    bad_ops = good.op_samples.assign(calls="many")  # cannot be an INTEGER column
    bad = TestRecord("tests/t.py::bad", "gpu_time", good.samples, bad_ops, good.ops, good.kernels)
    path = tmp_path / "s.db"
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


def test_runs_history_and_medians(tmp_path, records):
    a100, bert = records["a100"], records["bert"]
    with Store(tmp_path / "s.db") as store:
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


def test_export_import_round_trip_is_idempotent_and_diffable(tmp_path, records):
    src = tmp_path / "a.db"
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

    dst = tmp_path / "b.db"
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
def test_import_of_a_bad_file_adds_nothing(tmp_path, content, problem):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with Store(tmp_path / "s.db") as store:
        store.save_run(run("1" * 40, "2024-01-01T00:00:00+00:00"), [])
        with pytest.raises(BaselineError) as err:
            store.import_json(bad)
        assert len(store.runs()) == 1
    msg = str(err.value)
    assert msg.startswith(f"{bad}: ") and problem in msg and "\n" not in msg


# ------------------------------------------------------------------ prune


def test_prune_by_count_age_and_commit(tmp_path, records):
    rec = records["bert"]
    path = tmp_path / "s.db"
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

WORKER = """
import json, pickle, sys, time
from pathlib import Path
from perfguard.baseline.record import Fingerprint, RunInfo
from perfguard.baseline.store import Store

store, recs, worker, n_runs, gate = sys.argv[1:]
worker, n_runs, gate = int(worker), int(n_runs), Path(gate)
records = pickle.loads(Path(recs).read_bytes())
(gate / f"ready-{worker}").touch()
deadline = time.monotonic() + 120
while len(list(gate.glob("ready-*"))) < 8 and time.monotonic() < deadline:
    time.sleep(0.005)
fp = Fingerprint(gpu_name="NVIDIA H100", gpu_count=1, backend="torch", host=f"w{worker}")
with Store(store) as s:  # all 8 open (and race to create) the store at once
    ids = [s.save_run(RunInfo(f"{worker:02d}{k:038d}", "main", False,
                              f"2024-01-01T00:{worker:02d}:{k:02d}+00:00", fp), records)
           for k in range(n_runs)]
print(json.dumps(ids))
"""


def test_eight_processes_write_one_store_at_once(tmp_path, records):
    recs = [records["a100"], records["bert"]]
    (tmp_path / "recs.pkl").write_bytes(pickle.dumps(recs))
    (tmp_path / "worker.py").write_text(WORKER)
    gate = tmp_path / "gate"
    gate.mkdir()
    path = tmp_path / "shared.db"
    n_runs = 3
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(tmp_path / "worker.py"),
                str(path),
                str(tmp_path / "recs.pkl"),
                str(w),
                str(n_runs),
                str(gate),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(8)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    ids = [i for out, _ in outs for i in json.loads(out)]
    assert len(ids) == len(set(ids)) == 8 * n_runs
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert count(path, "runs") == 8 * n_runs
    assert count(path, "tests") == 8 * n_runs * len(recs)
    for name in FRAMES:
        assert count(path, name) == 8 * n_runs * sum(len(getattr(r, name)) for r in recs)
    with Store(path) as store:
        runs = store.runs()
        assert sorted(runs["host"].value_counts().tolist()) == [n_runs] * 8
        for run_id in runs["run_id"].iloc[:: n_runs + 1]:  # a few, from different workers
            _, loaded = store.load_run(int(run_id))
            for rec in recs:
                assert_same_record(loaded[rec.nodeid], rec)


def test_a_locked_store_is_retried_then_refused_in_one_line(tmp_path, records, monkeypatch):
    monkeypatch.setattr(store_mod, "BUSY_TIMEOUT_MS", 50)
    path = tmp_path / "s.db"
    Store(path).close()
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    release = threading.Timer(0.6, lambda: blocker.execute("COMMIT"))
    with Store(path) as store:
        release.start()
        started = time.monotonic()
        run_id = store.save_run(run("1" * 40, "2024-01-01T00:00:00Z"), [records["bert"]])
        assert time.monotonic() - started >= 0.5  # it waited for the lock, then wrote
        assert store.load_test(run_id, records["bert"].nodeid) is not None
        release.join()
        monkeypatch.setattr(store_mod, "LOCK_BUDGET_S", 0.3)
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(BaselineError) as err:
            store.save_run(run("2" * 40, "2024-01-02T00:00:00Z"), [])
        blocker.execute("ROLLBACK")
    blocker.close()
    assert str(err.value).startswith(f"{path}: store is locked") and "\n" not in str(err.value)
    assert count(path, "runs") == 1


# ------------------------------------------------------------------ schema versions


def _schema(conn: sqlite3.Connection) -> dict[str, list[str]]:
    sql = "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
    tables = [r[0] for r in conn.execute(sql)]
    return {t: [c[1] for c in conn.execute(f"PRAGMA table_info({t})")] for t in sorted(tables)}


def rewind_to_v1(path: Path) -> None:
    """What a v1 store looked like: no kernels table, fingerprint only as JSON, no
    per-iteration CPU time (v3), no rounds, dtypes or counters (v4)."""
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("ALTER TABLE samples DROP COLUMN round")
        conn.execute("ALTER TABLE ops DROP COLUMN dtypes")
        conn.execute("DROP TABLE counters")
        conn.execute("ALTER TABLE samples DROP COLUMN cpu_time_ns")
        conn.execute("DROP TABLE kernels")
        conn.execute("DROP INDEX runs_commit")
        for col in FINGERPRINT_COLUMNS:
            conn.execute(f'ALTER TABLE runs DROP COLUMN "{col}"')
        conn.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def test_v1_store_is_migrated_in_place_and_keeps_every_row(tmp_path, records):
    path = tmp_path / "perfguard.db"
    recs = list(records.values())
    with Store(path) as store:
        ids = [
            store.save_run(run(f"{i:040x}", f"2024-01-0{i + 1}T00:00:00Z", fp), recs)
            for i, fp in enumerate([H100, A100, H100])
        ]
    rewind_to_v1(path)
    # the rewound file has exactly the shape the frozen v1 migration creates
    fresh = sqlite3.connect(":memory:")
    _v1_initial(fresh)
    with sqlite3.connect(path) as conn:
        assert _schema(conn) == _schema(fresh)
        before = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in _schema(conn)}
    conn.close()
    fresh.close()

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
    with sqlite3.connect(path) as conn:
        for table, n in before.items():
            if table != "meta":
                got = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                assert got == n + (
                    1
                    if table == "runs"
                    else len(recs)
                    if table == "tests"
                    else sum(len(getattr(r, table)) for r in recs)
                )
    conn.close()
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
    assert "not a database" in _one_line_error(garbage, lambda: Store(garbage))

    header = tmp_path / "header.db"
    header.write_bytes(b"\0" * 100 + data[100:])
    assert "not a database" in _one_line_error(header, lambda: Store(header))

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
    median_ms = np.median(a100.samples["gpu_time_ns"]) / 1e6
    assert f"{median_ms:.3f} ms" in row and " gpu_time " in row

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
