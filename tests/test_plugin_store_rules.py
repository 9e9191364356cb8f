"""The plugin and the store's rules, end to end in real git repositories (each pytest
session a subprocess: torch imported afresh): a second save of a commit replaces the
first unless ``--perfguard-save-mode=append``; a read-only ``baselines/`` folder (a
real read-only mount) still gives a baseline to compare with, and a save into it
fails the run in one line; a rootdir that pytest put outside the tests' repository
does not make perfguard read the wrong repository."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_store_rules import read_only, snapshot

BENCH = """
import pytest


@pytest.mark.gpuprofile(iterations=4, warmup=1, rounds=2)
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        sum(i * i for i in range(20_000))
"""


def git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def new_repo(path: Path, *, ini: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "ci@example.com")
    git(path, "config", "user.name", "CI")
    git(path, "config", "commit.gpgsign", "false")
    if ini:
        (path / "pytest.ini").write_text("[pytest]\n")
    return path


def commit(path: Path, text: str) -> str:
    (path / "test_bench.py").write_text(BENCH + text)
    git(path, "add", "-A", "--", ".", ":!baselines", ":!.perfguard", ":!out")
    git(path, "commit", "-q", "-m", text or "bench")
    return git(path, "rev-parse", "HEAD")


def session(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """One pytest session in ``cwd``; its results.json (from ``--perfguard-output``)."""
    out = next((a.split("=", 1)[1] for a in args if a.startswith("--perfguard-output=")), None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--perfguard",
            "--perfguard-backend=cpu",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = Path(out) if out else cwd / ".perfguard"
    return done, json.loads((results / "results.json").read_text())


def runs(store: Path) -> list[tuple]:
    import sqlite3

    with sqlite3.connect(f"file:{store}?mode=ro&immutable=1", uri=True) as conn:
        rows = conn.execute('SELECT run_id, "commit" FROM runs ORDER BY run_id').fetchall()
    conn.close()
    return rows


def test_saves_replace_append_and_a_read_only_store(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "proj")
    first = commit(repo, "")
    store = repo / "baselines" / "perfguard.db"

    done, doc = session(repo, "--perfguard-save")
    assert done.returncode == 0, done.stdout + done.stderr
    assert doc["saved"] == {"run_id": 1, "store": str(store)}
    done, doc = session(repo, "--perfguard-save")  # the same commit again: replaces run 1
    assert done.returncode == 0, done.stdout + done.stderr
    assert doc["saved"] == {"run_id": 2, "store": str(store), "replaced": {"tests": 1, "runs": [1]}}
    assert "replaced 1 test record(s) of run(s) 1" in done.stdout
    assert runs(store) == [(2, first)]
    done, doc = session(repo, "--perfguard-save", "--perfguard-save-mode=append")
    assert done.returncode == 0 and doc["saved"] == {"run_id": 3, "store": str(store)}
    assert runs(store) == [(2, first), (3, first)]
    assert doc["settings"]["save_mode"] == "append"

    commit(repo, "# next commit\n")
    before = snapshot(store.parent)
    with read_only(store.parent):
        done, doc = session(repo)  # compare: reads the read-only store
        assert done.returncode == 0, done.stdout + done.stderr
        assert doc["baseline"]["commit"] == first and doc["baseline"]["run_id"] in (2, 3)
        (test,) = doc["tests"]
        assert test["timing"]["n_baseline"] == 2 * 2  # both runs' rounds, pooled
        done, doc = session(repo, "--perfguard-save")  # a save into it fails the run
        assert done.returncode == pytest.ExitCode.TESTS_FAILED
        assert doc["saved"] is None
        assert doc["save_error"] == (
            f"{store}: cannot save a run: the store is read-only (on a read-only file system)"
        )
        assert f"not saved: {doc['save_error']}" in done.stdout
    assert snapshot(store.parent) == before


def test_a_rootdir_outside_the_tests_repository_is_not_the_project(tmp_path: Path) -> None:
    """A rootdir given outside the tests' repository (here another repository around it):
    perfguard reads the tests' repository. (``--perfguard-output /abs/dir`` with a space
    made pytest choose such a rootdir; that is refused now: tests/test_plugin_path_options.py.)"""
    outer = new_repo(tmp_path, ini=False)
    git(outer, "commit", "-q", "--allow-empty", "-m", "the outer repository")
    outer_head = git(outer, "rev-parse", "HEAD")
    proj = new_repo(tmp_path / "proj", ini=False)
    head = commit(proj, "")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--perfguard-backend=cpu",
            "--perfguard-save",
            f"--perfguard-output={out}",
            f"--rootdir={tmp_path}",
        ],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"rootdir: {tmp_path}" in done.stdout
    doc = json.loads((out / "results.json").read_text())
    assert doc["run"]["commit"] == head != outer_head
    assert doc["saved"]["store"] == str(proj / "baselines" / "perfguard.db")
    assert runs(proj / "baselines" / "perfguard.db") == [(1, head)]
    assert not (tmp_path / "baselines").exists()
    note = (
        f"pytest's rootdir {tmp_path} is outside the git repository of the tests ({proj}): "
        "perfguard reads that repository"
    )
    assert any(n.startswith(note) for n in doc["notes"]), doc["notes"]
