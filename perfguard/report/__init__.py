"""Reports: DLProf-style tables (CSV/JSON) and the terminal summary."""

from perfguard.report.dlprof import ALL_REPORTS, FORMATS, REPORTS, TABLES
from perfguard.report.terminal import format_summary
from perfguard.report.writer import write_reports

__all__ = ["ALL_REPORTS", "FORMATS", "REPORTS", "TABLES", "format_summary", "write_reports"]
