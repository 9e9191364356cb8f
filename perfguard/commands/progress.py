"""A one-line progress display for commands that read and analyse a capture.

A million-kernel capture takes seconds; a silent terminal for that long
looks like a hang. The line says the phase, the time so far and the events
read, and is redrawn in place on stderr (stdout carries the summary, and
may be piped). It appears only after ``delay`` seconds, so quick runs print
nothing extra, and never when stderr is not a terminal or with ``-q``.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

#: seconds of work before the line first appears
DELAY_S = 2.0
#: seconds between redraws
INTERVAL_S = 0.25


class Progress:
    """``with Progress() as p: p.phase("reading x"); p.events(n)``; the line is cleared on exit."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        quiet: bool = False,
        delay: float = DELAY_S,
        interval: float = INTERVAL_S,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _is_tty(self.stream)
        self.delay, self.interval = delay, interval
        self._phase, self._events, self._detail = "starting", 0, ""
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._drawn = 0  # width of the line on screen, 0: nothing drawn
        self._last = ""  # the text on screen: redrawn only when it changes
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(
                target=self._run, name="perfguard-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._clear()

    def phase(self, name: str, detail: str = "") -> None:
        """Start a phase (``reading``, ``analysing``, ``writing reports``)."""
        with self._lock:
            self._phase, self._detail = name, detail

    def events(self, count: int, detail: str | None = None) -> None:
        """The events read so far (and what else there is to say, e.g. ``3/8 ranks``)."""
        with self._lock:
            self._events = count
            if detail is not None:
                self._detail = detail

    def line(self) -> str:
        """The text of the line as it would be drawn now."""
        elapsed = time.monotonic() - self._t0
        parts = [f"perfguard: {self._phase}"]
        if self._detail:
            parts.append(self._detail)
        if self._events:
            parts.append(f"{self._events:,} events read")
        parts.append(f"{elapsed:.0f} s")
        return ", ".join(parts)

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        while not self._stop.is_set():
            with self._lock:
                self._draw(self.line())
            self._stop.wait(self.interval)

    def _draw(self, text: str) -> None:
        # a line wider than the terminal wraps, and "\r" would not get back to its start
        text = text[: max(shutil.get_terminal_size((80, 24)).columns - 1, 20)]
        if text == self._last:
            return
        self._last = text
        pad = max(self._drawn - len(text), 0)
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop drawing
            self._stop.set()
            return
        self._drawn = len(text)

    def _clear(self) -> None:
        if self._drawn:
            self._draw(" " * self._drawn)
            try:
                self.stream.write("\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._drawn = 0


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
