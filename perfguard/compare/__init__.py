"""Baseline vs current: noise-aware verdicts per test and per op (see DESIGN.md, Verdicts).

Knows :mod:`perfguard.baseline.record` only. :func:`compare_records` is the
one call; the statistics live in :mod:`perfguard.compare.stats`.
"""

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
