"""A/B mode: the base commit and the head measured in alternating rounds on one machine.

``pytest --perfguard --perfguard-against=REF`` checks REF out into a git
worktree (``.git/perfguard-ab/base-<sha>``, inside the repository's git
folder so it never shows in ``git status``; detached, reused while it is at REF)
and measures the marked tests of both trees in rounds: each round is a
fresh child pytest in one tree (its own code really imported: the tree's
root, and its ``src/`` if there is one, lead ``sys.path``, so an editable
install of the head does not shadow the base; forked from a warm server that
never loaded either tree's code, :mod:`perfguard.plugin.forkserver`, or a
fresh interpreter with ``--perfguard-children spawn``), running every selected test
for :data:`~perfguard.plugin.options.AB_CHILD_ROUNDS` timing rounds of its
loop, whose median is the child's value; rounds alternate
ABBA (A B, B A, A B, ...), so a drift of the machine hits both sides alike
and pairs of adjacent rounds cancel it. The child writes its records (one
round each) and each test's pytest outcome to a pickle
(:data:`AB_OUT_ENV`); the parent merges a side's rounds into one record
(:func:`perfguard.baseline.record.merge_rounds`) and judges the paired
rounds (:func:`perfguard.compare.timing.judge_ab`).

After the first pairs, tests whose change is not yet resolved (interval
wider than the tolerance, tachometer's rule) get more pairs while the
budget (``--perfguard-ab-budget`` seconds) lasts, up to
:data:`~perfguard.plugin.options.MAX_AB_PAIRS`.

A child that crashes or times out loses its round: the tests it did not
report are noted, and a side with too few rounds is ``not-judged``. Each
child also lists modules it imported from the *other* tree (outside any
``site-packages``): a base tree that ran the head's code would make the
comparison a lie, so such a test is ``incomparable``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from perfguard.baseline.record import PAIR_STATISTIC, round_value
from perfguard.forking import FORK_UNSAFE
from perfguard.plugin.forkserver import ForkServer, preload_names
from perfguard.plugin.options import AB_CHILD_ROUNDS

if TYPE_CHECKING:
    from perfguard.compare.halves import TimingVerdict

#: the child's output file (a pickle of :class:`RoundOutput`); set => round-child mode
AB_OUT_ENV = "PERFGUARD_AB_OUT"
#: a file with the nodeids the child runs, one per line
AB_SELECT_ENV = "PERFGUARD_AB_SELECT"
#: the other tree's root: modules imported from there are reported
AB_FOREIGN_ENV = "PERFGUARD_AB_FOREIGN"
#: the child's own tree root (the trees may nest)
AB_OWN_ENV = "PERFGUARD_AB_OWN"
#: "1": the child times its tests without a profiled round (A/B pair children after the
#: first: the first one's profiled round gave the ops and gates; an analysis costs more
#: than the timing rounds of a small test)
AB_TIMING_ONLY_ENV = "PERFGUARD_AB_TIMING_ONLY"
#: a fork server restarts to preload what its children imported at most this often,
#: and only for at least this many new modules (one restart costs an import of them)
MAX_SERVER_RESTARTS = 2
#: auto-sampling looks at a test's interval after every this many extra pairs, not after
#: each: every look is a chance for noise to read as a change (optional stopping), so a
#: few looks keep a red verdict's false-alarm rate near its interval's level
AB_LOOK_EVERY = 3
MIN_NEW_MODULES = 20


@dataclass
class RoundOutput:
    """What one round child reports: records by nodeid, pytest outcomes, foreign modules."""

    records: dict[str, Any] = field(default_factory=dict)  # nodeid -> TestRecord
    outcomes: dict[str, dict[str, str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # capture/analysis errors
    foreign: list[str] = field(default_factory=list)
    #: modules (outside both trees) the child had loaded: the fork server's next preload
    modules: list[str] = field(default_factory=list)


@dataclass
class Side:
    """One tree's measurements of one test, round by round."""

    records: list[Any] = field(default_factory=list)
    failure: str | None = None  # the test raised (or its capture failed) in this tree
    missing: int = 0  # rounds in which the test did not report (crash, not collected)
    crash: str | None = None  # why the last child that lost this test's round died


@dataclass
class TestAB:
    """Both sides of one test."""

    __test__ = False

    base: Side = field(default_factory=Side)
    head: Side = field(default_factory=Side)
    foreign: list[str] = field(default_factory=list)


def foreign_modules(other_root: str, own_root: str) -> list[str]:
    """``name (file)`` of every loaded module whose file lies in ``other_root`` but not in
    ``own_root`` (the trees may nest), outside any site-packages: evidence that a tree
    ran the other tree's code."""
    other = os.path.realpath(other_root) + os.sep
    own = os.path.realpath(own_root) + os.sep
    found = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path):
            continue  # frozen or synthetic modules (torch.ops names a relative file)
        real = os.path.realpath(path)
        if real.startswith(other) and not real.startswith(own):
            if "-packages" + os.sep not in real:
                found.append(f"{name} ({real})")
    return sorted(found)


def write_round_output(path: str, output: RoundOutput) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(output, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def abba(pairs: int, start: int = 0) -> list[str]:
    """``A B B A A B ...`` for pairs ``start .. start+pairs-1``."""
    order: list[str] = []
    for k in range(start, start + pairs):
        order += ["A", "B"] if k % 2 == 0 else ["B", "A"]
    return order


class ABRunner:
    """Runs round children in both trees and gathers each test's sides."""

    def __init__(
        self,
        *,
        head_root: Path,
        base_root: Path,
        head_rel: Path,
        output: Path,
        backend: str,
        xdist: bool,
        timeout: float,
        say: Callable[[str], None] = lambda line: None,
        rounds: int | None = AB_CHILD_ROUNDS,
        children: str = "fork",
        interleave: bool = True,
        plugin_args: tuple[str, ...] = (),
    ) -> None:
        self.roots = {"A": base_root, "B": head_root}
        self.head_rel = head_rel  # the pytest rootdir relative to the git root
        self.output = output
        self.backend = backend
        self.xdist = xdist
        self.timeout = timeout
        self.say = say
        #: wall seconds of each round's child so far (its start, import, rounds, exit)
        self.round_seconds: list[float] = []
        self.rounds = rounds  # per child; None: the marker's (isolation mode)
        self.results: dict[str, TestAB] = {}
        self.notes: list[str] = []
        self.rounds_run = 0
        self.children = children  # "fork" (from a ForkServer) or "spawn"
        #: A/B pairs in one child each, both trees stepping in turn (perfguard.plugin.
        #: interleave); False: a child per side per pair (ABBA)
        self.interleave = interleave
        #: the session's own plugin options (perfguard.plugin.options.plugin_args): each
        #: child loads the plugins the session did, autoloading on or off alike
        self.plugin_args = plugin_args
        self.server: ForkServer | None = None
        #: every pair child times only (no profiled round): a confirmation of a test whose
        #: ops and gates the session has judged already (perfguard.plugin.confirm)
        self.timing_only = False
        self._learnt: list[str] = []  # modules children loaded that the server had not
        self._restarts = 0

    def _fork_server(self) -> ForkServer | None:
        """The warm server the children fork from, started on first use; None when
        children spawn (asked, or forking is unsafe here: noted once)."""
        if self.children != "fork":
            return None
        if self.server is None:
            folder = self.output / "forkserver"
            preload = preload_names([self.roots["A"], self.roots["B"]])
            preload += [m for m in self._learnt if m not in set(preload)]
            self.server = ForkServer(preload, folder, folder / "server.log")
            t0 = time.monotonic()
            if self.server.start() and not self._restarts:
                self.notes.append(
                    f"children fork from a server that imported {len(preload)} modules "
                    f"in {time.monotonic() - t0:.1f} s"
                )
            elif self.server.why_not:
                self.notes.append(f"children start as fresh interpreters: {self.server.why_not}")
                self.children = "spawn"
                return None
        return self.server if self.server.proc is not None else None

    def _learn(self, modules: list[str]) -> None:
        """A child loaded modules the server had not (the session itself never runs the
        tests: torch.optim's lazy torch._dynamo, the verdict's scipy): restart the server
        with them, at most :data:`MAX_SERVER_RESTARTS` times a session."""
        if self.server is None or self.server.proc is None:
            return
        have = set(self.server.preload) | set(self._learnt)
        new = [m for m in modules if m not in have and m.partition(".")[0] not in FORK_UNSAFE]
        if len(new) < MIN_NEW_MODULES or self._restarts >= MAX_SERVER_RESTARTS:
            return
        self._learnt += new
        self._restarts += 1
        self.server.close()
        self.server = None

    def close(self) -> None:
        """Stop the fork server, if one was started."""
        if self.server is not None:
            self.server.close()

    def _spawn(self, side: str, argv: list[str], env: dict[str, str], log: Path) -> int | str:
        """One child as a fresh interpreter: its return code, or why it was stopped."""
        try:
            done = subprocess.run(
                argv,
                cwd=self.roots[side] / self.head_rel,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
            tail = (done.stdout or "")[-2000:] + (done.stderr or "")[-2000:]
            log.write_text(tail, encoding="utf-8", errors="replace")
            return done.returncode
        except subprocess.TimeoutExpired:
            return f"timed out after {self.timeout:g} s"

    def _start_child(self, side: str, argv: list[str], env: dict[str, str], log: Path) -> int | str:
        """One child, forked from the warm server when there is one, else spawned."""
        server = self._fork_server()
        if server is not None:
            root = self.roots[side] / self.head_rel
            lead = tree_lead(root)
            try:
                return server.run(
                    cwd=root, args=argv[3:], env=env, lead=lead, log=log, timeout=self.timeout
                )
            except OSError as exc:  # the server died: the rest of the session spawns
                self.notes.append(f"the fork server stopped ({exc}); children spawn from here on")
                server.close()
                self.children = "spawn"
        return self._spawn(side, argv, env, log)

    def _argv(self, side: str, files: list[str], out: Path) -> list[str]:
        argv = [sys.executable, "-m", "pytest", *files, *self.plugin_args]
        argv += ["-p", "no:cacheprovider", "-q", f"--rootdir={self.roots[side] / self.head_rel}"]
        argv += ["--perfguard", f"--perfguard-backend={self.backend}"]
        if self.rounds is not None:
            argv.append(f"--perfguard-rounds={self.rounds}")
        # '=': a path written apart is one of pytest's paths when it picks the rootdir
        argv += [f"--perfguard-output={out}", "--perfguard-fail-on=never"]
        if self.xdist:
            argv.append("-n0")
        return argv

    def _env(self, side: str, out_file: Path, select: Path) -> dict[str, str]:
        env = dict(os.environ)
        root = self.roots[side] / self.head_rel
        lead = tree_lead(root)
        env["PYTHONPATH"] = os.pathsep.join(lead + [p for p in [env.get("PYTHONPATH")] if p])
        env[AB_OUT_ENV] = str(out_file)
        env[AB_SELECT_ENV] = str(select)
        other = self.roots["B" if side == "A" else "A"]
        env[AB_FOREIGN_ENV] = str(other)
        env[AB_OWN_ENV] = str(self.roots[side])
        return env

    def _prepare(self, side: str, nodeids: list[str], index: int) -> _Round | None:
        """A round's folder, selection and command in tree ``side``; None when the tree has
        none of the tests (each is then marked so)."""
        root = self.roots[side] / self.head_rel
        present = [n for n in nodeids if (root / n.split("::", 1)[0]).is_file()]
        for n in set(nodeids) - set(present):
            self._side(n, side).failure = "the test's file is not in this tree"
        if not present:
            return None
        files = sorted({n.split("::", 1)[0] for n in present})
        work = self.output / "ab" / f"round-{index:03d}-{side}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        select = work / "select.txt"
        select.write_text("\n".join(present) + "\n", encoding="utf-8")
        out_file = work / "round.pkl"
        argv = self._argv(side, files, work / "output")
        return _Round(side, present, work, out_file, argv, self._env(side, out_file, select))

    def run_round(self, side: str, nodeids: list[str], index: int) -> None:
        """One child in tree ``side`` ("A" base, "B" head), one round of each test."""
        prep = self._prepare(side, nodeids, index)
        if prep is None:
            return
        t0 = time.monotonic()
        code = self._start_child(side, prep.argv, prep.env, prep.work / "child.log")
        self.rounds_run += 1
        self.round_seconds.append(time.monotonic() - t0)
        self._collect(prep, _read_output(prep.out_file), code, index)

    def run_pair(self, nodeids: list[str], index: int, first: str) -> None:
        """One pair child: both trees' sessions in one process, their timed steps in turn
        (:mod:`perfguard.plugin.interleave`), ``first`` stepping first. A test reported by
        one side only loses the pair's round on both, so the sides' rounds stay paired."""
        preps = {side: self._prepare(side, nodeids, index) for side in ("A", "B")}
        if preps["A"] is None or preps["B"] is None:
            for side, prep in preps.items():
                if prep is not None:
                    self.run_round(side, prep.present, index)
            return
        order = [first, "B" if first == "A" else "A"]
        pair = []
        for side in order:
            prep = preps[side]
            assert prep is not None
            root = self.roots[side] / self.head_rel
            keys = (AB_OUT_ENV, AB_SELECT_ENV, AB_FOREIGN_ENV, AB_OWN_ENV)
            side_env = {k: prep.env[k] for k in keys}
            if index > 0 or self.timing_only:  # the first pair child's profiled round
                # gave the ops and gates
                side_env[AB_TIMING_ONLY_ENV] = "1"
            pair.append(
                {
                    "name": side,
                    "root": str(self.roots[side]),
                    "cwd": str(root),
                    "args": prep.argv[3:],
                    "env": side_env,
                    "lead": tree_lead(root),
                }
            )
        log = self.output / "ab" / f"round-{index:03d}-pair.log"
        env = {k: v for k, v in os.environ.items() if k not in (AB_OUT_ENV, AB_SELECT_ENV)}
        t0 = time.monotonic()
        code = self._start_pair(pair, env, log)
        self.rounds_run += 2
        half = (time.monotonic() - t0) / 2
        self.round_seconds += [half, half]
        outputs = {side: _read_output(prep.out_file) for side, prep in preps.items() if prep}
        for side, prep in preps.items():
            assert prep is not None
            name = "B" if side == "A" else "A"
            other, asked = outputs[name], set(preps[name].present)  # type: ignore[union-attr]
            only = None
            if other is not None:  # tests of both trees that the other did not time
                only = {n for n in prep.present if n in asked and n not in other.records}
            self._collect(prep, outputs[side], code, index, drop=only, statistic=PAIR_STATISTIC)

    def _start_pair(self, pair: list[dict[str, Any]], env: dict[str, str], log: Path) -> int | str:
        """A pair child, forked from the warm server when there is one, else spawned."""
        cwd = Path(pair[0]["cwd"])
        server = self._fork_server()
        if server is not None:
            try:
                return server.run(
                    cwd=cwd,
                    args=[],
                    env=env,
                    lead=pair[0]["lead"],
                    log=log,
                    timeout=self.timeout,
                    pair=pair,
                )
            except OSError as exc:
                self.notes.append(f"the fork server stopped ({exc}); children spawn from here on")
                server.close()
                self.children = "spawn"
        request = log.with_suffix(".json")
        request.write_text(json.dumps({"pair": pair}), encoding="utf-8")
        code = "from perfguard.plugin.interleave import main; main()"
        return self._spawn(pair[0]["name"], [sys.executable, "-c", code, str(request)], env, log)

    def _collect(
        self,
        prep: _Round,
        output: RoundOutput | None,
        code: int | str,
        index: int,
        drop: set[str] | None = None,
        statistic: str | None = None,
    ) -> None:
        """A round child's output into each test's side (``drop``: tests whose round is
        lost; ``statistic``: how the records' steps reduce, kept in their meta)."""
        side, present = prep.side, prep.present
        name = "base" if side == "A" else "head"
        if output is not None and self.children == "fork":
            self._learn(output.modules)
        if output is not None and drop:
            for n in drop:
                output.records.pop(n, None)
        if output is not None and statistic is not None:
            for rec in output.records.values():
                rec.meta["round_statistic"] = statistic
                rec.meta["ab_children"] = "pair"
        if output is None:
            why = _exit_reason(code)
            self.notes.append(f"round {index + 1} ({name}) reported nothing: {why}")
            for n in present:
                self._side(n, side).missing += 1
                self._side(n, side).crash = why
            return
        for n in present:
            s = self._side(n, side)
            if n in output.records:
                s.records.append(output.records[n])
            else:
                s.missing += 1
                if isinstance(code, str) or code not in (0, 1):
                    s.crash = _exit_reason(code)
            result = output.outcomes.get(n)
            if result and result.get("outcome") == "failed" and s.failure is None:
                s.failure = result.get("message") or "failed"
            if n in output.errors and s.failure is None:
                s.failure = f"capture failed: {output.errors[n]}"
            if output.foreign:
                self.results[n].foreign = output.foreign

    def _one_pair(self, nodeids: list[str], k: int, index: int) -> int:
        """Pair ``k``: one pair child (its first stepper alternating A, B, ...) or, with
        separate children, two rounds in ABBA order; the next round index."""
        if self.interleave:
            self.run_pair(nodeids, index, "A" if k % 2 == 0 else "B")
            return index + 1
        for side in abba(1, k):
            self.run_round(side, nodeids, index)
            index += 1
        return index

    def _progress(
        self,
        done: int,
        total: int,
        nodeids: list[str],
        status: Callable[[str, TestAB], str],
        pair_done: bool,
    ) -> None:
        """One progress line: round ``done`` of ``total``, their pace, the time left; after
        a whole pair, each test's change so far."""
        recent = self.round_seconds[-4:]
        pace = sum(recent) / len(recent) if recent else 0.0
        left = max(total - done, 0) * pace
        line = (
            f"perfguard A/B: pair {(done + 1) // 2} of {max(total // 2, 1)} "
            f"(round {done} of {total}, {pace:.1f} s a round, about {left:.0f} s left)"
        )
        if pair_done:
            said = [text for n in nodeids if (text := status(n, self.results[n]))]
            if said:
                line += ": " + "; ".join(said)
        self.say(line)

    def _side(self, nodeid: str, side: str) -> Side:
        ab = self.results.setdefault(nodeid, TestAB())
        return ab.base if side == "A" else ab.head

    def measure(
        self,
        nodeids: list[str],
        pairs: int,
        *,
        budget: float,
        max_pairs: int,
        unresolved: Callable[[str, TestAB], bool],
        status: Callable[[str, TestAB], str] = lambda nodeid, ab: "",
    ) -> dict[str, TestAB]:
        """``pairs`` ABBA pairs of rounds, then more for unresolved tests within ``budget``.

        Says its progress after every round (pair k of n, the time a round takes, the
        time left) and, after every pair, each test's change so far (``status``): an A/B
        session runs for minutes before the first test reports."""
        for n in nodeids:
            self.results.setdefault(n, TestAB())
        index = 0
        for k in range(pairs):
            index = self._one_pair(nodeids, k, index)
            self._progress(2 * (k + 1), 2 * pairs, nodeids, status, pair_done=True)
        deadline = time.monotonic() + budget
        done = pairs
        todo = nodeids
        while budget > 0 and done < max_pairs and time.monotonic() < deadline:
            if (done - pairs) % AB_LOOK_EVERY == 0:  # a look: who is still unresolved
                todo = [n for n in todo if unresolved(n, self.results[n])]
            if not todo:
                break
            index = self._one_pair(todo, done, index)
            left = min(max_pairs - done - 1, max(deadline - time.monotonic(), 0) / 2)
            rounds = 2 * (done + 1)
            self._progress(rounds, rounds + 2 * max(int(left), 0), todo, status, True)
            done += 1
        if budget > 0 and done > pairs:
            self.notes.append(f"A/B auto-sampling: {done} pairs for the unresolved test(s)")
        return self.results


def pairs_verdict(ab: TestAB, tolerance: float, alpha: float) -> TimingVerdict | None:
    """The timing verdict of the pairs measured so far (None while a side has none): what
    auto-sampling, its progress line and a confirmation look at. (The judge is imported
    here: a pair child imports this module and must not load the comparison layer.)"""
    from perfguard.compare.timing import judge_ab

    values = pair_values(ab)
    if values is None:
        return None
    return judge_ab(*values, metric=ab.head.records[0].metric, tolerance=tolerance, alpha=alpha)


def pair_values(ab: TestAB) -> tuple[np.ndarray, np.ndarray] | None:
    """Each pair's value per side (ns), paired by index: a child's timed steps reduced as
    :func:`~perfguard.baseline.record.merge_rounds` makes a round of them. None while a
    side failed or has no pair yet."""
    if ab.base.failure or ab.head.failure or not ab.base.records or not ab.head.records:
        return None
    metric = ab.head.records[0].metric

    def value(r: Any) -> float:
        return round_value(r.values(metric), metric, r.meta.get("round_statistic"))

    a = np.array([value(r) for r in ab.base.records])
    b = np.array([value(r) for r in ab.head.records])
    n = min(len(a), len(b))
    return a[:n], b[:n]


@dataclass
class _Round:
    """One side's round, prepared: its tests, folder, output file and command."""

    side: str
    present: list[str]
    work: Path
    out_file: Path
    argv: list[str]
    env: dict[str, str]


def tree_lead(root: Path) -> list[str]:
    """What leads ``sys.path`` in a tree's child: its root, and its ``src/`` if any."""
    return [str(root)] + ([str(root / "src")] if (root / "src").is_dir() else [])


def _read_output(path: Path) -> RoundOutput | None:
    try:
        with open(path, "rb") as fh:
            data = pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None
    return data if isinstance(data, RoundOutput) else None


def _exit_reason(code: int | str) -> str:
    if isinstance(code, str):
        return code
    if code < 0:
        import signal

        try:
            return f"the child was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the child was killed by signal {-code}"
    return f"the child exited with {code} before writing its results"
