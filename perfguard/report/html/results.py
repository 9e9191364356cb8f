"""Read and check a session's ``results.json``: the typed document of
:mod:`perfguard.compare.results` (one model, one check), under the names the
report layer has always used.
"""

from __future__ import annotations

from typing import Any

from perfguard.compare.results import OUTCOMES, SCHEMA, SessionResults, load_results

__all__ = ["OUTCOMES", "SCHEMA", "SessionResults", "load_results", "validate_results"]


def validate_results(data: Any, source: str = "results") -> SessionResults:
    """``data`` (a results.json dict, or a :class:`SessionResults`) checked and typed;
    ``source`` names it in the one-line :class:`~perfguard.errors.ReportError`."""
    return SessionResults.from_dict(data, source)
