"""Versioned JSON documents of the commands' answers, for CI scripts (``--json``).

A script that reads ``perfguard history --json`` must be able to tell, a
perfguard upgrade later, whether it still understands the document, as
``results.json`` lets a report tell (:mod:`perfguard.compare.results`). So
every document starts with ``"schema": "perfguard.<kind>/<version>"``;
:func:`check` is how a reader refuses a kind it did not ask for or a newer
version. Within a version, keys are only ever added. Numbers are plain JSON
(times in ns, changes in %), a value the store does not know is ``null``,
never NaN.

Kinds: ``history`` (one test), ``history-list`` (every test),
``baseline-list``, ``baseline-show``, ``compare``, ``bisect``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfguard.errors import ReportError

if TYPE_CHECKING:
    import pandas as pd

    from perfguard.baseline.record import Fingerprint, RunInfo, TestRecord
    from perfguard.compare.history import History

__all__ = [
    "VERSIONS",
    "check",
    "document",
    "history_document",
    "history_summary",
    "run_document",
    "runs_document",
]

#: the version of each kind this perfguard writes (and the newest it reads)
#: compare/2: its tests are results.json schema 3 entries (the figures in ``timing`` only)
VERSIONS = {
    "history": 1,
    "history-list": 1,
    "baseline-list": 1,
    "baseline-show": 1,
    "compare": 2,
    "bisect": 1,
}


def _plain(value: Any) -> Any:
    """``value`` as JSON takes it: numpy scalars unboxed, NaN/inf as None, containers deep."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def document(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as a ``kind`` document: ``schema`` first, every value JSON-safe."""
    if kind not in VERSIONS:
        raise ValueError(f"unknown document kind {kind!r}")
    return {"schema": f"perfguard.{kind}/{VERSIONS[kind]}", **_plain(body)}


def check(doc: Any, kind: str, source: str = "document") -> int:
    """The version of ``doc`` when it is a ``kind`` document this perfguard reads; else a
    one-line ReportError naming ``source``."""
    schema = doc.get("schema") if isinstance(doc, dict) else None
    prefix = f"perfguard.{kind}/"
    if not isinstance(schema, str) or not schema.startswith(prefix):
        raise ReportError(f"{source}: not a perfguard {kind} document (schema {schema!r})")
    try:
        version = int(schema[len(prefix) :])
    except ValueError:
        raise ReportError(f"{source}: bad schema {schema!r}") from None
    if version > VERSIONS[kind]:
        raise ReportError(
            f"{source}: {schema} is newer than this perfguard reads "
            f"(perfguard.{kind}/{VERSIONS[kind]}); upgrade perfguard"
        )
    return version


def _fingerprint(fp: Fingerprint | None) -> dict[str, Any] | None:
    return None if fp is None else fp.to_dict()


def _acceptance(a: Any) -> dict[str, Any]:
    return {
        "commit": str(a.commit),
        "reason": str(a.reason),
        "time": str(a.time),
        "author": None if a.author is None else str(a.author),
    }


def history_document(hist: History, accepted: Sequence[Any] = ()) -> dict[str, Any]:
    """One test's history (``perfguard history TEST --json``): every run's level and
    counters, the timing change points with the ops that moved, the counter steps and the
    acceptances on the line."""
    counters = hist.counters.set_index("run_id") if len(hist.counters) else None
    runs = []
    for r in hist.levels.itertuples(index=False):
        row: dict[str, Any] = {
            "run_id": r.run_id,
            "commit": r.commit,
            "time": str(r.time),
            "position": getattr(r, "position", None),
            "level_ns": r.value,
            "rounds": r.n_rounds,
            "counters": {},
            "machine": getattr(r, "machine", "") or None,
        }
        if counters is not None and r.run_id in counters.index:
            values = counters.loc[int(r.run_id)]  # type: ignore[arg-type]
            row["counters"] = {str(k): v for k, v in values.items() if v == v}
        runs.append(row)
    points = [
        {
            "index": cp.index,
            "run_id": cp.run_id,
            "commit": cp.commit,
            "kind": cp.kind,
            "change_pct": cp.change_pct,
            "before_ns": cp.before_ns,
            "after_ns": cp.after_ns,
            "z": cp.z,
            "ops": [
                {
                    "op_id": o.op_id,
                    "op_name": o.op_name,
                    "before_ns": o.before_ns,
                    "after_ns": o.after_ns,
                }
                for o in cp.ops
            ],
        }
        for cp in hist.change_points
    ]
    steps = [
        {
            "index": s.index,
            "run_id": s.run_id,
            "commit": s.commit,
            "counter": s.counter,
            "before": s.before,
            "after": s.after,
            "ops": [{"name": n, "before": b, "after": a} for n, b, a in s.ops],
        }
        for s in hist.counter_steps
    ]
    return document(
        "history",
        {
            "nodeid": hist.nodeid,
            "metric": hist.metric,
            "fingerprint": _fingerprint(hist.fingerprint),
            "runs_needed": hist.runs_needed,
            "runs": runs,
            "change_points": points,
            "counter_steps": steps,
            "acceptances": [_acceptance(a) for a in accepted],
        },
    )


def history_summary(hist: History, accepted: Sequence[Any] = ()) -> dict[str, Any]:
    """One test's line of ``perfguard history --json`` without TEST."""
    last = hist.change_points[-1] if hist.change_points else None
    step = hist.counter_steps[-1] if hist.counter_steps else None
    return _plain(
        {
            "nodeid": hist.nodeid,
            "metric": hist.metric,
            "runs": len(hist.levels),
            "latest_ns": float(hist.levels["value"].iloc[-1]) if len(hist.levels) else None,
            "change_points": len(hist.change_points),
            "counter_steps": len(hist.counter_steps),
            "last_change": None
            if last is None
            else {"commit": last.commit, "kind": last.kind, "change_pct": last.change_pct},
            "last_counter_step": None
            if step is None
            else {"commit": step.commit, "counter": step.counter},
            "acceptance": _acceptance(accepted[-1]) if accepted else None,
        }
    )


def runs_document(runs: pd.DataFrame, acceptances: pd.DataFrame) -> dict[str, Any]:
    """The store's runs and acceptances (``perfguard baseline list --json``)."""
    out = []
    keys = ("run_id", "commit", "branch", "dirty", "time", "perfguard_version")
    for r in runs.to_dict("records"):
        out.append(
            {
                **{k: r[k] for k in keys},
                "dirty": bool(r["dirty"]),
                "tests": r["n_tests"],
                "fingerprint": r["fingerprint"].to_dict(),
            }
        )
    accepted = [
        {"acceptance_id": a.acceptance_id, "nodeid": a.nodeid, **_acceptance(a)}
        for a in acceptances.itertuples(index=False)
    ]
    return document("baseline-list", {"runs": out, "acceptances": accepted})


def run_document(run_id: int, info: RunInfo, records: dict[str, TestRecord]) -> dict[str, Any]:
    """One run and each test's figures (``perfguard baseline show RUN --json``)."""
    import numpy as np

    tests = []
    for nodeid, rec in sorted(records.items()):
        values = rec.values()
        rounds = rec.round_values()
        counters = rec.counters
        whole = {}
        if len(counters):
            whole = counters.groupby("counter")["value"].sum().to_dict()
        tests.append(
            {
                "nodeid": nodeid,
                "metric": rec.metric,
                "samples": len(values),
                "median_ns": float(np.median(values)) if len(values) else None,
                "min_ns": float(values.min()) if len(values) else None,
                "rounds_ns": [float(v) for v in rounds],
                "ops": len(rec.ops),
                "counters": whole,
                "meta": rec.meta,
            }
        )
    return document("baseline-show", {"run_id": run_id, "run": info.to_dict(), "tests": tests})
