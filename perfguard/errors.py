"""Exceptions perfguard raises on bad input.

Every error a user can cause carries the offending file and a one-line
problem statement, so the CLI can print it without a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import final


class PerfguardError(Exception):
    """Base class of the errors perfguard raises for bad input or setup."""

    __module__ = "perfguard"


@final
class TraceError(PerfguardError):
    """A capture file cannot be read as a trace.

    The message is always ``<path>: <problem>`` on one line.
    """

    __module__ = "perfguard"

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = " ".join(str(problem).split())
        super().__init__(f"{self.path}: {self.problem}")


@final
class AnalysisError(PerfguardError):
    """An analysis request does not fit the trace (e.g. an empty iteration range)."""

    __module__ = "perfguard"
