"""The one interface every capture backend implements, and what a capture returns.

A backend turns "run this command" into a file that :func:`perfguard.load_trace`
reads (an nsys SQLite export, a Kineto JSON trace, an XSpace profile). Backends
differ in what they can see, not in how they are driven, so the CLI and the
pytest plugin call them all the same way: :class:`Backend` is the one
template of a capture (check, run the command once under the profiler, judge
its exit, find the file), and each backend states only its :class:`RunPlan` and
what it does after the run.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from perfguard.capture.process import Completed, describe_status, format_command, run_command
from perfguard.errors import CaptureError

#: ``python``, ``python3``, ``python3.11``, ``pythonw``... as a command's first word
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?[tw]?(\.exe)?$", re.IGNORECASE)


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
    #: what the capture holds, where the backend says (torch: "3 iterations after 2 warm-up")
    detail: str = ""


#: the backend each option of :class:`RunOptions` belongs to, as the messages name it
OPTION_OWNER = {
    "delay": "nsys",
    "duration": "nsys",
    "capture range": "nsys",
    "warmup": "torch",
    "iterations": "torch",
    "with stack": "torch",
    "fallback seconds": "torch",
}


@dataclass(frozen=True)
class RunOptions:
    """The options of :meth:`Backend.capture` that only some backends take (nsys: a time
    window; torch: an iteration window, :mod:`perfguard.capture.torch_window`). None: not
    asked for. ``key_node`` is no one's: a backend that cannot use it ignores it (it is
    the analysis' option too)."""

    delay: float | None = None
    duration: float | None = None
    capture_range: str | None = None
    warmup: int | None = None
    #: ``0`` (``torch_profiler.WHOLE_RUN``): the whole run
    iterations: int | None = None
    with_stack: bool | None = None
    fallback_s: float | None = None
    key_node: str | None = None

    def asked(self) -> list[str]:
        """The options given, as the messages name them."""
        named = (
            ("delay", self.delay),
            ("duration", self.duration),
            ("capture range", self.capture_range),
            ("warmup", self.warmup),
            ("iterations", self.iterations),
            ("with stack", self.with_stack),
            ("fallback seconds", self.fallback_s),
        )
        return [flag for flag, value in named if value is not None]


@dataclass(frozen=True)
class RunPlan:
    """What one backend runs for one capture (:meth:`Backend.plan`)."""

    argv: list[str]
    env: dict[str, str]
    #: the file the readers load
    path: Path
    #: what the messages call that file ("trace", "profile", "SQLite export")
    what: str
    #: files of an earlier capture to remove first, beside ``path`` itself
    stale: tuple[Path, ...] = ()
    #: where the profiler may leave its own report (the first found is kept)
    reports: tuple[Path, ...] = ()


class Backend(ABC):
    """A way of profiling a command, and the one capture template every backend follows.

    :meth:`capture` checks the command (a list, no option another backend owns), lets the
    backend plan the run (:meth:`plan`: its command line, environment and file), runs it
    once, and a failed exit is an error unless :meth:`accepts_exit` says the file it left
    is the capture; then :meth:`finish` (nsys: the separate export), and the file must
    exist. ``why`` is recorded in every result.
    """

    #: the backend's name in results and messages (a class's, or an instance's: XSpace's
    #: is its framework)
    name: str

    def __init__(self, *, why: str = "") -> None:
        self.why = why or f"backend {self.name!r} was requested"

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """Whether this backend can run here, and the reason (a short phrase)."""

    #: the :class:`RunOptions` the backend takes (``delay``, ``duration``, ``capture
    #: range``, ``warmup``, ...); any other one asked for is refused, naming its backend
    takes: ClassVar[frozenset[str]] = frozenset()

    @property
    def profiler(self) -> str:
        """How the messages name what ran the command ("the torch profiler", "nsys")."""
        return f"the {self.name} profiler"

    @abstractmethod
    def plan(
        self, command: list[str], out: Path, options: RunOptions, env: Mapping[str, str] | None
    ) -> RunPlan:
        """The run of ``command`` writing ``out`` plus the backend's suffix; raises
        :class:`CaptureError` when the backend cannot run it here."""

    def accepts_exit(self, done: Completed, plan: RunPlan, options: RunOptions) -> bool:
        """Whether a run that exited non-zero still gave the capture (default: never)."""
        return False

    def finish(self, result: CaptureResult, plan: RunPlan, timeout: float | None) -> CaptureResult:
        """What the backend does after a run that gave its capture (default: nothing)."""
        return result

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
        options: RunOptions | None = None,
    ) -> CaptureResult:
        """Run ``command`` under this backend; write ``output_dir/name.*``.

        ``options`` carries the rest of :class:`RunOptions` (the torch window);
        ``delay``, ``duration`` and ``capture_range``, when given, win over its
        fields. Raises
        :class:`perfguard.errors.CaptureError` (one line) when the tool is missing,
        an option belongs to another backend, the command fails or times out, or
        nothing was written.
        """
        command = command_list(command)
        options = options or RunOptions()
        options = replace(
            options,
            delay=options.delay if delay is None else delay,
            duration=options.duration if duration is None else duration,
            capture_range=options.capture_range if capture_range is None else capture_range,
        )
        refused = [flag for flag in options.asked() if flag not in self.takes]
        if refused:
            owners = " or ".join(sorted({OPTION_OWNER[f] for f in refused}))
            raise CaptureError(
                f"{' and '.join(refused)} need the {owners} backend; this capture uses "
                f"{self.name} ({self.why})"
            )
        plan = self.plan(command, output_base(output_dir, name), options, env)
        for stale in (plan.path, *plan.stale):
            stale.unlink(missing_ok=True)
        done = run_command(plan.argv, timeout=timeout, env=plan.env)
        result = CaptureResult(
            path=plan.path,
            backend=self.name,
            command=command,
            returncode=done.returncode,
            wall_time_s=done.wall_time_s,
            log=done.stderr_tail,
            why=self.why,
            argv=done.argv,
            report=next((r for r in plan.reports if r.is_file()), None),
        )
        if done.returncode != 0 and not self.accepts_exit(done, plan, options):
            last = done.last_stderr_line
            kept = plan.path.is_file()
            raise CaptureError(
                f"`{format_command(command)}` under {self.profiler} ended with "
                f"{describe_status(done.returncode)}"
                + (f": {last}" if last else "")
                + (f" (its {plan.what} up to that point is in {plan.path})" if kept else ""),
                result=result if kept else None,
            )
        result = self.finish(result, plan, timeout)
        if not plan.path.is_file():
            raise CaptureError(
                f"{self.profiler} finished but wrote no {plan.what}: expected {plan.path}"
                + (f" (report: {result.report})" if result.report else "")
            )
        return result

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


def python_target(command: Sequence[str], backend: str = "torch") -> list[str]:
    """The part of a Python ``command`` a Python runner takes after ``--``.

    ``python script.py a`` → ``[script.py, a]``; ``python -m mod a`` →
    ``[-m, mod, a]``; ``python -c CODE`` → ``[-c, CODE]``; ``script.py a`` →
    ``[script.py, a]``. Anything else is a :class:`CaptureError` naming ``backend``.
    """
    command = command_list(command)
    first = command[0]
    if first.endswith(".py"):
        return command
    if _PYTHON.match(Path(first).name) or _same_file(first, sys.executable):
        rest = command[1:]
        if rest and rest[0] in ("-m", "-c") and len(rest) >= 2:
            return rest
        if rest and not rest[0].startswith("-"):
            return rest
        shown = " ".join(rest[:1]) or "nothing"
        raise CaptureError(
            f"the {backend} backend runs `python SCRIPT`, `python -m MODULE` or "
            f"`python -c CODE`, but `{format_command(command)}` gives the interpreter {shown}; "
            "drop interpreter options or use the nsys backend"
        )
    raise CaptureError(
        f"the {backend} backend profiles Python programs only (python script.py, python -m "
        f"module, or a .py file), not `{format_command(command)}`: use the nsys backend for "
        "other programs"
    )


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def python_runner_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The environment of a runner that is a perfguard module (``python -m
    perfguard.capture...``): perfguard must be importable there.

    An installed perfguard (regular or editable) is; one used from a source
    tree on ``sys.path`` gets that tree appended to ``PYTHONPATH``.
    """
    child = dict(os.environ if env is None else env)
    try:
        importlib.metadata.distribution("perfguard")
    except importlib.metadata.PackageNotFoundError:
        tree = str(Path(__file__).resolve().parents[2])
        parts = [p for p in child.get("PYTHONPATH", "").split(os.pathsep) if p]
        if tree not in parts:
            child["PYTHONPATH"] = os.pathsep.join([*parts, tree])
    return child
