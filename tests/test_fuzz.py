"""The fuzzer (``benchmarks/fuzz.py``) at a small size: every mutation kind on the
small real fixtures, each case a real ``perfguard analyze`` in a forked child.

Zero bugs expected: no untyped exception, no crash, no run over the CPU-time
limit, no memory blow-up, no report with a negative time, a utilization over
100 % or a non-finite number. The large run is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, NO_FIXTURES, load_fuzzer

pytestmark = pytest.mark.skipif(FIXTURES is None, reason=NO_FIXTURES)

FUZZ = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz.py"


def test_fuzz_small_run_finds_no_bug(tmp_path: Path) -> None:
    fuzz = load_fuzzer()
    small = fuzz.fixture_files(FIXTURES, max_mb=0.7)
    nsys = [f for f in small if f.suffix == ".sqlite"]
    kinds = len(fuzz.SQLITE_MUTATIONS) + len(fuzz.BYTE_MUTATIONS)
    cases = len(small) * kinds  # every kind on every small nsys file, and most on Kineto
    log = tmp_path / "fuzz.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            str(FUZZ),
            "--cases",
            str(cases),
            "--seed",
            "0",
            "--max-input-mb",
            "0.7",
            "--log",
            str(log),
            "--quiet",
            "--keep-failures",
            str(tmp_path / "bugs"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(results) == cases, done.stderr[-2000:]
    bugs = [r for r in results if r["outcome"] in fuzz.BUGS]
    assert bugs == [], done.stdout[-3000:]
    assert done.returncode == 0
    # every nsys mutation kind ran on every small nsys file; both outcomes happen
    ran = {(r["fixture"], r["kind"]) for r in results}
    for f in nsys:
        assert {(f.name, k) for k in (*fuzz.SQLITE_MUTATIONS, *fuzz.BYTE_MUTATIONS)} <= ran
    outcomes = {r["outcome"] for r in results}
    assert {"report", "error"} <= outcomes


def test_report_check_catches_impossible_figures(tmp_path: Path) -> None:
    """The fuzzer's oracle is worth something only if it fails on bad reports."""
    fuzz = load_fuzzer()
    (tmp_path / "x_iteration.csv").write_text(
        "Iteration,Duration (ns),GPU Utilization (%)\n1,100,150.7\n2,-5,50\n3,100,\n"
    )
    (tmp_path / "x_summary.json").write_text('{"Wall Clock Time (ns)": NaN, "Op ID": "1e999"}')
    (tmp_path / "x_detail.csv").write_text("Op Name,Total GPU Time (ns)\ninf,inf\n")
    problems = fuzz.check_reports(tmp_path)
    assert any("150.7" in p and "over 100" in p for p in problems)
    assert any("-5" in p and "negative" in p for p in problems)
    assert any("non-finite JSON number NaN" in p for p in problems)
    assert any("Total GPU Time" in p and "not finite" in p for p in problems)
    assert not any("Op Name" in p or "Op ID" in p for p in problems)  # names are not figures
    assert len(problems) == 4
