"""HTML reports: one self-contained file per pytest session or per analysed capture.

* :func:`write_session_html` renders a session's ``results.json`` (verdicts,
  per-op diffs, kernel changes, findings, history) for a reviewer;
* :func:`write_analysis_html` renders one :class:`~perfguard.analysis.Analysis`
  (the DLProf Viewer's pages: summary, top ops, Tensor Core use, iterations,
  kernels, expert findings).

Pages are Jinja2 templates (``perfguard/report/templates``, autoescaped)
with matplotlib figures inlined as SVG and a few lines of inline script to
sort tables. A Content-Security-Policy forbids every fetch, so the file
works offline and from an artifact store.
"""

from perfguard.report.html.analysis_page import render_analysis_html, write_analysis_html
from perfguard.report.html.results import OUTCOMES, SCHEMA, load_results, validate_results
from perfguard.report.html.session import render_session_html, write_session_html

__all__ = [
    "OUTCOMES",
    "SCHEMA",
    "load_results",
    "render_analysis_html",
    "render_session_html",
    "validate_results",
    "write_analysis_html",
    "write_session_html",
]
