"""pytest-benchmark's saved runs as stored runs: a team's history before perfguard.

``pytest --benchmark-autosave`` (or ``--benchmark-save=NAME``) writes one JSON file per
session, ``.benchmarks/<machine>/NNNN_<commit>_<time>.json``: ``machine_info``,
``commit_info`` (``id``, ``branch``, ``dirty``), ``datetime`` (when the session ran) and
``benchmarks``, each with its ``fullname`` (pytest's node id) and ``stats`` (seconds per
call: ``min``, ``median``, ``mean``, ...; ``data``, the time of every round, only with
``--benchmark-save-data``). Each file becomes one run of its commit with a ``wall_time``
record per benchmark, so ``perfguard history`` shows the team's history with its change
points.

How a record holds what the file has, and no more:

* with ``data``: one sample per pytest-benchmark round, each its own round (a round's
  value is its time per call), so a run's level (the geometric mean of its rounds) is
  pytest-benchmark's median; past :data:`MAX_ROUNDS` rounds (a 1 µs function gets 100,000)
  the data's :data:`MAX_ROUNDS` evenly spaced quantiles stand in for them, which keeps the
  median and the spread while the store stays small;
* without it: one sample, the ``median``, and the other figures in the record's meta.

The runs' machine is the file's (host, CPU model, Python) with the backend
``pytest-benchmark``: pytest-benchmark times a calibrated number of calls per round,
without waiting for a GPU, so its figures never stand as a baseline for perfguard's
measurements of the same test (their fingerprints are incompatible), and its runs read as
their own machine in ``history``. A run already stored (same commit, time and host) is
skipped, so importing a folder again adds only the new files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.baseline.frames import conform_frame
from perfguard.baseline.record import (
    COUNTER_COLUMNS,
    IMPORTED_BACKENDS,
    KERNEL_COLUMNS,
    OP_COLUMNS,
    OP_SAMPLE_COLUMNS,
    Fingerprint,
    RunInfo,
    TestRecord,
    empty_frame,
)
from perfguard.baseline.store import Store
from perfguard.baseline.writer import Imported
from perfguard.errors import BaselineError

#: the backend of an imported run's fingerprint (never compatible with perfguard's own)
SOURCE = IMPORTED_BACKENDS[0]
#: rounds kept per benchmark; more are summarised by this many quantiles
MAX_ROUNDS = 1000
#: the figures of ``stats`` kept in the record's meta (seconds, as pytest-benchmark writes)
STATS_KEPT = (
    "min",
    "max",
    "mean",
    "stddev",
    "median",
    "iqr",
    "q1",
    "q3",
    "rounds",
    "iterations",
    "ops",
    "total",
)
#: commit ids pytest-benchmark writes when the project is not in git
_NO_COMMIT = {"", "unversioned", "unknown"}


@dataclass(frozen=True)
class BenchmarkRun:
    """One saved pytest-benchmark session, as the run it is stored as."""

    path: Path
    run: RunInfo
    records: list[TestRecord]
    #: benchmarks whose every round the file holds (``--benchmark-save-data``)
    with_data: int = 0
    #: benchmarks whose rounds were summarised by :data:`MAX_ROUNDS` quantiles
    summarised: int = 0


@dataclass(frozen=True)
class FileImport:
    """What importing one file did: the run added (or found), or why it was skipped."""

    path: Path
    imported: Imported | None = None
    run: BenchmarkRun | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def is_benchmark_path(path: str | Path) -> bool:
    """Whether ``path`` is pytest-benchmark's: a folder (``.benchmarks/``), or a JSON file
    with its ``machine_info`` and ``benchmarks`` (a perfguard export has neither)."""
    path = Path(path)
    if path.is_dir():
        return True
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and "machine_info" in doc and "benchmarks" in doc


def benchmark_files(path: str | Path) -> list[Path]:
    """The JSON files of a folder (``.benchmarks/<machine>/*.json``, any depth), in name
    order (pytest-benchmark numbers them), or the one file given."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    return sorted(
        (p for p in path.rglob("*.json") if p.is_file()),
        key=lambda p: (p.parent.as_posix(), p.name),
    )


def read_benchmark_run(path: str | Path) -> BenchmarkRun:
    """The run a saved file stands for; :class:`BaselineError` (one line naming the file)
    when it is not a pytest-benchmark save or records no git commit."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise BaselineError(f"{path}: cannot read: {why}") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise BaselineError(f"{path}: not a pytest-benchmark save (no 'benchmarks' list)")
    commit = _mapping(doc.get("commit_info"))
    sha = str(commit.get("id") or "").strip()
    if sha.lower() in _NO_COMMIT or commit.get("error"):
        why = commit.get("error") or "no commit id"
        raise BaselineError(f"{path}: records no git commit ({why}): nothing to store it under")
    where = "the session"
    try:
        run = RunInfo(
            commit=sha,
            branch=str(commit["branch"]) if commit.get("branch") else None,
            dirty=bool(commit.get("dirty", False)),
            time=_utc(str(doc["datetime"])),
            fingerprint=_fingerprint(doc.get("machine_info") or {}),
        )
        records, with_data, summarised = [], 0, 0
        for i, bench in enumerate(doc["benchmarks"]):
            where = f"benchmark #{i + 1}"
            record, data, folded = _record(bench, path.name, str(doc.get("version") or ""))
            records.append(record)
            with_data += data
            summarised += folded
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(
            f"{path}: {where} is malformed: {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None
    nodeids = [r.nodeid for r in records]
    if len(set(nodeids)) != len(nodeids):
        dup = next(n for n in nodeids if nodeids.count(n) > 1)
        raise BaselineError(f"{path}: two benchmarks named {dup!r}")
    return BenchmarkRun(path, run, records, with_data, summarised)


def import_benchmarks(store: Store, path: str | Path) -> list[FileImport]:
    """Import every save at ``path`` (a file or a folder), one transaction per file; a file
    that cannot be read is a :class:`FileImport` with its ``error``, the others go on."""
    out = []
    for file in benchmark_files(path):
        try:
            run = read_benchmark_run(file)
        except BaselineError as exc:
            out.append(FileImport(file, error=str(exc)))
            continue
        out.append(FileImport(file, store.writer.add_runs([(run.run, run.records)]), run))
    return out


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _utc(text: str) -> str:
    """pytest-benchmark's ``datetime`` as perfguard writes a run's time (ISO 8601, UTC)."""
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat()


def _fingerprint(info: dict[str, Any]) -> Fingerprint:
    """The machine of the file (``machine_info``), as a fingerprint of its own backend."""
    cpu = _mapping(info.get("cpu"))
    brand = str(cpu.get("brand_raw") or info.get("processor") or info.get("machine") or "")
    return Fingerprint(
        gpu_name="",
        gpu_count=0,
        backend=SOURCE,
        host=str(info.get("node") or ""),
        python=str(info.get("python_version") or ""),
        cpu=brand,
    )


def _record(bench: dict[str, Any], file: str, version: str) -> tuple[TestRecord, int, int]:
    """One benchmark's wall-time record, and whether it had its rounds' data / summarised
    them (module docstring)."""
    stats = bench["stats"]
    nodeid = str(bench["fullname"])
    data = stats.get("data")
    folded = False
    if isinstance(data, list) and data:
        seconds = np.asarray(data, dtype=np.float64)
        if len(seconds) > MAX_ROUNDS:
            seconds = np.quantile(seconds, np.linspace(0.0, 1.0, MAX_ROUNDS))
            folded = True
        how = f"{len(data)} rounds" + (f" as {MAX_ROUNDS} quantiles" if folded else "")
    else:
        seconds = np.asarray([float(stats["median"])])
        how = f"median of {int(stats['rounds'])} rounds (saved without --benchmark-save-data)"
    if not np.isfinite(seconds).all() or (seconds < 0).any():
        raise ValueError(f"{nodeid}: times must be finite and >= 0")
    ns = np.rint(seconds * 1e9).astype(np.int64)
    n = len(ns)
    samples = pd.DataFrame(
        {
            "iteration": np.arange(n, dtype=np.int64),
            "gpu_time_ns": np.zeros(n, dtype=np.int64),
            "wall_time_ns": ns,
            "cpu_time_ns": pd.array([pd.NA] * n, dtype="Int64"),
            "round": np.arange(n, dtype=np.int64),
            "profiled": np.zeros(n, dtype=bool),
        }
    )
    meta = {
        "source": SOURCE,
        "file": file,
        "note": f"imported from pytest-benchmark {version} ({file}): {how}, time per call",
        "pytest_benchmark": {
            "stats": {k: stats[k] for k in STATS_KEPT if k in stats},
            "group": bench.get("group"),
            "param": bench.get("param"),
            "extra_info": bench.get("extra_info") or {},
            "options": bench.get("options") or {},
        },
    }
    record = TestRecord(
        nodeid,
        "wall_time",
        samples=conform_frame("samples", samples),
        op_samples=empty_frame(OP_SAMPLE_COLUMNS),
        ops=empty_frame(OP_COLUMNS),
        kernels=empty_frame(KERNEL_COLUMNS),
        meta=meta,
        counters=empty_frame(COUNTER_COLUMNS),
    )
    return record, int(isinstance(data, list) and bool(data)), int(folded)
