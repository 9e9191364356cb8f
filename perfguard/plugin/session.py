"""One ``pytest --perfguard`` session: the hooks, each handing its step to the part that owns it.

Registered by ``pytest_configure`` only when ``--perfguard`` is on; this is where torch,
pandas and the analysis get imported. The parts, along a test's life:

* :class:`~perfguard.plugin.context.SessionContext` — configure: the backend, the git
  state, the machine's fingerprint, the baseline run (a bad backend, ref or store is a
  :class:`pytest.UsageError` before any test runs); at the end, the save.
* :class:`~perfguard.plugin.coordinator.Coordinator` — tests measured in child processes:
  A/B mode measures both trees after collection; ``--perfguard-isolate`` runs each test
  in a child at set-up. :class:`~perfguard.plugin.coordinator.RoundChild` is such a child.
* :class:`~perfguard.plugin.runner.CaptureRunner` — tests captured here: what each item
  asks for (once per test), the fixture's loop, nsys at **setup** (the test re-run alone
  in a child pytest under nsys; the parent then skips the body and reports the child's
  outcome; a crash, hang or profiler failure is the test's setup *error*), a marked test
  without the fixture captured whole at **call**; after the body a typed
  :class:`~perfguard.core.record.TestCapture`.
* :class:`~perfguard.plugin.judging.Verdicts` — right after the body, in the
  ``pytest_runtest_call`` wrapper: the core's record and verdict (:mod:`perfguard.core`),
  kept; a regression is raised there,
  so the failure, its message and ``-ra`` line belong to that test's call report, and
  ``user_properties`` (hence ``--junitxml``) carry the figures. A capture that failed is
  raised at **teardown** as the test's *error*, with the reason; the session goes on.
* :class:`~perfguard.plugin.outputs.SessionOutputs` — the entries and records, and alone
  ``results.json`` (after every test, and at **sessionfinish**), the reports and the
  terminal summary.

pytest-xdist: every worker captures and judges its own tests (it looks the baseline up
itself; SQLite reads are concurrent) and hands its records and results to the controller
through ``workeroutput``; the controller merges them in ``pytest_testnodedown`` and alone
saves (one run, one transaction) and writes ``results.json`` and the terminal summary.
A worker spools each entry and record as it makes them (``outputs.SPOOL``): one that dies
(a test calling ``os._exit``) loses only the test it was running, reported ``crashed``.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import pytest

from perfguard.compare.outcomes import fails
from perfguard.core.phases import timed
from perfguard.core.spec import ProfileSpec
from perfguard.errors import PerfguardError
from perfguard.plugin.changed import VERDICT_KEY, select_changed, verdict_meta
from perfguard.plugin.confirm import Confirmer
from perfguard.plugin.context import SaveResult, SessionContext
from perfguard.plugin.coordinator import Coordinator, RoundChild
from perfguard.plugin.footprint import SessionFootprint
from perfguard.plugin.items import profiled, spec_of, uses_loop
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.judging import Verdicts
from perfguard.plugin.options import Settings, plugin_args
from perfguard.plugin.outputs import SessionOutputs
from perfguard.plugin.runner import CaptureRunner
from perfguard.plugin.valgrind_child import METRIC, InstructionSession

OUTPUT_KEY = "perfguard"


class PerfguardSession:
    """The plugin object of a ``--perfguard`` session: a thin dispatcher (module docstring)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        t0 = time.perf_counter()
        self.config = config
        self.context = SessionContext(config, settings)
        self.outputs = SessionOutputs(self.context)
        self.runner = CaptureRunner(self.context)
        self.verdicts = Verdicts(self.context, self.outputs)
        #: the session's one Callgrind child, when a test asks for instructions
        self.instructions = InstructionSession(
            settings.output,
            settings.timeout,
            keep_env=settings.instructions_env,
            plugin_args=plugin_args(config),
        )
        self.verdicts.instructions = self.instructions
        self.child = RoundChild(self.context.round_child) if self.context.round_child else None
        self.coordinator: Coordinator | None = None
        if self.child is not None:
            return
        self.coordinator = Coordinator(self.context, self.verdicts)
        if not settings.against:
            self.context.find_baseline()
            self.verdicts.confirmer = Confirmer(self.context, self.coordinator.say)
        if self.context.worker_id is None:  # last: a usage error above leaves no lock behind
            self.context.claim_output()
        self.outputs.phase_s["start"] = time.perf_counter() - t0  # the outputs began above

    def close(self) -> None:
        if self.verdicts.confirmer is not None:
            self.verdicts.confirmer.close()
        if self.coordinator is not None:
            self.coordinator.close()
        self.context.close()

    def profile_for(self, item: pytest.Item, spec: ProfileSpec) -> GpuProfile:
        """The ``gpuprofile`` fixture's loop for ``item``."""
        return self.runner.profile_for(item, spec)

    # ------------------------------------------------------------------ collection
    @pytest.hookimpl(wrapper=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> Generator[None, None, None]:
        """After every other plugin's selection (``-k``, ``--perfguard-shard``): a round
        child keeps its test; a session records footprints and skips the unchanged."""
        yield
        if self.child is not None:
            self.child.select(config, items)
            return
        ctx = self.context
        if ctx.git is None or ctx.settings.against:
            if ctx.settings.changed:
                ctx.notes.append("--perfguard-changed: store mode in a git repository only")
            return
        measured = [i for i in items if profiled(i)]
        if ctx.settings.save or ctx.settings.changed:
            self.outputs.footprint = SessionFootprint(ctx.git.root, [i.path for i in measured])
        if ctx.settings.changed and measured:
            with timed(self.outputs.phase_s, "changed"):
                self._skip_unchanged(config, items, measured)

    def _skip_unchanged(
        self, config: pytest.Config, items: list[pytest.Item], measured: list[pytest.Item]
    ) -> None:
        """``--perfguard-changed``: deselect the benchmarks nothing changed under, each one's
        entry carrying its baseline verdict (:mod:`perfguard.plugin.changed`)."""
        footprint = self.outputs.footprint
        assert footprint is not None and self.context.git is not None
        chosen = select_changed(self.context, {i.nodeid: i.path for i in measured}, footprint)
        self.context.notes.append(chosen.note())
        if not chosen.carried:
            return
        drop = [i for i in items if i.nodeid in chosen.carried]
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i.nodeid not in chosen.carried]
        for entry in chosen.carried.values():
            self.outputs.add(entry)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """A/B: every selected marked test measured in both trees, up front. Store mode:
        the instructions of the tests that ask for them, counted in one Callgrind child."""
        if self.coordinator is None:
            return
        settings = self.context.settings
        counted = [
            i.nodeid for i in session.items if profiled(i) and _wants_instructions(i, settings)
        ]
        if self.coordinator.ab is None:
            if counted:
                with timed(self.outputs.phase_s, "instructions"):
                    self.instructions.measure(counted, self.config.rootpath, self.config.inipath)
                self.context.notes.extend(self.instructions.notes)
            return
        with timed(self.outputs.phase_s, "ab_rounds"):
            self.coordinator.measure([i.nodeid for i in session.items if profiled(i)])
        if counted:
            with timed(self.outputs.phase_s, "instructions"):
                self.coordinator.count_instructions(counted, self.instructions, self.config.inipath)

    # ------------------------------------------------------------------ per test
    def marker_error(self, item: pytest.Item, message: str) -> None:
        """A bad ``gpuprofile`` marker: the test's ``error`` row, with the marker's message
        (it was measured in intent; a summary saying no test was measured misleads)."""
        if self.child is None:
            self.verdicts.error(item, message, self.context.backend.label, at_teardown=False)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        try:
            what = self.runner.captures(item)
        except PerfguardError as exc:  # the marker's backend= cannot run here
            backend = spec_of(item).backend or "?"
            self.verdicts.error(item, str(exc), backend, at_teardown=False)
            pytest.fail(f"perfguard: backend {backend!r} of {item.nodeid}: {exc}", pytrace=False)
        if what is None:
            return
        if what[1].label != "nsys":
            if self.coordinator is not None:
                self.coordinator.isolate(item)
            return
        try:
            self.runner.run_nsys(item)
        except PerfguardError as exc:
            self.verdicts.error(item, str(exc), what[1].label, at_teardown=False)
            pytest.fail(f"perfguard: capture of {item.nodeid} failed: {exc}", pytrace=False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        if self.coordinator is not None and self.coordinator.ran(pyfuncitem.nodeid):
            self.coordinator.call(pyfuncitem)
            return True  # the body ran in the child processes
        child = self.runner.nsys_child(pyfuncitem)
        if child is None:
            return None
        if child.get("outcome") == "failed":
            head = (child.get("crash") or "failed").splitlines()[0]
            pytest.fail(f"{head} (run under nsys)\n\n{child.get('longrepr') or ''}", pytrace=False)
        if child.get("outcome") == "skipped":
            pytest.skip(child.get("skip_reason") or "skipped (under nsys)")
        return True  # the body ran in the child

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        try:
            what = self.runner.captures(item)
        except (ValueError, PerfguardError):
            what = None
        coordinator = self.coordinator
        if what is not None:
            self.outputs.started(item.nodeid)
        try:
            if what is not None and coordinator is not None and coordinator.ran(item.nodeid):
                result = yield
                coordinator.judge(item)
                return result
            if what is None or what[1].label == "nsys" or uses_loop(item):
                result = yield
            else:
                with self.runner.whole_call(item, what[1]):
                    result = yield
        except (pytest.skip.Exception, pytest.xfail.Exception, KeyboardInterrupt):
            raise  # skipped, or the session is being interrupted: not this test's fault
        except BaseException as exc:
            if what is not None and not self.verdicts.judged(item.nodeid):
                text = " ".join(str(exc).split()) or type(exc).__name__
                if not isinstance(exc, pytest.fail.Exception):
                    text = f"the test raised {type(exc).__name__}: {text}"
                self.verdicts.error(item, text[:500], what[1].label, at_teardown=False)
            raise
        if what is not None:
            capture = self.runner.result(item, what[0])
            if capture is not None:
                self.verdicts.judge_capture(item, what[0], capture)
        return result

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self.verdicts.raise_teardown_error(item)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.child is not None:
            self.child.report(report)

    # ------------------------------------------------------------------ xdist
    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        data = getattr(node, "workeroutput", {}).get(OUTPUT_KEY)
        if data:
            self.outputs.merge_worker(data)
            return
        worker = getattr(node, "workerinput", {}).get("workerid")
        if worker:  # it died before handing over: what it spooled, and the test it was in
            self.outputs.merge_lost_worker(str(worker), error)

    # ------------------------------------------------------------------ the end
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        ctx, settings, outputs = self.context, self.context.settings, self.outputs
        if self.child is not None:
            self.child.write(outputs)
            return
        if exitstatus != pytest.ExitCode.INTERRUPTED:
            self._confirm_noisy(session)
        if ctx.worker_id is not None:
            self.config.workeroutput[OUTPUT_KEY] = outputs.worker_output()  # type: ignore[attr-defined]
            return
        outputs.clear_spool()  # every worker's output is merged by now
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if settings.save and interrupted:
            outputs.saved = SaveResult(
                error="the session was interrupted: a partial run is never saved"
            )
        elif settings.save:
            for nodeid, record in outputs.records.items():  # what --perfguard-changed carries
                if nodeid in outputs.entries:
                    record.meta[VERDICT_KEY] = verdict_meta(outputs.entries[nodeid])
            with timed(outputs.phase_s, "save"):
                outputs.saved = ctx.save(outputs.records)
        if outputs.saved.error and settings.save and not interrupted:
            # --perfguard-save exists to make baselines: not saving must not look green
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if settings.require_baseline and not self._compared():
            ctx.notes.append("--perfguard-require-baseline: no test was compared with a baseline")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        outputs.final()

    def _confirm_noisy(self, session: pytest.Session) -> None:
        """The tests whose timing was noisy, measured again together A/B against their
        baseline commit (:mod:`perfguard.plugin.confirm`); a test that regressed once
        confirmed fails the session, and every view shows its verdict (its pytest report
        was made before: it is named in a note)."""
        confirmer = self.verdicts.confirmer
        if confirmer is None:
            return
        t0 = time.perf_counter()
        entries = confirmer.finish()
        if entries:  # a part of the session's own only where it measured
            self.outputs.phase_s["confirm"] = time.perf_counter() - t0
        late = []
        for entry in entries:
            self.outputs.add(entry)
            if fails(entry.outcome, self.context.settings.fail_on):
                late.append(entry.nodeid)
        confirmer.note()
        if late:
            self.context.notes.append(
                f"{len(late)} test(s) regressed once their noisy timing was confirmed on this "
                f"machine after they ran (their pytest result was reported before): "
                + ", ".join(late[:5])
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _compared(self) -> bool:
        """Some test was compared with something (a judged timing or gates)."""
        judged = ("regressed", "improved", "unchanged")
        for e in self.outputs.entries.values():
            if e.timing is not None and e.timing.mode in ("store", "ab") and e.timing.n_baseline:
                return True
            if e.gates is not None and e.gates.outcome.value in judged:
                return True
        return False

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.context.worker_id is not None or self.child is not None:
            return
        terminalreporter.section("perfguard")
        for line in self.outputs.summary_lines():
            terminalreporter.write_line(line)


def _wants_instructions(item: pytest.Item, settings: Settings) -> bool:
    """The test asks for host instructions: its marker's ``metrics=`` or the session's
    ``--perfguard-metric``; a bad marker is its own setup error later, not counted."""
    if settings.metric == METRIC:
        return True
    try:
        return METRIC in spec_of(item).metrics
    except ValueError:
        return False
