"""A stored run judged as the plugin judges it: the session document
(:class:`~perfguard.compare.results.SessionResults`) that ``perfguard report
STORE --run ID`` renders, from the store alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from perfguard.compare.results import Baseline, HistoryRow, Run, SessionResults
from perfguard.compare.tolerance import ALPHA

__all__ = ["results_from_store"]


def results_from_store(
    store_path: str | Path,
    run_id: int,
    *,
    baseline_run: int | None = None,
    baseline_ref: str | None = None,
    repo: str | Path = ".",
    tolerance: float | None = None,
    alpha: float = ALPHA,
) -> SessionResults:
    """The session document of stored run ``run_id``, judged as the plugin judges it.

    With ``baseline_ref``, each test against the nearest run at or before the ref that
    measured it (:func:`perfguard.compare.against.against_from_store`, the plugin's own
    path); with ``baseline_run``, against that one run; else ``no-baseline``.
    ``tolerance``: overrides the default, never a marker's own (``settings_for``).
    """
    from perfguard import __version__
    from perfguard.baseline.store import open_store
    from perfguard.compare.against import (
        History,
        against_from_store,
        history_levels,
        history_rows,
        read_history,
        settings_for,
    )
    from perfguard.compare.judge import Against, judge
    from perfguard.environment import incompatibility as env_incompatibility

    with open_store(store_path, create=False) as store:
        info, records = store.reader.load_run(run_id)
        fp = info.fingerprint
        baseline: Baseline | None = None
        walk = History.of(repo, baseline_ref) if baseline_ref is not None else None
        base_records: dict[str, Any] = {}
        base_reason = base_timing = base_commit = None
        changes: tuple[Any, ...] = ()
        if baseline_run is not None:
            base_info, base_records = store.reader.load_run(baseline_run)
            base_commit = base_info.commit
            base_reason = fp.incompatibility(base_info.fingerprint)
            base_timing = fp.timing_incompatibility(base_info.fingerprint)
            changes = info.environment.changes_since(base_info.environment)
            base_reason = base_reason or env_incompatibility(changes)
            baseline = Baseline(commit=base_info.commit, run_id=baseline_run)
        tests = []
        for nodeid, record in records.items():
            if walk is not None:
                against = against_from_store(
                    store,
                    walk,
                    record,
                    fp,
                    exclude_run_id=run_id,
                    environment=info.environment,
                    rows=True,
                )
                if baseline is None and against.commit:
                    baseline = Baseline(ref=baseline_ref, commit=against.commit)
            elif baseline_run is not None:
                base = base_records.get(nodeid)
                frame = read_history(store, nodeid, fp)  # read once: levels and rows
                against = Against(
                    records=[base] if base is not None else [],
                    commit=base_commit,
                    run_found=True,
                    incompatibility=base_reason,
                    timing_incompatibility=base_timing,
                    history=history_levels(
                        store, record, fp, None, before_run_id=run_id, rows=frame
                    ),
                    environment=changes,
                    rows=history_rows(store, nodeid, fp, frame),
                )
            else:
                against = Against(rows=history_rows(store, nodeid, fp))
            c = judge(record, against, settings_for(record, tolerance, alpha))
            capture = record.meta.get("capture")
            tests.append(
                c.entry(
                    history=[HistoryRow(**h) for h in against.rows],
                    backend=fp.backend,
                    capture=None if capture is None else str(capture),
                )
            )
    return SessionResults(
        tests=tests,
        perfguard_version=__version__,
        run=msgspec.convert(info.to_dict(), Run),
        baseline=baseline,
        settings={
            "tolerance": tolerance,
            "alpha": alpha,
            "fail_on": None,
            "backend": fp.backend,
        },
    )
