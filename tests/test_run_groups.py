"""Run groups: the saves of one CI run's jobs (a suite's shards) are one stored run.

On real SQLite and PostgreSQL stores: jobs on other hosts join the run of their commit,
group and machine kind; a re-run job replaces its records rather than doubling them;
another group, another machine kind or an append-mode save of a held test is a run of
its own; the group survives export, import and copies, which join a group's run; and 8
processes saving their shard of each of 10 commits at once leave one run per commit
holding every record once.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfguard.baseline.frames import conform_frame
from perfguard.baseline.record import (
    KERNEL_COLUMNS,
    OP_COLUMNS,
    OP_SAMPLE_COLUMNS,
    Fingerprint,
    RunInfo,
    TestRecord,
    empty_frame,
)
from perfguard.baseline.store import Store, open_store

REPO = Path(__file__).resolve().parents[1]


def record(nodeid: str, value_ns: int, rounds: int = 2, iterations: int = 3) -> TestRecord:
    """A wall-time record: ``rounds`` x ``iterations`` samples of about ``value_ns``."""
    n = rounds * iterations
    samples = pd.DataFrame(
        {
            "iteration": np.tile(np.arange(iterations), rounds),
            "gpu_time_ns": np.zeros(n, dtype=np.int64),
            "wall_time_ns": value_ns + np.arange(n),
            "cpu_time_ns": value_ns + np.arange(n),
            "round": np.repeat(np.arange(rounds), iterations),
            "profiled": np.ones(n, dtype=bool),
        }
    )
    tables = {
        t: conform_frame(t, empty_frame(c))
        for t, c in (
            ("op_samples", OP_SAMPLE_COLUMNS),
            ("ops", OP_COLUMNS),
            ("kernels", KERNEL_COLUMNS),
        )
    }
    return TestRecord(
        nodeid,
        "wall_time",
        conform_frame("samples", samples),
        meta={"iterations": iterations},
        **tables,
    )


def fingerprint(host: str) -> Fingerprint:
    return Fingerprint(gpu_name="NVIDIA H100", gpu_count=1, backend="torch", host=host)


def info(commit: str, host: str, group: str | None, when: str = "2024-01-01T00:00:00Z"):
    return RunInfo(commit, "main", False, when, fingerprint(host), group=group)


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "store.db"
    return request.getfixturevalue("postgres_server").new_database()


def test_shards_of_a_run_group_are_one_run_on_any_host(location):
    c = "a" * 40
    with Store(location) as store:
        first = store.writer.save(info(c, "runner-1", "ci:1"), [record("t1", 100)])
        second = store.writer.save(info(c, "runner-2", "ci:1"), [record("t2", 200)])
        assert (first.joined, second.joined) == (False, True)
        assert second.run_id == first.run_id
        # a shard re-run in the same CI run replaces its own records, never doubles them
        again = store.writer.save(info(c, "runner-3", "ci:1"), [record("t2", 210)])
        assert again.run_id == first.run_id and again.replaced_tests == 1
        other = store.writer.save(info(c, "runner-1", "ci:2"), [record("t3", 300)])
        assert other.run_id != first.run_id  # another CI run: a run of its own
        runs = store.reader.runs()
        assert runs.set_index("run_id")["n_tests"].to_dict() == {first.run_id: 2, other.run_id: 1}
        run, records = store.reader.load_run(first.run_id)
        assert run.group == "ci:1" and run.fingerprint.host == "runner-1"  # the first job's
        assert sorted(records) == ["t1", "t2"]
        assert records["t2"].samples["wall_time_ns"].iloc[0] == 210
        # another machine kind never joins: a different GPU is another run
        h200 = RunInfo(
            c,
            "main",
            False,
            "2024-01-01T00:00:00Z",
            Fingerprint(gpu_name="NVIDIA H200", gpu_count=1, backend="torch"),
            group="ci:1",
        )
        assert store.writer.save(h200, [record("t1", 100)]).run_id not in (first.run_id,)
        # append mode: a group run already holding the test is not joined (both kept)
        kept = store.writer.save(info(c, "runner-4", "ci:1"), [record("t1", 111)], replace=False)
        assert kept.run_id != first.run_id and not kept.joined


def test_export_and_import_keep_the_run_group(tmp_path):
    with Store(tmp_path / "a.db") as store:
        run_id = store.writer.save(info("b" * 40, "r1", "ci:9"), [record("t1", 5)]).run_id
        store.export_json(tmp_path / "a.json")
        untouched = store.writer.save(info("c" * 40, "r1", None), [record("t1", 5)]).run_id
    with Store(tmp_path / "b.db") as store:
        store.writer.import_file(tmp_path / "a.json")
        (only,) = store.reader.runs()["run_id"]
        assert store.reader.run_info(int(only)).group == "ci:9"
    assert json.loads((tmp_path / "a.json").read_text())["runs"][0]["run"]["group"] == "ci:9"
    with Store(tmp_path / "a.db") as store:
        assert store.reader.run_info(run_id).group == "ci:9"
        assert store.reader.run_info(untouched).group is None
        assert "group" not in store.reader.run_info(untouched).to_dict()  # exports unchanged


SAVER = """
import json, pickle, sys, time
from pathlib import Path
from perfguard.baseline.record import Fingerprint, RunInfo
from perfguard.baseline.store import open_store

location, recs, shard, shards, commits, gate = sys.argv[1:]
shard, shards, commits, gate = int(shard), int(shards), int(commits), Path(gate)
records = pickle.loads(Path(recs).read_bytes())
(gate / f"ready-{shard}").touch()
deadline = time.monotonic() + 300
while len(list(gate.glob("ready-*"))) < shards and time.monotonic() < deadline:
    time.sleep(0.005)
fp = Fingerprint(gpu_name="NVIDIA H100", gpu_count=1, backend="torch", host=f"runner-{shard}")
ids = []
with open_store(location, create=True) as store:
    for k in range(commits):  # every shard saves each commit's part: all at about once
        run = RunInfo(f"{k:040x}", "main", False, f"2024-01-01T00:00:{k:02d}Z", fp,
                      group=f"ci:{k}")
        ids.append(store.writer.save(run, records).run_id)
print(json.dumps(ids))
"""


def test_concurrent_shard_saves_make_one_run_per_commit_and_lose_nothing(location, tmp_path):
    """8 shard jobs of 10 CI runs, each job saving its 3 tests per run, all at once."""
    shards, commits, per_shard = 8, 10, 3
    (tmp_path / "saver.py").write_text(SAVER)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for s in range(shards):
        recs = [record(f"t{s}_{i}", 1000 * s + i) for i in range(per_shard)]
        (tmp_path / f"recs{s}.pkl").write_bytes(pickle.dumps(recs))
        args = [str(location), str(tmp_path / f"recs{s}.pkl"), str(s), str(shards), str(commits)]
        procs.append(
            subprocess.Popen(
                [sys.executable, str(tmp_path / "saver.py"), *args, str(gate)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    ids = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        ids.append(json.loads(out))
    # every shard's save of commit k went into the same run
    assert all(len({shard_ids[k] for shard_ids in ids}) == 1 for k in range(commits))
    with open_store(location, create=False) as store:
        runs = store.reader.runs()
        assert len(runs) == commits and runs["commit"].is_unique
        assert set(runs["n_tests"]) == {shards * per_shard}
        for run_id in runs["run_id"]:
            _, records = store.reader.load_run(int(run_id))
            assert len(records) == shards * per_shard
            for nodeid, rec in records.items():
                s, i = map(int, nodeid[1:].split("_"))
                assert rec.samples["wall_time_ns"].tolist() == [1000 * s + i + j for j in range(6)]


def test_copies_join_a_group_run_and_add_only_its_missing_tests(tmp_path):
    """Two shard stores (each the shared history plus its job's part) merged into a third."""
    c = "d" * 40
    parts = []
    for k, tests in enumerate((["t1", "t2"], ["t3"])):
        path = tmp_path / f"shard{k}.db"
        with Store(path) as store:
            store.writer.save(info("e" * 40, "old", None), [record("t1", 1)])  # shared history
            store.writer.save(
                info(c, f"runner-{k}", "ci:5", f"2024-01-0{k + 2}T00:00:00Z"),
                [record(t, 10 * k) for t in tests],
            )
        parts.append(path)
    with Store(tmp_path / "merged.db") as dest:
        with Store(parts[0]) as one:
            first = dest.copy_from(one)
        with Store(parts[1]) as two:
            second = dest.copy_from(two)
            again = dest.copy_from(two)
        assert (len(first.added), first.tests) == (2, 3)
        assert (len(second.added), len(second.joined), second.present, second.tests) == (0, 1, 1, 1)
        assert (len(again.added), len(again.joined), again.present, again.tests) == (0, 0, 2, 0)
        runs = dest.reader.runs().set_index("commit")["n_tests"].to_dict()
        assert runs == {"e" * 40: 1, c: 3}
