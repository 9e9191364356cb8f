"""What a session leaves behind, kept and written in one place.

:class:`SessionOutputs` holds each test's typed entry (:class:`~perfguard.compare.results.
TestEntry`, checked once when it is made) and record, and alone writes ``results.json``
(after every test with ``complete: false``, so a killed session still leaves what it
measured, and at the end), then ``report.html`` and ``summary.md`` from that same
document, and the terminal summary's lines. An entry is serialised once, when it is added:
the partial document after each test appends that text to the session's header instead of
re-serialising every earlier entry.

A report that cannot be rendered removes the previous session's (a stale report must never
pass for this one's) and says so in :attr:`SessionOutputs.notes`; it never changes an
outcome.
"""

from __future__ import annotations

import base64
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import msgspec

from perfguard.baseline.record import TestRecord
from perfguard.compare.results import (
    Baseline,
    Replaced,
    Run,
    Saved,
    SessionResults,
    TestEntry,
    encode,
)
from perfguard.compare.tolerance import ALPHA
from perfguard.errors import PerfguardError
from perfguard.plugin.context import SaveResult, SessionContext
from perfguard.plugin.footprint import FOOTPRINT_KEY, SessionFootprint
from perfguard.plugin.phases import timed

RESULTS = "results.json"
#: where each xdist worker spools its entries as it makes them (one file per worker), so a
#: worker that dies (a test calling os._exit, a signal, the OOM killer) loses nothing but
#: the test it was running, which the controller then reports ``crashed``
SPOOL = ".workers"
REPORTS = ("report.html", "summary.md")


class SessionOutputs:
    """The entries and records of one session, and the writer of its output folder."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        self.folder = context.settings.output
        #: each test's entry, checked once when it is made (never re-read from dicts)
        self.entries: dict[str, TestEntry] = {}
        self.records: dict[str, TestRecord] = {}
        self.saved = SaveResult()
        self.results_path: Path | None = None
        self.report_path: Path | None = None
        #: what went wrong while writing, for the terminal summary
        self.notes: list[str] = []
        self._texts: dict[str, bytes] = {}  # nodeid -> the entry's JSON, made once
        #: wall seconds of the session's own parts (:attr:`SessionResults.phase_s`)
        self.phase_s: dict[str, float] = {}
        #: records what each test's process loaded, in a session that saves (set after
        #: collection: it needs the collected test files)
        self.footprint: SessionFootprint | None = None
        self.clear_spool()  # an earlier session's

    # ------------------------------------------------------------------ the ledger
    def add(self, entry: TestEntry, record: TestRecord | None = None) -> None:
        """Keep a test's entry (and record), then write the partial document (on an xdist
        worker: spool them for the controller). A record to be saved gets what this
        process loaded (``meta["footprint"]``, what ``--perfguard-changed`` reads later)."""
        saving = self.context.settings.save
        if record is not None and self.footprint is not None and saving:
            with timed(self.phase_s, "footprint"):
                record.meta.setdefault(FOOTPRINT_KEY, self.footprint.meta())
        self._keep(entry, record)
        self._spool(("entry", entry, record))
        if self.context.worker_id is None and not self.context.round_child:
            with timed(self.phase_s, "results"):
                self.partial()

    def _keep(self, entry: TestEntry, record: TestRecord | None) -> None:
        """The one place an entry (and its record) joins the ledger: this process's, a
        worker's handed over, or a dead worker's spooled."""
        self.entries[entry.nodeid] = entry
        if record is not None:
            self.records[entry.nodeid] = record
        self._texts.pop(entry.nodeid, None)

    def worker_output(self) -> dict[str, Any]:
        """What an xdist worker hands its controller (``workeroutput`` is JSON-safe)."""
        return {
            "entries": {k: e.to_dict() for k, e in self.entries.items()},
            "records": [
                base64.b64encode(pickle.dumps(r)).decode("ascii") for r in self.records.values()
            ],
        }

    def started(self, nodeid: str) -> None:
        """A measured test begins on this xdist worker: spooled, so that if the worker dies
        in it the controller can say which test it was."""
        self._spool(("started", nodeid, None))

    def clear_spool(self) -> None:
        """The controller's: remove the workers' spools (at the start, and once merged)."""
        if self.context.worker_id is None and not self.context.round_child:
            shutil.rmtree(self.folder / SPOOL, ignore_errors=True)

    def _spool_file(self, worker: str) -> Path:
        return self.folder / SPOOL / f"{worker}.spool"

    def _spool(self, item: tuple[str, Any, Any]) -> None:
        worker = self.context.worker_id
        if worker is None or self.context.round_child:
            return
        path = self._spool_file(worker)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            pickle.dump(item, f)

    def merge_lost_worker(self, worker: str, error: Any) -> None:
        """A worker that went down without handing over its output: its spooled entries and
        records, and a ``crashed`` entry for the measured test it had begun and not ended."""
        path = self._spool_file(worker)
        running: str | None = None
        try:
            with path.open("rb") as f:
                while True:
                    try:
                        kind, data, record = pickle.load(f)
                    except EOFError:
                        break
                    if kind == "started":
                        running = data
                        continue
                    self._keep(data, record)
                    entry = data
                    running = None if entry.nodeid == running else running
        except (OSError, pickle.UnpicklingError, ValueError, AttributeError) as exc:
            self.notes.append(f"the output of worker {worker} is lost: {path}: {exc}")
        if running is not None and running not in self.entries:
            why = " ".join(str(error or "").split()) or "no message"
            self._keep(
                TestEntry.not_judged(
                    running,
                    "crashed",
                    f"its pytest-xdist worker {worker} died while running it ({why[:200]}); "
                    "--perfguard-isolate runs each measured test in a process of its own",
                    worker=worker,
                ),
                None,
            )
        path.unlink(missing_ok=True)

    def merge_worker(self, data: dict[str, Any]) -> None:
        """A worker's entries and records, checked once as they arrive."""
        for nodeid, entry in data["entries"].items():
            self._keep(TestEntry.from_dict(entry, f"worker output ({nodeid})"), None)
        for blob in data["records"]:
            record = pickle.loads(base64.b64decode(blob))
            self.records[record.nodeid] = record

    # ------------------------------------------------------------------ the document
    def document(self, complete: bool = True) -> SessionResults:
        """The session document (:class:`~perfguard.compare.results.SessionResults`);
        ``complete`` is false while the session runs."""
        from perfguard import __version__

        ctx = self.context
        tests = [self.entries[k] for k in sorted(self.entries)]
        settings = {
            **ctx.settings.to_dict(),
            "alpha": ALPHA,
            "resolved_backend": ctx.backend.label,
            "backend_why": ctx.backend.why,
        }
        if ctx.shard:  # --perfguard-shard: this job's part and the split it belongs to
            settings["shard_plan"] = dict(ctx.shard)
        mode = settings.get("mode")
        saved = self.saved
        base = ctx.baseline_dict()
        return SessionResults(
            tests=tests,
            perfguard_version=__version__,
            run=msgspec.convert(ctx.run.to_dict(), Run),
            baseline=Baseline(**base) if base is not None else None,
            baseline_status=ctx.baseline_status(),
            saved=(
                Saved(
                    run_id=saved.run_id,
                    store=str(ctx.settings.store),
                    replaced=Replaced(**saved.replaced) if saved.replaced else None,
                )
                if saved.run_id is not None
                else None
            ),
            save_error=saved.error,
            settings=settings,
            notes=list(ctx.notes),
            mode=mode
            if mode in ("store", "ab")
            else ("ab" if any(t.mode == "ab" for t in tests) else "store"),
            complete=complete,
            phase_s=dict(self.phase_s),
        )

    def _text(self, doc: SessionResults) -> bytes:
        """The document as JSON (:func:`~perfguard.compare.results.encode`); each entry's
        text is made once and reused."""
        parts = []
        for entry in doc.tests:
            text = self._texts.get(entry.nodeid)
            if text is None:
                text = self._texts[entry.nodeid] = encode(entry)
            parts.append(text)
        head = json.dumps(doc.header(), indent=1, allow_nan=False).encode()
        return head[:-2] + b',\n "tests": [\n' + b",\n".join(parts) + b"\n ]\n}"

    def _write_json(self, doc: SessionResults) -> Path:
        """``results.json``, atomically (a reader never sees half a file)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / RESULTS
        tmp = path.with_name(RESULTS + ".tmp")
        tmp.write_bytes(self._text(doc))
        tmp.replace(path)
        return path

    def partial(self) -> None:
        """The document so far; a failure here is said by the final write, not here."""
        try:
            self._write_json(self.document(complete=False))
        except (OSError, ValueError, PerfguardError):
            pass

    def final(self) -> None:
        """The complete document, then the reports rendered from it."""
        with timed(self.phase_s, "reports"):
            self._final()

    def _final(self) -> None:
        try:
            doc = self.document()
        except PerfguardError as exc:
            self.notes.append(f"could not assemble {RESULTS}: {exc}")
            self.remove_stale_reports()
            return
        try:
            self.results_path = self._write_json(doc)
        except (OSError, ValueError) as exc:
            self.notes.append(f"could not write {RESULTS} in {self.folder}: {exc}")
            self.remove_stale_reports()
            return
        self._reports(doc)

    def _reports(self, doc: SessionResults) -> None:
        """``report.html`` for the reviewer, ``summary.md`` for the PR comment (and
        ``$GITHUB_STEP_SUMMARY``)."""
        from perfguard.report.html import write_session_html
        from perfguard.report.markdown import write_markdown

        try:
            self.report_path = write_session_html(doc, self.folder / REPORTS[0])
            write_markdown(doc, self.folder / REPORTS[1])
        except Exception as exc:  # a report bug must not cost the session: say it, clean up
            self.report_path = None
            why = " ".join(str(exc).split()) or type(exc).__name__
            self.notes.append(f"could not write the HTML/Markdown report in {self.folder}: {why}")
            self.remove_stale_reports()

    def remove_stale_reports(self) -> None:
        gone = []
        for name in REPORTS:
            try:
                (self.folder / name).unlink()
                gone.append(name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.notes.append(
                    f"could not remove the stale {self.folder / name}: {exc.strerror}"
                )
        if gone:
            self.notes.append(f"removed {' and '.join(gone)} so that no stale report remains")

    # ------------------------------------------------------------------ the terminal
    def _cost_lines(self) -> list[str]:
        """perfguard's own seconds: per test beyond its timed rounds, and the session's."""
        from perfguard.plugin.summary import cost_line

        line = cost_line(list(self.entries.values()), self.phase_s)
        return [line] if line else []

    def summary_lines(self) -> list[str]:
        """The ``perfguard`` section of pytest's terminal summary."""
        from perfguard.plugin.summary import results_lines

        ctx = self.context
        lines = [f"backend: {ctx.backend.label} ({ctx.backend.why})"]
        lines.append(f"baseline: {ctx.baseline_status()}")
        try:
            lines += results_lines(self.document())
        except PerfguardError as exc:  # a malformed entry must not cost the summary
            lines.append(f"perfguard: cannot tabulate the results: {exc}")
        if self.saved.run_id is not None:
            dirty = " (dirty tree)" if ctx.run.dirty else ""
            lines.append(
                f"saved run {self.saved.run_id} for {ctx.run.commit[:12]}{dirty} "
                f"in {ctx.settings.store}"
            )
        elif ctx.settings.save:
            lines.append(f"not saved: {self.saved.error}")
        lines += self._cost_lines()
        if self.results_path is not None:
            lines.append(f"results: {self.results_path}")
        if self.report_path is not None:
            lines.append(f"report: {self.report_path} (open it in a browser; summary.md beside it)")
        notes = [*ctx.notes, *self.notes]
        lines += [f"note: {n}" for n in notes if not n.startswith("no baseline")]
        return lines
