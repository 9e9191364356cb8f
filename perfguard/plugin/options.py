"""The plugin's command-line and ini options, and the one place their values are checked.

Every option lives in the ``perfguard`` group and is also an ini key of the
same name (``perfguard_backend = "torch"`` in ``[tool.pytest.ini_options]``).
A command-line value wins over the ini value, which wins over the default.
Values are checked in :func:`read_settings` (from ``pytest_configure``), so a
bad value from either source is the same one-line :class:`pytest.UsageError`.

Relative paths: a command-line path is relative to the directory pytest was
started in (as ``--junitxml``); an ini or default path to the rootdir, so
``baselines/perfguard.db`` is always the project's store.

This module is imported whenever the plugin loads: standard library and
pytest only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from perfguard.compare.tolerance import parse_tolerance

BACKEND_CHOICES = ("auto", "torch", "nsys", "cpu")
FAIL_ON_CHOICES = ("regression", "never")
DEFAULT_STORE = "baselines/perfguard.db"
DEFAULT_OUTPUT = ".perfguard"
DEFAULT_TOLERANCE = 0.05
#: seconds one nsys child run (one test) may take before it is stopped
DEFAULT_CAPTURE_TIMEOUT = 900.0


# (dest, flag, ini type, help); ini keys are the dest names
_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("perfguard", "--perfguard", "bool",
     "capture every gpuprofile test, compare it with the baseline, fail regressions"),
    ("perfguard_backend", "--perfguard-backend", "string",
     "capture backend: auto (nsys with a GPU, else the torch profiler), torch, nsys, "
     "or cpu (torch profiler, CPU activities only); default auto"),
    ("perfguard_baseline", "--perfguard-baseline", "string",
     "git ref whose nearest stored run is the baseline (default: merge base of HEAD with "
     "the default branch, else HEAD's first parent)"),
    ("perfguard_save", "--perfguard-save", "bool",
     "store this run's results under HEAD's commit"),
    ("perfguard_store", "--perfguard-store", "string",
     f"baseline store: a SQLite file (default {DEFAULT_STORE} under the rootdir) or a "
     "postgresql://user@host/dbname URL"),
    ("perfguard_output", "--perfguard-output", "string",
     f"folder for captures and results.json; default {DEFAULT_OUTPUT}/ under the rootdir"),
    ("perfguard_tolerance", "--perfguard-tolerance", "string",
     "slowdown of the median tolerated before a test regresses, e.g. 5% or 0.05 "
     "(a marker's tolerance= wins); default 5%"),
    ("perfguard_fail_on", "--perfguard-fail-on", "string",
     "regression (default): a regressed test fails; never: report only"),
)  # fmt: skip


_METAVARS = {
    "perfguard_backend": "{auto,torch,nsys,cpu}",
    "perfguard_baseline": "REF",
    "perfguard_store": "PATH_OR_URL",
    "perfguard_output": "DIR",
    "perfguard_tolerance": "TOLERANCE",
    "perfguard_fail_on": "{regression,never}",
}


def add_options(parser: pytest.Parser) -> None:
    """Register the ``perfguard`` option group and the matching ini keys."""
    group = parser.getgroup("perfguard", "perfguard: GPU performance regression checks")
    for dest, flag, ini_type, help_text in _OPTIONS:
        cli_help = help_text.replace("%", "%%")  # argparse %-formats option help
        if ini_type == "bool":
            group.addoption(flag, action="store_true", dest=dest, default=None, help=cli_help)
        else:
            metavar = _METAVARS[dest]
            group.addoption(flag, dest=dest, default=None, metavar=metavar, help=cli_help)
        parser.addini(dest, help_text, type=ini_type, default=None)  # type: ignore[arg-type]


def _choice(value: str, choices: tuple[str, ...], what: str) -> str:
    key = value.strip().lower()
    if key not in choices:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(choices)}")
    return key


@dataclass(frozen=True)
class Settings:
    """The session's checked option values (what ``results.json`` reports as ``settings``)."""

    enabled: bool
    backend: str
    baseline: str | None
    save: bool
    store: Path | str  # a SQLite file, or a postgresql:// URL
    output: Path
    tolerance: float
    fail_on: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["store"], d["output"] = str(self.store), str(self.output)
        return d


def _value(config: pytest.Config, dest: str) -> tuple[Any, str]:
    """The option's value and where it came from: ``cli``, ``ini`` or ``default``."""
    given = config.getoption(dest, default=None)
    if given is not None:
        return given, "cli"
    ini = config.getini(dest)
    if ini not in (None, "", []):
        return ini, "ini"
    return None, "default"


def _path(config: pytest.Config, dest: str, default: str) -> Path:
    value, source = _value(config, dest)
    if value is None:
        return (config.rootpath / default).resolve()
    text = str(value).strip()
    if not text:
        raise ValueError("must name a path, got an empty string")
    base = config.invocation_params.dir if source == "cli" else config.rootpath
    return (Path(base) / Path(text).expanduser()).resolve()


def _store(config: pytest.Config, dest: str, value: Any) -> Path | str:
    """A postgresql:// URL as given, else the store file's path."""
    if value is not None:
        from perfguard.baseline.db import is_url  # only when given: the plugin loads light

        if is_url(str(value).strip()):
            return str(value).strip()
    return _path(config, dest, DEFAULT_STORE)


def read_settings(config: pytest.Config) -> Settings:
    """Every option, checked. A bad value is a :class:`pytest.UsageError` naming the option."""
    current = "--perfguard"
    try:
        values = {}
        for dest, flag, ini_type, _ in _OPTIONS:
            current = flag
            value, _source = _value(config, dest)
            if ini_type == "bool":
                values[dest] = bool(value)
            elif dest == "perfguard_backend":
                values[dest] = _choice(str(value or "auto"), BACKEND_CHOICES, "backend")
            elif dest == "perfguard_fail_on":
                values[dest] = _choice(str(value or "regression"), FAIL_ON_CHOICES, "fail-on")
            elif dest == "perfguard_tolerance":
                values[dest] = (
                    DEFAULT_TOLERANCE if value is None else parse_tolerance(value, "tolerance")
                )
            elif dest == "perfguard_baseline":
                ref = None if value is None else str(value).strip()
                if ref is not None and (not ref or ref.startswith("-")):
                    raise ValueError(f"{value!r} is not a git ref")
                values[dest] = ref
            elif dest == "perfguard_store":
                values[dest] = _store(config, dest, value)
            elif dest == "perfguard_output":
                values[dest] = _path(config, dest, DEFAULT_OUTPUT)
    except ValueError as exc:
        raise pytest.UsageError(f"{current} (or ini {_dest(current)}): {exc}") from None
    return Settings(
        enabled=values["perfguard"],
        backend=values["perfguard_backend"],
        baseline=values["perfguard_baseline"],
        save=values["perfguard_save"],
        store=values["perfguard_store"],
        output=values["perfguard_output"],
        tolerance=values["perfguard_tolerance"],
        fail_on=values["perfguard_fail_on"],
    )


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
