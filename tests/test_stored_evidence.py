"""A run saved while the machine was busy is judged afterwards as its live session judged
it: real pytest sessions in a real git repository, the middle one saved with a
``python -c 'while 1: pass'`` process per core beside it (killed after), then every later
view of the store (``perfguard compare`` of two stored runs, ``report --run``,
``history``, ``publish``) judged from what the sessions stored of the machine.

Before, a stored comparison had no machine evidence: a busy run followed by a
comment-only commit read ``improved -65.8 %`` on the published page and in ``compare``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from test_plugin_store_rules import git, new_repo, session

from perfguard.baseline.store import open_store
from perfguard.compare.halves import BUSY_WAIT
from perfguard.compare.timing import SPEED_DIFF

NODEID = "test_bench.py::test_step"
BENCH = """
import pytest


@pytest.mark.gpuprofile(iterations=4, warmup=1, rounds=4)
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        sum(i * i for i in range(50_000))
"""


def commit(path: Path, text: str) -> None:
    """The benchmark with ``text`` (a comment) appended, committed."""
    (path / "test_bench.py").write_text(BENCH + text)
    git(path, "add", "-A", "--", ".", ":!baselines", ":!.perfguard")
    git(path, "commit", "-q", "-m", text or "bench")


@contextmanager
def spinners() -> Iterator[list[subprocess.Popen]]:
    """A CPU-bound process per core, for the duration of the block."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def perfguard(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfguard", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def machine_said(message: str) -> bool:
    return "machine busy" in message or "machine at another speed" in message


def test_a_run_saved_under_a_cpu_spinner_is_judged_afterwards_as_it_was_live(
    tmp_path: Path,
) -> None:
    repo = new_repo(tmp_path / "proj")
    store = repo / "baselines" / "perfguard.db"
    live = {}
    for run, text in ((1, ""), (2, "# a comment"), (3, "# another comment")):
        commit(repo, text)
        if run == 2:
            with spinners():
                done, doc = session(repo, "--perfguard-save")
        else:
            done, doc = session(repo, "--perfguard-save")
        assert done.returncode == 0, done.stdout + done.stderr
        assert doc["saved"]["run_id"] == run
        (live[run],) = doc["tests"]
    # the live session saw the spinners: noisy for the machine, whatever the timing did
    assert live[2]["outcome"] == "noisy" and machine_said(live[2]["timing"]["message"])

    # compare of two stored runs: the live verdict, figure for figure
    for run in (2, 3):
        done = perfguard(repo, "compare", f"{store}#{run}", f"{store}#{run - 1}", "--json", "-")
        assert done.returncode == 0, done.stdout + done.stderr
        (test,) = json.loads(done.stdout)["tests"]
        assert test["outcome"] == live[run]["outcome"]
        for figure in ("message", "threshold_pct", "delta_pct", "outcome"):
            assert test["timing"][figure] == live[run]["timing"][figure], figure

    # report --run: the session document of a stored run, against the run before it
    from perfguard.compare.stored import results_from_store

    for run in (2, 3):
        (entry,) = results_from_store(store, run, baseline_run=run - 1).tests
        assert entry.outcome.value == live[run]["outcome"]
        assert entry.timing.message == live[run]["timing"]["message"]
    out = tmp_path / "r3"
    done = perfguard(
        repo,
        "report",
        str(store),
        "--run",
        "3",
        "--baseline-run",
        "2",
        "-o",
        f"{out}.html",
        "--markdown",
        f"{out}.md",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = Path(f"{out}.md").read_text()
    assert live[3]["outcome"] in summary and "improved" not in summary.split("Profiles")[0]

    # history: a run's level is marked as the machine's when what its session stored of the
    # machine is off the series' usual (its median run), recomputed here from the store. The
    # spinner run is marked unless a neighbour waited as long: on a box busy with other
    # work (a full suite beside a spinner once) the usual run is itself a busy one
    done = perfguard(repo, "history", NODEID, "--store", str(store), "--json", "-")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    runs = {r["run_id"]: r for r in doc["runs"]}
    with open_store(store, create=False) as opened:
        evidence = opened.machine_evidence(NODEID).set_index("run_id")
    wait, speed = evidence["wait"], evidence["speed_ns"]
    assert wait.notna().all() and (speed > 0).all(), evidence  # every session kept both
    # what the live session judged run 2 busy by is in the store
    assert abs(wait[2] - wait[1]) > BUSY_WAIT or abs(math.log(speed[2] / speed[1])) > SPEED_DIFF
    for run_id, row in runs.items():
        off_wait = abs(wait[run_id] - wait.median()) > BUSY_WAIT
        off_speed = abs(math.log(speed[run_id] / speed.median())) > SPEED_DIFF
        assert bool(row["machine"]) == (off_wait or off_speed), (run_id, row, evidence)
    if wait[2] - max(wait[1], wait[3]) > BUSY_WAIT:  # the neighbours were quieter
        assert "machine" in runs[2]["machine"], runs[2]

    # publish: the latest run (a comment after the busy run) is judged with the evidence
    done = perfguard(repo, "publish", str(store), str(tmp_path / "site"), "--repo", str(repo))
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((tmp_path / "site" / "manifest.json").read_text())
    (page,) = [p for p in manifest["pages"].values() if not p.get("empty")]
    assert page["row"]["outcome"] not in ("improved", "regressed"), page["row"]
    if machine_said(live[3]["timing"]["message"]):
        assert machine_said(page["row"]["reason"]), page["row"]
    assert git(repo, "status", "--porcelain", "--", "test_bench.py") == ""
