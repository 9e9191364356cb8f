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


class CaptureError(PerfguardError):
    """A capture could not be made: tool missing, command failed or timed out, nothing written.

    The message is one line. ``result`` carries the partial
    :class:`perfguard.capture.CaptureResult` when the run wrote something
    worth keeping (e.g. the trace of a program that then failed).
    """

    __module__ = "perfguard"

    def __init__(self, message: str, *, result: object | None = None) -> None:
        self.result = result
        super().__init__(" ".join(str(message).split()))


class BaselineError(PerfguardError):
    """The baseline store or the git repository cannot serve a request.

    One line naming the store file (or repository) and the problem: a store
    that is not a perfguard store, a newer schema than this perfguard knows,
    a ref git cannot resolve, a store locked past the retry budget.
    """

    __module__ = "perfguard"


class DamagedStoreError(BaselineError):
    """The baseline store's file (or server) says its data is damaged: a page SQLite cannot
    read, a failed integrity check, a value no perfguard writes. Never caught as "no data":
    a command stops on it rather than show part of a store, and the plugin judges nothing
    against the store and writes nothing into it. The one line names the store and what to
    do (``perfguard baseline check`` / ``recover``)."""

    __module__ = "perfguard"


class CompareError(PerfguardError):
    """Two results cannot be compared (different metrics, nothing recorded)."""

    __module__ = "perfguard"


class ReportError(PerfguardError):
    """A report cannot be rendered from the given results file or store."""

    __module__ = "perfguard"
