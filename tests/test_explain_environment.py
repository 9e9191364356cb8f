"""What changed in the environment since the baseline: which run is the baseline when the
environment blocks, the judge's one explanation carrying the changes, every renderer
saying them, and ``perfguard compare`` of two real H200 captures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from perfguard.baseline.git import match_runs
from perfguard.baseline.record import Fingerprint
from perfguard.compare.explanation import Explanation
from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import Baseline, Run, SessionResults, TestEntry
from perfguard.environment import Environment
from perfguard.plugin.summary import results_lines
from perfguard.report.markdown import render_markdown

FP = Fingerprint(gpu_name="NVIDIA H100 80GB HBM3", gpu_count=8, backend="torch", host="ci")
OLD = Environment(driver="535.161.08", cudnn="9.1.0.70", power_limit="700 W")
NEW = Environment(driver="575.51.03", cudnn="9.3.0.75", power_limit="700 W")
H200_KINETO = Path(__file__).resolve().parent / "data" / "gpu_h200" / "eager.pt.trace.json.gz"


def _runs(*rows: tuple[int, str, Environment]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_id": np.array([r[0] for r in rows], dtype=np.int64),
            "commit": [r[1] for r in rows],
            "dirty": False,
            "time": [f"2024-01-0{r[0]}T00:00:00Z" for r in rows],
            "fingerprint": [FP] * len(rows),
            "environment": [r[2] for r in rows],
        }
    )


def test_a_blocking_environment_is_skipped_like_another_machine():
    walk = ["c3", "c2", "c1"]
    runs = _runs((1, "c1", NEW), (2, "c2", OLD))
    match, _ = match_runs(runs, walk, "c3", FP, environment=NEW)
    assert (match.status, match.commit) == ("found", "c1")  # the nearest run on this driver
    match, _ = match_runs(runs.iloc[1:], walk, "c3", FP, environment=NEW)
    assert match.status == "incomparable"
    assert (
        "run 2 at c2: environment differs from the baseline's: driver 535.161.08 → "
        "575.51.03" in str(match.reason)
    )
    match, _ = match_runs(runs.iloc[1:], walk, "c3", FP, environment=NEW, across={"driver"})
    assert (match.status, match.commit) == ("found", "c2")
    match, _ = match_runs(runs.iloc[1:], walk, "c3", FP)  # no environment given: not checked
    assert match.status == "found"


def _explained() -> Explanation:
    changes = NEW.changes_since(OLD, {"driver"})
    return Explanation(
        outcome="unchanged", headline="unchanged: -0.4 %", timing="t", lines=("timing: -0.4 %",)
    ).with_environment(changes)


LINE = (
    "environment since the baseline: driver 535.161.08 → 575.51.03 (compared across driver); "
    "cuDNN 9.1.0.70 → 9.3.0.75"
)


def test_the_explanation_carries_and_renders_the_changes():
    why = _explained()
    assert why.environment_line == LINE
    assert why.text() == f"unchanged: -0.4 %\n  - timing: -0.4 %\n  - {LINE}"
    again = msgspec.json.decode(msgspec.json.encode(why), type=Explanation)
    assert again == why and again.environment[0].across == "driver"
    older = msgspec.convert({"outcome": "new", "headline": "x"}, Explanation)
    assert older.environment == ()  # an older results.json


def _results() -> SessionResults:
    entries = [
        TestEntry(nodeid=f"t.py::test_{k}", outcome=Outcome.UNCHANGED, explanation=_explained())
        for k in ("a", "b")
    ]
    return SessionResults(
        tests=entries, run=Run(commit="a" * 40), baseline=Baseline(commit="b" * 40)
    )


def test_terminal_and_summary_say_it():
    lines = results_lines(_results())
    assert f"{LINE} (2 tests)" in lines  # once for the tests that share it
    md = render_markdown(_results())
    assert md.count("environment since the baseline: driver 535.161.08 → 575.51.03") == 1
    assert "cuDNN 9.1.0.70 → 9.3.0.75 (2 tests)" in md


def test_results_json_round_trip_keeps_it():
    doc = _results().to_dict()
    assert doc["tests"][0]["explanation"]["environment"][1] == {
        "field": "cudnn",
        "label": "cuDNN",
        "before": "9.1.0.70",
        "after": "9.3.0.75",
        "blocking": False,
        "across": "",
    }
    back = SessionResults.from_dict(doc)
    assert back.tests[0].explained.environment_line == LINE


def _compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfguard", "compare", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_compare_two_real_h200_captures_shows_the_driver_difference(fixture_file):
    """The nsys H200 export (driver 565.57.01, its CUDA 12.8) against this project's own
    Kineto H200 capture (driver CUDA 13.0): a newer driver branch."""
    nsys = fixture_file("nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite")
    done = _compare(str(H200_KINETO), str(nsys))
    assert done.returncode == 0, done.stderr
    assert "INCOMPARABLE" in done.stdout
    assert "environment differs from the baseline's: driver CUDA 12.8 → 13.0" in done.stdout
    assert "--compare-across driver" in done.stdout
    done = _compare(str(H200_KINETO), str(nsys), "--compare-across", "driver")
    assert "INCOMPARABLE" not in done.stdout
    assert (
        "environment since the baseline: driver CUDA 12.8 → 13.0 (compared across driver)"
        in done.stdout
    )
    done = _compare(str(H200_KINETO), str(nsys), "--compare-across", "cudnn")
    assert done.returncode == 2 and "cannot compare across cudnn" in done.stderr
