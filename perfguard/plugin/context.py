"""What a ``--perfguard`` session knows before its first test, and the store it talks to.

Made once at ``pytest_configure``: the capture backend, the machine's fingerprint and
environment (one ``nvidia-smi -q`` serves both; an A/B round child, which judges nothing,
records no environment), the git state and the run it will be saved as, the baseline run
looked up for the baseline ref, and the output folder claimed for this session alone. A bad
backend, ref or store is a :class:`pytest.UsageError` here, before any test runs. At the end
:meth:`SessionContext.save` writes the session's records as one run (one store transaction).

The verdicts (:mod:`perfguard.plugin.judging`) read the store through :attr:`store`;
nothing else in the plugin opens it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import pytest

from perfguard.baseline import nvidia_smi
from perfguard.baseline.fingerprint import machine_fingerprint
from perfguard.baseline.git import (
    BaselineMatch,
    GitState,
    default_baseline_ref,
    find_baseline,
    first_parent_commits,
    repo_state,
    resolve,
)
from perfguard.baseline.probe import machine_environment
from perfguard.baseline.record import RunInfo, TestRecord
from perfguard.baseline.store import Store, open_store
from perfguard.capture.select import select_backend
from perfguard.capture.torch_profiler import TorchBackend
from perfguard.environment import Environment
from perfguard.errors import DamagedStoreError, PerfguardError
from perfguard.plugin.ab import AB_OUT_ENV
from perfguard.plugin.interleave import ab_env
from perfguard.plugin.options import Settings, project_root


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


@dataclass(frozen=True)
class SaveResult:
    """What ``--perfguard-save`` did: the run it saved, what it replaced, or why it did not."""

    run_id: int | None = None
    replaced: dict[str, Any] | None = None
    error: str | None = None


class SessionContext:
    """The session's fixed facts (module docstring); ``notes`` collects what the terminal
    summary and ``results.json`` say about the session as a whole."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        workerinput = getattr(config, "workerinput", None)
        self.worker_id: str | None = workerinput["workerid"] if workerinput else None
        #: round-child mode (A/B): this process runs one round for a parent session and
        #: writes its records to this file
        self.round_child: str | None = ab_env(AB_OUT_ENV)
        self.notes: list[str] = []
        self.store: Store | None = None
        #: why the store cannot be used (its DamagedStoreError, one line), once found: no
        #: test is judged against it and nothing is saved into it
        self.damaged: str | None = None
        self.baseline_ref: str | None = None
        self.match: BaselineMatch | None = None
        #: A/B mode's base: (the ref asked for, its commit), set when its tree is checked out
        self.ab_base: tuple[str, str] | None = None
        self._backends: dict[str, ResolvedBackend] = {}
        self._lock: IO[str] | None = None
        self._restore_sigterm: Any = None
        try:
            self.backend = self.backend_for(settings.backend)
        except PerfguardError as exc:
            raise pytest.UsageError(f"--perfguard-backend {settings.backend}: {exc}") from None
        smi = None if self.round_child else nvidia_smi.query()
        self.fingerprint = machine_fingerprint(
            self.backend.label, workers=_workers(config), smi=smi
        )
        self.environment = Environment() if self.round_child else machine_environment(smi)
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
            environment=self.environment,
            group=settings.run_group,
        )
        #: ``--perfguard-shard``'s split, filled after collection (plugin/shards.py)
        self.shard: dict[str, object] | None = None

    def backend_for(self, choice: str) -> ResolvedBackend:
        """The resolved backend for a session's or a marker's ``backend=`` (cached)."""
        if choice not in self._backends:
            self._backends[choice] = resolve_backend(choice)
        return self._backends[choice]

    def find_baseline(self) -> None:
        """Store mode: the baseline ref, and the run found for it (``match``)."""
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
            self.store = open_store(self.settings.store, create=server)
            self.match = find_baseline(
                self.store,
                root,
                ref,
                self.fingerprint,
                environment=self.environment,
                across=self.settings.compare_across,
            )
        except DamagedStoreError as exc:  # every test still runs, and says why it is not judged
            self.store_damaged(exc)
        except PerfguardError as exc:
            raise pytest.UsageError(f"--perfguard-store: {exc}") from None

    def stored_durations(self) -> dict[str, float]:
        """Seconds each test's timed steps took in the stored run of the nearest commit on
        the baseline ref's first-parent line other than HEAD (what ``--perfguard-shard``
        balances by; any machine: only the ratios matter); empty without one. Never
        HEAD's: the other jobs of this CI run save it while this one starts, and a re-run
        job must split as its siblings did."""
        if self.store is None or self.git is None or self.baseline_ref is None:
            return {}
        try:
            stored = set(self.store.reader.runs()["commit"])
            for commit in first_parent_commits(self.git.root, self.baseline_ref):
                if commit != self.run.commit and commit in stored:
                    return self.store.reader.durations(commit)
        except DamagedStoreError as exc:
            self.store_damaged(exc)
        except PerfguardError:  # no git history to walk: balanced by count
            pass
        return {}

    def store_damaged(self, exc: DamagedStoreError) -> str:
        """The store turned out damaged (at open, or at a test's read): close it, judge
        nothing more against it, save nothing into it. Returns the one line."""
        if self.damaged is None:
            self.damaged = " ".join(str(exc).split())
            self.notes.insert(0, f"no baseline: {self.damaged}")
        self.match = None
        if self.store is not None:
            self.store.close()
            self.store = None
        return self.damaged

    def claim_output(self) -> None:
        """The output folder must be writable, and one session's alone: a second session
        in the same checkout would overwrite the first one's captures and results. Also
        makes SIGTERM end the session as Ctrl-C does (the controller only)."""
        out = self.settings.output
        flag = "--perfguard-output"
        try:
            out.mkdir(parents=True, exist_ok=True)
            lock = open(out / ".lock", "a+")  # noqa: SIM115 (held for the session)
        except OSError as exc:
            raise pytest.UsageError(
                f"{flag} {out}: cannot write there ({exc.strerror or exc})"
            ) from None
        try:
            import fcntl

            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not on POSIX: no lock, as before
            self._lock = lock
            return
        except OSError:
            lock.seek(0)
            other = lock.read().strip() or "?"
            lock.close()
            raise pytest.UsageError(
                f"{flag} {out}: another perfguard session (pid {other}) is writing there; "
                "give this one its own folder with --perfguard-output"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock
        self._restore_sigterm = _sigterm_interrupts()

    def save(self, records: dict[str, TestRecord]) -> SaveResult:
        """``--perfguard-save``: every record as one run; never raises (the error is said)."""
        if not records:
            return SaveResult(error="nothing captured, nothing saved")
        if self.damaged is not None:
            return SaveResult(error=self.damaged)  # never a new run beside a damaged one
        try:
            with open_store(self.settings.store, create=True) as store:
                replace = self.settings.save_mode == "replace"
                saved = store.writer.save(
                    self.run, [records[k] for k in sorted(records)], replace=replace
                )
        except (PerfguardError, ValueError) as exc:
            return SaveResult(error=" ".join(str(exc).split()))
        replaced = None
        if saved.replaced_tests:
            replaced = {"tests": saved.replaced_tests, "runs": list(saved.replaced_runs)}
            self.notes.append(
                f"replaced {saved.replaced_tests} test record(s) of run(s) "
                f"{', '.join(map(str, saved.replaced_runs))} saved earlier for this commit "
                "on this machine (--perfguard-save-mode=append keeps both)"
            )
        if saved.joined:
            self.notes.append(
                f"saved into run {saved.run_id} with the other jobs of run group "
                f"{self.run.group} (same commit and machine kind)"
            )
        return SaveResult(run_id=saved.run_id, replaced=replaced)

    def baseline_status(self) -> str:
        """One line on which baseline this session compared with, or why none."""
        m = self.match
        if self.ab_base is not None:
            ref, commit = self.ab_base
            return f"A/B: the base tree at {commit[:12]} ({ref}), measured here in turn with HEAD"
        if m is None:  # the first note says why (no git, a store error) or names A/B's base;
            # the later ones (instruction counts, the fork server, saves) are listed apart
            return self.notes[0] if self.notes else "no baseline"
        if m.found:
            return (
                f"run {m.run_id} at {(m.commit or '')[:12]} ({m.distance} first-parent "
                f"step(s) from {m.ref[:12]}{', dirty' if m.dirty else ''})"
            )
        if m.status == "incomparable":
            return f"only incomparable runs near {m.ref[:12]}: {m.reason}"
        return f"no stored run on {m.ref[:12]} or its {m.searched - 1} first-parent ancestors"

    def baseline_dict(self) -> dict[str, Any] | None:
        """The baseline every view names: the stored run's, or A/B's base commit (``ab``)."""
        if self.ab_base is not None:
            return {"ref": self.ab_base[0], "commit": self.ab_base[1], "run_id": None, "ab": True}
        m = self.match
        if m is None or not m.found:
            return None
        return {"ref": m.ref, "commit": m.commit, "run_id": m.run_id}

    def close(self) -> None:
        if self._restore_sigterm is not None:
            self._restore_sigterm()
            self._restore_sigterm = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        if self.store is not None:
            self.store.close()
            self.store = None


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
