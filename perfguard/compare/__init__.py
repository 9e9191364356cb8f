"""Baseline vs current: noise-aware verdicts per test and per op (see DESIGN.md, Verdicts).

Knows :mod:`perfguard.baseline.record` only. :func:`judge` is the one call
that decides an outcome (:mod:`.judge`); its halves are :mod:`.timing`
(rounds, history noise, A/B pairs) and :mod:`.gates` (deterministic
counters); per-op tables and the U statistics live in :mod:`.comparison` and
:mod:`.stats`; the typed session document in :mod:`.results`. Names are
loaded on first use (PEP 562) so the pytest plugin can parse a tolerance
(:mod:`perfguard.compare.tolerance`) without importing numpy and pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfguard.compare.comparison import (
        CHANGE_COLUMNS,
        MIN_SAMPLES,
        OP_COLUMNS,
        TestComparison,
        classify,
        compare_ops,
        kernel_changes,
    )
    from perfguard.compare.judge import Against, JudgeSettings, compare_records, judge
    from perfguard.compare.outcomes import Outcome, fails

#: where each lazily loaded name lives
_HOME = {
    "Against": "judge",
    "JudgeSettings": "judge",
    "judge": "judge",
    "compare_records": "judge",
    "fails": "outcomes",
}

__all__ = [
    "Against",
    "JudgeSettings",
    "judge",
    "CHANGE_COLUMNS",
    "MIN_SAMPLES",
    "OP_COLUMNS",
    "Outcome",
    "TestComparison",
    "classify",
    "compare_ops",
    "compare_records",
    "fails",
    "kernel_changes",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = _HOME.get(name, "comparison")
        value = getattr(importlib.import_module(f"perfguard.compare.{module}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'perfguard.compare' has no attribute {name!r}")
