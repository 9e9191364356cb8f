"""Accepted changes: the store's acceptances (SQLite and the real PostgreSQL server), which
commits an acceptance covers on a real git history with a merged branch, and the whole
flow through real ``pytest --perfguard`` sessions: a regression, ``perfguard baseline
accept``, then runs compared with the new level and every report saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfguard.baseline import store as store_mod
from perfguard.baseline.accept import applicable, since
from perfguard.baseline.schema import SCHEMA_VERSION
from perfguard.baseline.store import open_store
from perfguard.errors import BaselineError

sys.path.insert(0, str(Path(__file__).parent))
from history_repo import git, init_project  # noqa: E402

ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
ENV.pop("PYTEST_XDIST_WORKER", None)
NODEID = "test_bench.py::test_step"


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    init_project(path)
    return path


def commit(path: Path, name: str) -> str:
    (path / f"{name.split(':')[0]}.txt").write_text(name + "\n")  # a file each: merges are clean
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", name)
    return git(path, "rev-parse", "HEAD")


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "s.db"
    return request.getfixturevalue("postgres_server").new_database()


# ------------------------------------------------------------------ the store


def test_acceptances_are_stored_exported_imported_and_copied(location, tmp_path):
    with open_store(location) as store:
        first = store.accept(
            NODEID,
            "a" * 40,
            "  bigger model:\n on purpose ",
            author="ann",
            time="2026-01-01T00:00:00+00:00",
        )
        second = store.accept("t.py::other", "b" * 40, "new kernel")
        assert second > first
        with pytest.raises(BaselineError, match="needs a reason"):
            store.accept(NODEID, "c" * 40, "  ")
        rows = store.acceptances(NODEID)
        assert rows[["commit", "reason", "author"]].values.tolist() == [
            ["a" * 40, "bigger model: on purpose", "ann"]
        ]
        assert len(store.acceptances()) == 2
        export = tmp_path / "e.json"
        store.export_json(export)
    doc = json.loads(export.read_text())
    assert [a["commit"] for a in doc["acceptances"]] == ["a" * 40, "b" * 40]
    with open_store(tmp_path / "imported.db") as other:
        other.import_json(export)
        other.import_json(export)  # again: nothing doubles
        assert len(other.acceptances()) == 2
        with open_store(tmp_path / "copy.db") as copy:
            copy.copy_from(other)
            copy.copy_from(other)
            got = copy.acceptances().drop(columns="acceptance_id")
    want = open_store(location)
    try:
        expected = want.acceptances().drop(columns="acceptance_id")
    finally:
        want.close()
    assert got.values.tolist() == expected.values.tolist()


def test_a_v4_store_is_migrated_to_hold_acceptances(location, monkeypatch):
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:4])
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", 4)
    with open_store(location) as old:
        assert old.schema_version == 4 and "acceptances" not in old.db.tables()
    monkeypatch.undo()
    with open_store(location) as store:
        assert store.schema_version == SCHEMA_VERSION
        store.accept(NODEID, "d" * 40, "migrated")
        assert store.acceptances()["reason"].tolist() == ["migrated"]
    if isinstance(location, Path):
        assert location.with_name(f"{location.name}.v4.bak").is_file()


def test_which_commits_an_acceptance_covers(tmp_path):
    """main m0-m1-m2-M-m3, a branch b1-b2 from m1 merged at M: an acceptance at b1 covers
    b1, b2, the merge and what follows, never main before the merge."""
    repo = new_repo(tmp_path / "repo")
    m0, m1 = commit(repo, "m0"), commit(repo, "m1")
    git(repo, "checkout", "-q", "-b", "feature")
    b1, b2 = commit(repo, "b1"), commit(repo, "b2")
    git(repo, "checkout", "-q", "main")
    m2 = commit(repo, "m2")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge", "feature")
    merge = git(repo, "rev-parse", "HEAD")
    m3 = commit(repo, "m3")
    assert since(repo, b1, m3) == {b1, b2, merge, m3}
    assert since(repo, b1, b2) == {b1, b2}
    for before in (m0, m1, m2):
        assert since(repo, b1, before) is None
    assert since(repo, m1, m3) == {m1, m2, b1, b2, merge, m3}
    with open_store(tmp_path / "s.db") as store:
        store.accept(NODEID, b1, "branch")
        store.accept(NODEID, m1, "main, earlier")
        store.accept("other::t", m3, "another test")
        assert applicable(store, repo, NODEID, m3).reason == "branch"  # the nearest one
        assert applicable(store, repo, NODEID, m2).reason == "main, earlier"
        assert applicable(store, repo, NODEID, m0) is None
        assert applicable(store, repo, "other::t", m2) is None


# ------------------------------------------------------------------ real sessions

TEST = """import pytest
import torch

# one thread: torch's intra-op threads spin when another process holds a core, and CPU
# time then reads several times its level (a suite beside this one is such a process)
torch.set_num_threads(1)
A = torch.randn(64, 64)


@pytest.mark.gpuprofile(iterations=6, warmup=1, metrics=("cpu_time",))
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        x = torch.mm(A, A)
{extra}"""
ITEM = "        x.sum().item()  # log the loss\n"


def session(repo: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--perfguard",
            "--perfguard-rounds=3",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            *args,
        ],
        cwd=repo,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    doc = json.loads((repo / ".perfguard" / "results.json").read_text())
    (test,) = doc["tests"]
    return done, test


def test_an_accepted_slowdown_is_the_new_level_and_every_report_says_so(tmp_path):
    repo = new_repo(tmp_path / "repo")
    (repo / "test_bench.py").write_text(TEST.format(extra=""))
    c0 = commit(repo, "c0")
    done, test = session(repo, "--perfguard-save")
    assert done.returncode == 0, done.stdout[-2000:]
    (repo / "test_bench.py").write_text(TEST.format(extra=ITEM))
    c1 = commit(repo, "c1: log the loss every step")
    done, test = session(repo)  # the control: without an acceptance this regresses
    assert test["outcome"] == "regressed" and done.returncode == 1
    assert test["accepted"] is None

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perfguard", *args],
            cwd=repo,
            env=ENV,
            capture_output=True,
            text=True,
        )

    bad = cli("baseline", "accept", "test_bench.py::nope", "--reason", "x")
    assert bad.returncode == 2 and "no stored run of 'test_bench.py::nope'" in bad.stderr
    ok = cli("baseline", "accept", NODEID, "--at", "HEAD", "--reason", "we want the loss logged")
    assert ok.returncode == 0 and f"at {c1[:12]}" in ok.stdout, ok.stderr
    # at the accepted commit: the old level no longer counts, and there is no run since
    done, test = session(repo, "--perfguard-save")
    assert done.returncode == 0, done.stdout[-2000:]
    assert test["outcome"] == "no-baseline"
    assert test["accepted"]["commit"] == c1 and test["accepted"]["author"] == "ci@example.com"
    # the next commit compares with the new level: the host read is no longer a change
    (repo / "README").write_text("docs\n")
    commit(repo, "c2: docs")
    # (the gates are the point: the timing of a 64x64 matmul judged on 3 rounds against 1
    # stored run is left to report, not to fail the session)
    done, test = session(repo, "--perfguard-fail-on=never")
    assert done.returncode == 0, done.stdout[-2000:]
    assert test["baseline_commit"] == c1 and test["gates"]["outcome"] == "unchanged"
    # nothing but the timing may regress it: the accepted level holds for the whole verdict
    assert test["outcome"] != "regressed" or test["timing"]["outcome"] == "regressed"
    shown = f"accepted at {c1[:12]}: we want the loss logged"
    assert shown in done.stdout  # the terminal table
    out = repo / ".perfguard"
    assert shown in (out / "summary.md").read_text()
    assert shown in (out / "report.html").read_text()
    listing = cli("baseline", "list")
    assert "1 acceptance(s)" in listing.stdout and "we want the loss logged" in listing.stdout
    hist = cli("history", NODEID)
    assert shown in hist.stdout, hist.stdout + hist.stderr
    assert c0  # the first level stays stored: an acceptance deletes nothing
    with open_store(repo / "baselines" / "perfguard.db") as store:
        assert set(store.runs()["commit"]) == {c0, c1}
