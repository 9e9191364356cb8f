"""A damaged store is read whole or refused (issue 42): real stores, really damaged.

The store holds real measurements: ``tests/data/history_steps.json`` (30 real
``pytest --perfguard --perfguard-save`` sessions) with each run's test kept
under three node ids, over a real git repository. It is damaged the way a
disk or a copy does it: 8 KB of random bytes written into the middle of the
file (SQLite's own ``integrity_check`` then fails), values no perfguard
writes, a table gone. Every read command runs through ``perfguard.cli.main``;
the plugin runs as a real pytest session.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from history_repo import commit_per_run

from perfguard.baseline import db as store_db
from perfguard.baseline.store import Store
from perfguard.cli import main

REPO = Path(__file__).resolve().parents[1]
RECORDED = Path(__file__).parent / "data" / "history_steps.json"
TESTS = ("test_bench.py::test_a", "test_bench.py::test_b", "test_bench.py::test_c")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def real_store(tmp_path_factory) -> tuple[Path, Path]:
    """(store, repo): the recorded history, one commit per run, three tests per run."""
    root = tmp_path_factory.mktemp("real")
    repo = root / "repo"
    doc = json.loads(RECORDED.read_text())
    commit_per_run(doc, repo)
    for entry in doc["runs"]:
        (record,) = entry["tests"].values()
        entry["tests"] = {nodeid: record for nodeid in TESTS}
    (root / "export.json").write_text(json.dumps(doc))
    store = root / "good.db"
    with Store(store) as s:
        s.import_json(root / "export.json")
    return store, repo


def _garbage_in_the_middle(good: Path, dest: Path, seed: int = 1) -> Path:
    data = bytearray(good.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 8192] = random.Random(seed).randbytes(8192)
    dest.write_bytes(bytes(data))
    conn = sqlite3.connect(dest)
    try:  # really damaged, by SQLite's own account
        found = conn.execute("PRAGMA quick_check").fetchall()
        assert found != [("ok",)]
    except sqlite3.DatabaseError as exc:
        assert "malformed" in str(exc)
    finally:
        conn.close()
    return dest


#: the commands that read every table of every record (publish reads no op_samples)
WHOLE_STORE = ("history", "history --json")


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _read_commands(store: Path, out: Path) -> dict[str, list[str]]:
    s = str(store)
    return {
        "history": ["history", "--store", s],
        "history --json": ["history", "--store", s, "--json", "-"],
        "history TEST": ["history", TESTS[1], "--store", s],
        "baseline list": ["baseline", "list", "--store", s],
        "baseline show": ["baseline", "show", "1", "--store", s],
        "compare": ["compare", f"{s}#30", f"{s}#1"],
        "report --run": ["report", s, "--run", "30", "-o", str(out / "r.html")],
        "publish": ["publish", s, str(out / "site"), "-j", "1"],
    }


@pytest.mark.parametrize("open_check", [True, False], ids=["checked-at-open", "large-store"])
def test_every_read_command_refuses_a_damaged_store_in_one_line(
    real_store, tmp_path, capsys, monkeypatch, open_check
):
    """Before: ``history`` exited 0 listing 1 of 3 tests, ``publish`` exited 3 (internal
    error). Now every command stops with exit 2 and one line naming the file and what to
    do, whether the store is checked whole at open (small) or damage is met by a query
    (a store over CHECK_ON_OPEN_BYTES)."""
    good, repo = real_store
    damaged = _garbage_in_the_middle(good, tmp_path / "damaged.db")
    before = damaged.read_bytes()
    monkeypatch.chdir(repo)
    if not open_check:
        monkeypatch.setattr(store_db, "CHECK_ON_OPEN_BYTES", 0)
    for name, argv in _read_commands(damaged, tmp_path).items():
        rc, out, err = _run(capsys, argv)
        lines = err.strip().splitlines()
        if not open_check and name not in WHOLE_STORE:
            # unchecked, a command reads only the pages it needs: a run or two it shows
            # whole, or it meets the damage (the fuzzer checks the counts of both)
            assert rc in (0, 1, 2) and (rc != 2 or len(lines) == 1), (name, rc, err)
            continue
        assert rc == 2, (name, rc, out[-300:], err)
        assert len(lines) == 1 and lines[0].startswith("perfguard: error: "), (name, err)
        assert str(damaged) in err and "damaged" in err, (name, err)
        assert f"perfguard baseline recover {damaged} NEW.db" in err, (name, err)
    assert damaged.read_bytes() == before  # read, never written
    assert not damaged.with_name("damaged.db-wal").exists()


def test_the_same_commands_read_the_undamaged_store(real_store, tmp_path, capsys, monkeypatch):
    """The control: on the store before the damage every command above gives its result."""
    good, repo = real_store
    monkeypatch.chdir(repo)
    for name, argv in _read_commands(good, tmp_path).items():
        rc, out, err = _run(capsys, argv)
        assert rc in (0, 1), (name, err)
    rc, out, _ = _run(capsys, ["history", "--store", str(good), "--json", "-"])
    assert [t["nodeid"] for t in json.loads(out)["tests"]] == sorted(TESTS)


#: a sample of test_b (the test ``history TEST`` reads), in run 2; its metric is CPU time
B_SAMPLE = "(SELECT min(rowid) FROM samples WHERE test_id = 5)"


def _damage_values(store: Path, sql: str) -> None:
    conn = sqlite3.connect(store, isolation_level=None)
    conn.execute(sql)
    conn.close()


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        (f"UPDATE samples SET cpu_time_ns = -5 WHERE rowid = {B_SAMPLE}", "negative"),
        (f"UPDATE samples SET cpu_time_ns = 'NaN' WHERE rowid = {B_SAMPLE}", "samples"),
        ("UPDATE runs SET fingerprint = '{not json' WHERE run_id = 3", "runs.fingerprint"),
        ("UPDATE tests SET metric = 'bogus' WHERE test_id = 5", "unknown metric"),
        ("DROP TABLE counters", "without its table(s) counters"),
        ("UPDATE meta SET value = '99' WHERE key = 'schema_version'", "newer than this"),
    ],
    ids=[
        "negative-time",
        "nan-text",
        "fingerprint-not-json",
        "unknown-metric",
        "no-table",
        "future-schema",
    ],
)
def test_impossible_values_are_damage_not_data(
    real_store, tmp_path, capsys, monkeypatch, sql, said
):
    """SQLite keeps no checksum of values: a value no perfguard writes is found where rows
    are decoded, and said as the same one line, never a crash, a partial list or exit 0."""
    good, repo = real_store
    store = tmp_path / "values.db"
    store.write_bytes(good.read_bytes())
    _damage_values(store, sql)
    monkeypatch.chdir(repo)
    for name in ("history", "history --json", "history TEST", "publish"):
        rc, out, err = _run(capsys, _read_commands(store, tmp_path)[name])
        assert rc == 2 and len(err.strip().splitlines()) == 1, (name, rc, err, out[-200:])
        assert said in err and str(store) in err, (name, err)
    if said != "newer than this":
        rc, out, err = _run(capsys, ["baseline", "check", "--store", str(store)])
        assert rc == 2 and "damaged" in err, (out, err)


def test_check_says_what_it_found_and_recover_keeps_whole_records(
    real_store, tmp_path, capsys, monkeypatch
):
    """``baseline check`` lists SQLite's findings (exit 2); ``baseline recover`` copies
    what can be read into a new store and counts per table what it kept and lost. Every
    record it keeps is whole: the same rows as in the store before the damage."""
    good, repo = real_store
    damaged = _garbage_in_the_middle(good, tmp_path / "damaged.db")
    rc, out, err = _run(capsys, ["baseline", "check", "--store", str(good)])
    assert rc == 0 and "ok" in out
    rc, out, err = _run(capsys, ["baseline", "check", "--store", str(damaged)])
    assert rc == 2 and f"{damaged}: damaged" in out and "problem(s)" in out
    assert err.count("\n") == 1 and "baseline recover" in err

    new = tmp_path / "recovered.db"
    rc, out, err = _run(capsys, ["baseline", "recover", str(damaged), str(new)])
    assert rc == 0, err
    kept = {
        m[0]: (int(m[1].replace(",", "")), int(m[2].replace(",", ""))) for m in _kept_lines(out)
    }
    assert kept["runs"][1] == 30 and kept["tests"][1] == 90
    assert any(k < n for k, n in kept.values()), out  # the damage cost something, said
    rc, out2, _ = _run(capsys, ["baseline", "check", "--store", str(new)])
    assert rc == 0, out2

    with Store(good) as before, Store(new) as after:
        runs = after.runs()
        assert len(runs) and set(runs["run_id"]) <= set(before.runs()["run_id"])
        for run_id in runs["run_id"]:
            _, was = before.load_run(int(run_id))
            _, now = after.load_run(int(run_id))
            for nodeid, record in now.items():  # a kept record is the whole record
                for table in ("samples", "ops", "counters", "op_samples"):
                    assert getattr(record, table).equals(getattr(was[nodeid], table)), table
    assert damaged.read_bytes() == _garbage_in_the_middle(good, tmp_path / "again.db").read_bytes()
    rc, _, err = _run(capsys, ["baseline", "recover", str(damaged), str(new)])
    assert rc == 2 and "already exists" in err


def _kept_lines(out: str) -> list[tuple[str, str, str]]:
    import re

    return re.findall(r"^\s+(\w+)\s+([\d,]+) of ([\d,]+) row\(s\) kept", out, re.M)


PROJECT = """
import pytest
import torch

A = torch.randn(32, 32)


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=2)
def test_mm(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.mm(A, A)


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=2)
def test_add(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.add(A, A)
"""


def test_a_plugin_session_reports_every_test_and_never_writes_a_damaged_store(real_store, tmp_path):
    """A real ``pytest --perfguard --perfguard-save`` session whose store is damaged: every
    test runs and is reported ``not-judged`` with the store's one line, the save fails the
    session (exit 1) with that line, and the file is not touched."""
    pytest.importorskip("torch")
    good, _ = real_store
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q", "-b", "main")
    _git(project, "config", "user.email", "ci@example.com")
    _git(project, "config", "user.name", "CI")
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / ".gitignore").write_text(".perfguard/\n__pycache__/\n")
    for i in range(2):  # HEAD~1 is the baseline ref: the store is opened to look it up
        (project / "test_bench.py").write_text(PROJECT + f"# {i}\n")
        _git(project, "add", "-A")
        _git(project, "commit", "-q", "-m", f"c{i}")
    damaged = _garbage_in_the_middle(good, tmp_path / "damaged.db")
    before = damaged.read_bytes()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--perfguard",
            f"--perfguard-store={damaged}",
            "--perfguard-save",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-2000:]
    assert "2 passed" in text and "internal" not in text.lower()
    assert f"not saved: {damaged}: the store is damaged" in text
    doc = json.loads((project / ".perfguard" / "results.json").read_text())
    entries = {e["nodeid"]: e for e in doc["tests"]}
    assert set(entries) == {"test_bench.py::test_mm", "test_bench.py::test_add"}
    for e in entries.values():
        assert e["outcome"] == "not-judged"
        assert e["message"].startswith(f"not judged: {damaged}: the store is damaged")
    assert damaged.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.db", "project"]
