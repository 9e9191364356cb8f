"""Write report tables as ``<base>_<report>.<ext>`` files.

Files are written to a temporary name and renamed into place, so an
interrupted run never leaves a half-written report, and an existing report
is only replaced with ``force``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import pandas as pd

from perfguard.analysis import Analysis
from perfguard.errors import PerfguardError
from perfguard.report.dlprof import FORMATS, REPORTS, TABLES
from perfguard.report.perfetto import FORMAT as PERFETTO
from perfguard.report.perfetto import perfetto_path, write_perfetto

#: formats written as one file per report (html and perfetto are one file for all)
_TABLE_FORMATS = ("csv", "json")


def report_paths(
    out_dir: Path, base: str, reports: Iterable[str], formats: Iterable[str]
) -> list[Path]:
    """The files a run will write, in order: tables per report and format, then
    one HTML page (``<base>_report.html``) when ``html`` is among the formats and
    the Perfetto timeline (``<base>_perfetto.json.gz``) for ``perfetto``."""
    formats = list(formats)
    tables = [out_dir / f"{base}_{r}.{f}" for r in reports for f in formats if f in _TABLE_FORMATS]
    html = [out_dir / f"{base}_report.html"] if "html" in formats else []
    return tables + html + ([perfetto_path(out_dir, base)] if PERFETTO in formats else [])


def check_output(
    out_dir: str | Path,
    base: str,
    reports: Iterable[str] = REPORTS,
    formats: Iterable[str] = FORMATS,
    force: bool = False,
) -> None:
    """Raise :class:`PerfguardError` naming the path when the reports cannot be written.

    Cheap (no analysis needed), so the CLI calls it before reading a capture:
    the output path must be a directory or not exist yet, and no report may
    exist unless ``force`` (a directory in a report's place is never replaced).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise PerfguardError(f"{out_dir}: output path exists and is not a directory")
    for p in report_paths(out_dir, base, reports, formats):
        if p.is_dir():
            raise PerfguardError(f"{p}: a directory is in the report's place")
        if p.exists() and not force:
            raise PerfguardError(f"{p}: report exists; pass --force to overwrite it")


def write_reports(
    analysis: Analysis,
    out_dir: str | Path,
    reports: Iterable[str] = REPORTS,
    formats: Iterable[str] = FORMATS,
    base: str = "dlprof",
    force: bool = False,
) -> list[Path]:
    """Write the chosen reports; returns the paths written.

    Raises :class:`PerfguardError` naming the file when a report exists and
    ``force`` is false, before anything is written.
    """
    reports, formats = list(reports), list(formats)
    check_output(out_dir, base, reports, formats, force)
    # render everything before touching a file, so a failure leaves old reports whole
    tables = {report: TABLES[report](analysis) for report in reports}
    pages = {}
    if "html" in formats:  # the DLProf Viewer's pages in one self-contained file
        from perfguard.report.html import render_analysis_html

        pages[Path(out_dir) / f"{base}_report.html"] = render_analysis_html(analysis)
    written = write_tables(tables, out_dir, formats, base, force, pages=pages)
    if PERFETTO in formats:  # streamed to a temporary file and renamed: traces are large
        written.append(write_perfetto(analysis, perfetto_path(Path(out_dir), base)))
    return written


def write_tables(
    tables: dict[str, pd.DataFrame],
    out_dir: str | Path,
    formats: Iterable[str] = FORMATS,
    base: str = "dlprof",
    force: bool = False,
    *,
    pages: dict[Path, str] | None = None,
) -> list[Path]:
    """Write report tables (name -> table) in the table formats among ``formats``,
    and ``pages`` (path -> text) beside them; returns the paths written."""
    out_dir = Path(out_dir)
    formats = [f for f in formats if f in _TABLE_FORMATS]
    check_output(out_dir, base, tables, formats, force)
    texts = {
        out_dir / f"{base}_{report}.{fmt}": _render(report, table, fmt)
        for report, table in tables.items()
        for fmt in formats
    }
    texts.update(pages or {})
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PerfguardError(
            f"{out_dir}: cannot create output directory ({exc.strerror})"
        ) from None
    for path, text in texts.items():
        _atomic_write(path, text)
    return list(texts)


def _render(report: str, table: pd.DataFrame, fmt: str) -> str:
    try:
        return _render_as(report, table, fmt)
    except UnicodeEncodeError:  # a lone surrogate in a name (a damaged capture)
        return _render_as(report, _escape_surrogates(table), fmt)


def _escape_surrogates(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with lone surrogates in text written as ``\\udXXX`` (pandas' JSON
    writer cannot encode them); only taken after such a failure."""

    def fix(v: object) -> object:
        if isinstance(v, str):
            return v.encode("utf-8", "backslashreplace").decode("utf-8")
        return v

    table = table.copy()
    for col in table.columns:
        if pd.api.types.is_object_dtype(table[col]) or pd.api.types.is_string_dtype(table[col]):
            table[col] = table[col].map(fix).astype(object)
    return table


def _render_as(report: str, table: pd.DataFrame, fmt: str) -> str:
    if fmt == "csv":
        return table.to_csv(index=False)
    if report == "summary" and "Value" in table.columns:  # one run: {metric: value}
        values = dict(zip(table["Metric"], (_plain(v) for v in table["Value"]), strict=True))
        return json.dumps(values, indent=2) + "\n"
    return table.to_json(orient="records", indent=2) + "\n"


def _plain(v: object) -> object:
    """numpy/pandas scalars -> JSON-native values."""
    if v is None or (not isinstance(v, str) and pd.isna(cast(Any, v))):
        return None
    return v.item() if hasattr(v, "item") else v


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # a lone surrogate (a damaged name) is written as \\udXXX, never fails the report
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PerfguardError(f"{path}: cannot write report ({exc.strerror})") from None
