"""Reports: DLProf-style tables (CSV/JSON) and the terminal summary."""

from perfguard.report.dlprof import FORMATS, REPORTS, TABLES
from perfguard.report.terminal import format_summary
from perfguard.report.writer import write_reports

__all__ = ["FORMATS", "REPORTS", "TABLES", "format_summary", "write_reports"]
