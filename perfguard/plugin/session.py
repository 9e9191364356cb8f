"""One ``pytest --perfguard`` session: capture, verdict, store, outputs.

Registered by ``pytest_configure`` only when ``--perfguard`` is on; this is
where torch, pandas and the analysis get imported.

Where each step runs, and why there:

* **configure** — the backend is chosen, the git state read, the machine
  fingerprinted and the baseline run looked up once (a bad backend, ref or
  store is a :class:`pytest.UsageError` before any test runs).
* **setup** (nsys only) — the test is re-run alone in a child pytest under
  nsys (:func:`perfguard.capture.capturers.run_nsys_child`); the parent then
  skips the body (``pytest_pyfunc_call``) and reports the child's outcome.
  A crash, hang or profiler failure of the child is the test's setup *error*.
* **call** — torch backend: the recorded iterations are profiled in process
  (the fixture's loop, or the whole call as one iteration for a marked test
  that does not use the fixture). Right after the test body, in the
  ``pytest_runtest_call`` wrapper, the capture is analysed, the record built
  and compared with the baseline; a regression is raised there, so the
  failure, its message and ``-ra`` line belong to that test's call report,
  and ``user_properties`` (hence ``--junitxml``) carry the figures.
* **teardown** — a capture that failed (profiler, trace, analysis) is raised
  as the test's teardown *error*, with the reason; the session goes on.
* **sessionfinish** — with ``--perfguard-save`` all records are saved as one
  run (one store transaction), then ``results.json`` is written.

pytest-xdist: every worker captures and judges its own tests (it looks the
baseline up itself; SQLite reads are concurrent) and hands its records and
results to the controller through ``workeroutput``; the controller merges
them in ``pytest_testnodedown`` and alone saves (one run, one transaction)
and writes ``results.json`` and the terminal summary. Records of a worker
that crashed are lost with it; the others are kept.
"""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
import sys
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfguard.baseline.fingerprint import machine_fingerprint
from perfguard.baseline.git import (
    BaselineMatch,
    GitState,
    default_baseline_ref,
    find_baseline,
    repo_state,
    resolve,
)
from perfguard.baseline.record import RunInfo, TestRecord
from perfguard.baseline.store import Store, open_store
from perfguard.capture.capturers import TorchCapturer, capture_name, run_nsys_child, whole_call
from perfguard.capture.select import select_backend
from perfguard.capture.torch_profiler import TRACE_SUFFIX, TorchBackend
from perfguard.compare.results import TestEntry
from perfguard.errors import PerfguardError
from perfguard.plugin.ab import (
    AB_FOREIGN_ENV,
    AB_OUT_ENV,
    AB_OWN_ENV,
    AB_SELECT_ENV,
    ABRunner,
    RoundOutput,
    TestAB,
    foreign_modules,
    prepare_worktree,
    write_round_output,
)
from perfguard.plugin.forkserver import preload_names
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import ProfileSpec
from perfguard.plugin.options import AB_CHILD_ROUNDS, MAX_AB_PAIRS, Settings, project_root
from perfguard.plugin.outputs import SessionOutputs

ALPHA = 0.01
OUTPUT_KEY = "perfguard"

_error_key = pytest.StashKey[str]()
_capture_key = pytest.StashKey[dict[str, Any]]()


@dataclass(frozen=True)
class ResolvedBackend:
    """How tests are captured: ``label`` is what the fingerprint records.

    ``nsys``; ``torch`` (the profiler with CUDA activities); ``cpu`` (the
    torch profiler with CPU activities only — also what ``torch`` means on a
    machine without CUDA, since the measurement is then the same).
    """

    label: str
    device: str | None
    why: str


def resolve_backend(choice: str) -> ResolvedBackend:
    """The backend for ``auto|torch|nsys|cpu``; :class:`PerfguardError` when it cannot run here."""
    if choice == "cpu":
        select_backend("torch")  # raises when torch is missing
        return ResolvedBackend("cpu", "cpu", "the cpu backend was requested")
    chosen = select_backend(choice)
    if not isinstance(chosen, TorchBackend):
        return ResolvedBackend("nsys", None, chosen.why)
    device = chosen.device
    if device == "auto":
        from perfguard.capture.torch_profiler import torch_cuda_available

        device = "cuda" if torch_cuda_available() else "cpu"
    if device == "cuda":
        return ResolvedBackend("torch", "cuda", chosen.why)
    why = chosen.why if choice == "auto" else f"{chosen.why}; torch sees no CUDA: CPU only"
    return ResolvedBackend("cpu", "cpu", why)


class PerfguardSession:
    """The plugin object of a ``--perfguard`` session (see the module docstring)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        workerinput = getattr(config, "workerinput", None)
        self.worker_id: str | None = workerinput["workerid"] if workerinput else None
        #: each test's entry, checked once when it is made (never re-read from dicts)
        self.entries: dict[str, TestEntry] = {}
        self.records: dict[str, TestRecord] = {}
        #: nodeid -> the acceptance (perfguard.baseline.accept) it was judged under
        self.accepted: dict[str, Any] = {}
        self.notes: list[str] = []
        self.saved_run_id: int | None = None
        self.save_error: str | None = None
        #: what the save replaced (earlier records of this commit and machine), if anything
        self.replaced: dict[str, Any] | None = None
        #: the one writer of results.json and the reports
        self.outputs = SessionOutputs(settings.output)
        self._backends: dict[str, ResolvedBackend] = {}
        self._store: Store | None = None
        self._walk: Any = None  # the baseline ref's first-parent history, walked once

        try:
            self.backend = self._backend(settings.backend)
        except PerfguardError as exc:
            raise pytest.UsageError(f"--perfguard-backend {settings.backend}: {exc}") from None
        self.fingerprint = machine_fingerprint(self.backend.label, workers=_workers(config))
        if self.backend.label != "nsys":
            from perfguard.capture.torch_profiler import record_compiled_kernels

            # before any test compiles: torch.compile's C++ kernels get a profiler range
            # each, so a compiled CPU model's fused ops can be named (trace/compiled.py)
            record_compiled_kernels()
        self.git: GitState | None = None
        root, misplaced = project_root(config)
        if misplaced:
            self.notes.append(misplaced)
        try:
            self.git = repo_state(root)
        except PerfguardError as exc:
            if settings.save or settings.baseline:
                flag = "--perfguard-save" if settings.save else "--perfguard-baseline"
                raise pytest.UsageError(f"{flag} needs a git repository: {exc}") from None
            self.notes.append(f"no git state, so no baseline: {exc}")
        self.run = RunInfo(
            commit=self.git.commit if self.git else "",
            branch=self.git.branch if self.git else None,
            dirty=self.git.dirty if self.git else False,
            time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            fingerprint=self.fingerprint,
        )
        self.baseline_ref: str | None = None
        self.match: BaselineMatch | None = None
        #: round-child mode (A/B): this process runs one round for a parent session
        self.ab_out = os.environ.get(AB_OUT_ENV)
        self.ab_outcomes: dict[str, dict[str, str]] = {}
        self.ab: ABRunner | None = None
        self.ab_results: dict[str, TestAB] = {}
        self.ab_commit: str | None = None
        self._lock: Any = None
        self._restore_sigterm: Any = None
        #: --perfguard-isolate: each measured test runs in a child process of its own
        self.isolated: set[str] = set()
        self.isolator: ABRunner | None = None
        if self.ab_out:
            return
        if settings.isolate and not settings.against:
            self.isolator = ABRunner(
                head_root=config.rootpath, base_root=config.rootpath, head_rel=Path("."),
                output=settings.output / "isolated", backend=settings.backend,
                xdist=config.pluginmanager.hasplugin("xdist"), timeout=settings.timeout,
                rounds=settings.rounds, children=settings.children,
            )  # fmt: skip
        if settings.against:
            self._prepare_ab()
        else:
            self._find_baseline()
        if self.worker_id is None:  # last: a usage error above leaves no lock behind
            self._claim_output()
            self._restore_sigterm = _sigterm_interrupts()

    # ------------------------------------------------------------------ set-up helpers
    def _backend(self, choice: str) -> ResolvedBackend:
        if choice not in self._backends:
            self._backends[choice] = resolve_backend(choice)
        return self._backends[choice]

    def _find_baseline(self) -> None:
        if self.git is None:
            return
        root = self.git.root
        try:
            if self.settings.baseline:
                ref: str | None = resolve(root, self.settings.baseline)
            else:
                ref = default_baseline_ref(root)
        except PerfguardError as exc:
            if self.settings.baseline:
                raise pytest.UsageError(f"--perfguard-baseline: {exc}") from None
            self.notes.append(f"no baseline: {exc}")
            return
        if ref is None:
            self.notes.append("no baseline: HEAD is the repository's first commit")
            return
        self.baseline_ref = ref
        if isinstance(self.settings.store, Path) and not self.settings.store.is_file():
            self.notes.append(f"no baseline: no store at {self.settings.store}")
            return
        try:
            # a server store is made on first use; a lookup never leaves a new empty file
            server = isinstance(self.settings.store, str)
            self._store = open_store(self.settings.store, create=server)
            self.match = find_baseline(self._store, root, ref, self.fingerprint)
        except PerfguardError as exc:
            raise pytest.UsageError(f"--perfguard-store: {exc}") from None

    def _claim_output(self) -> None:
        """The output folder must be writable, and one session's alone: a second session
        in the same checkout would overwrite the first one's captures and results."""
        out = self.settings.output
        flag = "--perfguard-output"
        try:
            out.mkdir(parents=True, exist_ok=True)
            self._lock = open(out / ".lock", "a+")  # noqa: SIM115 (held for the session)
        except OSError as exc:
            raise pytest.UsageError(
                f"{flag} {out}: cannot write there ({exc.strerror or exc})"
            ) from None
        try:
            import fcntl

            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not on POSIX: no lock, as before
            return
        except OSError:
            self._lock.seek(0)
            other = self._lock.read().strip() or "?"
            self._lock.close()
            self._lock = None
            raise pytest.UsageError(
                f"{flag} {out}: another perfguard session (pid {other}) is writing there; "
                "give this one its own folder with --perfguard-output"
            ) from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()

    def _prepare_ab(self) -> None:
        """A/B mode: the base worktree, made before any test runs (a bad ref is a usage
        error); the measurement itself runs once the tests are collected."""
        flag = f"--perfguard-against {self.settings.against}"
        if self.worker_id is not None or getattr(self.config.option, "numprocesses", None):
            raise pytest.UsageError(
                f"{flag}: A/B mode alternates rounds of both trees in fresh processes on "
                "this machine; run it without -n (pytest-xdist)"
            )
        if self.git is None:
            raise pytest.UsageError(f"{flag} needs a git repository")
        try:
            base_root, self.ab_commit = prepare_worktree(
                self.git.root, self.settings.against, _git_dir(self.git.root) / "perfguard-ab"
            )
        except (RuntimeError, OSError) as exc:
            raise pytest.UsageError(f"{flag}: cannot check it out: {exc}") from None
        rootdir = self.config.rootpath.resolve()
        if not rootdir.is_relative_to(self.git.root.resolve()):
            raise pytest.UsageError(
                f"{flag}: pytest's rootdir {rootdir} is outside the git repository "
                f"{self.git.root}; pass --rootdir={self.git.root} (or give paths with '=')"
            )
        self.ab = ABRunner(
            head_root=self.git.root, base_root=base_root,
            head_rel=self.config.rootpath.resolve().relative_to(self.git.root.resolve()),
            output=self.settings.output, backend=self.settings.backend,
            xdist=self.config.pluginmanager.hasplugin("xdist"),
            timeout=self.settings.timeout, children=self.settings.children,
            say=self._say,
        )  # fmt: skip
        self.notes.append(
            f"A/B mode: {self.settings.ab_pairs} ABBA pairs of rounds against "
            f"{self.settings.against} ({self.ab_commit[:12]}), each a fresh child process "
            f"({self.settings.children}) timing {AB_CHILD_ROUNDS} rounds (its fastest step)"
        )

    # ------------------------------------------------------------------ A/B mode
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """A round child runs only the tests its parent selected."""
        select = os.environ.get(AB_SELECT_ENV)
        if not self.ab_out or not select:
            return
        wanted = set(Path(select).read_text(encoding="utf-8").split("\n"))
        keep = [i for i in items if i.nodeid in wanted]
        dropped = [i for i in items if i.nodeid not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """A/B parent: measure every selected marked test in both trees, up front."""
        if self.ab is None:
            return
        from perfguard.plugin.items import profiled

        nodeids = [i.nodeid for i in session.items if profiled(i)]
        if not nodeids:
            return
        self.ab_results = self.ab.measure(
            nodeids, self.settings.ab_pairs, budget=self.settings.ab_budget,
            max_pairs=MAX_AB_PAIRS, unresolved=self._ab_unresolved, status=self._ab_status,
        )  # fmt: skip
        self.notes.extend(self.ab.notes)

    def _say(self, line: str) -> None:
        """A line on the terminal now, past pytest's output capture (a progress line
        written while collecting would otherwise appear only when the session ends)."""
        from contextlib import nullcontext

        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else nullcontext():
            reporter.write_line(line)
            reporter.flush()

    def _ab_verdict(self, ab: TestAB) -> Any:
        """The timing verdict of the pairs measured so far (None while a side has none)."""
        from perfguard.baseline.record import round_value
        from perfguard.compare.timing import judge_ab

        if ab.base.failure or ab.head.failure or not ab.base.records or not ab.head.records:
            return None
        metric = ab.head.records[0].metric
        # a child's value: its timing iterations reduced as merge_rounds makes a round of them
        a = np.array([round_value(r.values(metric), metric) for r in ab.base.records])
        b = np.array([round_value(r.values(metric), metric) for r in ab.head.records])
        n = min(len(a), len(b))
        return judge_ab(a[:n], b[:n], metric=metric, tolerance=self.settings.tolerance,
                        alpha=ALPHA)  # fmt: skip

    def _ab_unresolved(self, nodeid: str, ab: TestAB) -> bool:
        from perfguard.compare.timing import ab_resolved

        verdict = self._ab_verdict(ab)
        return verdict is not None and not ab_resolved(verdict, self.settings.tolerance)

    def _ab_status(self, nodeid: str, ab: TestAB) -> str:
        """A test's change so far, for the progress line."""
        verdict = self._ab_verdict(ab)
        name = nodeid.rsplit("::", 1)[-1]
        if verdict is None or not math.isfinite(verdict.delta_pct):
            return ""  # fewer pairs than a change is estimated from
        ci = ""
        if verdict.ci_low_pct == verdict.ci_low_pct:
            ci = f" [{verdict.ci_low_pct:+.1f}, {verdict.ci_high_pct:+.1f}]"
        return f"{name} {verdict.delta_pct:+.1f}%{ci}"

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A round child remembers each test's pytest outcome for its parent."""
        if not self.ab_out:
            return
        if report.failed and report.nodeid not in self.ab_outcomes:
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
            text = crash or (report.longreprtext or "failed").strip().splitlines()[-1]
            text = " ".join(str(text).split())
            self.ab_outcomes[report.nodeid] = {"outcome": "failed", "message": text[:500]}

    def _judge_ab(self, item: pytest.Item, spec: ProfileSpec) -> None:
        """The A/B verdict of one test from its rounds in both trees."""
        from perfguard.baseline.record import merge_rounds
        from perfguard.compare.against import settings_for
        from perfguard.compare.judge import Against, judge

        ab = self.ab_results.get(item.nodeid)
        if ab is None:
            return
        if ab.head.failure is not None or not ab.head.records:
            why = ab.head.failure or f"no round of the head reported ({ab.head.missing} lost)"
            self._error_entry(item, why, self.backend.label, at_teardown=ab.head.failure is None)
            return
        head = merge_rounds(ab.head.records)
        notes = []
        if ab.head.missing or ab.base.missing:
            notes.append(f"rounds lost: head {ab.head.missing}, base {ab.base.missing}")
        reason = None
        if ab.foreign:
            reason = "a tree imported the other tree's code: " + ", ".join(ab.foreign[:3])
        if ab.base.failure is not None:
            notes.append(f"in the base tree: {ab.base.failure}")
        against = Against(
            records=[merge_rounds(ab.base.records)] if ab.base.records else [],
            mode="ab", commit=self.ab_commit,
            run_found=True,  # the base tree was measured: a test it lacks is new
            incompatibility=reason,
        )  # fmt: skip
        comparison = judge(head, against, settings_for(head, self.settings.tolerance))
        self._finish(item, head, comparison, [], head.meta.get("capture"), self.backend.label,
                     notes)  # fmt: skip

    def _judge_isolated(self, item: pytest.Item, spec: ProfileSpec) -> None:
        """Store mode on the record the test's own child process made."""
        ab = self.ab_results[item.nodeid]
        if not ab.head.records:
            return
        record = ab.head.records[0]
        try:
            comparison = self._compare(record, spec)
        except (PerfguardError, ValueError, KeyError) as exc:
            self._error_entry(item, " ".join(str(exc).split()), self.backend.label)
            return
        self._finish(item, record, comparison, [], record.meta.get("capture"),
                     str(record.meta.get("backend") or self.backend.label), [])  # fmt: skip

    def close(self) -> None:
        for runner in (self.ab, self.isolator):
            if runner is not None:
                runner.close()
        if self._restore_sigterm is not None:
            self._restore_sigterm()
            self._restore_sigterm = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        if self._store is not None:
            self._store.close()
            self._store = None

    # ------------------------------------------------------------------ per test
    def _captures(self, item: pytest.Item) -> tuple[ProfileSpec, ResolvedBackend] | None:
        from perfguard.plugin.items import profiled, spec_of

        if not profiled(item):
            return None
        spec = self.effective(spec_of(item))  # validated in setup already
        return spec, (self._backend(spec.backend) if spec.backend else self.backend)

    def effective(self, spec: ProfileSpec) -> ProfileSpec:
        """The marker's settings with the session's: ``--perfguard-rounds`` fills in the
        rounds a marker did not set; in an A/B round child it is the parent's word (one
        round per child, whatever the marker says)."""
        from dataclasses import replace

        rounds = self.settings.rounds
        if rounds is not None and (self.ab_out or not spec.rounds_given):
            return replace(spec, rounds=rounds)
        return spec

    def _capture_path(self, item: pytest.Item) -> Path:
        folder = self.settings.output / "captures"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / (capture_name(item.nodeid) + TRACE_SUFFIX)

    def profile_for(self, item: pytest.Item, spec: ProfileSpec) -> GpuProfile:
        """The fixture's value: a profiled loop with the torch backends, a plain one for nsys."""
        try:
            what = self._captures(item)
        except PerfguardError:
            return GpuProfile(spec)  # the marker's backend cannot run: setup reports it next
        if what is None or what[1].label == "nsys":
            return GpuProfile(self.effective(spec))  # nsys: the child runs the body
        from perfguard.capture.frameworks import DeferredCapturer

        # the framework is decided when the loop starts (the marker's framework=, else what
        # the test holds and the process has imported by then): importorskip in the body
        where = self._capture_path(item).with_name(capture_name(item.nodeid))
        capturer = DeferredCapturer(spec.framework, getattr(item, "module", None), where,
                                    what[1].device or "cpu", TRACE_SUFFIX)  # fmt: skip
        item.stash[_capture_key] = {"path": where, "backend": what[1].label}
        return GpuProfile(what[0], capturer)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        try:
            what = self._captures(item)
        except PerfguardError as exc:  # the marker's backend= cannot run here
            backend = spec_backend(item) or "?"
            self._error_entry(item, str(exc), backend, at_teardown=False)
            pytest.fail(f"perfguard: backend {backend!r} of {item.nodeid}: {exc}", pytrace=False)
        if what is not None and self.isolator is not None and what[1].label != "nsys":
            self.isolated.add(item.nodeid)
            self.isolator.run_round("B", [item.nodeid], len(self.isolated) - 1)
            self.ab_results[item.nodeid] = self.isolator.results[item.nodeid]
            return
        if what is None or what[1].label != "nsys":
            return
        out = self.settings.output / "captures"
        out.mkdir(parents=True, exist_ok=True)
        try:
            path, child = run_nsys_child(
                item.nodeid, rootdir=self.config.rootpath, inifile=self.config.inipath,
                output_dir=out, timeout=self.settings.timeout,
                xdist=self.config.pluginmanager.hasplugin("xdist"),
            )  # fmt: skip
        except PerfguardError as exc:
            self._error_entry(item, str(exc), what[1].label, at_teardown=False)
            pytest.fail(f"perfguard: capture of {item.nodeid} failed: {exc}", pytrace=False)
        item.stash[_capture_key] = {"path": path, "backend": "nsys", "child": child}

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        ab = self.ab_results.get(pyfuncitem.nodeid)
        if ab is not None:
            where = (
                "its own process"
                if pyfuncitem.nodeid in self.isolated
                else ("an A/B round of the head")
            )
            if ab.head.failure is not None:
                pytest.fail(f"{ab.head.failure} (in {where})", pytrace=False)
            if not ab.head.records and ab.head.crash:
                why = f"crashed in {where}: {ab.head.crash}"
                self._error_entry(pyfuncitem, why, self.backend.label, at_teardown=False,
                                  outcome="crashed")  # fmt: skip
                pytest.fail(f"perfguard: {pyfuncitem.nodeid} {why}", pytrace=False)
            return True  # the body ran in the child processes
        child = pyfuncitem.stash.get(_capture_key, {}).get("child")
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
            what = self._captures(item)
        except (ValueError, PerfguardError):
            what = None
        try:
            if item.nodeid in self.ab_results and what is not None:
                result = yield
                if item.nodeid in self.isolated:
                    self._judge_isolated(item, what[0])
                else:
                    self._judge_ab(item, what[0])
                return result
            uses_fixture = "gpuprofile" in getattr(item, "fixturenames", ())
            if what is None or what[1].label == "nsys" or uses_fixture:
                result = yield
            else:
                path = self._capture_path(item)
                capturer = TorchCapturer(path, what[1].device or "cpu")
                with whole_call(capturer) as walls:
                    result = yield
                item.stash[_capture_key] = {"path": path, "backend": what[1].label,
                                            "capturer": capturer, "walls": walls}  # fmt: skip
        except (pytest.skip.Exception, pytest.xfail.Exception, KeyboardInterrupt):
            raise  # skipped, or the session is being interrupted: not this test's fault
        except BaseException as exc:
            if what is not None and item.nodeid not in self.entries:
                text = " ".join(str(exc).split()) or type(exc).__name__
                if not isinstance(exc, pytest.fail.Exception):
                    text = f"the test raised {type(exc).__name__}: {text}"
                self._error_entry(item, text[:500], what[1].label, at_teardown=False)
            raise
        if what is not None:
            self._judge(item, what[0])
        return result

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        error = item.stash.get(_error_key, None)
        if error is not None:
            pytest.fail(f"perfguard: capture of {item.nodeid} failed: {error}", pytrace=False)

    # ------------------------------------------------------------------ the verdict
    def _judge(self, item: pytest.Item, spec: ProfileSpec) -> None:
        """Analyse the capture, compare it, record the result; raise a regression as a failure."""
        from perfguard.plugin.items import profile_key

        info = item.stash.get(_capture_key, None)
        if info is None:
            return
        notes: list[str] = []
        rounds: list[int] = []
        env: dict[str, Any] = {}
        profile = item.stash.get(profile_key, None)
        if "child" in info:
            child = info["child"]
            walls, error = child.get("wall_times_ns") or [], child.get("error")
            info["cpu_times_ns"] = child.get("cpu_times_ns") or []
            rounds = list(child.get("rounds") or [])
            if not child.get("fixture"):
                notes.append("test does not use the gpuprofile fixture: captured as one iteration")
            if child.get("fixture") and not child.get("completed"):
                notes.append("the iteration loop ended early")
        elif profile is not None:
            profile.close()  # a loop left early still ends its capture here
            capturer = profile.capturer
            if getattr(capturer, "inner", None) is not None:  # decided at the loop's start
                info["path"] = capturer.path
            walls, error = profile.wall_times_ns, getattr(capturer, "error", None)
            info["cpu_times_ns"] = list(profile.cpu_times_ns)
            rounds = list(profile.round_of)
            env = {
                "load": profile.load,
                "wait": profile.wait,
                "peak_memory": profile.peak_memory,
                "profiled": list(profile.profiled),
                "speed_ns": float(np.median(profile.speed_ns)) if profile.speed_ns else None,
                "slow_rounds": profile.slow_rounds,
            }
            if not profile.started:
                error = error or (
                    "the test requests the gpuprofile fixture but never runs "
                    "gpuprofile.iterations(): nothing was measured"
                )
            elif not profile.captured:
                error = error or (
                    f"the iteration loop ended after {len(walls)} timed iterations, before "
                    "the profiled round: nothing was captured"
                )
            elif not profile.completed:
                notes.append(
                    f"the iteration loop ended early: {len(walls)} of {spec.iterations} recorded"
                )
        else:
            walls, error = info.get("walls", []), info["capturer"].error
            notes.append("test does not use the gpuprofile fixture: captured as one iteration")
        backend = info["backend"]
        if error:
            self._error_entry(item, error, backend, info.get("path"))
            return
        try:
            record, findings, analysis = self._record(
                item, spec, Path(info["path"]), walls, notes, backend,
                info.get("cpu_times_ns", []), rounds, env,
            )  # fmt: skip
            comparison = self._compare(record, spec)
            if analysis.ops.empty:  # nothing attributed or gated: never judged silently
                from perfguard.capture.frameworks import empty_capture_reason
                from perfguard.compare.verdict import with_empty_capture

                framework = getattr(getattr(profile, "capturer", None), "framework", None)
                framework = framework or (None if backend == "nsys" else "torch")
                comparison = with_empty_capture(comparison, empty_capture_reason(framework))
        except (PerfguardError, ValueError, KeyError) as exc:
            msg = " ".join(str(exc).split()) or type(exc).__name__
            self._error_entry(item, msg, backend, info.get("path"))
            return
        timeline = self._timeline(comparison, analysis, Path(info["path"]), item.nodeid)
        self._finish(item, record, comparison, findings, info["path"], backend, notes, timeline)

    def _timeline(self, comparison: Any, analysis: Any, capture: Path, nodeid: str) -> str | None:
        """A regressed test's capture as a Perfetto trace beside it (the report links it):
        the reviewer opens the evidence in ui.perfetto.dev, op to kernel. Named after the
        test (one file per test: a name cut from the capture's would be its module's)."""
        from perfguard.compare.outcomes import Outcome

        if comparison.outcome is not Outcome.REGRESSED:
            return None
        from perfguard.report.perfetto import write_perfetto

        name = capture_name(nodeid) + ".perfetto.json.gz"
        try:
            path = write_perfetto(analysis, capture.with_name(name))
            return str(Path(path).resolve().relative_to(self.settings.output.resolve()))
        except (OSError, ValueError, PerfguardError):
            return None  # the verdict stands without its timeline

    def _finish(
        self,
        item: pytest.Item,
        record: TestRecord,
        comparison: Any,
        findings: list[dict[str, Any]],
        capture: Any,
        backend: str,
        notes: list[str],
        timeline: str | None = None,
    ) -> None:
        """Keep the record and the verdict; a regression fails the test here."""
        self.records[item.nodeid] = record
        entry = comparison.to_dict()
        accepted = self.accepted.get(item.nodeid) if comparison.mode == "store" else None
        if accepted is not None:
            entry["accepted"] = accepted.to_dict()
        entry.update(
            timeline=timeline,
            load=record.meta.get("load"),
            wait=record.meta.get("wait"),
            findings=findings,
            history=self._history(item.nodeid),
            capture=str(capture) if capture else None,
            backend=backend,
            error=None,
            notes=notes,
            worker=self.worker_id,
        )
        self.entries[item.nodeid] = TestEntry.from_dict(entry, "results", item.nodeid)
        _add_properties(item, entry)
        self._write_partial()
        from perfguard.compare.verdict import failed

        if failed(comparison, self.settings.fail_on):
            commit = comparison.baseline_commit or ""
            what = "the base tree" if comparison.mode == "ab" else "the baseline"
            pytest.fail(
                f"perfguard: {item.nodeid} regressed against {what} at {commit[:12]}: "
                f"{comparison.explanation.text()}",
                pytrace=False,
            )

    def _record(
        self,
        item: pytest.Item,
        spec: ProfileSpec,
        path: Path,
        walls: list[int],
        notes: list[str],
        backend: str,
        cpu_times: list[int],
        rounds: list[int] | None = None,
        env: dict[str, Any] | None = None,
    ) -> tuple[TestRecord, list[dict[str, Any]], Any]:
        from perfguard.analysis import analyze
        from perfguard.baseline.record import record_from_analysis
        from perfguard.trace import load_trace

        analysis = analyze(load_trace(path), key_node=spec.key_node)
        has_gpu = len(analysis.activities) > 0
        available = {"gpu_time": has_gpu, "wall_time": True, "cpu_time": bool(cpu_times)}
        # the first metric the marker names that this capture has; wall time otherwise
        metric = next((m for m in spec.metrics if available[m]), "wall_time")
        if metric not in spec.metrics:
            notes.append(
                f"no {' or '.join(spec.metrics)} measured here"
                f"{'' if has_gpu else ' (no GPU activity captured)'}: "
                "judged on per-iteration wall time"
            )
        n_ranges = int((analysis.iterations["rank"] == analysis.iterations["rank"].min()).sum())
        if n_ranges == 0:
            raise PerfguardError(f"{path}: the capture holds no iteration")
        env = env or {}
        profiled = np.asarray(env.get("profiled") or [], dtype=bool)
        if len(profiled) != len(walls):
            profiled = np.ones(len(walls), dtype=bool)
        if not profiled.all():
            notes.append(
                f"timed in {len(set(np.asarray(rounds)[~profiled]))} rounds with the profiler "
                f"off; ops, kernels and gates from 1 profiled round of {int(profiled.sum())} "
                "iterations"
            )
        if walls and int(profiled.sum()) != n_ranges:
            notes.append(
                f"{len(walls)} timed iterations but {n_ranges} in the capture: "
                "iteration durations from the capture are used"
            )
        load, wait = env.get("load"), env.get("wait")
        meta = {
            "marker": spec.to_dict(),
            "tolerance": self._tolerance(spec),
            "capture": str(path),
            "backend": backend,
            "note": "; ".join(notes) or None,
            "cpu_times_ns": cpu_times or None,
            "load": load if load is not None and np.isfinite(load) else None,
            "wait": wait if wait is not None and np.isfinite(wait) else None,
            "speed_ns": env.get("speed_ns"),
            "slow_rounds": env.get("slow_rounds") or 0,
            "autotuned": _autotuned(),
        }
        peak = env.get("peak_memory")
        record = record_from_analysis(
            item.nodeid,
            analysis,
            wall_times_ns=np.asarray(walls, dtype=np.int64) if walls else None,
            cpu_times_ns=np.asarray(cpu_times, dtype=np.int64) if cpu_times else None,
            metric=metric,
            meta=meta,
            rounds=np.asarray(rounds, dtype=np.int64) if rounds else None,
            extra_counters={"peak_memory": float(peak)} if peak else None,
            profiled=profiled if walls and int(profiled.sum()) == n_ranges else None,
        )
        return record, _findings(analysis), analysis

    def _tolerance(self, spec: ProfileSpec) -> float:
        return self.settings.tolerance if spec.tolerance is None else spec.tolerance

    def _compare(self, record: TestRecord, spec: ProfileSpec) -> Any:
        """The verdict, from :func:`perfguard.compare.judge` (store mode) on the input
        :func:`perfguard.compare.against.against_from_store` builds, as every entry point."""
        from perfguard.compare.against import settings_for
        from perfguard.compare.judge import judge

        return judge(record, self._against(record), settings_for(record, self.settings.tolerance))

    def _against(self, record: TestRecord) -> Any:
        """The nearest stored run at or before the baseline ref that measured this test on
        a compatible machine (pooled with that commit's other runs of it), and its history;
        since the test's acceptance, when one applies."""
        from perfguard.compare.against import History, against_from_store
        from perfguard.compare.judge import Against

        if self._store is None or self.git is None or not self.baseline_ref:
            return Against()
        accepted = self._acceptance(record.nodeid)
        if self._walk is None:
            self._walk = History.of(self.git.root, self.baseline_ref)
        return against_from_store(
            self._store, self._walk, record, self.fingerprint,
            only=accepted.commits if accepted is not None else None,
        )  # fmt: skip

    def _acceptance(self, nodeid: str) -> Any:
        """The acceptance of ``nodeid`` that applies to HEAD (store mode), remembered for
        the test's entry; None when there is none (or no store or git to ask)."""
        from perfguard.baseline.accept import applicable

        if self._store is None or self.git is None or not self.baseline_ref:
            return None
        try:
            found = applicable(self._store, self.git.root, nodeid, self.git.commit)
        except PerfguardError:
            return None
        if found is not None:
            self.accepted[nodeid] = found
        return found

    def _history(self, nodeid: str) -> list[dict[str, Any]]:
        from perfguard.compare.against import history_rows

        if self._store is None:
            return []
        try:
            return history_rows(self._store, nodeid, self.fingerprint)
        except PerfguardError:
            return []

    def _error_entry(
        self,
        item: pytest.Item,
        error: str,
        backend: str,
        path: Any = None,
        at_teardown: bool = True,
        outcome: str = "error",
    ) -> None:
        """Record a test nothing could be judged on (capture failed, test raised, child
        crashed); teardown raises a capture failure as the test's error."""
        if at_teardown:
            item.stash[_error_key] = error
        self.entries[item.nodeid] = TestEntry.not_judged(
            item.nodeid, outcome, error, capture=str(path) if path else None,
            backend=backend, worker=self.worker_id,
        )  # fmt: skip
        item.user_properties.append(("perfguard_outcome", outcome))
        self._write_partial()

    def _write_partial(self) -> None:
        """results.json after every test (``complete: false``): a session killed later
        (os._exit, a segfault, OOM) still leaves what it measured before."""
        if self.worker_id is not None or self.ab_out:
            return
        try:
            self.outputs.partial(self.results(complete=False))
        except PerfguardError:
            pass  # the final write at the session's end says what is wrong

    # ------------------------------------------------------------------ xdist
    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        data = getattr(node, "workeroutput", {}).get(OUTPUT_KEY)
        if not data:
            return
        for nodeid, entry in data["entries"].items():  # checked once, as they arrive
            self.entries[nodeid] = TestEntry.from_dict(entry, "results", nodeid)
        for blob in data["records"]:
            record = pickle.loads(base64.b64decode(blob))
            self.records[record.nodeid] = record

    # ------------------------------------------------------------------ the end
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.ab_out:
            errors = {k: str(e.error) for k, e in self.entries.items() if e.error}
            foreign, own = os.environ.get(AB_FOREIGN_ENV), os.environ.get(AB_OWN_ENV)
            trees = [Path(p) for p in (foreign, own) if p]
            write_round_output(self.ab_out, RoundOutput(
                records=self.records, outcomes=self.ab_outcomes, errors=errors,
                foreign=foreign_modules(foreign, own) if foreign and own else [],
                modules=preload_names(trees),
            ))  # fmt: skip
            return
        if self.worker_id is not None:
            self.config.workeroutput[OUTPUT_KEY] = {  # type: ignore[attr-defined]
                "entries": {k: e.to_dict() for k, e in self.entries.items()},
                "records": [
                    base64.b64encode(pickle.dumps(r)).decode("ascii") for r in self.records.values()
                ],
            }
            return
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if self.settings.save and interrupted:
            self.save_error = "the session was interrupted: a partial run is never saved"
        elif self.settings.save:
            self._save()
        if self.save_error and self.settings.save and not interrupted:
            # --perfguard-save exists to make baselines: not saving must not look green
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.settings.require_baseline and not self._compared():
            self.notes.append("--perfguard-require-baseline: no test was compared with a baseline")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._write_results()

    def _compared(self) -> bool:
        """Some test was compared with something (a judged timing or gates)."""
        judged = ("regressed", "improved", "unchanged")
        for e in self.entries.values():
            if e.timing is not None and e.timing.mode in ("store", "ab") and e.timing.n_baseline:
                return True
            if e.gates is not None and e.gates.outcome.value in judged:
                return True
        return False

    def _save(self) -> None:
        if not self.records:
            self.save_error = "nothing captured, nothing saved"
            return
        try:
            with open_store(self.settings.store, create=True) as store:
                records = [self.records[k] for k in sorted(self.records)]
                replace = self.settings.save_mode == "replace"
                saved = store.save(self.run, records, replace=replace)
            self.saved_run_id = saved.run_id
            if saved.replaced_tests:
                self.replaced = {"tests": saved.replaced_tests, "runs": list(saved.replaced_runs)}
                self.notes.append(
                    f"replaced {saved.replaced_tests} test record(s) of run(s) "
                    f"{', '.join(map(str, saved.replaced_runs))} saved earlier for this commit "
                    "on this machine (--perfguard-save-mode=append keeps both)"
                )
        except (PerfguardError, ValueError) as exc:
            self.save_error = " ".join(str(exc).split())

    def results(self, complete: bool = True) -> Any:
        """The session document (:class:`~perfguard.compare.results.SessionResults`,
        schema 2): every entry checked into a typed :class:`TestEntry`; ``complete``
        is false while the session runs."""
        from perfguard import __version__
        from perfguard.compare.results import SessionResults

        match = self.match
        baseline = None
        if match is not None and match.found:
            baseline = {"ref": match.ref, "commit": match.commit, "run_id": match.run_id}
        tests = [self.entries[k] for k in sorted(self.entries)]
        settings = {
            **self.settings.to_dict(),
            "alpha": ALPHA,
            "resolved_backend": self.backend.label,
            "backend_why": self.backend.why,
        }
        mode = settings.get("mode")
        return SessionResults(
            tests=tests,
            perfguard_version=__version__,
            run=self.run.to_dict(),
            baseline=baseline,
            baseline_status=self.baseline_status(),
            saved=(
                {"run_id": self.saved_run_id, "store": str(self.settings.store),
                 **({"replaced": self.replaced} if self.replaced else {})}
                if self.saved_run_id is not None
                else None
            ),
            save_error=self.save_error,
            settings=settings,
            notes=list(self.notes),
            mode=mode if mode in ("store", "ab") else
            ("ab" if any(t.mode == "ab" for t in tests) else "store"),
            complete=complete,
        )  # fmt: skip

    def baseline_status(self) -> str:
        """One line on which baseline this session compared with, or why none."""
        m = self.match
        if m is None:
            return "; ".join(self.notes) or "no baseline"
        if m.found:
            return (
                f"run {m.run_id} at {(m.commit or '')[:12]} ({m.distance} first-parent "
                f"step(s) from {m.ref[:12]}{', dirty' if m.dirty else ''})"
            )
        if m.status == "incomparable":
            return f"only incomparable runs near {m.ref[:12]}: {m.reason}"
        return f"no stored run on {m.ref[:12]} or its {m.searched - 1} first-parent ancestors"

    def _write_results(self) -> None:
        """The session's document, then its reports (:mod:`perfguard.plugin.outputs`)."""
        try:
            doc = self.results()
        except PerfguardError as exc:
            self.notes.append(f"could not assemble results.json: {exc}")
            self.outputs.remove_stale_reports()
        else:
            self.outputs.final(doc)
        self.notes.extend(self.outputs.notes)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker_id is not None or self.ab_out:
            return
        from perfguard.plugin.summary import summary_lines

        terminalreporter.section("perfguard")
        for line in summary_lines(self):
            terminalreporter.write_line(line)


def _workers(config: pytest.Config) -> int:
    """How many test processes measure at once: xdist's worker count, else 1. Recorded in
    the fingerprint, so a -n 4 run is never silently compared with a serial baseline."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput:
        return int(workerinput.get("workercount", 1) or 1)
    n = getattr(config.option, "numprocesses", None)
    if isinstance(n, int) and n > 0:
        return n
    if n in ("auto", "logical"):
        return os.cpu_count() or 1
    return 1


def _sigterm_interrupts() -> Any:
    """SIGTERM (a CI runner cancelling the job) ends the session as Ctrl-C does: the
    reports are written, and an interrupted run is never saved as a baseline. Returns
    the function that puts the previous handler back (None when nothing was changed)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None  # someone else handles it

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _git_dir(root: Path) -> Path:
    """The repository's common git folder (``.git`` of the main worktree)."""
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--git-common-dir"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return (root / out).resolve()


def spec_backend(item: pytest.Item) -> str | None:
    from perfguard.plugin.items import spec_of

    return spec_of(item).backend


def _autotuned() -> list[str]:
    """The libraries that chose kernels by timing them in this process (their kernel
    choice is not a gate: :mod:`perfguard.compare.gates`)."""
    torch = sys.modules.get("torch")
    try:
        on = bool(torch is not None and torch.backends.cudnn.benchmark)
    except AttributeError:
        on = False
    return ["cudnn.benchmark"] if on else []


def _findings(analysis: Any) -> list[dict[str, Any]]:
    """The expert system's findings on this capture (``[]`` when it cannot run on it)."""
    try:
        from perfguard.analysis.expert import run_detectors

        table = run_detectors(analysis)
    except Exception:  # findings are advice; they must never cost the verdict
        return []
    return json.loads(table.to_json(orient="records", default_handler=str))


def _add_properties(item: pytest.Item, entry: dict[str, Any]) -> None:
    """JUnit properties (``--junitxml``): the figures and the explanation's own words."""
    for key in ("outcome", "delta_pct", "ci_low_pct", "ci_high_pct", "p_value",
                "level_baseline_ns", "level_current_ns"):  # fmt: skip
        value = entry.get(key)
        item.user_properties.append((f"perfguard_{key}", "" if value is None else value))
    why = entry.get("explanation") or {}
    item.user_properties.append(("perfguard_explanation", why.get("headline") or ""))
    for k, culprit in enumerate((why.get("culprits") or [])[:3], 1):
        item.user_properties.append((f"perfguard_culprit_{k}", culprit.get("text") or ""))
