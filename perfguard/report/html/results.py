"""Read and check a session's ``results.json`` before anything renders it.

The pytest plugin writes the file and ``perfguard report`` re-renders it,
possibly months later and from a different perfguard version, so the
loader is strict about what a report needs (a schema it knows, a ``tests``
list whose entries have a ``nodeid`` and a known ``outcome``, numbers where
numbers belong) and lenient about the rest: every optional key gets a
default, so a file from a smaller plugin still renders. A bad file is one
:class:`~perfguard.errors.ReportError` line naming the file and the key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from perfguard.errors import ReportError

#: the ``schema`` value this perfguard reads
SCHEMA = 1
#: verdicts a test can carry, in the order reports list them
OUTCOMES = ("regressed", "improved", "unchanged", "new", "no-baseline", "incomparable")

_TEST_NUMBERS = (
    "n_current", "n_baseline", "median_current_ns", "median_baseline_ns", "delta_pct",
    "ci_low_pct", "ci_high_pct", "p_value", "tolerance_pct", "alpha",
)  # fmt: skip
_OP_NUMBERS = (
    "baseline_ns", "current_ns", "delta_pct", "ci_low_pct", "ci_high_pct", "p_value",
    "calls_baseline", "calls_current", "tc_util_baseline", "tc_util_current",
    "flop_eff_baseline", "flop_eff_current",
)  # fmt: skip
_OP_TEXTS = ("op_id", "op_name", "direction", "status")
_KERNEL_CHANGE_TEXTS = ("kind", "op_name", "kernel_name")
_FINDING_TEXTS = ("check", "severity", "problem", "evidence", "recommendation")
_FINGERPRINT_KEYS = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "perfguard", "backend",
                     "host", "python", "cpu")  # fmt: skip
_TEST_TEXTS = ("metric", "message", "capture", "backend", "error")


def load_results(path: str | Path) -> dict[str, Any]:
    """``results.json`` at ``path``, checked and with every optional key filled in.

    Raises :class:`ReportError` (``<path>: <problem>``) for a missing or
    unreadable file, invalid JSON, or content that is not perfguard results.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ReportError(f"{path}: is a directory, expected a results.json file") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a text file, expected results.json") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    return validate_results(data, source=str(path))


def validate_results(data: Any, source: str = "results") -> dict[str, Any]:
    """A checked copy of results ``data`` with defaults filled in; ``data`` is not changed.

    ``source`` names the file (or object) in error messages.
    """
    if not isinstance(data, dict):
        raise ReportError(f"{source}: not perfguard results (expected a JSON object)")
    if "schema" not in data or "tests" not in data:
        missing = "schema" if "schema" not in data else "tests"
        raise ReportError(f"{source}: not perfguard results (no {missing!r} key)")
    schema = data["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise ReportError(f"{source}: schema must be an integer, got {schema!r}")
    if schema > SCHEMA:
        raise ReportError(
            f"{source}: written by a newer perfguard (schema {schema}; this one reads "
            f"{SCHEMA}); upgrade perfguard to render it"
        )
    out = dict(data)  # every nested object below is copied as it is checked: data stays as is
    out["perfguard_version"] = _text(out.get("perfguard_version"), source, "perfguard_version")
    out["run"] = _run(out.get("run"), source, "run")
    baseline = out.get("baseline")
    if baseline is not None:
        _need(isinstance(baseline, dict), source, "baseline", "an object or null", baseline)
        baseline = dict(baseline)
        for key in ("ref", "commit", "run_id"):
            value = baseline.get(key)
            baseline[key] = None if value is None else str(value)
    out["baseline"] = baseline
    settings = out.get("settings") or {}
    _need(isinstance(settings, dict), source, "settings", "an object", settings)
    settings = dict(settings)
    for key in ("tolerance", "alpha"):
        settings[key] = _number(settings.get(key), source, f"settings.{key}")
    for key in ("fail_on", "backend"):
        value = settings.get(key)
        settings[key] = None if value is None else str(value)
    out["settings"] = settings
    notes = out.get("notes") or []
    notes = [notes] if isinstance(notes, str) else notes
    _need(isinstance(notes, list), source, "notes", "a list of strings", notes)
    out["notes"] = [str(n) for n in notes if n]
    tests = out["tests"]
    _need(isinstance(tests, list), source, "tests", "a list", tests)
    out["tests"] = [_test(t, source, f"tests[{i}]") for i, t in enumerate(tests)]
    counts = out.get("counts")
    derived = {o: 0 for o in OUTCOMES}
    for t in out["tests"]:
        derived[t["outcome"]] += 1
    if counts is None:
        counts = derived
    _need(isinstance(counts, dict), source, "counts", "an object", counts)
    out["counts"] = {
        o: int(_number(counts.get(o, 0), source, f"counts.{o}") or 0) for o in OUTCOMES
    }
    return out


def _need(ok: bool, source: str, where: str, expected: str, value: Any) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ReportError(f"{source}: {where}: expected {expected}, got {shown}")


def _number(value: Any, source: str, where: str) -> float | None:
    """A finite float, or None for null/NaN; anything else is an error."""
    if value is None:
        return None
    if type(value) is float:  # the common case, checked first: reports have 10^5 numbers
        return value if math.isfinite(value) else None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    _need(ok, source, where, "a number or null", value)
    value = float(value)
    return value if math.isfinite(value) else None


def _text(value: Any, source: str, where: str) -> str | None:
    if value is None:
        return None
    _need(isinstance(value, str | int | float), source, where, "a string", value)
    return str(value)


def _run(run: Any, source: str, where: str) -> dict[str, Any]:
    run = {} if run is None else run
    _need(isinstance(run, dict), source, where, "an object", run)
    run = dict(run)
    for key in ("commit", "branch", "time"):
        run[key] = _text(run.get(key), source, f"{where}.{key}")
    run["dirty"] = bool(run.get("dirty", False))
    fp = run.get("fingerprint") or {}
    _need(isinstance(fp, dict), source, f"{where}.fingerprint", "an object", fp)
    fp = {k: fp.get(k) for k in _FINGERPRINT_KEYS} | fp
    run["fingerprint"] = {
        k: (v if k == "gpu_count" else _text(v, source, f"{where}.fingerprint.{k}"))
        for k, v in fp.items()
    }
    return run


def _test(test: Any, source: str, where: str) -> dict[str, Any]:
    _need(isinstance(test, dict), source, where, "an object", test)
    test = dict(test)
    nodeid = test.get("nodeid")
    _need(isinstance(nodeid, str) and bool(nodeid), source, f"{where}.nodeid", "a string", nodeid)
    where = f"{where} ({nodeid})"
    outcome = test.get("outcome")
    if outcome not in OUTCOMES:
        raise ReportError(
            f"{source}: {where}: unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}"
        )
    for key in _TEST_NUMBERS:
        test[key] = _number(test.get(key), source, f"{where}.{key}")
    for key in _TEST_TEXTS:
        test[key] = _text(test.get(key), source, f"{where}.{key}")
    test["ops"] = _rows(test.get("ops"), source, f"{where}.ops", _OP_TEXTS, _OP_NUMBERS)
    test["kernel_changes"] = _rows(
        test.get("kernel_changes"), source, f"{where}.kernel_changes", _KERNEL_CHANGE_TEXTS, ()
    )
    for row in test["kernel_changes"]:  # before/after: a count, a flag or a name, shown as text
        row.setdefault("baseline", None)
        row.setdefault("current", None)
    test["findings"] = _rows(test.get("findings"), source, f"{where}.findings", _FINDING_TEXTS, ())
    test["history"] = _rows(
        test.get("history"), source, f"{where}.history", ("commit", "time"), ("median_ns",)
    )
    for key in ("samples_current", "samples_baseline"):
        values = test.get(key) or []
        _need(isinstance(values, list), source, f"{where}.{key}", "a list", values)
        if not all(type(x) is float or type(x) is int for x in values):
            for i, x in enumerate(values):
                _number(x, source, f"{where}.{key}[{i}]")  # raises on the first bad one
        test[key] = [float(x) for x in values if x is not None and math.isfinite(x)]
    return test


def _rows(
    rows: Any, source: str, where: str, texts: tuple[str, ...], numbers: tuple[str, ...]
) -> list[dict[str, Any]]:
    rows = [] if rows is None else rows
    _need(isinstance(rows, list), source, where, "a list", rows)
    out = []
    for i, row in enumerate(rows):
        _need(isinstance(row, dict), source, f"{where}[{i}]", "an object", row)
        row = dict(row)
        for key in texts:
            value = row.get(key)
            if value is not None and type(value) is not str:  # the location is built on error only
                row[key] = _text(value, source, f"{where}[{i}].{key}")
            else:
                row[key] = value
        for key in numbers:
            value = row.get(key)
            if value is not None and (type(value) is not float or not math.isfinite(value)):
                value = _number(value, source, f"{where}[{i}].{key}")
            row[key] = value
        out.append(row)
    return out
