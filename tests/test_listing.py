"""The terminal summary and ``summary.md`` list a test with the same words: both take a
listed test's headline and the lines under it, and the environment line said once for the
tests sharing it, from :mod:`perfguard.compare.listing` (issue 43: they had drifted, the
terminal leaving out the acceptance and the host instructions line)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from perfguard.compare.listing import detail_lines, headline
from perfguard.compare.results import SessionResults
from perfguard.plugin.summary import results_lines
from perfguard.report.markdown import render_markdown

#: a real session's document (``tests/test_results_upgrade.py`` says where it came from)
DOC = Path(__file__).parent / "data" / "results_schema2" / "results.json"


def _session(outcome: str) -> SessionResults:
    """The real document's test as ``outcome``, with explanation lines, an environment change
    and an acceptance, and a second test sharing that change but not listed."""
    doc = json.loads(DOC.read_text())
    t = doc["tests"][0]
    t["outcome"] = outcome
    why = t["explanation"]
    why["outcome"] = outcome
    why["lines"] = ["aten::softmax at model.py:64 in forward: input dtypes fp32 → fp64"]
    why["environment"] = [
        {"field": "driver", "label": "driver", "before": "550.54", "after": "555.42"}
    ]
    t["accepted"] = {"commit": "ab" * 20, "reason": "known slower softmax", "author": "rev"}
    other = copy.deepcopy(t)
    other["nodeid"] = t["nodeid"] + "_other"
    other["outcome"] = other["explanation"]["outcome"] = "unchanged"
    other["accepted"] = None
    doc["tests"].append(other)
    return SessionResults.from_dict(doc)


def _plain(markdown_line: str) -> str:
    """A Markdown line's text: escapes and entities undone."""
    text = re.sub(r"\\(.)", r"\1", markdown_line)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def test_terminal_and_summary_list_a_regression_with_the_same_lines() -> None:
    results = _session("regressed")
    listed = next(t for t in results.tests if t.outcome.value == "regressed")
    below = detail_lines(listed)
    # what the test adds is said: the explanation's line, the environment, the acceptance
    assert below[0].startswith("aten::softmax at model.py:64")
    assert any("driver 550.54 → 555.42" in line for line in below)
    assert any("known slower softmax" in line for line in below)

    terminal = results_lines(results)
    at = terminal.index(f"regressed {listed.nodeid}: {headline(listed)}")
    assert terminal[at + 1 : at + 1 + len(below)] == [f"  - {line}" for line in below]

    md = render_markdown(results).splitlines()
    at = next(i for i, line in enumerate(md) if "**regressed**" in line)
    assert [_plain(line) for line in md[at + 1 : at + 1 + len(below)]] == [
        f"  - {line}" for line in below
    ]


def test_a_shared_environment_change_is_said_once_in_both_views() -> None:
    """The unchanged test's environment line, in neither view's full listing, is said once
    with its test's id in both."""
    results = _session("noisy")  # the terminal lists noisy tests in its table only
    other = next(t for t in results.tests if t.outcome.value == "unchanged")
    line = other.explained.environment_line
    terminal = results_lines(results)
    assert terminal.count(f"{line} (2 tests)") == 1  # noisy and unchanged share it here
    md = [_plain(x) for x in render_markdown(results).splitlines()]
    said = [x for x in md if line in x and "(`" in x]
    assert said == [f"- {line} (`{other.nodeid}`)"]  # summary.md lists the noisy one in full
