"""The one interface every capture backend implements, and what a capture returns.

A backend turns "run this command" into a file that :func:`perfguard.load_trace`
reads (an nsys SQLite export or a Kineto JSON trace). Backends differ in what
they can see, not in how they are driven, so the CLI and the pytest plugin
call them all the same way.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from perfguard.errors import CaptureError


@dataclass(frozen=True)
class CaptureResult:
    """One finished capture.

    ``path`` is the file the readers load; ``command`` is what the user asked
    to profile and ``argv`` what actually ran (the profiler's command line).
    ``log`` is the tail of the run's stderr, ``why`` says why this backend was
    used (auto selection records its reasoning here).
    """

    path: Path
    backend: str
    command: list[str]
    returncode: int
    wall_time_s: float
    log: str
    why: str
    argv: list[str] = field(default_factory=list)
    #: the profiler's own report next to ``path`` (nsys ``.nsys-rep``/``.qdrep``), if any
    report: Path | None = None


class Backend(ABC):
    """A way of profiling a command. ``why`` is recorded in every result."""

    name: ClassVar[str]

    def __init__(self, *, why: str = "") -> None:
        self.why = why or f"backend {self.name!r} was requested"

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """Whether this backend can run here, and the reason (a short phrase)."""

    @abstractmethod
    def capture(
        self,
        command: Sequence[str],
        *,
        output_dir: str | Path,
        name: str = "capture",
        delay: float | None = None,
        duration: float | None = None,
        capture_range: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CaptureResult:
        """Run ``command`` under this backend; write ``output_dir/name.*``.

        Raises :class:`perfguard.errors.CaptureError` (one line) when the
        tool is missing, the command fails or times out, or nothing was written.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}: {self.why}>"


def command_list(command: Sequence[str]) -> list[str]:
    """``command`` as a list of strings; a bare string is refused (no shell, ever)."""
    if isinstance(command, (str, bytes)) or not command:
        raise CaptureError(
            "the command to profile must be a non-empty list of arguments, e.g. "
            "['python', 'train.py'] (it is never run through a shell)"
        )
    return [os.fspath(c) for c in command]


def output_base(output_dir: str | Path, name: str) -> Path:
    """``output_dir/name`` as an absolute path (no extension); creates ``output_dir``."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise CaptureError(f"capture name must be a plain file name, got {name!r}")
    out = Path(output_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out / name
