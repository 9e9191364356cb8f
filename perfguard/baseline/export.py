"""The store's JSON export: runs and acceptances in one file meant for review in git.

Sorted keys, indented, one table row per line (a changed kernel or op is one
changed line that names it), runs ordered by time and no store-specific ids,
so re-exporting an unchanged store gives the same bytes. :func:`write_export`
writes one from a store's reader; :func:`read_export` parses one whole (a bad
file is one :class:`~perfguard.errors.BaselineError` naming it, before anything
is added) for :meth:`~perfguard.baseline.writer.Writer.import_file`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from perfguard import __version__
from perfguard.baseline.accept import Acceptances, plain_rows
from perfguard.baseline.db import one_line
from perfguard.baseline.frames import conform_frame
from perfguard.baseline.reader import FRAME_TABLES, Reader
from perfguard.baseline.record import METRICS, RunInfo, TestRecord
from perfguard.baseline.schema import SCHEMA_VERSION
from perfguard.errors import BaselineError

__all__ = ["EXPORT_FORMAT", "ExportedRun", "meta_json", "read_export", "write_export"]

#: ``format`` of the JSON files an export writes
EXPORT_FORMAT = "perfguard-baseline-export"
#: frames an export writes only when a record has rows (older exports stay byte-identical)
OPTIONAL_FRAMES = ("functions",)

#: a run read from an export: its info, records and the perfguard version that saved it
ExportedRun = tuple[RunInfo, list[TestRecord], str | None]


def meta_json(meta: dict[str, Any]) -> str:
    """A record's ``meta`` as the store keeps it (and an export, parsed back, shows it)."""
    # default=str: a marker setting that is a Path or an enum is kept as text, not refused
    return json.dumps(meta, sort_keys=True, default=str)


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


def _dumps(obj: Any, level: int = 0) -> str:
    """JSON with sorted keys, indented, but a table row (flat object) on one line."""
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(obj, dict) and obj and not all(_scalar(v) for v in obj.values()):
        items = [
            f"{inner}{json.dumps(str(k))}: {_dumps(v, level + 1)}" for k, v in sorted(obj.items())
        ]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list) and obj and not all(_scalar(v) for v in obj):
        items = [inner + _dumps(v, level + 1) for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(obj, sort_keys=True, allow_nan=False)


def write_export(
    reader: Reader,
    accepted: Acceptances,
    dest: str | os.PathLike[str],
    run_ids: Sequence[int] | None = None,
) -> int:
    """Write runs (default: all) and every acceptance to ``dest``; returns the run count."""
    if run_ids is None:
        run_ids = [int(i) for i in reader.runs()["run_id"]]
    exported: list[dict[str, Any]] = []
    for run_id in run_ids:
        info, records = reader.load_run(run_id)
        tests = {
            nodeid: {
                "metric": r.metric,
                "meta": json.loads(meta_json(r.meta)),
                **{
                    t: plain_rows(getattr(r, t))
                    for t in FRAME_TABLES
                    if t not in OPTIONAL_FRAMES or len(getattr(r, t))
                },
            }
            for nodeid, r in records.items()
        }
        version = reader.run_version(run_id)
        exported.append({"run": info.to_dict(), "perfguard_version": version, "tests": tests})
    exported.sort(
        key=lambda e: (e["run"]["time"], e["run"]["commit"], e["run"]["fingerprint"]["host"])
    )
    doc = {
        "format": EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "exported_by": f"perfguard {__version__}",
        "runs": exported,
    }
    rows = accepted.rows()
    if rows:  # only when there are some: older exports stay byte-identical
        doc["acceptances"] = rows
    text = _dumps(doc) + "\n"
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BaselineError(f"{dest}: cannot write the export: {exc.strerror or exc}") from None
    return len(exported)


def read_export(src: str | os.PathLike[str]) -> tuple[list[ExportedRun], list[dict[str, Any]]]:
    """The runs and acceptances of export ``src``; a file that cannot be imported
    (unreadable, not JSON, not an export, a newer schema, a malformed run) is one
    BaselineError naming it."""
    src = Path(src)
    try:
        doc = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(
            f"{src}: cannot read: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{src}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise BaselineError(f"{src}: not a perfguard baseline export")
    if not isinstance(doc.get("schema_version"), int) or doc["schema_version"] > SCHEMA_VERSION:
        raise BaselineError(
            f"{src}: export schema version {doc.get('schema_version')!r} is not one this "
            f"perfguard reads (<= {SCHEMA_VERSION})"
        )
    runs = doc.get("runs")
    if runs is not None and not isinstance(runs, list):
        raise BaselineError(f"{src}: 'runs' is not a list")
    parsed = [_parse_run(src, i, e) for i, e in enumerate(runs or [])]
    accepted = doc.get("acceptances") or []
    keys = ("nodeid", "commit", "reason", "time")
    if not isinstance(accepted, list) or not all(
        isinstance(a, dict) and all(isinstance(a.get(k), str) for k in keys) for a in accepted
    ):
        raise BaselineError(f"{src}: acceptances are malformed (each needs {', '.join(keys)})")
    return parsed, accepted


def _parse_run(src: Path, index: int, entry: Any) -> ExportedRun:
    try:
        info = RunInfo.from_dict(entry["run"])
        records = []
        for nodeid, t in sorted(entry.get("tests", {}).items()):
            frames = {
                name: conform_frame(name, pd.DataFrame.from_records(t.get(name) or []))
                for name in FRAME_TABLES
            }
            if t["metric"] not in METRICS:
                raise ValueError(f"unknown metric {t['metric']!r}")
            records.append(
                TestRecord(nodeid, t["metric"], meta=dict(t.get("meta") or {}), **frames)
            )
        return info, records, entry.get("perfguard_version")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(
            f"{src}: run #{index + 1} is malformed: {type(exc).__name__}: {one_line(exc)}"
        ) from None
