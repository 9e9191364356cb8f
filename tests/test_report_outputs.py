"""The plugin's outputs at the end of a real session: every test is a row of the terminal
table, results.json, report.html and summary.md with its reason, and a report that cannot
be rendered leaves no stale one behind.

Each test runs pytest with ``--perfguard`` on a small project (``pytester``,
in process, the CPU torch profiler).
"""

from __future__ import annotations

import json

import pytest
import torch  # noqa: F401  (loaded before pytester snapshots sys.modules, see test_plugin)
from test_plugin import _profiler_loaded  # noqa: F401  (the autouse warm-up fixture)
from test_report_html import cell_texts, parse

import perfguard.plugin.session  # noqa: F401

pytest_plugins = ["pytester"]

PROJECT = """
import pytest
import torch

A = torch.randn(64, 64)


@pytest.mark.gpuprofile
def test_measured():
    A @ A


@pytest.mark.gpuprofile
def test_never_iterates(gpuprofile):
    A @ A
"""
NEVER = "test_out.py::test_never_iterates"
STALE = "<p>stale report of an earlier session</p>"

BREAK_RENDER = """
import perfguard.report.html as html

_real = html.write_session_html


def _broken(*args, **kwargs):
    raise RuntimeError("template exploded")


def pytest_configure(config):
    html.write_session_html = _broken


def pytest_unconfigure(config):
    html.write_session_html = _real
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_out=PROJECT)
    out = pytester.path / ".perfguard"
    out.mkdir()
    (out / "report.html").write_text(STALE)
    (out / "summary.md").write_text(STALE)
    return pytester


def test_error_row_in_every_output(project: pytest.Pytester) -> None:
    r = project.runpytest_inprocess("--perfguard", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=2, errors=1)
    reason = "never runs gpuprofile.iterations()"
    r.stdout.fnmatch_lines(
        [
            "perfguard: INCOMPLETE (1 error: not every test was measured)",
            "test * outcome *",
            f"{NEVER} *error *the test requests the gpuprofile fixture but*",
            "test_out.py::test_measured *no-baseline *no baseline to compare with*",
        ]
    )
    out = project.path / ".perfguard"
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == 3 and doc["badge"] == "INCOMPLETE"
    by_id = {t["nodeid"]: t for t in doc["tests"]}
    assert by_id[NEVER]["outcome"] == "error" and reason in by_id[NEVER]["error"]
    html = (out / "report.html").read_text()
    assert STALE not in html
    page = parse(html)
    assert page.find("span", id="badge").text() == "INCOMPLETE"
    rows = {r[0]: r for r in cell_texts(page.find("table", id="tests"))}
    assert rows[NEVER][1] == "error" and reason in rows[NEVER][10]
    md = (out / "summary.md").read_text()
    assert md.startswith("## perfguard :boom: INCOMPLETE: 1 error, 1 no-baseline")
    assert f"- :warning: **error** `{NEVER}`: the test requests the gpuprofile fixture" in md


def test_a_report_that_cannot_render_removes_the_stale_one(project: pytest.Pytester) -> None:
    project.makeconftest(BREAK_RENDER)
    r = project.runpytest_inprocess("--perfguard", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=2, errors=1)  # the session's outcome is not changed
    r.stdout.fnmatch_lines(
        [
            "note: could not write the HTML/Markdown report in *: template exploded",
            "note: removed report.html and summary.md so that no stale report remains",
        ]
    )
    out = project.path / ".perfguard"
    assert (out / "results.json").is_file()
    assert not (out / "report.html").exists() and not (out / "summary.md").exists()
    assert "report: " not in r.stdout.str()
