"""One ``pytest --perfguard`` session: capture, verdict, store, outputs.

Registered by ``pytest_configure`` only when ``--perfguard`` is on; this is
where torch, pandas and the analysis get imported.

Where each step runs, and why there:

* **configure** — the backend is chosen, the git state read, the machine
  fingerprinted and the baseline run looked up once (a bad backend, ref or
  store is a :class:`pytest.UsageError` before any test runs).
* **setup** (nsys only) — the test is re-run alone in a child pytest under
  nsys (:func:`perfguard.plugin.capture.run_nsys_child`); the parent then
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
import pickle
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
from perfguard.capture.select import select_backend
from perfguard.capture.torch_profiler import TRACE_SUFFIX, TorchBackend
from perfguard.errors import PerfguardError
from perfguard.plugin.capture import TorchCapturer, capture_name, run_nsys_child, whole_call
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import ProfileSpec
from perfguard.plugin.options import DEFAULT_CAPTURE_TIMEOUT, Settings

RESULTS_SCHEMA = 1
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
        self.entries: dict[str, dict[str, Any]] = {}
        self.records: dict[str, TestRecord] = {}
        self.notes: list[str] = []
        self.saved_run_id: int | None = None
        self.save_error: str | None = None
        self.results_path: Path | None = None
        self.report_path: Path | None = None
        self._backends: dict[str, ResolvedBackend] = {}
        self._store: Store | None = None

        try:
            self.backend = self._backend(settings.backend)
        except PerfguardError as exc:
            raise pytest.UsageError(f"--perfguard-backend {settings.backend}: {exc}") from None
        self.fingerprint = machine_fingerprint(self.backend.label)
        self.git: GitState | None = None
        try:
            self.git = repo_state(config.rootpath)
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
        self._find_baseline()

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

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    # ------------------------------------------------------------------ per test
    def _captures(self, item: pytest.Item) -> tuple[ProfileSpec, ResolvedBackend] | None:
        from perfguard.plugin import profiled, spec_of

        if not profiled(item):
            return None
        spec = spec_of(item)  # validated in setup already
        return spec, (self._backend(spec.backend) if spec.backend else self.backend)

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
            return GpuProfile(spec)  # nsys: the child runs the body, not this process
        path = self._capture_path(item)
        item.stash[_capture_key] = {"path": path, "backend": what[1].label}
        return GpuProfile(spec, TorchCapturer(path, what[1].device or "cpu"))

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        try:
            what = self._captures(item)
        except PerfguardError as exc:  # the marker's backend= cannot run here
            backend = spec_backend(item) or "?"
            self._error_entry(item, str(exc), backend, at_teardown=False)
            pytest.fail(f"perfguard: backend {backend!r} of {item.nodeid}: {exc}", pytrace=False)
        if what is None or what[1].label != "nsys":
            return
        out = self.settings.output / "captures"
        out.mkdir(parents=True, exist_ok=True)
        try:
            path, child = run_nsys_child(
                item.nodeid, rootdir=self.config.rootpath, inifile=self.config.inipath,
                output_dir=out, timeout=DEFAULT_CAPTURE_TIMEOUT,
                xdist=self.config.pluginmanager.hasplugin("xdist"),
            )  # fmt: skip
        except PerfguardError as exc:
            self._error_entry(item, str(exc), what[1].label, at_teardown=False)
            pytest.fail(f"perfguard: capture of {item.nodeid} failed: {exc}", pytrace=False)
        item.stash[_capture_key] = {"path": path, "backend": "nsys", "child": child}

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
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
        from perfguard.plugin import profile_key

        info = item.stash.get(_capture_key, None)
        if info is None:
            return
        notes: list[str] = []
        profile = item.stash.get(profile_key, None)
        if "child" in info:
            child = info["child"]
            walls, error = child.get("wall_times_ns") or [], child.get("error")
            info["cpu_times_ns"] = child.get("cpu_times_ns") or []
            if not child.get("fixture"):
                notes.append("test does not use the gpuprofile fixture: captured as one iteration")
            if child.get("fixture") and not child.get("completed"):
                notes.append("the iteration loop ended early")
        elif profile is not None:
            profile.close()  # a loop left early still ends its capture here
            capturer = profile.capturer
            walls, error = profile.wall_times_ns, getattr(capturer, "error", None)
            info["cpu_times_ns"] = list(profile.cpu_times_ns)
            if not profile.started:
                error = error or (
                    "the test requests the gpuprofile fixture but never runs "
                    "gpuprofile.iterations(): nothing was measured"
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
            record, findings = self._record(
                item, spec, Path(info["path"]), walls, notes, backend, info.get("cpu_times_ns", [])
            )
            comparison = self._compare(record, spec)
        except (PerfguardError, ValueError, KeyError) as exc:
            msg = " ".join(str(exc).split()) or type(exc).__name__
            self._error_entry(item, msg, backend, info.get("path"))
            return
        self.records[item.nodeid] = record
        entry = comparison.to_dict()
        entry.update(
            findings=findings,
            history=self._history(item.nodeid),
            capture=str(info["path"]),
            backend=backend,
            error=None,
            notes=notes,
            worker=self.worker_id,
        )
        self.entries[item.nodeid] = entry
        _add_properties(item, entry)
        from perfguard.compare.verdict import failed

        if failed(comparison, self.settings.fail_on):
            at = (self.match.commit or "")[:12] if self.match else ""
            pytest.fail(
                f"perfguard: {item.nodeid} regressed against the baseline at {at}: "
                f"{comparison.message}",
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
    ) -> tuple[TestRecord, list[dict[str, Any]]]:
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
        if walls and len(walls) != n_ranges:
            notes.append(
                f"{len(walls)} timed iterations but {n_ranges} in the capture: "
                "iteration durations from the capture are used"
            )
        meta = {
            "marker": spec.to_dict(),
            "tolerance": self._tolerance(spec),
            "capture": str(path),
            "backend": backend,
            "note": "; ".join(notes) or None,
            "cpu_times_ns": cpu_times or None,
        }
        record = record_from_analysis(
            item.nodeid,
            analysis,
            wall_times_ns=np.asarray(walls, dtype=np.int64) if walls else None,
            cpu_times_ns=np.asarray(cpu_times, dtype=np.int64) if cpu_times else None,
            metric=metric,
            meta=meta,
        )
        return record, _findings(analysis)

    def _tolerance(self, spec: ProfileSpec) -> float:
        return self.settings.tolerance if spec.tolerance is None else spec.tolerance

    def _compare(self, record: TestRecord, spec: ProfileSpec) -> Any:
        from perfguard.compare.verdict import compare_records

        tolerance = self._tolerance(spec)
        match = self.match
        if match is not None and match.status == "incomparable":
            return _incomparable(record, match.reason or "machines differ", tolerance)
        if match is None or not match.found or self._store is None:
            return compare_records(record, None, tolerance=tolerance, alpha=ALPHA)
        baseline = self._store.load_test(int(match.run_id or 0), record.nodeid)
        reason = None
        if baseline is not None:
            theirs = (baseline.meta or {}).get("backend")
            if theirs and theirs != record.meta.get("backend"):
                reason = f"backend differs: {theirs!r} (baseline) vs {record.meta['backend']!r}"
        return compare_records(
            record, baseline, tolerance=tolerance, alpha=ALPHA, incompatibility=reason,
            baseline_commit=match.commit, baseline_run_exists=True,
        )  # fmt: skip

    def _history(self, nodeid: str) -> list[dict[str, Any]]:
        if self._store is None:
            return []
        try:
            rows = self._store.history(nodeid, fingerprint=self.fingerprint, limit=50)
        except PerfguardError:
            return []
        return json.loads(rows[["commit", "time", "median_ns"]].to_json(orient="records"))

    def _error_entry(
        self,
        item: pytest.Item,
        error: str,
        backend: str,
        path: Any = None,
        at_teardown: bool = True,
    ) -> None:
        """Record a failed capture; teardown raises it as the test's error (unless raised)."""
        if at_teardown:
            item.stash[_error_key] = error
        self.entries[item.nodeid] = {
            "nodeid": item.nodeid, "outcome": "error", "message": error, "findings": [],
            "history": [], "capture": str(path) if path else None, "backend": backend,
            "error": error, "notes": [], "worker": self.worker_id,
        }  # fmt: skip
        item.user_properties.append(("perfguard_outcome", "error"))

    # ------------------------------------------------------------------ xdist
    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        data = getattr(node, "workeroutput", {}).get(OUTPUT_KEY)
        if not data:
            return
        self.entries.update(data["entries"])
        for blob in data["records"]:
            record = pickle.loads(base64.b64decode(blob))
            self.records[record.nodeid] = record

    # ------------------------------------------------------------------ the end
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.worker_id is not None:
            self.config.workeroutput[OUTPUT_KEY] = {  # type: ignore[attr-defined]
                "entries": self.entries,
                "records": [
                    base64.b64encode(pickle.dumps(r)).decode("ascii") for r in self.records.values()
                ],
            }
            return
        if self.settings.save:
            self._save()
        self._write_results()

    def _save(self) -> None:
        if not self.records:
            self.save_error = "nothing captured, nothing saved"
            return
        try:
            with open_store(self.settings.store, create=True) as store:
                records = [self.records[k] for k in sorted(self.records)]
                self.saved_run_id = store.save_run(self.run, records)
        except (PerfguardError, ValueError) as exc:
            self.save_error = " ".join(str(exc).split())

    def results(self) -> dict[str, Any]:
        """The ``results.json`` document."""
        from perfguard import __version__

        counts: dict[str, int] = {}
        for entry in self.entries.values():
            counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
        match = self.match
        baseline = None
        if match is not None and match.found:
            baseline = {"ref": match.ref, "commit": match.commit, "run_id": match.run_id}
        return {
            "schema": RESULTS_SCHEMA,
            "perfguard_version": __version__,
            "run": self.run.to_dict(),
            "baseline": baseline,
            "baseline_status": self.baseline_status(),
            "saved": (
                {"run_id": self.saved_run_id, "store": str(self.settings.store)}
                if self.saved_run_id is not None
                else None
            ),
            "save_error": self.save_error,
            "settings": {
                **self.settings.to_dict(),
                "alpha": ALPHA,
                "resolved_backend": self.backend.label,
                "backend_why": self.backend.why,
            },
            "counts": dict(sorted(counts.items())),
            "notes": self.notes,
            "tests": [self.entries[k] for k in sorted(self.entries)],
        }

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
        out = self.settings.output
        try:
            out.mkdir(parents=True, exist_ok=True)
            path = out / "results.json"
            tmp = path.with_name("results.json.tmp")
            tmp.write_text(json.dumps(self.results(), indent=1, allow_nan=False))
            tmp.replace(path)
            self.results_path = path
        except (OSError, ValueError) as exc:
            self.notes.append(f"could not write results.json in {out}: {exc}")
            return
        self._write_reports(out)

    def _write_reports(self, out: Path) -> None:
        """``report.html`` for the reviewer and ``summary.md`` for the PR comment (and
        ``$GITHUB_STEP_SUMMARY``), from the results just written. A failure here is
        said in the terminal summary; it never changes the session's outcome."""
        from perfguard.report.html import write_session_html
        from perfguard.report.markdown import write_markdown

        results = self.results()
        try:
            self.report_path = write_session_html(results, out / "report.html")
            write_markdown(results, out / "summary.md")
        except (PerfguardError, OSError, ValueError) as exc:
            self.notes.append(f"could not write the HTML/Markdown report in {out}: {exc}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker_id is not None:
            return
        from perfguard.plugin.summary import summary_lines

        terminalreporter.section("perfguard")
        for line in summary_lines(self):
            terminalreporter.write_line(line)


def spec_backend(item: pytest.Item) -> str | None:
    from perfguard.plugin import spec_of

    return spec_of(item).backend


def _incomparable(record: TestRecord, reason: str, tolerance: float) -> Any:
    """The ``incomparable`` verdict when the only baseline runs are from another machine."""
    from perfguard.compare.verdict import Outcome, TestComparison

    values = record.values()
    nan = float("nan")
    return TestComparison(
        nodeid=record.nodeid, outcome=Outcome.INCOMPARABLE, metric=record.metric,
        n_current=len(values), n_baseline=0,
        median_current_ns=float(np.median(values)) if len(values) else nan,
        median_baseline_ns=nan, delta_pct=nan, ci_low_pct=nan, ci_high_pct=nan, p_value=nan,
        tolerance_pct=100.0 * tolerance, alpha=ALPHA, message=f"incomparable: {reason}",
        samples_current=[int(v) for v in values],
    )  # fmt: skip


def _findings(analysis: Any) -> list[dict[str, Any]]:
    """The expert system's findings on this capture (``[]`` when it cannot run on it)."""
    try:
        from perfguard.analysis.expert import run_detectors

        table = run_detectors(analysis)
    except Exception:  # findings are advice; they must never cost the verdict
        return []
    return json.loads(table.to_json(orient="records", default_handler=str))


def _add_properties(item: pytest.Item, entry: dict[str, Any]) -> None:
    for key in ("outcome", "delta_pct", "p_value", "median_current_ns", "median_baseline_ns"):
        value = entry.get(key)
        item.user_properties.append((f"perfguard_{key}", "" if value is None else value))
