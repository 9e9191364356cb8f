"""Tests measured in child processes: A/B mode, ``--perfguard-isolate``, and the round child.

* **A/B parent** (``--perfguard-against=REF``): the base tree is checked out before any
  test runs (a bad ref is a usage error); once the tests are collected every marked test
  is measured in both trees in alternating rounds (:class:`~perfguard.plugin.ab.ABRunner`,
  with a progress line on the terminal), and each test's verdict is made from its rounds
  when pytest reaches it (its body ran in the children).
* **Isolation** (``--perfguard-isolate``): each measured test runs in a child process of
  its own at set-up; its record is judged in store mode like an in-process one.
* **Round child** (:data:`~perfguard.plugin.ab.AB_OUT_ENV` set): this process runs the
  tests its parent selected and writes their records and outcomes for the parent.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from perfguard.baseline.git import common_dir, prepare_worktree
from perfguard.baseline.record import merge_rounds
from perfguard.compare.against import settings_for
from perfguard.compare.judge import Against
from perfguard.compare.timing import ab_resolved
from perfguard.compare.tolerance import ALPHA
from perfguard.compare.units import interval, percent
from perfguard.core.record import Measured
from perfguard.core.verdict import verdict
from perfguard.errors import PerfguardError
from perfguard.plugin.ab import (
    AB_FOREIGN_ENV,
    AB_OWN_ENV,
    AB_SELECT_ENV,
    ABRunner,
    RoundOutput,
    TestAB,
    foreign_modules,
    pairs_verdict,
    tree_lead,
    write_round_output,
)
from perfguard.plugin.context import SessionContext
from perfguard.plugin.forkserver import preload_names
from perfguard.plugin.interleave import ab_env
from perfguard.plugin.items import spec_of
from perfguard.plugin.judging import Verdicts
from perfguard.plugin.options import AB_CHILD_ROUNDS, MAX_AB_PAIRS, plugin_args
from perfguard.plugin.outputs import SessionOutputs
from perfguard.plugin.valgrind_child import InstructionSession


class Coordinator:
    """The A/B parent and the isolation runner of a session (module docstring)."""

    def __init__(self, context: SessionContext, verdicts: Verdicts) -> None:
        self.context = context
        self.verdicts = verdicts
        self.ab: ABRunner | None = None
        self.ab_commit: str | None = None
        #: each test measured in children: its sides
        self.results: dict[str, TestAB] = {}
        #: --perfguard-isolate: each measured test runs in a child process of its own
        self.isolated: set[str] = set()
        self.isolator: ABRunner | None = None
        #: A/B with the instructions metric: each tree's Callgrind counts
        self.head_instructions: InstructionSession | None = None
        self.base_instructions: InstructionSession | None = None
        settings, config = context.settings, context.config
        if settings.isolate and not settings.against:
            self.isolator = ABRunner(
                head_root=config.rootpath,
                base_root=config.rootpath,
                head_rel=Path("."),
                output=settings.output / "isolated",
                backend=settings.backend,
                xdist=config.pluginmanager.hasplugin("xdist"),
                timeout=settings.timeout,
                rounds=settings.rounds,
                children=settings.children,
                plugin_args=plugin_args(config),
            )
        if settings.against:
            self._prepare_ab()

    def _prepare_ab(self) -> None:
        """The base worktree, made before any test runs (a bad ref is a usage error); the
        measurement itself runs once the tests are collected."""
        ctx, settings = self.context, self.context.settings
        flag = f"--perfguard-against {settings.against}"
        if ctx.worker_id is not None or getattr(ctx.config.option, "numprocesses", None):
            raise pytest.UsageError(
                f"{flag}: A/B mode alternates rounds of both trees in fresh processes on "
                "this machine; run it without -n (pytest-xdist)"
            )
        if ctx.git is None:
            raise pytest.UsageError(f"{flag} needs a git repository")
        try:
            base_root, self.ab_commit = prepare_worktree(
                ctx.git.root, str(settings.against), common_dir(ctx.git.root) / "perfguard-ab"
            )
        except (PerfguardError, OSError) as exc:
            raise pytest.UsageError(f"{flag}: cannot check it out: {exc}") from None
        ctx.ab_base = (str(settings.against), self.ab_commit)
        rootdir = ctx.config.rootpath.resolve()
        if not rootdir.is_relative_to(ctx.git.root.resolve()):
            raise pytest.UsageError(
                f"{flag}: pytest's rootdir {rootdir} is outside the git repository "
                f"{ctx.git.root}; pass --rootdir={ctx.git.root} (or give paths with '=')"
            )
        self.ab = ABRunner(
            head_root=ctx.git.root,
            base_root=base_root,
            head_rel=rootdir.relative_to(ctx.git.root.resolve()),
            output=settings.output,
            backend=settings.backend,
            xdist=ctx.config.pluginmanager.hasplugin("xdist"),
            timeout=settings.timeout,
            children=settings.children,
            say=self.say,
            interleave=settings.ab_children == "pair",
            plugin_args=plugin_args(ctx.config),
        )
        if settings.ab_children == "pair":
            ctx.notes.append(
                f"A/B mode: {settings.ab_pairs} pairs against {settings.against} "
                f"({self.ab_commit[:12]}), each one child process ({settings.children}) "
                f"running both trees' tests, their timed steps in turn, {AB_CHILD_ROUNDS} "
                "rounds (each side's median step)"
            )
        else:
            ctx.notes.append(
                f"A/B mode: {settings.ab_pairs} ABBA pairs of rounds against "
                f"{settings.against} ({self.ab_commit[:12]}), each a fresh child process "
                f"({settings.children}) timing {AB_CHILD_ROUNDS} rounds (its fastest step)"
            )

    def close(self) -> None:
        for runner in (self.ab, self.isolator):
            if runner is not None:
                runner.close()

    # ------------------------------------------------------------------ A/B parent
    def measure(self, nodeids: list[str]) -> None:
        """Every selected marked test in both trees, up front."""
        if self.ab is None or not nodeids:
            return
        settings = self.context.settings
        self.results = self.ab.measure(
            nodeids,
            settings.ab_pairs,
            budget=settings.ab_budget,
            max_pairs=MAX_AB_PAIRS,
            unresolved=self._unresolved,
            status=self._status,
        )
        self.context.notes.extend(self.ab.notes)

    def count_instructions(
        self, nodeids: list[str], head: InstructionSession, inifile: Path | None
    ) -> None:
        """A/B with the ``instructions`` metric: each tree's tests counted once under Callgrind
        (counts need no pairs: they do not vary by run), each child importing its own tree's
        code first, as the round children do. The base tree's counts become the base
        record's, so the gates compare them like any counter."""
        assert self.ab is not None
        self.base_instructions = InstructionSession(
            head.folder.parent, head.timeout, "base", head.keep_env, head.plugin_args
        )
        for side, session in (("B", head), ("A", self.base_instructions)):
            root = self.ab.roots[side] / self.ab.head_rel
            ini = None
            if inifile is not None:
                rel = inifile.resolve().relative_to(self.ab.roots["B"].resolve())
                ini = self.ab.roots[side] / rel if (self.ab.roots[side] / rel).is_file() else None
            present = [n for n in nodeids if (root / n.split("::", 1)[0]).is_file()]
            lead = tree_lead(root)
            session.measure(present, root, ini, pythonpath=lead)
            self.context.notes.extend(session.notes)
        self.head_instructions = head

    def say(self, line: str) -> None:
        """A line on the terminal now, past pytest's output capture (a progress line
        written while collecting would otherwise appear only when the session ends)."""
        plugins = self.context.config.pluginmanager
        reporter = plugins.get_plugin("terminalreporter")
        if reporter is None:
            return
        capman = plugins.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else nullcontext():
            reporter.write_line(line)
            reporter.flush()

    def _verdict(self, ab: TestAB) -> Any:
        """The timing verdict of the pairs measured so far (None while a side has none)."""
        if not ab.head.records:  # the tolerance is read from the head's record
            return None
        return pairs_verdict(ab, self._tolerance(ab), ALPHA)

    def _tolerance(self, ab: TestAB) -> float:
        """The test's own tolerance (its marker's, else the session's), as the final judge
        takes it: auto-sampling must resolve the change that verdict will be asked about."""
        return settings_for(ab.head.records[0], self.context.settings.tolerance).tolerance

    def _unresolved(self, nodeid: str, ab: TestAB) -> bool:
        so_far = self._verdict(ab)
        return so_far is not None and not ab_resolved(so_far, self._tolerance(ab))

    def _status(self, nodeid: str, ab: TestAB) -> str:
        """A test's change so far, for the progress line."""
        so_far = self._verdict(ab)
        name = nodeid.rsplit("::", 1)[-1]
        if so_far is None or so_far.delta_pct is None:
            return ""  # fewer pairs than a change is estimated from
        ci = ""
        if so_far.ci_low_pct is not None:
            ci = f" {interval(so_far.ci_low_pct, so_far.ci_high_pct)}"
        return f"{name} {percent(so_far.delta_pct, True)}{ci}"

    # ------------------------------------------------------------------ per test
    def isolate(self, item: pytest.Item) -> bool:
        """Isolation: run the test in its own child now; False when not isolating."""
        if self.isolator is None:
            return False
        self.isolated.add(item.nodeid)
        self.isolator.run_round("B", [item.nodeid], len(self.isolated) - 1)
        self.results[item.nodeid] = self.isolator.results[item.nodeid]
        return True

    def ran(self, nodeid: str) -> bool:
        """Whether the test's body ran in child processes (A/B or isolation)."""
        return nodeid in self.results

    def call(self, item: pytest.Item) -> None:
        """In place of the body: the head's failure or crash becomes the test's own."""
        ab = self.results[item.nodeid]
        where = "its own process" if item.nodeid in self.isolated else "an A/B round of the head"
        if ab.head.failure is not None:
            pytest.fail(f"{ab.head.failure} (in {where})", pytrace=False)
        if not ab.head.records and ab.head.crash:
            why = f"crashed in {where}: {ab.head.crash}"
            self.verdicts.error(
                item, why, self.context.backend.label, at_teardown=False, outcome="crashed"
            )
            pytest.fail(f"perfguard: {item.nodeid} {why}", pytrace=False)

    def judge(self, item: pytest.Item) -> None:
        if item.nodeid in self.isolated:
            self._judge_isolated(item)
        else:
            self._judge_ab(item)

    def _judge_ab(self, item: pytest.Item) -> None:
        """The A/B verdict of one test from its rounds in both trees."""
        ab = self.results.get(item.nodeid)
        if ab is None:
            return
        backend = self.context.backend.label
        if ab.head.failure is not None or not ab.head.records:
            why = ab.head.failure or f"no round of the head reported ({ab.head.missing} lost)"
            self.verdicts.error(item, why, backend, at_teardown=ab.head.failure is None)
            return
        head = merge_rounds(ab.head.records)
        notes: list[str] = []
        base = merge_rounds(ab.base.records) if ab.base.records else None
        if self.head_instructions is not None and self.base_instructions is not None:
            iterations = spec_of(item).iterations
            head = self.head_instructions.counted(head, iterations, notes)
            if base is not None:
                base = self.base_instructions.counted(base, iterations, notes)
        if ab.head.missing or ab.base.missing:
            notes.append(f"rounds lost: head {ab.head.missing}, base {ab.base.missing}")
        reason = None
        if ab.foreign:
            reason = "a tree imported the other tree's code: " + ", ".join(ab.foreign[:3])
        if ab.base.failure is not None:
            notes.append(f"in the base tree: {ab.base.failure}")
        against = Against(
            records=[base] if base is not None else [],
            mode="ab",
            commit=self.ab_commit,
            run_found=True,  # the base tree was measured: a test it lacks is new
            incompatibility=reason,
        )
        # the head's rounds ran in children, which know the marker's tolerance but not the
        # session's --perfguard-tolerance: it is resolved for them here
        settings = settings_for(head, self.context.settings.tolerance)
        measured = Measured(head, capture=head.meta.get("capture"), backend=backend, notes=notes)
        entry = verdict(head, against, settings, measured, worker=self.context.worker_id)
        self.verdicts.finish(item, head, entry)

    def _judge_isolated(self, item: pytest.Item) -> None:
        """Store mode on the record the test's own child process made."""
        ab = self.results[item.nodeid]
        if not ab.head.records:
            return
        record = ab.head.records[0]
        backend = str(record.meta.get("backend") or self.context.backend.label)
        measured = Measured(record, capture=record.meta.get("capture"), backend=backend)
        self.verdicts.judge_record(item, record, measured)


class RoundChild:
    """A round child of an A/B parent (or of isolation): runs the selected tests and
    writes their records and pytest outcomes to the parent's file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.outcomes: dict[str, dict[str, str]] = {}

    @staticmethod
    def select(config: pytest.Config, items: list[pytest.Item]) -> None:
        """Only the tests the parent selected."""
        select = ab_env(AB_SELECT_ENV)
        if not select:
            return
        wanted = set(Path(select).read_text(encoding="utf-8").split("\n"))
        keep = [i for i in items if i.nodeid in wanted]
        dropped = [i for i in items if i.nodeid not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep

    def report(self, report: pytest.TestReport) -> None:
        """A test's pytest failure, remembered for the parent (its first one)."""
        if report.failed and report.nodeid not in self.outcomes:
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
            text = crash or (report.longreprtext or "failed").strip().splitlines()[-1]
            text = " ".join(str(text).split())
            self.outcomes[report.nodeid] = {"outcome": "failed", "message": text[:500]}

    def write(self, outputs: SessionOutputs) -> None:
        errors = {k: str(e.error) for k, e in outputs.entries.items() if e.error}
        foreign, own = ab_env(AB_FOREIGN_ENV), ab_env(AB_OWN_ENV)
        trees = [Path(p) for p in (foreign, own) if p]
        write_round_output(
            self.path,
            RoundOutput(
                records=outputs.records,
                outcomes=self.outcomes,
                errors=errors,
                foreign=foreign_modules(foreign, own) if foreign and own else [],
                modules=preload_names(trees),
            ),
        )
