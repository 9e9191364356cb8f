"""What one test is judged against, from a store: the one path from stored data to a verdict.

The plugin (store mode), ``perfguard report --run``, ``perfguard compare``
(two stored runs) and ``perfguard bisect`` all build the judge's input here,
so the same store, record and settings give the same outcome and figures.

* **A baseline per test.** The test is compared with the nearest first-parent
  ancestor of the baseline ref (the ref included) that has a run *measuring
  this test* on a compatible machine; every such run of that commit is
  pooled. A partial save (``-k``) or two concurrent saves of one commit
  therefore never hide a test that an older run measured: ``new`` only when
  no run on that history has it.
* **Gates across worker counts.** The machine must match for anything to be
  compared (GPU model and count, backend, CPU model:
  :meth:`Fingerprint.incompatibility`); the number of test processes
  measuring at once (``-n``) changes timing only, so a baseline saved with
  another ``-n`` still gates the counters, and its timing is said to be not
  comparable, with how to fix it (:meth:`Fingerprint.timing_incompatibility`).
* **The environment.** Runs whose environment differs in a blocking field (the driver's
  branch, clocks, power limit, ECC, MIG, CPU quota) are skipped like other machines'
  unless the session compares across that group; what differs between the chosen
  baseline run and this one is handed to the judge, which lists it with the verdict
  (:mod:`perfguard.environment`).
* **Settings from the record.** The test's tolerance was resolved once, when its
  record was made (the marker's, else the session's: ``meta["tolerance"]``), and its
  gates stored with it; an explicit tolerance (a CLI flag) is the only override of a
  tolerance the marker did not set, and every default is
  :mod:`perfguard.compare.tolerance`'s.
* **One read of the history.** The test's stored levels are read once
  (:func:`read_history`) for both the noise the timing is judged with
  (:func:`history_levels`) and the rows the reports list (:func:`history_rows`).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfguard.baseline.accept import Acceptance, applicable
from perfguard.baseline.git import first_parent_commits, match_runs
from perfguard.baseline.record import Fingerprint, TestRecord
from perfguard.baseline.store import Store
from perfguard.compare.gates import parse_gates
from perfguard.compare.history import change_marks, with_machine
from perfguard.compare.judge import Against, JudgeSettings
from perfguard.compare.timing import MIN_HISTORY
from perfguard.compare.tolerance import ALPHA, TOLERANCE
from perfguard.environment import Environment, EnvironmentChange
from perfguard.errors import DamagedStoreError, PerfguardError

#: stored runs of a test read for its between-run noise (the judge's history)
HISTORY_RUNS = 50


@dataclass
class History:
    """The first-parent commits of a baseline ref, newest first, walked once per session."""

    ref: str
    commits: list[str]

    @classmethod
    def of(cls, repo: str | os.PathLike[str], ref: str, max_depth: int = 1000) -> History:
        return cls(ref, first_parent_commits(repo, ref, max_depth=max_depth))


def settings_for(
    record: TestRecord, tolerance: float | None = None, alpha: float = ALPHA
) -> JudgeSettings:
    """The judge's thresholds for ``record``: the marker's tolerance and gates as stored with
    it; ``tolerance`` where the caller sets one (it wins over a default, never over a
    marker that set its own)."""
    marker = record.meta.get("marker") or {}
    own = marker.get("tolerance")
    stored = record.meta.get("tolerance")
    if own is not None:
        tol = float(own)
    elif tolerance is not None:
        tol = float(tolerance)
    elif stored is not None:
        tol = float(stored)
    else:
        tol = TOLERANCE
    return JudgeSettings(tolerance=tol, alpha=alpha, gates=parse_gates(marker.get("gates")))


def against_from_store(
    store: Store,
    history: History,
    record: TestRecord,
    fingerprint: Fingerprint,
    *,
    exclude_run_id: int | None = None,
    only: Collection[str] | None = None,
    environment: Environment | None = None,
    across: Collection[str] = (),
    rows: bool = False,
    head: tuple[str, bool] | None = None,
) -> Against:
    """The judge's input for ``record`` (module docstring).

    ``exclude_run_id``: the run being judged, when it is stored already.
    ``only``: the commits an acceptance allows (runs before it no longer count).
    ``environment``: this run's (None: not checked); ``across``: the blocking groups
    compared across anyway (``--perfguard-compare-across``). ``rows``: also the history
    rows the reports list (``Against.rows``), from the same read of the history.
    ``head``: the commit measured and whether its tree is dirty (the same clean commit is an
    A/A: :func:`perfguard.compare.judge.same_code`).
    """
    nodeid = record.nodeid
    frame = read_history(store, nodeid, fingerprint) if rows else None
    listed = history_rows(store, nodeid, fingerprint, frame) if frame is not None else []
    match, pooled = match_runs(
        store.reader.runs_with_test(nodeid),
        history.commits,
        history.ref,
        fingerprint,
        exclude_run_id=exclude_run_id,
        only=only,
        environment=environment,
        across=across,
    )
    if match.status == "no-runs":
        # some run on this history, just not of this test: the test is new there
        anyone, _ = match_runs(
            store.reader.runs(),
            history.commits,
            history.ref,
            fingerprint,
            exclude_run_id=exclude_run_id,
            only=only,
            environment=environment,
            across=across,
        )
        return Against(run_found=anyone.found, rows=listed)
    if match.status == "incomparable":
        return Against(incompatibility=match.reason, run_found=True, rows=listed)
    commit = str(match.commit)
    # timing pools only runs measured like this one (same -n); the gates need one record
    timing_ok = [fingerprint.timing_incompatibility(fp) is None for fp in pooled["fingerprint"]]
    same = pooled[timing_ok]
    chosen = same if len(same) else pooled.head(1)
    records = [r for r in (store.reader.load_test(int(i), nodeid) for i in chosen["run_id"]) if r]
    timing_reason = None
    if not len(same):
        why = fingerprint.timing_incompatibility(pooled.iloc[0]["fingerprint"])
        timing_reason = (
            f"{why}: timing is not compared across worker counts (each worker shares the "
            f"machine); run with the baseline's -n, or save a baseline with this one; the "
            "gates were compared"
        )
    reason = None
    if records:
        theirs = (records[0].meta or {}).get("backend")
        mine = record.meta.get("backend")
        if theirs and mine and theirs != mine:
            reason = f"backend differs: {theirs!r} (baseline) vs {mine!r}"
    changes: tuple[EnvironmentChange, ...] = ()
    if environment is not None and len(chosen):  # the run the verdict names: the latest
        changes = environment.changes_since(chosen.iloc[0]["environment"], across)
    return Against(
        records=records,
        commit=commit,
        run_found=True,
        incompatibility=reason,
        timing_incompatibility=timing_reason,
        history=history_levels(
            store, record, fingerprint, only, before_run_id=exclude_run_id, rows=frame
        ),
        environment=changes,
        rows=listed,
        current_commit=head[0] if head else None,
        current_dirty=head[1] if head else True,
        baseline_dirty=bool(chosen["dirty"].any()) if "dirty" in chosen else True,
    )


@dataclass
class StoreBaseline:
    """What a session's tests are judged against (store mode): its store, the baseline ref
    and the commit being measured, its machine and environment. :meth:`against` is one
    test's whole lookup (the acceptance that applies to HEAD, the nearest run, the history
    read once), so the plugin makes one call per test; the ref's first-parent walk is
    made once, for the session's first test."""

    store: Store
    repo: str | os.PathLike[str]
    ref: str
    head: str
    fingerprint: Fingerprint
    environment: Environment | None = None
    across: Collection[str] = ()
    #: the tree measured has uncommitted changes (unknown: dirty)
    dirty: bool = True
    _walk: History | None = None

    def against(self, record: TestRecord) -> tuple[Against, Acceptance | None]:
        """``record``'s input to the judge and the acceptance it is judged under (None:
        none applies). A damaged store raises :class:`DamagedStoreError`: the test is not
        judged against it, nor without the acceptance it could not read."""
        try:
            accepted = applicable(self.store, self.repo, record.nodeid, self.head)
        except DamagedStoreError:
            raise
        except PerfguardError:
            accepted = None
        if self._walk is None:
            self._walk = History.of(self.repo, self.ref)
        against = against_from_store(
            self.store,
            self._walk,
            record,
            self.fingerprint,
            only=accepted.commits if accepted is not None else None,
            environment=self.environment,
            across=self.across,
            rows=True,
            head=(self.head, self.dirty),
        )
        return against, accepted


def read_history(store: Store, nodeid: str, fingerprint: Fingerprint) -> pd.DataFrame:
    """The test's latest :data:`HISTORY_RUNS` run levels on machines like ``fingerprint``
    (:meth:`Store.history`): the one read behind both :func:`history_levels` and
    :func:`history_rows`."""
    return store.reader.history(nodeid, fingerprint=fingerprint, limit=HISTORY_RUNS)


def history_levels(
    store: Store,
    record: TestRecord,
    fingerprint: Fingerprint,
    only: Collection[str] | None,
    *,
    before_run_id: int | None = None,
    rows: pd.DataFrame | None = None,
) -> np.ndarray:
    """The test's run levels measured like this one (machine and ``-n``), oldest first; since
    the acceptance, when ``only`` names its commits. ``before_run_id``: a stored run being
    judged again sees the history its session saw (the runs saved before it). ``rows``:
    :func:`read_history`'s, when read already."""
    if rows is None:
        rows = read_history(store, record.nodeid, fingerprint)
    if before_run_id is not None:
        rows = rows[rows["run_id"] < before_run_id]
    rows = rows[rows["metric"] == record.metric]
    if only is not None:
        rows = rows[rows["commit"].isin(list(only))]
    if len(rows) >= MIN_HISTORY:
        # a run the machine's evidence explains (another speed, a busy machine) teaches the
        # noise of the machine, not of the test: a between-run noise learnt from sessions
        # with and without a neighbour made every later interval that wide (issue 55)
        notes = with_machine(store, record.nodeid, rows[["run_id"]], record.metric)["machine"]
        rows = rows[(notes == "").to_numpy()]
    return rows["median_ns"].to_numpy(dtype=np.float64)


def history_rows(
    store: Store, nodeid: str, fingerprint: Fingerprint, rows: pd.DataFrame | None = None
) -> list[dict[str, Any]]:
    """The test's stored levels as the reports list them (commit, time, median_ns, and
    ``change``: the timing and counter change points at that run, and a run measured on an
    unusual machine, :func:`perfguard.compare.history.change_marks`). ``rows``:
    :func:`read_history`'s, when read already."""

    if rows is None:
        rows = read_history(store, nodeid, fingerprint)
    rows = rows[rows["median_ns"].notna()].reset_index(drop=True)
    levels = pd.DataFrame(
        {
            "run_id": rows["run_id"],
            "commit": rows["commit"].astype(str),
            "value": rows["median_ns"].astype(np.float64),
        }
    )
    if len(rows):
        levels = with_machine(store, nodeid, levels, str(rows["metric"].iloc[-1]))
    marks = change_marks(store, nodeid, levels)
    return [
        {"commit": str(commit), "time": str(time), "median_ns": float(median), "change": mark}
        for commit, time, median, mark in zip(
            rows["commit"], rows["time"], rows["median_ns"], marks, strict=True
        )
    ]
