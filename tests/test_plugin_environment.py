"""The environment behind a comparison, end to end: real pytest sessions (subprocesses) in
a real git repository, on a machine whose ``nvidia-smi`` prints a real H100 report
(``tests/data/nvidia_smi``, served by a stand-in on ``PATH``). The baseline run is then
edited in the store to the environment a real H100 capture recorded (the shared Kineto
BERT trace: driver 575.51.03, cuDNN 9.1.0.70, torch 2.6.0+cu124): the next session reads
``incomparable`` naming the driver, and with ``--perfguard-compare-across driver`` its
verdicts list what changed in every view."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_plugin_store_rules import git, new_repo

from perfguard.baseline.nvidia_smi import parse_report

REPORT = Path(__file__).resolve().parent / "data" / "nvidia_smi" / "h100x8_driver535.183.01.txt"
CAPTURE = "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz"

BENCH = """
import pytest
import torch


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=3)
def test_step(gpuprofile):
    a = torch.ones(32, 32)
    for _ in gpuprofile.iterations():
        for _ in range({n}):
            a @ a
"""


def _commit(repo: Path, n: int, message: str) -> str:
    (repo / "test_bench.py").write_text(BENCH.format(n=n))
    git(repo, "add", "test_bench.py", "pytest.ini")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def _session(repo: Path, bin_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
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
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return done, json.loads((repo / ".perfguard" / "results.json").read_text())


def test_another_driver_is_incomparable_and_compared_across_it_lists_the_changes(
    tmp_path, fixture_file, cached_trace
):
    recorded = cached_trace(fixture_file(CAPTURE)).environment  # the H100 capture's
    smi_env = parse_report(REPORT.read_text()).environment()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\n[ "$1" = "-q" ] && exec cat "{REPORT}"\nexit 6\n')
    smi.chmod(0o755)
    repo = new_repo(tmp_path / "proj")
    _commit(repo, 1, "bench")

    done, doc = _session(repo, bin_dir, "--perfguard-save")
    assert done.returncode == 0, done.stdout + done.stderr
    saved_env = doc["run"]["environment"]
    assert saved_env["driver"] == "535.183.01" and saved_env["power_limit"] == "700 W"
    assert doc["run"]["fingerprint"]["gpu_name"] == "NVIDIA H100 80GB HBM3"

    # the baseline as if measured where the H100 capture was: its driver and libraries,
    # the GPU settings of an H100 report
    baseline_env = recorded.filled_from(smi_env).to_dict()
    store = repo / "baselines" / "perfguard.db"
    with sqlite3.connect(store) as conn:
        conn.execute(
            "UPDATE runs SET environment = ? WHERE run_id = 1",
            (json.dumps(baseline_env, sort_keys=True),),
        )
    conn.close()

    _commit(repo, 1, "a comment-only change")
    done, doc = _session(repo, bin_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    (test,) = doc["tests"]
    assert test["outcome"] == "incomparable"
    assert "driver 575.51.03 → 535.183.01" in test["message"]
    assert "driver CUDA 12.9 → 12.2" in test["message"]
    assert "--perfguard-compare-across driver" in test["message"]

    # compared across the driver, judged whatever the timing of this microsecond step says
    done, doc = _session(
        repo, bin_dir, "--perfguard-compare-across=driver", "--perfguard-fail-on=never"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (test,) = doc["tests"]
    assert test["outcome"] != "incomparable", test["message"]
    changes = {c["field"]: c for c in test["explanation"]["environment"]}
    assert changes["driver"]["before"] == "575.51.03" and changes["driver"]["across"] == "driver"
    assert changes["torch"]["before"] == "2.6.0+cu124" and not changes["torch"]["blocking"]
    line = (
        "environment since the baseline: driver 575.51.03 → 535.183.01 (compared across "
        "driver); driver CUDA 12.9 → 12.2 (compared across driver); torch 2.6.0+cu124 → "
    )
    assert line in done.stdout  # the terminal, once for the tests that share it
    assert line in (repo / ".perfguard" / "summary.md").read_text()
    assert line in (repo / ".perfguard" / "report.html").read_text()

    _commit(repo, 20, "twenty matmuls a step")  # a real regression, judged across the driver
    done, doc = _session(repo, bin_dir, "--perfguard-compare-across", "driver")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    (test,) = doc["tests"]
    assert test["outcome"] == "regressed"
    failure = done.stdout[done.stdout.index("FAILURES") :]
    assert "- " + line in failure  # the failure message, under the explanation's lines
    props = [c["field"] for c in test["explanation"]["environment"]]
    assert props[:2] == ["driver", "driver_cuda"]
