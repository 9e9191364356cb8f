"""The store of results keyed by git commit and machine (see DESIGN.md, Baselines).

``Store`` / ``open_store`` (a SQLite file or a PostgreSQL URL), git lookups
(``repo_state``, ``default_baseline_ref``, ``find_baseline``; every git command
perfguard runs is in :mod:`perfguard.baseline.git`) and ``machine_fingerprint``.
"""

from perfguard.baseline.fingerprint import machine_fingerprint
from perfguard.baseline.frames import conform_frame, conform_record
from perfguard.baseline.git import (
    BaselineMatch,
    GitState,
    default_baseline_ref,
    find_baseline,
    repo_state,
    resolve,
)
from perfguard.baseline.record import Fingerprint, RunInfo, TestRecord, record_from_analysis
from perfguard.baseline.store import DEFAULT_STORE, Store, open_store

__all__ = [
    "DEFAULT_STORE",
    "BaselineMatch",
    "Fingerprint",
    "GitState",
    "RunInfo",
    "Store",
    "TestRecord",
    "conform_frame",
    "conform_record",
    "default_baseline_ref",
    "find_baseline",
    "machine_fingerprint",
    "open_store",
    "record_from_analysis",
    "repo_state",
    "resolve",
]
