"""``--json`` on history, baseline list/show, compare and bisect: each answer a versioned
document (``perfguard.<kind>/1``) a CI script parses, with what the text says.

The store is the real recorded history of ``tests/test_history.py`` (30 real sessions),
replayed onto a git repository; bisect runs two real sessions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_history import RECORDED, replay

from perfguard.cli import main
from perfguard.compare.documents import VERSIONS, check, document
from perfguard.errors import ReportError

NODEID = "test_bench.py::test_step"


@pytest.fixture
def replayed(tmp_path):
    return replay(RECORDED, tmp_path, tmp_path / "s.db")


def _json(capsys, *argv: str) -> dict:
    assert main(list(argv)) in (0, 1)
    out = capsys.readouterr().out
    return json.loads(out)  # the whole of stdout is the document


def test_history_json(replayed, capsys, tmp_path):
    location, repo, shas, steps = replayed
    doc = _json(capsys, "history", NODEID, "--store", str(location), "--repo", str(repo), "--json")
    assert check(doc, "history") == 1 and doc["schema"] == "perfguard.history/1"
    assert doc["nodeid"] == NODEID and doc["metric"] == "cpu_time"
    assert [r["commit"] for r in doc["runs"]] == shas
    assert all(r["level_ns"] > 0 and "calls" in r["counters"] for r in doc["runs"])
    up = doc["change_points"][0]
    assert up["commit"] == shas[steps["up"]] and up["ops"][0]["op_name"] == "extra_work"
    assert {s["commit"] for s in doc["counter_steps"]} == {shas[steps["up"]], shas[steps["down"]]}
    listed = _json(capsys, "history", "--store", str(location), "--repo", str(repo), "--json")
    assert listed["schema"] == "perfguard.history-list/1"
    (test,) = listed["tests"]
    assert test["nodeid"] == NODEID and test["runs"] == len(shas)
    assert test["last_change"]["commit"] in shas
    out = tmp_path / "h.json"  # to a file: the text is printed as before
    assert (
        main(["history", NODEID, "--store", str(location), "--repo", str(repo), "--json", str(out)])
        == 0
    )
    assert "timing change point" in capsys.readouterr().out
    assert json.loads(out.read_text()) == doc


def test_baseline_list_and_show_json(replayed, capsys):
    location, repo, shas, _ = replayed
    doc = _json(capsys, "baseline", "list", "--store", str(location), "--json")
    assert check(doc, "baseline-list") == 1
    assert [r["commit"] for r in doc["runs"]] == shas and doc["acceptances"] == []
    assert doc["runs"][0]["fingerprint"]["backend"] == "cpu" and doc["runs"][0]["tests"] == 1
    run_id = doc["runs"][3]["run_id"]
    shown = _json(capsys, "baseline", "show", str(run_id), "--store", str(location), "--json")
    assert check(shown, "baseline-show") == 1
    assert shown["run_id"] == run_id and shown["run"]["commit"] == shas[3]
    (test,) = shown["tests"]
    assert test["nodeid"] == NODEID and test["median_ns"] > 0 and test["counters"]["calls"] > 0


def test_compare_json(replayed, capsys, tmp_path):
    location, repo, shas, steps = replayed
    up = steps["up"] + 1  # run ids follow the commits
    doc = _json(capsys, "compare", f"{location}#{up}", f"{location}#1", "--json")
    assert check(doc, "compare") == 2 and doc["mode"] == "records"
    (test,) = doc["tests"]
    assert test["nodeid"] == NODEID and test["outcome"] == "regressed"  # extra_work: calls up
    out = tmp_path / "c.json"  # the FILE form scripts already use
    assert main(["compare", f"{location}#{up}", f"{location}#1", "--json", str(out)]) == 1
    assert "JSON written" in capsys.readouterr().out
    assert json.loads(out.read_text())["tests"][0]["outcome"] == "regressed"


def test_bisect_json(tmp_path):
    """Two real sessions (GOOD and BAD stored); store mode skips the commits between, so
    the answer is a range, and the document says so on stdout and in bisect.json."""
    import bisect_repo

    root = tmp_path / "repo"
    shas = bisect_repo.build(root)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    for sha in (shas[0], shas[-1]):
        bisect_repo.git(root, "checkout", "-q", sha)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--perfguard",
                "--perfguard-save",
                "--perfguard-rounds=3",
                "--perfguard-fail-on=never",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "-q",
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-2000:]
    bisect_repo.git(root, "checkout", "-q", "main")
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfguard",
            "bisect",
            shas[0],
            shas[-1],
            bisect_repo.NODEID,
            "--oracle",
            "gates",
            "--mode",
            "store",
            "--output",
            str(out),
            "--json",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    doc = json.loads(done.stdout)
    assert check(doc, "bisect") == 1 and doc["selected"] == [bisect_repo.NODEID]
    assert doc["steps"][0]["commit"] == shas[-1] and doc["steps"][0]["mark"] == "bad"
    assert "perfguard bisect:" in done.stderr  # the progress went to stderr
    assert json.loads((out / "bisect.json").read_text()) == doc


def test_documents_are_versioned_and_checked():
    doc = document("history", {"runs": [{"level_ns": float("nan")}]})
    assert doc == {"schema": "perfguard.history/1", "runs": [{"level_ns": None}]}
    assert set(VERSIONS) == {
        "history",
        "history-list",
        "baseline-list",
        "baseline-show",
        "compare",
        "bisect",
    }
    with pytest.raises(ReportError, match="newer than this perfguard"):
        check({"schema": "perfguard.history/2"}, "history")
    with pytest.raises(ReportError, match="not a perfguard compare document"):
        check(doc, "compare")
    with pytest.raises(ReportError, match="not a perfguard history"):
        check({"schema": 2, "tests": []}, "history")  # results.json is not one


@pytest.mark.parametrize("argv", [["history"], ["baseline", "list"]])
def test_json_of_an_empty_store(argv, capsys, tmp_path):
    from perfguard.baseline.store import Store

    Store(tmp_path / "e.db").close()
    doc = _json(capsys, *argv, "--store", str(tmp_path / "e.db"), "--json")
    assert doc["schema"].startswith("perfguard.") and Path(tmp_path / "e.db").exists()
