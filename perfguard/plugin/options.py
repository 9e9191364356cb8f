"""The plugin's command-line and ini options, and the one place their values are checked.

Every option lives in the ``perfguard`` group and is also an ini key of the
same name (``perfguard_backend = "torch"`` in ``[tool.pytest.ini_options]``).
A command-line value wins over the ini value, which wins over the default.
Values are checked in :func:`read_settings` (from ``pytest_configure``), so a
bad value from either source is the same one-line :class:`pytest.UsageError`.

Relative paths: a command-line path is relative to the directory pytest was
started in (as ``--junitxml``); an ini path to the rootdir and a default path
to the project root (:func:`project_root`: the rootdir, unless pytest put it
outside the tests' git repository), so ``baselines/perfguard.db`` is always
the project's store.

This module is imported whenever the plugin loads: standard library and
pytest only.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from perfguard.compare.tolerance import TOLERANCE, parse_tolerance
from perfguard.environment import parse_across
from perfguard.plugin.shards import ci_run_group, parse_shard

BACKEND_CHOICES = ("auto", "torch", "nsys", "cpu")
FAIL_ON_CHOICES = ("regression", "never")
#: replace: a save supersedes the records of earlier runs of the same commit and machine
#: fingerprint (one run per commit and machine); append: keep them all
SAVE_MODE_CHOICES = ("replace", "append")
#: how A/B and isolation children start: fork (from a warm server, plugin/forkserver.py)
#: or spawn (a fresh interpreter each)
CHILDREN_CHOICES = ("fork", "spawn")
AB_CHILDREN_CHOICES = ("pair", "separate")
#: metrics a whole session can add to every measured test (the marker's ``metrics=`` per test)
METRIC_CHOICES = ("instructions",)
DEFAULT_STORE = "baselines/perfguard.db"
DEFAULT_OUTPUT = ".perfguard"
#: rounds of a test's loop per session (store mode): enough for a spread and a
#: t interval, few enough that a CI run stays practical
DEFAULT_ROUNDS = 5
#: A/B mode: pairs (base, head) measured before any auto-sampling: with pair children
#: and the trimmed-mean judge, 8 pairs caught +5 % in 49 of 50 idle model-sessions of five
#: small models (benchmarks/README.md, "A/B sensitivity per test"); after the first (which
#: profiles), a pair child of a small test takes a few seconds
DEFAULT_AB_PAIRS = 8
#: A/B mode: at most this many pairs when sampling on until the change is resolved
MAX_AB_PAIRS = 20
#: A/B mode: seconds of more pairs while a test's change is unresolved (its interval wider
#: than the tolerance): by default, since how many pairs a test needs depends on the test
#: (benchmarks/README.md, "A/B sensitivity per test")
DEFAULT_AB_BUDGET = 60.0
#: A/B mode: timing rounds each child process runs; a child's value is their median. Its
#: start (python, torch, pytest: seconds) dwarfs a round, so extra rounds are nearly free
#: and cut the within-process noise of the value the pair is judged on
AB_CHILD_ROUNDS = 3
#: store mode: seconds a session may spend measuring suspect timings again A/B against
#: their baseline commit (perfguard.plugin.confirm); 0 turns confirmation off
DEFAULT_CONFIRM_BUDGET = 120.0
#: the confirmation budget's default for every session started in this environment (a CI
#: job's, or a test suite's own pytester sessions); the option and ini key win over it
CONFIRM_BUDGET_ENV = "PERFGUARD_CONFIRM_BUDGET"
#: seconds one nsys child run (one test) may take before it is stopped
DEFAULT_CAPTURE_TIMEOUT = 900.0


# (dest, flag, ini type, help); ini keys are the dest names
_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "perfguard",
        "--perfguard",
        "bool",
        "capture every gpuprofile test, compare it with the baseline, fail regressions",
    ),
    (
        "perfguard_backend",
        "--perfguard-backend",
        "string",
        "capture backend: auto (nsys with a GPU, else the torch profiler), torch, nsys, "
        "or cpu (torch profiler, CPU activities only); default auto",
    ),
    (
        "perfguard_baseline",
        "--perfguard-baseline",
        "string",
        "git ref whose nearest stored run is the baseline (default: merge base of HEAD with "
        "the default branch, else HEAD's first parent)",
    ),
    ("perfguard_save", "--perfguard-save", "bool", "store this run's results under HEAD's commit"),
    (
        "perfguard_save_mode",
        "--perfguard-save-mode",
        "string",
        "replace (default): a save replaces the tests' records of an earlier run of the same "
        "commit on the same machine (one run per commit and machine); append: keep both",
    ),
    (
        "perfguard_store",
        "--perfguard-store",
        "string",
        f"baseline store: a SQLite file (default {DEFAULT_STORE} under the rootdir) or a "
        "postgresql://user@host/dbname URL",
    ),
    (
        "perfguard_output",
        "--perfguard-output",
        "string",
        f"folder for captures and results.json; default {DEFAULT_OUTPUT}/ under the rootdir",
    ),
    (
        "perfguard_tolerance",
        "--perfguard-tolerance",
        "string",
        "slowdown of the median tolerated before a test regresses, e.g. 5% or 0.05 "
        "(a marker's tolerance= wins); default 5%",
    ),
    (
        "perfguard_fail_on",
        "--perfguard-fail-on",
        "string",
        "regression (default): a regressed test fails; never: report only",
    ),
    (
        "perfguard_isolate",
        "--perfguard-isolate",
        "bool",
        "run each measured test in a fresh child process: a crash, os._exit or an "
        "out-of-memory kill loses that test only (reported as crashed)",
    ),
    (
        "perfguard_timeout",
        "--perfguard-timeout",
        "string",
        f"seconds a measured test may run in its child process (isolation, nsys, A/B rounds) "
        f"before it is stopped and reported as crashed; default {DEFAULT_CAPTURE_TIMEOUT:g}",
    ),
    (
        "perfguard_require_baseline",
        "--perfguard-require-baseline",
        "bool",
        "fail the run when no test was compared with anything (no store, no baseline run)",
    ),
    (
        "perfguard_benchmarks",
        "--perfguard-benchmarks",
        "bool",
        "also measure every test that uses pytest-benchmark's benchmark fixture (marked "
        "gpuprofile or not): the benchmarked function is the loop's step",
    ),
    (
        "perfguard_rounds",
        "--perfguard-rounds",
        "string",
        f"rounds of each test's iteration loop (the verdict's replicates; a marker's rounds= "
        f"wins); default {DEFAULT_ROUNDS}",
    ),
    (
        "perfguard_against",
        "--perfguard-against",
        "string",
        "A/B mode: check REF out into a git worktree and run the marked tests of both trees "
        "in alternating rounds on this machine, judging the paired differences",
    ),
    (
        "perfguard_ab_pairs",
        "--perfguard-ab-pairs",
        "string",
        f"A/B mode: pairs of rounds measured first (default {DEFAULT_AB_PAIRS})",
    ),
    (
        "perfguard_ab_budget",
        "--perfguard-ab-budget",
        "string",
        f"A/B mode: seconds to keep adding pairs (up to {MAX_AB_PAIRS}) while a test's change "
        f"is unresolved (its interval wider than the tolerance); default {DEFAULT_AB_BUDGET:g}, "
        "0: no auto-sampling",
    ),
    (
        "perfguard_confirm_budget",
        "--perfguard-confirm-budget",
        "string",
        "store mode: seconds the session may spend measuring a test whose timing reads "
        "regressed, noisy or improved again, A/B against its baseline commit on this machine "
        f"(a timing regression fails only when that confirms it); default "
        f"{DEFAULT_CONFIRM_BUDGET:g}, 0: off",
    ),
    (
        "perfguard_metric",
        "--perfguard-metric",
        "string",
        "instructions: also count each measured test's host instructions under Valgrind's "
        "Callgrind (one child for the session) and gate them (default budget 0.15%); "
        "set it as the ini key in pyproject.toml to opt a CPU-only runner in",
    ),
    (
        "perfguard_compare_across",
        "--perfguard-compare-across",
        "args",
        "compare runs whose environment differs in this group anyway, the difference listed "
        "with the verdict: driver, clocks, power_limit, ecc, mig, cpu_quota or all (repeat "
        "the option or give a comma list)",
    ),
    (
        "perfguard_instructions_env",
        "--perfguard-instructions-env",
        "string",
        "instructions: more environment variables the Callgrind child passes on (names or "
        "fnmatch patterns, comma- or space-separated, e.g. 'MYAPP_*'); it passes only paths, "
        "locale and framework settings, so a CI run's own variables cannot move the counts",
    ),
    (
        "perfguard_ab_children",
        "--perfguard-ab-children",
        "string",
        "A/B mode: pair (default: each pair is one child process running both trees' tests, "
        "their timed steps in turn, so the two share the process and every slow spell) or "
        "separate (a child per tree per pair, in ABBA order)",
    ),
    (
        "perfguard_children",
        "--perfguard-children",
        "string",
        "how A/B rounds and isolated tests start their child process: fork (default: from a "
        "warm server that imported the session's libraries once, never the trees' code) or "
        "spawn (a fresh interpreter each, seconds slower)",
    ),
    (
        "perfguard_shard",
        "--perfguard-shard",
        "string",
        "K/N: run the K-th (1-based) of N parts of the measured tests, balanced by their "
        "stored durations (by count without them); tests perfguard does not measure run in "
        "shard 1 only; merge the jobs' results with perfguard merge",
    ),
    (
        "perfguard_changed",
        "--perfguard-changed",
        "bool",
        "store mode, off the default branch: skip a benchmark when nothing it executes (its "
        "test file, conftests, the project modules they import, the files they name) changed "
        "since the baseline commit and the environment is the same; it carries its verdict "
        "there as not run; anything perfguard cannot rule out runs",
    ),
    (
        "perfguard_run_group",
        "--perfguard-run-group",
        "string",
        "the CI run this job belongs to: the saves of its jobs (same commit and machine kind) "
        "are one stored run; default from the CI's run id (GITHUB_RUN_ID, CI_PIPELINE_ID, "
        "...), none outside CI",
    ),
)


_METAVARS = {
    "perfguard_backend": "{auto,torch,nsys,cpu}",
    "perfguard_baseline": "REF",
    "perfguard_store": "PATH_OR_URL",
    "perfguard_output": "DIR",
    "perfguard_tolerance": "TOLERANCE",
    "perfguard_fail_on": "{regression,never}",
    "perfguard_save_mode": "{replace,append}",
    "perfguard_rounds": "N",
    "perfguard_timeout": "SECONDS",
    "perfguard_against": "REF",
    "perfguard_ab_pairs": "N",
    "perfguard_ab_budget": "SECONDS",
    "perfguard_confirm_budget": "SECONDS",
    "perfguard_children": "{fork,spawn}",
    "perfguard_ab_children": "{pair,separate}",
    "perfguard_metric": "{instructions}",
    "perfguard_compare_across": "GROUP[,GROUP]",
    "perfguard_instructions_env": "PATTERNS",
    "perfguard_shard": "K/N",
    "perfguard_run_group": "ID",
}


def add_options(parser: pytest.Parser) -> None:
    """Register the ``perfguard`` option group and the matching ini keys."""
    group = parser.getgroup("perfguard", "perfguard: GPU performance regression checks")
    for dest, flag, ini_type, help_text in _OPTIONS:
        cli_help = help_text.replace("%", "%%")  # argparse %-formats option help
        if ini_type == "bool":
            group.addoption(flag, action="store_true", dest=dest, default=None, help=cli_help)
        elif ini_type == "args":  # repeatable
            group.addoption(
                flag,
                action="append",
                dest=dest,
                default=None,
                metavar=_METAVARS[dest],
                help=cli_help,
            )
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
    rounds: int | None = None  # None: the marker's, else DEFAULT_ROUNDS
    against: str | None = None
    ab_pairs: int = DEFAULT_AB_PAIRS
    ab_budget: float = DEFAULT_AB_BUDGET
    confirm_budget: float = DEFAULT_CONFIRM_BUDGET
    isolate: bool = False
    timeout: float = DEFAULT_CAPTURE_TIMEOUT
    require_baseline: bool = False
    #: every test using pytest-benchmark's ``benchmark`` fixture is measured too
    benchmarks: bool = False
    save_mode: str = "replace"
    children: str = "fork"
    ab_children: str = "pair"  # A/B: one child per pair (both trees in turn) or per side
    metric: str | None = None  # "instructions": every measured test counts them too
    #: environment groups compared across anyway (perfguard.environment.GROUPS, or "all")
    compare_across: tuple[str, ...] = ()
    #: environment variables (fnmatch patterns) the Callgrind child passes on besides its own
    instructions_env: tuple[str, ...] = ()
    #: "K/N": this job runs the K-th of N parts of the measured tests (plugin/shards.py)
    shard: str | None = None
    #: the CI run whose jobs save into one stored run (None: a run of its own)
    run_group: str | None = None
    #: skip the benchmarks nothing changed under since the baseline (plugin/changed.py)
    changed: bool = False

    @property
    def shard_part(self) -> tuple[int, int] | None:
        """``shard`` as (K, N)."""
        return None if self.shard is None else parse_shard(self.shard)

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


def _git_top(path: Path) -> Path | None:
    """The top of the git work tree holding ``path`` (a ``.git`` folder or worktree file)."""
    for folder in (path, *path.parents):
        if (folder / ".git").exists():
            return folder
    return None


def project_root(config: pytest.Config) -> tuple[Path, str | None]:
    """The project's root for perfguard: the git state it reads and where the default
    store and output go. pytest's rootdir, unless the tests lie in a git repository
    that does not hold it (a ``--rootdir`` given outside it; ``--perfguard-output
    /elsewhere`` with a space made it a parent folder, and is refused now:
    :func:`check_spaced_values`). Then the tests' repository root, and a note saying so.
    (Stdlib only: a ``.git`` entry marks a work tree.)
    """
    root = config.rootpath.resolve()
    first = str(config.args[0]).split("::", 1)[0] if config.args else "."
    tests = (Path(config.invocation_params.dir) / first).resolve()
    top = _git_top(tests if tests.is_dir() else tests.parent)
    if top is None or top == root or top in root.parents:
        return root, None
    return top, (
        f"pytest's rootdir {root} is outside the git repository of the tests ({top}): "
        f"perfguard reads that repository and keeps its default store and output there "
        f"(pass --rootdir={top}, or --perfguard-output=DIR with '=', to move the rootdir too)"
    )


def _path(config: pytest.Config, dest: str, default: str) -> Path:
    value, source = _value(config, dest)
    if value is None:
        return (project_root(config)[0] / default).resolve()
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
        values: dict[str, Any] = {}
        for dest, flag, ini_type, _ in _OPTIONS:
            current = flag
            value, _source = _value(config, dest)
            if ini_type == "bool":
                values[dest] = bool(value)
            elif dest == "perfguard_backend":
                values[dest] = _choice(str(value or "auto"), BACKEND_CHOICES, "backend")
            elif dest == "perfguard_save_mode":
                values[dest] = _choice(str(value or "replace"), SAVE_MODE_CHOICES, "save mode")
            elif dest == "perfguard_metric":
                values[dest] = None if not value else _choice(str(value), METRIC_CHOICES, "metric")
            elif dest == "perfguard_instructions_env":
                values[dest] = tuple(str(value or "").replace(",", " ").split())
            elif dest == "perfguard_ab_children":
                values[dest] = _choice(str(value or "pair"), AB_CHILDREN_CHOICES, "A/B children")
            elif dest == "perfguard_children":
                values[dest] = _choice(str(value or "fork"), CHILDREN_CHOICES, "children")
            elif dest == "perfguard_fail_on":
                values[dest] = _choice(str(value or "regression"), FAIL_ON_CHOICES, "fail-on")
            elif dest == "perfguard_tolerance":
                values[dest] = TOLERANCE if value is None else parse_tolerance(value, "tolerance")
            elif dest == "perfguard_baseline":
                ref = None if value is None else str(value).strip()
                if ref is not None and (not ref or ref.startswith("-")):
                    raise ValueError(f"{value!r} is not a git ref")
                values[dest] = ref
            elif dest == "perfguard_store":
                values[dest] = _store(config, dest, value)
            elif dest == "perfguard_output":
                values[dest] = _path(config, dest, DEFAULT_OUTPUT)
            elif dest in ("perfguard_rounds", "perfguard_ab_pairs"):
                values[dest] = None if value is None else _count(value, 3 if "ab" in dest else 1)
            elif dest == "perfguard_ab_budget":
                values[dest] = DEFAULT_AB_BUDGET if value is None else _seconds(value)
            elif dest == "perfguard_confirm_budget":
                value = os.environ.get(CONFIRM_BUDGET_ENV) if value is None else value
                values[dest] = DEFAULT_CONFIRM_BUDGET if value is None else _seconds(value)
            elif dest == "perfguard_timeout":
                values[dest] = DEFAULT_CAPTURE_TIMEOUT if value is None else _seconds(value)
                if values[dest] <= 0:
                    raise ValueError("must be a positive number of seconds")
            elif dest == "perfguard_compare_across":
                values[dest] = tuple(sorted(parse_across(value or ())))
            elif dest == "perfguard_shard":
                values[dest] = None if value is None else "{}/{}".format(*parse_shard(value))
            elif dest == "perfguard_run_group":
                group = ci_run_group(os.environ) if value is None else str(value).strip()
                values[dest] = group or None
            elif dest == "perfguard_against":
                ref = None if value is None else str(value).strip()
                if ref is not None and (not ref or ref.startswith("-")):
                    raise ValueError(f"{value!r} is not a git ref")
                values[dest] = ref
    except ValueError as exc:
        raise pytest.UsageError(f"{current} (or ini {_dest(current)}): {exc}") from None
    # asking to save, to compare against a commit or to isolate means asking to measure
    enabled = values["perfguard"] or values["perfguard_save"] or bool(values["perfguard_against"])
    return Settings(
        enabled=enabled,
        backend=values["perfguard_backend"],
        baseline=values["perfguard_baseline"],
        save=values["perfguard_save"],
        store=values["perfguard_store"],
        output=values["perfguard_output"],
        tolerance=values["perfguard_tolerance"],
        fail_on=values["perfguard_fail_on"],
        rounds=values["perfguard_rounds"],
        against=values["perfguard_against"],
        ab_pairs=values["perfguard_ab_pairs"] or DEFAULT_AB_PAIRS,
        ab_budget=values["perfguard_ab_budget"],
        confirm_budget=values["perfguard_confirm_budget"],
        isolate=values["perfguard_isolate"],
        timeout=values["perfguard_timeout"],
        require_baseline=values["perfguard_require_baseline"],
        benchmarks=values["perfguard_benchmarks"],
        save_mode=values["perfguard_save_mode"],
        children=values["perfguard_children"],
        ab_children=values["perfguard_ab_children"],
        metric=values["perfguard_metric"],
        compare_across=values["perfguard_compare_across"],
        instructions_env=values["perfguard_instructions_env"],
        shard=values["perfguard_shard"],
        run_group=values["perfguard_run_group"],
        changed=values["perfguard_changed"],
    )


def _count(value: Any, minimum: int) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None
    if n < minimum:
        raise ValueError(f"must be at least {minimum}, got {n}")
    return n


def _seconds(value: Any) -> float:
    try:
        s = float(str(value).strip().rstrip("s"))
    except ValueError:
        raise ValueError(f"{value!r} is not a number of seconds") from None
    if not s >= 0 or s == float("inf"):
        raise ValueError(f"must be a finite number of seconds >= 0, got {value!r}")
    return s


#: the options given a value (``--perfguard-store PATH``); the rest are flags
_VALUED = frozenset(flag for _, flag, kind, _ in _OPTIONS if kind != "bool")
#: options whose value is a path: written apart, a path among pytest's own moves its rootdir
_PATHS = frozenset({"--perfguard-store", "--perfguard-output"})


def check_spaced_values(config: pytest.Config) -> None:
    """Refuse, in one line, an option value written apart from its option where pytest took
    it for one of its paths when choosing the rootdir and ini file.

    pytest picks its rootdir and ini file from its positional arguments before it loads any
    plugin, so ``--perfguard-store /elsewhere/s.db`` (a space, not ``=``) is then one of its
    paths: the rootdir becomes a common parent of the project and that folder and the
    project's pytest.ini is not read (its ``pythonpath``, ``addopts``, ``testpaths``: the
    collection fails with ModuleNotFoundError, or measures another project). No plugin can
    undo that (pytest has applied the wrong ini by the time one loads), so such a session
    stops here and says to write ``--perfguard-store=PATH``. Where the value did not move
    them (a path inside the project, a git ref) the spaced form works as it always did.
    Called from ``pytest_load_initial_conftests`` (before the project's conftests are
    imported) and again from ``pytest_configure`` (the plugin loaded by a conftest).
    """
    args = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    args += [str(a) for a in config.invocation_params.args]
    spaced = [(a, args[i + 1]) for i, a in enumerate(args[:-1]) if a in _VALUED]
    if not spaced:
        return
    chosen = _setup_without_values(config)
    if chosen == (config.rootpath, config.inipath):
        return
    if chosen is None:  # this pytest's setup cannot be recomputed: refuse the paths only
        spaced = [(a, v) for a, v in spaced if a in _PATHS]
        if not spaced:
            return
        why = "which can move them away from the project's"
    else:
        root, ini = chosen
        why = (
            f"so its rootdir is {config.rootpath}, not {root}, and its ini file "
            f"{config.inipath or 'none'}, not {ini or 'none'}"
        )
    flag, value = min(spaced, key=lambda given: given[0] not in _PATHS)  # a path, if any
    raise pytest.UsageError(
        f"{flag} {value}: written with a space, pytest counted {value} among its paths when "
        f"it chose its rootdir and ini file (before perfguard's options are known), {why}; "
        f"write {flag}={value}"
    )


def _setup_without_values(config: pytest.Config) -> tuple[Path, Path | None] | None:
    """The rootdir and ini file pytest would have chosen from its arguments as parsed with
    every plugin's options (the values no longer among its paths); None where this pytest's
    internals differ from pytest 7.4-9's ``determine_setup``."""
    import inspect

    try:
        from _pytest.config.findpaths import determine_setup

        ns = config.known_args_namespace
        given: dict[str, Any] = {
            "inifile": ns.inifilename,
            "override_ini": ns.override_ini,
            "args": [str(a) for a in ns.file_or_dir],
            "rootdir_cmd_arg": ns.rootdir or None,
            "invocation_dir": Path(config.invocation_params.dir),
            "config": config,
        }
        params = inspect.signature(determine_setup).parameters
        if not set(params) <= set(given):
            return None
        rootdir, inipath, *_ = determine_setup(**{k: given[k] for k in params})
    except (ImportError, AttributeError, TypeError, ValueError, pytest.UsageError):
        return None
    return Path(rootdir), (Path(inipath) if inipath else None)


def plugin_args(config: pytest.Config) -> tuple[str, ...]:
    """The options that chose this session's plugins, for a child pytest to start as this
    session did: each ``-p NAME`` and ``-p no:NAME`` of ``PYTEST_ADDOPTS`` and of the command
    line, in pytest's order (:meth:`pytest.PytestPluginManager.consider_preparse` reads
    ``-p NAME`` and ``-pNAME``), and ``--disable-plugin-autoload``.

    With autoloading off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``: how large repositories keep
    their plugin set fixed) a child without ``-p perfguard.plugin`` does not know
    ``--perfguard`` and exits 4; with it on, ``-p perfguard.plugin`` in a child would load
    perfguard twice (pytest refuses): so a child gets exactly the parent's. The ini's
    ``addopts`` is the child's own (it runs in the same project), ``PYTEST_PLUGINS`` and
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` come with its environment; an option that is in
    both ``PYTEST_ADDOPTS`` and the arguments is harmless twice (a plugin loads once).
    """
    env = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    out: list[str] = []
    for args in (env, [str(a) for a in config.invocation_params.args]):
        i = 0
        while i < len(args):
            opt, i = args[i], i + 1
            if opt == "--disable-plugin-autoload":
                out.append(opt)
            elif opt == "-p" and i < len(args):
                out += ["-p", args[i].strip()]
                i += 1
            elif opt.startswith("-p") and len(opt) > 2:
                out += ["-p", opt[2:].strip()]
    return tuple(out)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
