"""The nsys backend: run a command under Nsight Systems and export SQLite.

THE CONTRACT: the argv perfguard runs (built by :func:`nsys_profile_argv`),
with DLProf's trace options (CUDA and NVTX, no CPU sampling)::

    NSYS profile -t cuda,nvtx -s none -o OUTBASE --force-overwrite=true
         [--export=sqlite]                      # export_mode="inline" (default)
         [-y DELAY] [-d DURATION]               # whole seconds
         [--capture-range=cudaProfilerApi --capture-range-end=stop]
         [--capture-range=nvtx --nvtx-capture=NAME --capture-range-end=stop]
         COMMAND [ARGS...]

then, with ``export_mode="separate"`` (an nsys whose ``profile`` lacks
``--export``, or to keep the export step apart)::

    NSYS export --type=sqlite -o OUTBASE.sqlite REPORT

Every option is spelt as the User Guides of 2022.1 to 2026.2 document it: a short
option's value as the next argument, a long one's after ``=`` (``tests/nsys_options.py``
checks the argv against each release's documented options and values).

``OUTBASE`` is ``output_dir/name`` (absolute, no extension). nsys writes the
report as ``OUTBASE.nsys-rep`` (2022.1 on) or ``OUTBASE.qdrep`` (2021.x and
older) and the export as ``OUTBASE.sqlite``; both are looked for. Outputs of
an earlier run with the same base are removed first, so a stale export can
never pass for this run's.

With an NVTX capture range perfguard also sets
``NSYS_NVTX_PROFILER_REGISTER_ONLY=0`` (unless already set): otherwise nsys
matches only *registered* NVTX strings, and ``torch.cuda.nvtx`` or
``nvtx.annotate`` ranges never start the capture.

``NSYS`` is, in order: the ``nsys=`` argument (``--nsys PATH``), the
``PERFGUARD_NSYS`` environment variable, ``nsys`` on ``PATH``.

Exit status: nsys returns the program's status. A non-zero status is a
:class:`CaptureError`, except with ``duration``: nsys then stops the program
itself (SIGTERM by default), so a non-zero status with an export present is
the expected end of a timed capture and the result is returned.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from perfguard.capture.base import Backend, CaptureResult, RunOptions, RunPlan
from perfguard.capture.process import Completed, describe_status, run_command
from perfguard.errors import CaptureError

ENV_VAR = "PERFGUARD_NSYS"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
INSTALL_HINT = (
    "install NVIDIA Nsight Systems (https://developer.nvidia.com/nsight-systems) "
    f"or point perfguard at it with --nsys PATH or {ENV_VAR}=PATH"
)
ExportMode = Literal["inline", "separate"]


def find_nsys(nsys: str | None = None) -> tuple[str | None, str]:
    """The nsys executable to use and where it came from (``None`` and why not).

    Order: ``nsys`` argument, ``$PERFGUARD_NSYS``, ``PATH``. An explicit
    value that does not name an executable is an error, not a fallback: the
    user asked for that one.
    """
    for value, origin in ((nsys, "--nsys"), (os.environ.get(ENV_VAR) or None, ENV_VAR)):
        if value is None:
            continue
        found = _executable(value)
        if found is None:
            raise CaptureError(f"{origin} names {value!r}, which is not an executable nsys")
        return found, f"{found} (from {origin})"
    found = shutil.which("nsys")
    if found is not None:
        return found, f"{found} (from PATH)"
    return None, f"nsys (NVIDIA Nsight Systems) not found on PATH: {INSTALL_HINT}"


def _executable(value: str) -> str | None:
    path = Path(value).expanduser()
    if os.sep in value or (os.altsep and os.altsep in value):
        return str(path.resolve()) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(value)


def parse_capture_range(text: str | None) -> tuple[str, str | None] | None:
    """``"cudaProfilerApi"`` → ``("cudaProfilerApi", None)``, ``"nvtx:NAME"`` → ``("nvtx", NAME)``.

    ``NAME`` may carry nsys's ``@domain`` suffix (``step@mydomain``, ``step@*``).
    """
    if text is None:
        return None
    value = text.strip()
    if value.lower() in ("cudaprofilerapi", "cuda"):
        return ("cudaProfilerApi", None)
    kind, sep, name = value.partition(":")
    if kind.lower() == "nvtx" and sep and name.strip():
        return ("nvtx", name.strip())
    raise CaptureError(
        f"capture range {text!r} is not understood: use 'cudaProfilerApi' "
        "(capture between cudaProfilerStart/Stop) or 'nvtx:NAME' (capture the NVTX range NAME)"
    )


def _whole_seconds(value: float | None, what: str, *, positive: bool) -> str | None:
    if value is None:
        return None
    v = float(value)
    if v != int(v) or v < 0 or (positive and v == 0):
        need = "a whole number of seconds > 0" if positive else "a whole number of seconds >= 0"
        raise CaptureError(f"{what} must be {need} (nsys takes whole seconds), got {value}")
    return str(int(v))


def nsys_profile_argv(
    nsys: str,
    command: Sequence[str],
    outbase: str | Path,
    *,
    export_mode: ExportMode = "inline",
    delay: float | None = None,
    duration: float | None = None,
    capture_range: str | None = None,
) -> list[str]:
    """The ``nsys profile`` argv of the module contract (see the module docstring)."""
    if export_mode not in ("inline", "separate"):
        raise CaptureError(f"export_mode must be 'inline' or 'separate', got {export_mode!r}")
    argv = [nsys, "profile", "-t", "cuda,nvtx", "-s", "none"]
    argv += ["-o", str(outbase), "--force-overwrite=true"]
    if export_mode == "inline":
        argv.append("--export=sqlite")
    y = _whole_seconds(delay, "delay", positive=False)
    if y is not None:
        argv += ["-y", y]
    d = _whole_seconds(duration, "duration", positive=True)
    if d is not None:
        argv += ["-d", d]
    rng = parse_capture_range(capture_range)
    if rng is not None:
        kind, name = rng
        argv.append(f"--capture-range={kind}")
        if name is not None:
            argv.append(f"--nvtx-capture={name}")
        argv.append("--capture-range-end=stop")
    return argv + [str(c) for c in command]


def nsys_export_argv(nsys: str, report: str | Path, sqlite: str | Path) -> list[str]:
    """The separate export step of the contract: ``nsys export --type=sqlite -o X REPORT``."""
    return [nsys, "export", "--type=sqlite", "-o", str(sqlite), str(report)]


class NsysBackend(Backend):
    """Profile any command (Python or not) with Nsight Systems; returns the SQLite export."""

    name = "nsys"
    takes = frozenset({"delay", "duration", "capture range"})

    def __init__(
        self, nsys: str | None = None, *, export_mode: ExportMode = "inline", why: str = ""
    ) -> None:
        super().__init__(why=why)
        if export_mode not in ("inline", "separate"):
            raise CaptureError(f"export_mode must be 'inline' or 'separate', got {export_mode!r}")
        self.nsys = nsys
        self.export_mode: ExportMode = export_mode

    def available(self) -> tuple[bool, str]:
        """Whether nsys can be found (never raises for a missing PATH entry)."""
        try:
            found, how = find_nsys(self.nsys)
        except CaptureError as exc:
            return False, str(exc)
        return found is not None, (f"nsys at {how}" if found else how)

    @property
    def profiler(self) -> str:
        return "nsys"

    def plan(
        self, command: list[str], out: Path, options: RunOptions, env: Mapping[str, str] | None
    ) -> RunPlan:
        """``nsys profile`` of any ``command``, exporting ``.sqlite`` (inline mode)."""
        nsys, how = find_nsys(self.nsys)
        if nsys is None:
            raise CaptureError(how)
        if "%" in str(out):
            # nsys expands %q{VAR}, %h, %p in -o: the file would not be where we look.
            raise CaptureError(f"output path {out} contains '%', which nsys would expand")
        argv = nsys_profile_argv(
            nsys,
            command,
            out,
            export_mode=self.export_mode,
            delay=options.delay,
            duration=options.duration,
            capture_range=options.capture_range,
        )
        child_env = dict(os.environ if env is None else env)
        rng = parse_capture_range(options.capture_range)
        if rng is not None and rng[0] == "nvtx":
            child_env.setdefault("NSYS_NVTX_PROFILER_REGISTER_ONLY", "0")
        reports = tuple(out.with_name(out.name + s) for s in REPORT_SUFFIXES)
        return RunPlan(
            argv=argv,
            env=child_env,
            path=out.with_name(out.name + ".sqlite"),
            what="SQLite export",
            stale=reports,
            reports=reports,
        )

    def accepts_exit(self, done: Completed, plan: RunPlan, options: RunOptions) -> bool:
        """nsys ends the program at ``duration``: its export is the capture."""
        return options.duration is not None and plan.path.is_file()

    def finish(self, result: CaptureResult, plan: RunPlan, timeout: float | None) -> CaptureResult:
        """Export mode ``separate``: ``nsys export`` of the report to ``.sqlite``."""
        if self.export_mode != "separate":
            return result
        if result.report is None:
            expected = " or ".join(str(r) for r in plan.reports)
            raise CaptureError(f"nsys profile finished but wrote no report: expected {expected}")
        nsys = plan.argv[0]
        exported = run_command(nsys_export_argv(nsys, result.report, plan.path), timeout=timeout)
        if exported.returncode != 0:
            last = exported.last_stderr_line
            raise CaptureError(
                f"`nsys export` of {result.report} ended with "
                f"{describe_status(exported.returncode)}" + (f": {last}" if last else "")
            )
        return replace(
            result,
            wall_time_s=result.wall_time_s + exported.wall_time_s,
            log="\n".join(t for t in (result.log, exported.stderr_tail) if t),
        )


def usable_nsys(
    nsys: str | None = None, *, export_mode: ExportMode = "inline", why: str = ""
) -> NsysBackend:
    """An :class:`NsysBackend` checked to run here; CaptureError names what to install."""
    backend = NsysBackend(nsys, export_mode=export_mode, why=why)
    ok, reason = backend.available()
    if not ok:
        raise CaptureError(reason)
    return backend
