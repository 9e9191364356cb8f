"""perfguard: stop GPU performance regressions before they merge.

The library surface: read a capture with :func:`load_trace`, analyse it with
:func:`analyze` (per-op attribution and metrics as pandas DataFrames).
"""

from perfguard.analysis import Analysis, analyze
from perfguard.errors import AnalysisError, PerfguardError, TraceError
from perfguard.trace import Trace, load_trace

__version__ = "0.1.0"

__all__ = [
    "Analysis",
    "AnalysisError",
    "PerfguardError",
    "Trace",
    "TraceError",
    "__version__",
    "analyze",
    "load_trace",
]
