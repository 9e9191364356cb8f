"""What a ``pytest --perfguard`` session reports of its own cost (issue 27 item 7): each
measured test's parts in ``results.json`` (``phase_s``), the session's, and the terminal
line that adds them up; the partial ``results.json`` written after each test is the same
document as the final one, entry for entry. A real session (pytester, in process, the CPU
torch profiler); no timing is asserted, only that the parts are there, positive and add up.
"""

from __future__ import annotations

import json
import re

import pytest
import torch  # noqa: F401  (loaded before pytester snapshots sys.modules, see test_plugin)
from test_plugin import _profiler_loaded  # noqa: F401  (the autouse warm-up fixture)

import perfguard.plugin.session  # noqa: F401
from perfguard.compare.results import load_results

pytest_plugins = ["pytester"]

PROJECT = """
import pytest
import torch

A = torch.randn(32, 32)


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=3)
def test_loop(gpuprofile):
    for _ in gpuprofile.iterations():
        A @ A


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=3)
def test_second(gpuprofile):
    for _ in gpuprofile.iterations():
        (A + 1).relu()
"""

PARTS = {
    "warmup",
    "timing",
    "round_checks",
    "collect",
    "sites",
    "profiled",
    "analysis",
    "findings",
    "compare",
    "history",
}


def test_parts_in_results_and_terminal(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_costs=PROJECT)
    r = pytester.runpytest_inprocess("--perfguard", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=2)
    doc = load_results(pytester.path / ".perfguard" / "results.json")
    assert len(doc.tests) == 2
    per_test = []
    for entry in doc.tests:
        assert PARTS <= set(entry.phase_s), entry.phase_s
        assert all(v >= 0 for v in entry.phase_s.values())
        assert entry.phase_s["timing"] > 0 and entry.phase_s["profiled"] > 0
        per_test.append(sum(v for k, v in entry.phase_s.items() if k not in ("warmup", "timing")))
    assert {"start", "results"} <= set(doc.phase_s)
    line = next(x for x in r.outlines if x.startswith("perfguard's own time:"))
    m = re.match(
        r"perfguard's own time: ([\d.]+) s per test beyond its rounds \((.*)\); "
        r"session ([\d.]+) s \((.*)\)",
        line,
    )
    assert m, line
    # the line's figure is the mean of the entries' parts beyond the test's own rounds
    assert float(m.group(1)) == pytest.approx(sum(per_test) / 2, abs=0.006)
    named = dict(p.rsplit(" ", 1) for p in m.group(2).split(", "))
    assert set(named) == PARTS - {"warmup", "timing"} | (set(named) & {"timeline"})
    # the session's parts in the line include the final reports, written after the document
    assert "reports" in m.group(4) and "start" in m.group(4)


def test_partial_document_matches_final(pytester: pytest.Pytester) -> None:
    """The partial results.json reuses each entry's text; it must still be the document."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_costs=PROJECT)
    snapshots: list[dict] = []
    pytester.makeconftest(
        """
import json, pathlib
import pytest

SNAPSHOTS = []

@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    path = pathlib.Path(".perfguard/results.json")
    if path.is_file():
        SNAPSHOTS.append(json.loads(path.read_text()))

def pytest_sessionfinish(session):
    pathlib.Path("snapshots.json").write_text(json.dumps(SNAPSHOTS))
"""
    )
    r = pytester.runpytest_inprocess("--perfguard", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=2)
    snapshots = json.loads((pytester.path / "snapshots.json").read_text())
    final = json.loads((pytester.path / ".perfguard" / "results.json").read_text())
    assert [len(s["tests"]) for s in snapshots] == [1, 2]
    assert all(s["complete"] is False for s in snapshots) and final["complete"] is True
    by_id = {t["nodeid"]: t for t in final["tests"]}
    for snap in snapshots:
        for t in snap["tests"]:
            assert t == by_id[t["nodeid"]]  # an entry's text is made once, never stale
