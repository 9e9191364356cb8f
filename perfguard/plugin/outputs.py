"""What a session leaves in its output folder, written in one place: ``results.json`` (after
every test with ``complete: false``, so a killed session still leaves what it measured, and
at the end), then ``report.html`` and ``summary.md`` from that same document.

The session assembles the typed document (:class:`~perfguard.compare.results.SessionResults`);
this writer only writes it. A report that cannot be rendered removes the previous session's
(a stale report must never pass for this one's) and says so in :attr:`SessionOutputs.notes`;
it never changes an outcome.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfguard.compare.results import SessionResults

RESULTS = "results.json"
REPORTS = ("report.html", "summary.md")


class SessionOutputs:
    """The writer of one output folder (module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.results_path: Path | None = None
        self.report_path: Path | None = None
        #: what went wrong while writing, for the terminal summary
        self.notes: list[str] = []

    def _write_json(self, doc: SessionResults) -> Path:
        """``results.json``, atomically (a reader never sees half a file)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / RESULTS
        tmp = path.with_name(RESULTS + ".tmp")
        tmp.write_text(json.dumps(doc.to_dict(), indent=1, allow_nan=False))
        tmp.replace(path)
        return path

    def partial(self, doc: SessionResults) -> None:
        """The document so far; a failure here is said by the final write, not here."""
        try:
            self._write_json(doc)
        except (OSError, ValueError):
            pass

    def final(self, doc: SessionResults) -> None:
        """The complete document, then the reports rendered from it."""
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
