"""A/B pair children: both trees' tests in one process, their timed steps interleaved.

Why: on a shared VM each process carries its own timing offset, and the
machine has slow spells of a fraction of a second. A/B rounds that each ran
in a child of their own compared two processes: the pair's difference
carried both offsets. Measured on the 2-core VM for five small models
(``benchmarks/ab_offsets.py``, benchmarks/README.md "A/B children"): two
forked children of the same code differed by 11-50 % (SD of their log
ratio, median of each child's rounds); two copies of the model in *one*
child, stepping in turn, by 0.7-3.9 %. So a pair child runs the base tree's
and the head tree's pytest sessions side by side, one thread each, and the
two take turns: one timed step of one tree, then one of the other (the
gpuprofile loop calls :func:`handoff` before every unprofiled timed step).
Both sides share the process, its heap's neighbourhood and every slow
spell, and their values differ by the code's own cost.

Only one thread ever runs (a baton, :class:`Pair`), so the two sessions
never race. What a Python process holds once is swapped at each turn:

* ``sys.modules``: the modules whose files lie in a tree are that tree's
  and are taken out while the other runs, so both trees' ``test_model``
  and ``model`` modules live in one process, each test's code bound to its
  own tree's (its globals); a module outside both trees is shared;
* ``sys.path`` (pytest prepends a tree's root) and the working directory;
* the round-child settings :func:`ab_env` reads (the output file, the
  selection, the other tree), per thread rather than in ``os.environ``.

The profiled round is never interleaved (the profiler records every
thread's ops): a side keeps the baton through it. The pytest plugins that
hold process-wide state (output capture, ``faulthandler``, the warnings
plugin's filters) are turned off in a pair child's sessions: the child's
output goes to its log, and it reports outcomes, not warnings.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

#: pytest options of both sessions of a pair child (module docstring)
PAIR_PYTEST_ARGS = ("-s", "-p", "no:faulthandler", "-p", "no:warnings")

_local = threading.local()


def ab_env(name: str) -> str | None:
    """A round child's setting: this thread's pair side's, else the environment's."""
    env = getattr(_local, "env", None)
    if env is not None and name in env:
        return str(env[name])
    return os.environ.get(name)


def in_pair() -> bool:
    """Whether this thread runs one side of a pair child."""
    return getattr(_local, "pair", None) is not None


def handoff() -> None:
    """Let the other tree of a pair child take one step (no-op elsewhere)."""
    pair = getattr(_local, "pair", None)
    if pair is not None:
        pair.turn_over(_local.side)


def _under(path: str, root: str) -> bool:
    return path == root[:-1] or path.startswith(root)


@dataclass
class PairSide:
    """One tree's pytest session in a pair child."""

    name: str  # "A" (base) or "B" (head)
    root: str  # the tree's git root (modules under it are this side's)
    cwd: str
    args: list[str]
    env: dict[str, str]  # the round-child settings (ab_env), not os.environ
    lead: list[str] = field(default_factory=list)  # its root (and src/): first on sys.path
    path: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # its modules' names at its last turn
    stash: dict[str, ModuleType] = field(default_factory=dict)
    code: int = 0
    done: bool = False
    error: str | None = None


class Pair:
    """Two sessions, one thread each, taking turns (module docstring)."""

    def __init__(self, sides: list[PairSide]) -> None:
        self.sides = {s.name: s for s in sides}
        self.roots = {s.name: os.path.realpath(s.root) + os.sep for s in sides}
        self.cond = threading.Condition()
        self.turn = sides[0].name
        self._owner: dict[int, str | None] = {}  # id(module) -> side, or None (shared)
        self._entered_len = -1  # len(sys.modules) when the running side took its turn
        leads = {p for s in sides for p in [s.cwd, *s.lead]}
        self.base_path = [p for p in sys.path[1:] if p not in leads]

    def _other(self, name: str) -> PairSide:
        return next(s for n, s in self.sides.items() if n != name)

    def _side_of(self, mod: Any) -> str | None:
        key = id(mod)
        if key in self._owner:
            return self._owner[key]
        owner = None
        try:  # torch.ops / torch.classes make any attribute up: only real paths count
            path = getattr(mod, "__path__", None)
            dirs = [] if path is None or isinstance(path, str) else [p for p in path]
        except Exception:  # noqa: BLE001
            dirs = []
        for f in [getattr(mod, "__file__", None), *dirs]:
            if not isinstance(f, str) or not os.path.isabs(f):
                continue
            real = os.path.realpath(f)
            if "-packages" + os.sep in real:
                break
            # the trees may nest (the base worktree lies in the head's .git): the deeper wins
            inside = [n for n, r in self.roots.items() if _under(real, r)]
            if inside:
                owner = max(inside, key=lambda n: len(self.roots[n]))
                break
        self._owner[key] = owner
        return owner

    def _leave(self, side: PairSide) -> None:
        """Take this side's modules, path and directory out of the process."""
        mods = sys.modules
        if len(mods) == self._entered_len:  # nothing imported since its turn began
            mine = [n for n in side.names if n in mods]
        else:
            mine = [
                n for n, m in list(mods.items()) if m is not None and self._side_of(m) == side.name
            ]
        side.names = mine
        side.stash = {n: mods.pop(n) for n in mine}
        side.path = list(sys.path)
        side.cwd = os.getcwd()

    def _enter(self, side: PairSide) -> None:
        sys.modules.update(side.stash)
        side.stash = {}
        self._entered_len = len(sys.modules)
        # its first turn: as `python -m pytest` in its directory with PYTHONPATH=its lead
        sys.path[:] = side.path or [side.cwd, *side.lead, *self.base_path]
        os.chdir(side.cwd)

    def turn_over(self, name: str) -> None:
        """The side ``name`` holds the baton: hand it to the other, wait for it back."""
        other = self._other(name)
        if other.done:
            return
        me = self.sides[name]
        with self.cond:
            self._leave(me)
            self.turn = other.name
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.turn == name)
            self._enter(me)

    def _finish(self, side: PairSide) -> None:
        with self.cond:
            side.done = True
            other = self._other(side.name)
            if not other.done:
                self._leave(side)
                self.turn = other.name
                self.cond.notify_all()

    def _session(self, side: PairSide) -> None:
        import pytest

        _local.pair, _local.side, _local.env = self, side.name, side.env
        with self.cond:
            self.cond.wait_for(lambda: self.turn == side.name)
            self._enter(side)
        try:
            side.code = int(pytest.main([*side.args, *PAIR_PYTEST_ARGS]))
        except SystemExit as exc:
            side.code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - in its log; the other side goes on
            side.error = traceback.format_exc()
            print(side.error, file=sys.stderr)
            side.code = 70
        finally:
            _local.pair = None
            self._finish(side)

    def run(self) -> int:
        """Both sessions to the end; the first failing side's code (0: both ran)."""
        base_path = list(sys.path)
        _pin_to_one_cpu()
        _one_malloc_arena()
        threads = []
        first = self.turn
        for s in self.sides.values():
            if s.name == first:
                continue
            t = threading.Thread(target=self._session, args=(s,), name=f"perfguard-ab-{s.name}")
            t.start()
            threads.append(t)
        self._session(self.sides[first])  # the first side in this (the main) thread
        for t in threads:
            t.join()
        sys.path[:] = base_path
        codes = [s.code for s in self.sides.values()]
        return next((c for c in codes if c not in (0, 1)), max(codes))


def _pin_to_one_cpu() -> None:
    """Bind the process (and the threads it starts) to the CPU it runs on: a VM's CPUs
    run at different speeds at any moment (another guest on a sibling), and two sides
    stepping on two CPUs would carry that difference. Only one side runs at a time, so
    one CPU costs nothing."""
    try:
        allowed = os.sched_getaffinity(0)
        with open("/proc/self/stat", encoding="ascii") as fh:
            cpu = int(fh.read().rsplit(")", 1)[1].split()[36])  # field 39: the CPU last run on
        os.sched_setaffinity(0, {cpu if cpu in allowed else min(allowed)})
    except (AttributeError, OSError, ValueError, IndexError):
        pass  # not Linux, or not allowed: the sides may step on two CPUs


#: glibc's mallopt parameter: the most malloc arenas the process may make
M_ARENA_MAX = -8


def _one_malloc_arena() -> None:
    """Make every thread allocate from glibc's main arena. A second thread gets an arena
    of its own, whose heap grows, trims and maps large blocks differently from the main
    one: on the 2-core VM an embedding model's steps ran 6-26 % apart by which side had
    the main thread, alternating with the pair. One arena serves both sides alike."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass  # not glibc


def pair_sides(req: dict[str, Any]) -> list[PairSide]:
    """The two sides of a pair request (see :meth:`perfguard.plugin.ab.ABRunner.run_pair`),
    the one that steps first first."""
    sides = [
        PairSide(
            name=s["name"],
            root=s["root"],
            cwd=s["cwd"],
            args=list(s["args"]),
            env=dict(s["env"]),
            lead=list(s["lead"]),
        )
        for s in req["pair"]
    ]
    return sides


def run_pair(req: dict[str, Any]) -> int:
    """Run a pair request in this process (a forked or fresh child)."""
    return Pair(pair_sides(req)).run()


def main() -> None:  # pragma: no cover - a spawned pair child (tested end to end)
    """``python -c 'from perfguard.plugin.interleave import main; main()' REQUEST.json``."""
    with open(sys.argv[1], encoding="utf-8") as fh:
        req = json.load(fh)
    code = 70
    try:
        code = run_pair(req)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
