"""DLProf's header names live in report/dlprof.py alone: renaming every one of them
changes the DLProf-compatible files and nothing else (not a detector's finding, not a
figure or label of the HTML page, not the terminal summary)."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pandas as pd
import pytest

import perfguard
from perfguard.analysis import RunSummary
from perfguard.report import dlprof, format_summary, write_reports
from perfguard.report.labels import SUMMARY_LABELS
from perfguard.trace import load_trace

EXAMPLE = (
    Path(__file__).resolve().parents[1]
    / "examples"
    / "captures"
    / "a100_alexnet_tiny_cudasync.pt.trace.json.gz"
)
HEADER_MAPS = [name for name in vars(dlprof) if name.endswith("_COLUMNS") or name == "SUMMARY_ROWS"]


def _run(out: Path) -> tuple[pd.DataFrame, str]:
    a = perfguard.analyze(load_trace(EXAMPLE))
    write_reports(a, out, reports=dlprof.ALL_REPORTS, formats=["csv", "json", "html"])
    return a.findings, format_summary(a)


def _rows(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.reader(f))


def test_every_summary_field_has_a_dlprof_name_and_a_label() -> None:
    names = [f.name for f in dataclasses.fields(RunSummary)]
    assert list(dlprof.SUMMARY_ROWS) == names == list(SUMMARY_LABELS)


def test_renaming_dlprof_headers_changes_only_the_dlprof_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    findings, terminal = _run(tmp_path / "before")
    assert len(HEADER_MAPS) >= 9
    for name in HEADER_MAPS:
        for key, header in getattr(dlprof, name).items():
            monkeypatch.setitem(getattr(dlprof, name), key, f"renamed {header}")
    renamed_findings, renamed_terminal = _run(tmp_path / "after")

    pd.testing.assert_frame_equal(renamed_findings, findings)
    assert len(findings)  # the detectors found something to compare
    assert renamed_terminal == terminal
    page = "dlprof_report.html"
    assert (tmp_path / "after" / page).read_bytes() == (tmp_path / "before" / page).read_bytes()
    for before in sorted((tmp_path / "before").glob("*.csv")):
        after = tmp_path / "after" / before.name
        old, new = (_rows(p) for p in (before, after))
        if before.name == "dlprof_summary.csv":  # names in the first column, figures beside
            assert [r[1] for r in new] == [r[1] for r in old]
            assert all(n[0] == f"renamed {o[0]}" for n, o in zip(new[1:], old[1:], strict=True))
        else:  # the header row renamed, every figure the same
            assert new[0] == [f"renamed {h}" for h in old[0]], before.name
            assert new[1:] == old[1:], before.name
