"""``results.json`` schema 2 (figures written twice, flat and in ``timing``) is upgraded on
reading to schema 3 (the figures in ``timing`` only), as the store upgrades its schema.

The document is a real one: ``pytest --perfguard`` on ``examples/test_transformer_block.py``
by perfguard 5d11b50 (schema 2), saved then compared. Beside it, the views rendered from
it: the terminal listing, ``summary.md`` and ``report.html``, first by perfguard 70e34e3
(the last to write schema 2), refreshed only where a view changed on purpose (round 20: the
line of what the timing could see, each commit named once with its role; round 21: a CPU
run's op table without the Tensor Core, FLOP-efficiency, interval and p columns), the diff
read.
The upgraded document must render them byte for byte, and so must the schema 3 file this
perfguard writes of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfguard.compare.results import SCHEMA, encode, load_results, upgrade
from perfguard.errors import ReportError
from perfguard.plugin.summary import results_lines
from perfguard.report.html import render_session_html
from perfguard.report.markdown import render_markdown

DATA = Path(__file__).parent / "data" / "results_schema2"
URL = "https://example.invalid/report.html"


def _views(doc) -> dict[str, str]:
    return {
        "terminal.txt": "\n".join(results_lines(doc)) + "\n",
        "summary.md": render_markdown(doc, report_url=URL),
        "report.html": render_session_html(doc),
    }


def test_a_schema2_file_renders_as_it_did_before_the_upgrade() -> None:
    old = json.loads((DATA / "results.json").read_text())
    assert old["schema"] == 2 and "delta_pct" in old["tests"][0]  # the figures flat, too
    doc = load_results(DATA / "results.json")
    for name, text in _views(doc).items():
        assert text == (DATA / name).read_text(), name


def test_the_upgraded_document_writes_its_figures_once(tmp_path: Path) -> None:
    doc = load_results(DATA / "results.json")
    path = tmp_path / "results.json"
    path.write_bytes(encode(doc))
    new = json.loads(path.read_text())
    entry, was = new["tests"][0], json.loads((DATA / "results.json").read_text())["tests"][0]
    assert new["schema"] == SCHEMA == 3
    flat = ("delta_pct", "ci_low_pct", "ci_high_pct", "median_current_ns", "level_current_ns")
    assert not any(k in entry for k in flat)  # written once: in timing
    for k in flat:
        assert entry["timing"][k] == was[k] == was["timing"][k]
    again = load_results(path)  # the fresh schema 3 file renders the same views
    for name, text in _views(again).items():
        assert text == (DATA / name).read_text(), name


def test_upgrade_leaves_its_input_alone_and_refuses_a_newer_schema() -> None:
    old = json.loads((DATA / "results.json").read_text())
    before = json.dumps(old, sort_keys=True)
    upgraded = upgrade(old, "old.json")
    assert json.dumps(old, sort_keys=True) == before and upgraded["schema"] == SCHEMA
    with pytest.raises(ReportError, match=r"^new.json: written by a newer perfguard \(schema 4"):
        upgrade({**old, "schema": 4}, "new.json")
