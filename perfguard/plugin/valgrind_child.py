"""The ``instructions`` metric in a pytest session: one Callgrind child for the whole session.

A test asks for it with ``metrics=(..., "instructions")`` on its marker, or
every measured test does with ``--perfguard-metric instructions`` (ini
``perfguard_metric = "instructions"`` in ``pyproject.toml``: the opt-in for a
CPU-only runner). After collection the session runs the selected tests once
more, in one child ``pytest`` under Callgrind (start-up paid once per
session): there the ``gpuprofile`` loop runs its warm-up plain and its first
:data:`MAX_COUNTED_STEPS` recorded steps inside
:func:`perfguard.capture.valgrind.measured`, named by the test's node id.

Each test runs in a process forked from that child after collection
(:class:`ForkEachTest`), so every test starts from the same state: in one
process a loop's count depends on what ran before it (the same loop measured
first and second counted 10.40 M and 10.17 M instructions: type cache,
allocator and free lists warmed by the first), and a change to one test would
move the counts of the tests after it.

Each test's record then gets the counts of its dump
(:func:`perfguard.baseline.record.with_instructions`) before it is judged, so
the gates compare them with the baseline's. Without Valgrind the session
says why in a note and the tests are judged as before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from perfguard.capture.valgrind import ENV_OUT, named_dumps, run_callgrind, valgrind_missing
from perfguard.compare.units import human
from perfguard.errors import PerfguardError

if TYPE_CHECKING:  # the plugin loads light: pandas comes with the first record
    from perfguard.baseline.record import TestRecord

#: the metric's name, for the marker's ``metrics=`` and ``--perfguard-metric``
METRIC = "instructions"
#: recorded steps counted per test and layout at most: the count per step does not vary
#: between runs, so more steps add nothing but time (an instrumented step runs ~50x slower;
#: the CNN example's 20 steps took 8 min under Callgrind on the loaded 2-core VM)
MAX_COUNTED_STEPS = 3
#: heap layouts each test is counted in, its count their mean
#: (:func:`perfguard.capture.valgrind.layout_shift`): any code change moves every
#: later address, and with it a step's count by up to ~0.16 % (a small extra op is
#: +0.3 %); the mean of 4 layouts moves about half as much (benchmarks/README.md)
LAYOUTS = 4
#: set in a test's fork in the Callgrind child: the layout it is counted in
_layout = 0


def counted_steps(iterations: int) -> int:
    """How many of a test's ``iterations`` recorded steps the Callgrind child counts (in
    each of the :data:`LAYOUTS`)."""
    return max(1, min(iterations, MAX_COUNTED_STEPS))


def block_name() -> str:
    """The dump name of the test running now in the Callgrind child: its node id and the
    layout (``<nodeid>#<layout>``)."""
    return f"{current_test()}#{_layout}"


def callgrind_child() -> bool:
    """Whether this pytest process is the session's Callgrind child (no perfguard session)."""
    return bool(os.environ.get(ENV_OUT))


def current_test() -> str:
    """The node id of the test running now (pytest's ``PYTEST_CURRENT_TEST``)."""
    return os.environ.get("PYTEST_CURRENT_TEST", "test").rsplit(" (", 1)[0]


class ForkEachTest:
    """The Callgrind child's plugin: each test's protocol (set-up, call, teardown) runs in
    processes forked from the collected session, one per layout (:data:`LAYOUTS`), which
    only waits for them. Reports stay in the forks: the child exists for its dumps, the
    parent session reports the tests."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        # the layouts' forks run side by side, one per CPU: each is one thread with its own
        # count (a count does not depend on the load), and Valgrind's re-instrumentation of
        # each fork is most of a small test's time under it
        width = max(1, min(LAYOUTS, os.cpu_count() or 1))
        for first in range(0, LAYOUTS, width):
            pids = [
                _fork_test(item, layout) for layout in range(first, min(first + width, LAYOUTS))
            ]
            for pid in pids:
                os.waitpid(pid, 0)
        return True


def _fork_test(item: pytest.Item, layout: int) -> int:
    """A process forked from the collected session running ``item``'s protocol in heap layout
    ``layout`` (its pid; the fork never returns)."""
    global _layout
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the fork's coverage is not collected
        code = 1
        try:
            from _pytest.runner import runtestprotocol

            from perfguard.capture.valgrind import layout_shift

            _layout = layout
            kept = layout_shift(layout)
            runtestprotocol(item, nextitem=None, log=False)
            del kept
            code = 0
        finally:
            os._exit(code)
    return pid


class InstructionSession:
    """The session's Callgrind child and the dumps it left, by node id. In A/B mode there is
    one per tree (``tree``: "base" counts the base worktree's code, named in its notes)."""

    def __init__(
        self,
        output: Path,
        timeout: float,
        tree: str = "",
        keep_env: tuple[str, ...] = (),
        plugin_args: tuple[str, ...] = (),
    ) -> None:
        self.folder = output / ("callgrind" + (f"-{tree}" if tree else ""))
        self.tree = tree
        self.timeout = timeout
        #: the user's own variables the child passes on (``--perfguard-instructions-env``)
        self.keep_env = keep_env
        #: the session's plugin options (perfguard.plugin.options.plugin_args): the child
        #: loads perfguard and the other plugins as the session did
        self.plugin_args = plugin_args
        #: each test's dumps, one per layout counted
        self.dumps: dict[str, list[Path]] = {}
        self.notes: list[str] = []

    def measure(
        self,
        nodeids: list[str],
        rootdir: Path,
        inifile: Path | None,
        pythonpath: list[str] | None = None,
    ) -> None:
        """Run ``nodeids`` in one child pytest under Callgrind; a failure is a note.
        ``pythonpath``: folders put first on the child's ``PYTHONPATH`` (A/B: the tree's
        own root, so each tree's child imports its own code)."""
        if not nodeids:
            return
        where = f" in the {self.tree} tree" if self.tree else ""
        missing = valgrind_missing()
        if missing:
            self.notes.append(f"instructions not measured{where}: {missing}")
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in self.folder.glob("callgrind.out.*"):
            old.unlink()
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            *self.plugin_args,
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            f"--rootdir={rootdir}",
        ]
        if inifile is not None:
            argv += ["-c", str(inifile)]
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                [*pythonpath, *[p for p in [env.get("PYTHONPATH")] if p]]
            )
        timeout = self.timeout * len(nodeids)  # the per-test limit, for the whole child
        try:
            run = run_callgrind(
                [*argv, *nodeids],
                self.folder,
                timeout=timeout,
                cwd=rootdir,
                env=env,
                keep_env=self.keep_env,
            )
        except PerfguardError as exc:
            self.dumps = _by_test(named_dumps(self.folder))  # the tests that did finish
            self.notes.append(f"instructions{where}: the Callgrind child failed: {exc}")
            return
        self.dumps = _by_test(run.dumps)
        self.notes.append(
            f"instructions of {len(self.dumps)} test(s) counted under Callgrind in one "
            f"child{where} ({run.wall_time_s:.0f} s)"
        )

    def dumps_of(self, nodeid: str) -> list[Path]:
        return self.dumps.get(nodeid, [])

    def counted(self, record: TestRecord, iterations: int, notes: list[str]) -> TestRecord:
        """``record`` with its loop's Callgrind counts when this session's child made them
        (``iterations``: the test's recorded steps per round, of which the child counted
        :func:`counted_steps`); the count goes into ``notes`` too."""
        dumps = self.dumps_of(record.nodeid)
        if not dumps:
            return record
        from perfguard.analysis.instructions import mean_of, summarize
        from perfguard.baseline.record import with_instructions
        from perfguard.trace.callgrind import read_callgrind

        steps = counted_steps(iterations)
        each = [summarize(read_callgrind(d), steps) for d in dumps]
        figures, functions = mean_of(each)
        layouts = [f["instructions"] for f, _ in each if "instructions" in f]
        where = f" in the {self.tree} tree" if self.tree else ""
        counted = human(figures["instructions"], "instructions")
        notes.append(
            f"host instructions per iteration{where}: {counted} "
            f"({steps} step(s) in each of {len(dumps)} heap layout(s) counted under Callgrind)"
        )
        return with_instructions(record, figures, functions, steps, layouts)


def _by_test(dumps: dict[str, Path]) -> dict[str, list[Path]]:
    """Dumps named ``<nodeid>#<layout>`` (:func:`block_name`) grouped by node id, in layout
    order."""
    out: dict[str, list[tuple[int, Path]]] = {}
    for name, path in dumps.items():
        nodeid, _, layout = name.rpartition("#")
        if nodeid and layout.isdigit():
            out.setdefault(nodeid, []).append((int(layout), path))
    return {k: [p for _, p in sorted(v)] for k, v in out.items()}
