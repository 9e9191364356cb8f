"""The plugin with its store on a real PostgreSQL server: ``--perfguard-store postgresql://...``.

Two real sessions in a temp git repository (``pytester``, subprocesses: each
imports torch afresh): the first saves its run on the server, the second,
one commit later, finds it there as its baseline and saves its own. The
rows are read back with psycopg, not perfguard. A server that is not there
is a one-line usage error before any test runs.
"""

from __future__ import annotations

import json
import subprocess

import pytest

pytest_plugins = ["pytester"]

BENCH = """
import pytest
import torch

A = torch.randn(64, 64)


@pytest.mark.gpuprofile(iterations=6, warmup=1)
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        A @ A
"""


def git(path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def test_sessions_save_to_and_compare_with_a_server_store(pytester, postgres_server):
    import psycopg

    url = postgres_server.new_database()
    pytester.makeini("[pytest]\n")
    git(pytester.path, "init", "-q", "-b", "main")
    git(pytester.path, "config", "user.email", "ci@example.com")
    git(pytester.path, "config", "user.name", "CI")
    shas = []
    for i in range(2):
        pytester.makepyfile(test_bench=BENCH + f"\n# commit {i}\n")
        git(pytester.path, "add", "-A", "--", ".", ":!.perfguard")
        git(pytester.path, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(pytester.path, "rev-parse", "HEAD"))
        # report only: this is about the store; an 18 us step's timing can read anything on
        # a loaded runner (a full suite once saw +64,000 %), and the verdict is tested elsewhere
        r = pytester.runpytest_subprocess(
            "--perfguard",
            "--perfguard-save",
            f"--perfguard-store={url}",
            "-p",
            "no:cacheprovider",
            "--perfguard-fail-on=never",
        )
        r.assert_outcomes(passed=1)
        doc = json.loads((pytester.path / ".perfguard" / "results.json").read_text())
        assert doc["saved"] == {"run_id": i + 1, "store": url}
        want = None if i == 0 else {"ref": shas[1], "commit": shas[0], "run_id": 1, "ab": False}
        assert doc["baseline"] == want
        (test,) = doc["tests"]
        judged = ("unchanged", "regressed", "improved", "noisy")
        expected = {"no-baseline"} if i == 0 else set(judged)  # the second: judged against run 1
        assert test["outcome"] in expected, test["outcome"]
    assert not (pytester.path / "baselines").exists()  # no SQLite file on the side
    with psycopg.connect(url) as conn:
        rows = conn.execute('SELECT run_id, "commit" FROM runs ORDER BY run_id').fetchall()
        assert rows == [(1, shas[0]), (2, shas[1])]
        (n,) = conn.execute("SELECT count(*) FROM samples").fetchone()
        assert n == 2 * (5 + 1) * 6  # two runs of 5 timing rounds + 1 profiled round of 6

    down = f"postgresql://postgres@/nothing?host={pytester.path}"
    r = pytester.runpytest_subprocess("--perfguard", f"--perfguard-store={down}")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    err = [line for line in r.errlines if "perfguard-store" in line]
    assert len(err) == 1 and "cannot connect" in err[0], r.errlines
