"""Baseline vs current: noise-aware verdicts per test and per op (see DESIGN.md, Verdicts).

Knows :mod:`perfguard.baseline.record` only. :func:`compare_records` is the
one call; the statistics live in :mod:`perfguard.compare.stats`. Names are
loaded on first use (PEP 562) so the pytest plugin can parse a tolerance
(:mod:`perfguard.compare.tolerance`) without importing numpy and pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfguard.compare.verdict import (
        CHANGE_COLUMNS,
        MIN_SAMPLES,
        OP_COLUMNS,
        Outcome,
        TestComparison,
        classify,
        compare_ops,
        compare_records,
        failed,
        kernel_changes,
    )

__all__ = [
    "CHANGE_COLUMNS",
    "MIN_SAMPLES",
    "OP_COLUMNS",
    "Outcome",
    "TestComparison",
    "classify",
    "compare_ops",
    "compare_records",
    "failed",
    "kernel_changes",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("perfguard.compare.verdict"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'perfguard.compare' has no attribute {name!r}")
