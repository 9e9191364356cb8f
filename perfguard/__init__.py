"""perfguard: stop GPU performance regressions before they merge.

The library surface: read a capture with :func:`load_trace`, analyse it with
:func:`analyze` (per-op attribution and metrics as pandas DataFrames).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfguard.errors import AnalysisError, PerfguardError, TraceError

if TYPE_CHECKING:
    from perfguard.analysis import Analysis, analyze
    from perfguard.capture import (
        Instrumentation,
        annotate,
        annotate_function,
        instrument,
        name_thread,
        profile_command,
        unannotate_function,
    )
    from perfguard.trace import Trace, load_trace

__version__ = "0.1.0"

# Loaded on first use (PEP 562): the pytest plugin imports this package at
# every pytest start, and pandas must not be paid for without --perfguard.
_LAZY = {
    "Analysis": "perfguard.analysis",
    "analyze": "perfguard.analysis",
    "Trace": "perfguard.trace",
    "load_trace": "perfguard.trace",
    "Instrumentation": "perfguard.capture",
    "annotate": "perfguard.capture",
    "annotate_function": "perfguard.capture",
    "instrument": "perfguard.capture",
    "name_thread": "perfguard.capture",
    "profile_command": "perfguard.capture",
    "unannotate_function": "perfguard.capture",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'perfguard' has no attribute {name!r}")


__all__ = [
    "Analysis",
    "AnalysisError",
    "Instrumentation",
    "PerfguardError",
    "Trace",
    "TraceError",
    "__version__",
    "analyze",
    "annotate",
    "annotate_function",
    "instrument",
    "load_trace",
    "name_thread",
    "profile_command",
    "unannotate_function",
]
