"""The measurement and the verdict of one test, without pytest.

:func:`~perfguard.core.measure.measure` runs a step under a :class:`~perfguard.core.spec.
ProfileSpec` with a capturer (warm-up, timed rounds, the call-site pass, the profiled
round: :class:`~perfguard.core.loop.Loop`) and returns the test's
:class:`~perfguard.baseline.record.TestRecord` (:mod:`perfguard.core.record` chooses its
metric, its profiled round and its notes); :func:`~perfguard.core.verdict.verdict` judges a
record against what it is compared with and returns its
:class:`~perfguard.compare.results.TestEntry`. The pytest plugin translates pytest's
events into these calls; a notebook or another runner can make them directly.

Names load on first use (PEP 562): the plugin imports :mod:`.spec` and :mod:`.loop`
(standard library only) whenever pytest starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfguard.core.loop import Loop
    from perfguard.core.measure import measure
    from perfguard.core.record import Measured, TestCapture
    from perfguard.core.spec import ProfileSpec
    from perfguard.core.verdict import verdict

__all__ = ["Loop", "Measured", "ProfileSpec", "TestCapture", "measure", "verdict"]

#: where each lazily loaded name lives
_HOME = {
    "Loop": "loop",
    "measure": "measure",
    "TestCapture": "record",
    "Measured": "record",
    "ProfileSpec": "spec",
    "verdict": "verdict",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(f"perfguard.core.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'perfguard.core' has no attribute {name!r}")
