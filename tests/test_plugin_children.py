"""Children start as their parent session was started.

Large repositories keep their pytest plugin set fixed with
``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 pytest -p perfguard.plugin ...``. Each child
perfguard starts (A/B rounds, ``--perfguard-isolate``, the Callgrind child of the
``instructions`` metric, the nsys child) inherits that environment, so without the
parent's ``-p`` options it did not know ``--perfguard``: it exited 4 before writing its
results and every test read ``crashed``. Real sessions here: a git project, real children
(forked from the warm server and spawned), each test judged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfguard.capture.capturers import child_argv
from perfguard.capture.valgrind import valgrind_missing
from perfguard.plugin.options import plugin_args

sys.path.insert(0, str(Path(__file__).parent))
from history_repo import git, init_project  # noqa: E402

pytest_plugins = ["pytester"]

STEP = """
import time

import pytest

SLEEP_MS = {sleep}


def work():
    return sum(i * i for i in range(3000))


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1, tolerance="50%",
                        metrics=("wall_time", {extra_metric}))
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        work()
        time.sleep(SLEEP_MS / 1000)
"""
NODEID = "test_step.py::test_step"
#: the same code judged against itself (a loaded machine may make it noisy)
JUDGED_SAME = ("unchanged", "noisy")
#: a session that loads only the plugins it names
FIXED = ("-p", "perfguard.plugin", "-p", "no:cacheprovider", "-p", "no:xdist")


def _project(root: Path, *, sleep: float = 2, instructions: bool = False) -> None:
    init_project(root)
    extra = '"instructions"' if instructions else ""
    (root / "test_step.py").write_text(STEP.format(sleep=sleep, extra_metric=extra))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "A")


def _session(root: Path, *args: str, autoload_env: bool = True) -> tuple[str, dict]:
    """``pytest --perfguard ARGS`` in ``root`` with autoloading off (the variable, or
    ``--disable-plugin-autoload``): its output and the judged test's entry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADD"))}
    env.pop("PYTEST_PLUGINS", None)
    flag: tuple[str, ...] = ()
    if autoload_env:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    else:
        env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        flag = ("--disable-plugin-autoload",)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *flag, *FIXED, "--perfguard", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    out = done.stdout + done.stderr
    results = root / ".perfguard" / "results.json"
    assert results.is_file(), out[-3000:]
    doc = json.loads(results.read_text())
    (test,) = [t for t in doc["tests"] if t["nodeid"] == NODEID]
    return out, {**test, "notes": doc["notes"]}


def test_ab_children_load_the_plugins_the_session_named(tmp_path: Path) -> None:
    """A/B rounds in pair children forked from the warm server: the head sleeps 12 ms more
    per step, and is judged so (it read ``crashed``, each child exiting 4)."""
    _project(tmp_path, sleep=2)
    base = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "test_step.py").write_text(STEP.format(sleep=14, extra_metric=""))
    git(tmp_path, "commit", "-qam", "B: slower")
    out, test = _session(
        tmp_path, f"--perfguard-against={base}", "--perfguard-ab-pairs=3", "--perfguard-ab-budget=0"
    )
    assert not [n for n in test["notes"] if "reported nothing" in n], test["notes"]
    # both trees measured in every pair (a crash read "crashed"); the verdict sees the head
    # slower, and a box loaded enough to blur 3 pairs reads it noisy, never unchanged
    assert test["mode"] == "ab" and test["outcome"] in ("regressed", "noisy"), out[-3000:]
    assert test["timing"]["n_current"] == test["timing"]["n_baseline"] == 3
    assert test["timing"]["delta_pct"] > 100, test["timing"]  # +600 % on an idle box
    assert any("children fork from a server" in n for n in test["notes"])


@pytest.mark.parametrize("autoload_env", [True, False], ids=["env", "flag"])
def test_isolated_children_load_the_plugins_the_session_named(
    tmp_path: Path, autoload_env: bool
) -> None:
    """``--perfguard-isolate``, autoloading off by the variable and by pytest's flag (which
    no environment carries: the child gets it on its command line): a saved run, then one
    judged against it, each test measured in its child."""
    if not autoload_env and pytest.version_tuple < (8, 4):
        pytest.skip("--disable-plugin-autoload is pytest 8.4's")
    _project(tmp_path)
    isolate = ("--perfguard-isolate", "--perfguard-tolerance=500%")
    out, test = _session(tmp_path, *isolate, "--perfguard-save", autoload_env=autoload_env)
    assert test["outcome"] == "no-baseline", out[-3000:]
    assert "/isolated/" in test["capture"]  # measured in the child
    out, test = _session(tmp_path, *isolate, autoload_env=autoload_env)
    # the same code judged in its child as in process: a pure-Python step captures no op,
    # said first, and is never "unchanged" (the isolated path skipped that rule: it read
    # "unchanged" where the same test in process read "not-judged")
    assert test["outcome"] in ("not-judged", "noisy"), out[-3000:]
    assert test["message"].startswith("captured no ops"), test["message"]
    assert (
        test["timing"]["n_current"] == test["timing"]["n_baseline"] == 3
        and "/isolated/" in test["capture"]
    )


@pytest.mark.skipif(valgrind_missing() is not None, reason=str(valgrind_missing()))
def test_the_callgrind_child_loads_the_plugins_the_session_named(tmp_path: Path) -> None:
    """The Callgrind child passes on only some variables: the ones that choose pytest's
    plugins are among them, so it counts the test (it too exited 4); the next session's
    gate compares the counts."""
    _project(tmp_path, instructions=True)
    out, test = _session(tmp_path, "--perfguard-save")
    assert any("counted under Callgrind in one child" in n for n in test["notes"]), out[-3000:]
    out, test = _session(tmp_path, "--perfguard-tolerance=500%")
    assert any("counted under Callgrind in one child" in n for n in test["notes"]), out[-3000:]
    assert "instructions" in test["gates"]["checked"], test["gates"]
    # a pure-Python step captures no framework op, which is never "unchanged"
    # (test_plugin_runtime_framework): what this test checks is the counts' gate
    assert not test["gates"]["regressions"], out[-3000:]
    assert test["outcome"] in (*JUDGED_SAME, "not-judged"), out[-3000:]


def test_plugin_args_are_the_sessions_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a child is given: every ``-p`` of ``PYTEST_ADDOPTS`` and the command line in
    pytest's order, both spellings, and ``--disable-plugin-autoload``; nothing else."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:doctest")
    config = pytester.parseconfig(
        "-q", "-pno:junitxml", "--disable-plugin-autoload", "-k", "x", "-p", "no:pastebin"
    )
    args = plugin_args(config)
    assert args == (
        "-p",
        "no:doctest",
        "-p",
        "no:junitxml",
        "--disable-plugin-autoload",
        "-p",
        "no:pastebin",
    )
    # the nsys child's command carries them ahead of its own
    argv = child_argv("t.py::test_a", pytester.path, plugin_args=args)
    n = 4 + len(args)  # python -m pytest TARGET, then the session's, then the child's own
    assert argv[4:n] == list(args) and argv[n : n + 2] == ["-p", "no:cacheprovider"]
    monkeypatch.delenv("PYTEST_ADDOPTS")
    assert plugin_args(pytester.parseconfig("-q")) == ()
