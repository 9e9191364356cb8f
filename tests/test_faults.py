"""No result is ever lost: tests that raise, exit, crash, hang; a session interrupted;
two sessions in one checkout; options that cannot work. Real sessions, real torch
profiler captures, a real git repository and store.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

FAULTS = """
import ctypes
import os
import time

import pytest
import torch


def _work():
    a = torch.randn(64, 64)
    return torch.relu(a @ a)


@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=3)
def test_a_fine(gpuprofile):
    for _ in gpuprofile.iterations():
        _work()


@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=3)
def test_b_raises(gpuprofile):
    for _ in gpuprofile.iterations():
        raise ValueError('bad "input" <&> \\u2211')


@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=3)
def test_c_exits(gpuprofile):
    for _ in gpuprofile.iterations():
        os._exit(3)


@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=3)
def test_d_segfaults(gpuprofile):
    for _ in gpuprofile.iterations():
        ctypes.string_at(0)


@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=3)
def test_e_hangs(gpuprofile):
    for _ in gpuprofile.iterations():
        time.sleep(3600)


@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=3)
def test_f_fine_too(gpuprofile):
    for _ in gpuprofile.iterations():
        _work()
"""


def git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "config", "user.email", "ci@example.com")
    git(tmp_path, "config", "user.name", "CI")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / ".gitignore").write_text(".perfguard/\nbaselines/\n")
    (tmp_path / "test_faults.py").write_text(FAULTS)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "faults")
    return tmp_path


def pytest_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args]


def results(path: Path) -> dict:
    return json.loads((path / ".perfguard" / "results.json").read_text())


def runs(path: Path) -> int:
    db = path / "baselines" / "perfguard.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM runs").fetchone()[0]


def test_isolated_faults_lose_only_their_own_test(project: Path) -> None:
    """Each fault in its own process: the others are judged, the store gets the run,
    every row says what happened."""
    done = subprocess.run(
        pytest_argv("--perfguard-save", "--perfguard-isolate", "--perfguard-timeout=90"),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 1, done.stdout[-3000:]
    doc = results(project)
    assert doc["complete"] is True
    by = {t["nodeid"].split("::")[1]: t for t in doc["tests"]}
    assert by["test_a_fine"]["outcome"] == by["test_f_fine_too"]["outcome"] == "no-baseline"
    assert by["test_b_raises"]["outcome"] == "error"
    assert 'bad "input" <&>' in by["test_b_raises"]["message"]
    assert by["test_c_exits"]["outcome"] == "crashed"
    assert "exited with 3" in by["test_c_exits"]["message"]
    assert by["test_d_segfaults"]["outcome"] == "crashed"
    assert "SIGSEGV" in by["test_d_segfaults"]["message"]
    assert by["test_e_hangs"]["outcome"] == "crashed"
    assert "timed out after 90 s" in by["test_e_hangs"]["message"]
    for name in ("test_b_raises", "test_c_exits", "test_d_segfaults", "test_e_hangs"):
        assert f"FAILED test_faults.py::{name}" in done.stdout
    # the two fine tests' records are the saved run
    assert runs(project) == 1
    with sqlite3.connect(project / "baselines" / "perfguard.db") as conn:
        saved = sorted(r[0] for r in conn.execute("SELECT nodeid FROM tests"))
    assert saved == ["test_faults.py::test_a_fine", "test_faults.py::test_f_fine_too"]


def test_in_process_exit_keeps_what_was_measured_before(project: Path) -> None:
    """Without isolation an os._exit ends the session, but the results of the tests that
    finished before it are on disk (written after every test) and nothing was saved."""
    done = subprocess.run(
        pytest_argv("--perfguard-save", "-k", "a_fine or b_raises or c_exits"),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 3
    doc = results(project)
    assert doc["complete"] is False
    by = {t["nodeid"].split("::")[1]: t["outcome"] for t in doc["tests"]}
    assert by == {"test_a_fine": "no-baseline", "test_b_raises": "error"}
    assert runs(project) == 0


def test_an_xdist_worker_that_dies_loses_only_its_running_test(project: Path) -> None:
    """Under xdist without isolation an os._exit kills the worker it ran on: the tests that
    worker finished before keep their entries (spooled as they were made), the one it died
    in is ``crashed`` with the worker named, and the controller still saves the rest. One
    worker (``-n 1``), so the dead one ran the two tests before the crash, in order."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "1",
            "--perfguard-save",
            "-k",
            "a_fine or b_raises or c_exits or f_fine_too",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-3000:]
    doc = results(project)
    # every test has its row, whichever worker ran it before or after the crash
    by = {t["nodeid"].split("::")[1]: t for t in doc["tests"]}
    assert sorted(by) == ["test_a_fine", "test_b_raises", "test_c_exits", "test_f_fine_too"]
    assert by["test_a_fine"]["outcome"] == by["test_f_fine_too"]["outcome"] == "no-baseline"
    assert by["test_b_raises"]["outcome"] == "error"
    crashed = by["test_c_exits"]
    assert crashed["outcome"] == "crashed", crashed
    assert by["test_a_fine"]["worker"] == by["test_b_raises"]["worker"] == crashed["worker"]
    assert by["test_f_fine_too"]["worker"] != crashed["worker"]  # its replacement's
    assert f"worker {crashed['worker']} died while running it" in crashed["message"]
    assert "--perfguard-isolate" in crashed["message"]
    assert "crashed" in (project / ".perfguard" / "summary.md").read_text()
    assert not (project / ".perfguard" / ".workers").exists()
    with sqlite3.connect(project / "baselines" / "perfguard.db") as conn:
        saved = sorted(r[0] for r in conn.execute("SELECT nodeid FROM tests"))
    assert saved == ["test_faults.py::test_a_fine", "test_faults.py::test_f_fine_too"]


def _ctrl_c_reaches_it(argv: list[str]) -> list[str]:
    """``argv`` started with SIGINT handled as in a terminal's foreground job. A suite
    started as a shell's background job (``pytest ... &``) ignores SIGINT, and its children
    inherit that: the session would never see the signal, and the hanging test would hang.
    A small exec wrapper, not ``preexec_fn``: a hook run between fork and exec fires the
    at-fork handlers of whatever this worker imported (JAX's warns, an error under -W
    error), so the test's result would depend on the tests that ran before it."""
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", reset, *argv]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_interrupted_session_writes_reports_and_saves_nothing(project: Path, sig) -> None:
    proc = subprocess.Popen(
        _ctrl_c_reaches_it(pytest_argv("--perfguard-save", "-k", "a_fine or e_hangs")),
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    partial = project / ".perfguard" / "results.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # wait until the first test is judged
        if partial.exists() and '"test_faults.py::test_a_fine"' in partial.read_text():
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the first test never finished")
    time.sleep(1.0)  # inside test_e_hangs by now
    os.kill(proc.pid, sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-2000:]  # pytest's "interrupted"
    doc = results(project)
    assert doc["complete"] is True  # the session's end ran: the final results
    assert "a partial run is never saved" in (doc["save_error"] or "")
    assert runs(project) == 0
    assert [t["nodeid"] for t in doc["tests"]] == ["test_faults.py::test_a_fine"]


def test_two_sessions_in_one_checkout(project: Path) -> None:
    first = subprocess.Popen(
        pytest_argv(
            "--perfguard", "-k", "e_hangs", "--perfguard-isolate", "--perfguard-timeout=30"
        ),
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lock = project / ".perfguard" / ".lock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.2)
    second = subprocess.run(
        pytest_argv("--perfguard", "-k", "a_fine"),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 4  # a usage error, before any test ran
    assert f"another perfguard session (pid {first.pid})" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    # with a folder of its own it runs beside the first
    third = subprocess.run(
        pytest_argv("--perfguard", "-k", "a_fine", "--perfguard-output=.perfguard-2"),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert third.returncode == 0, third.stdout[-2000:]
    first.communicate(timeout=300)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--perfguard", "--perfguard-output=/proc/version/x"], "--perfguard-output"),
        (["--perfguard", "--perfguard-timeout=0"], "--perfguard-timeout"),
        (["--perfguard", "--perfguard-rounds=0"], "--perfguard-rounds"),
    ],
)
def test_unusable_options_are_one_line_usage_errors(
    project: Path, args: list[str], needle: str
) -> None:
    done = subprocess.run(
        pytest_argv(*args), cwd=project, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 4 and needle in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_save_without_the_flag_measures_and_require_baseline_fails_an_empty_compare(
    project: Path,
) -> None:
    done = subprocess.run(
        pytest_argv("-k", "a_fine", "--perfguard-save", "--perfguard-require-baseline"),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert runs(project) == 1  # --perfguard-save alone implies --perfguard
    assert done.returncode == 1  # but nothing was compared: required, so the run fails
    assert "no test was compared with a baseline" in " ".join(results(project)["notes"])
