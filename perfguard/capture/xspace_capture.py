"""What the TensorFlow and JAX capturers share: a profiler that writes an XSpace.

Both profilers write ``<logdir>/plugins/profile/<run>/<host>.xplane.pb``;
the capturer profiles into a private logdir next to its ``path`` and, when
it stops, moves that one file to ``path`` (always named ``*.xplane.pb``, so
:func:`perfguard.load_trace` recognises it). Each recorded iteration is a
step annotation named ``perfguard.iteration`` with ``step_num`` 0, 1, ...,
which the XSpace reader turns into ``ProfilerStep#N`` iterations.

The protocol is the plugin's ``Capturer`` (``perfguard/capture/capturers.py``):
``start``/``stop`` never raise, a failure is kept in ``error`` (one line).
The framework is imported only when a capture starts.
"""

from __future__ import annotations

import contextlib
import shutil
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

#: the analysis's explicit iteration marker (perfguard.trace.names.ITERATION_NAMES)
ITERATION_RANGE = "perfguard.iteration"
XPLANE_SUFFIX = ".xplane.pb"


def xplane_path(path: Path) -> Path:
    """``path`` named ``*.xplane.pb`` (the suffix is added when it is missing)."""
    path = Path(path)
    return path if path.name.endswith(XPLANE_SUFFIX) else path.with_name(path.name + XPLANE_SUFFIX)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class XSpaceCapturer:
    """Base of the TensorFlow and JAX capturers; subclasses supply the framework calls."""

    #: the framework's name in messages
    framework = "?"

    def __init__(self, path: Path, device: str = "cpu") -> None:
        self.path = xplane_path(path)
        self.device = device
        self.logdir = self.path.with_name(self.path.name.removesuffix(XPLANE_SUFFIX) + ".logdir")
        self.error: str | None = None
        self.started = False
        self.steps = 0

    # --- what a framework supplies ---------------------------------------------------------
    def _start(self, logdir: str) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def _step(self, number: int) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _sync(self) -> None:
        raise NotImplementedError

    # --- the Capturer protocol ------------------------------------------------------------
    @property
    def separate_timing(self) -> bool:
        """On the CPU the framework's tracer costs about a small op: rounds are timed without it."""
        return self.device == "cpu"

    def start(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.logdir, ignore_errors=True)
            self.logdir.mkdir(parents=True)
            self._start(str(self.logdir))
            self.started = True
            self.steps = 0
        except Exception as exc:  # noqa: BLE001 - any failure: the test runs uncaptured
            self.error = f"the {self.framework} profiler did not start: {one_line(exc)}"

    def iteration(self) -> AbstractContextManager[object]:
        if not self.started:
            return contextlib.nullcontext()
        number = self.steps
        self.steps += 1
        return self._step(number)

    def sync(self) -> None:
        try:
            self._sync()
        except Exception as exc:  # noqa: BLE001 - a failed sync must not fail the test
            self.error = self.error or f"{self.framework}: device sync failed: {one_line(exc)}"

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            self._stop()
        except Exception as exc:  # noqa: BLE001
            self.error = f"the {self.framework} profiler did not stop cleanly: {one_line(exc)}"
            return
        found = sorted(self.logdir.rglob("*" + XPLANE_SUFFIX))
        if not found:
            self.error = f"the {self.framework} profiler wrote no *.xplane.pb under {self.logdir}"
            return
        shutil.move(str(found[-1]), self.path)
        shutil.rmtree(self.logdir, ignore_errors=True)
