"""Running a profiled command: argv lists only, a timeout that never hangs.

Every backend runs its tool through :func:`run_command` so they share one
behaviour:

* the argv is a list and is never handed to a shell;
* the command gets its own session (``start_new_session=True``), so on a
  timeout or an interrupt the whole process group (the profiler, the program
  and anything they spawned) is stopped: SIGTERM, then SIGKILL after a grace
  period;
* stdout passes straight through; stderr is echoed as it arrives and its tail
  kept for the error message and ``CaptureResult.log``;
* stdin is ``/dev/null``: a profiled program waiting for input would
  otherwise hang a CI job.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfguard.errors import CaptureError

#: seconds between SIGTERM and SIGKILL when stopping a process group
KILL_GRACE_S = 3.0
#: bytes of stderr kept for the log tail
TAIL_BYTES = 16_384
#: lines of stderr kept in ``Completed.stderr_tail``
TAIL_LINES = 40
#: profiler chatter that is never the program's own last word (Kineto's USDT and
#: glog lines after a traceback; nsys's progress lines after a failed program)
NOISE = re.compile(
    r"^(USDT:|\[?[IWEF]\d{4} \d\d:\d\d:\d\d|Collecting data\.\.\.|Generating '|Generated:"
    r"|Processing events|Processing \[|Exporting |\[\d+/\d+\] )"
)


@dataclass(frozen=True)
class Completed:
    """A finished command: its status, wall time and the tail of its stderr."""

    argv: list[str]
    returncode: int
    wall_time_s: float
    stderr_tail: str

    @property
    def last_stderr_line(self) -> str:
        """The last non-blank stderr line that is not profiler chatter, or '' (for messages)."""
        lines = [
            ln.strip()
            for ln in self.stderr_tail.splitlines()
            if ln.strip() and not NOISE.match(ln.strip())
        ]
        return lines[-1] if lines else ""


def format_command(argv: Sequence[str]) -> str:
    """``argv`` as a shell would show it (for messages only; never executed)."""
    return shlex.join(str(a) for a in argv)


def describe_status(returncode: int) -> str:
    """'exit status 3' or 'killed by signal SIGKILL' (Popen's negative codes)."""
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def run_command(
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    echo: bool = True,
) -> Completed:
    """Run ``argv`` to completion (or until ``timeout`` seconds) and report how it ended.

    A non-zero status is returned, not raised: the caller knows what it means.
    Raises :class:`CaptureError` when the program cannot be started or runs
    past ``timeout`` (after stopping its whole process group).
    """
    argv = [os.fspath(a) for a in argv]
    if timeout is not None and timeout <= 0:
        raise CaptureError(f"timeout must be > 0 seconds, got {timeout}")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise CaptureError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None

    tail = bytearray()
    reader = threading.Thread(
        target=_pump_stderr, args=(proc, tail, echo), name="perfguard-stderr", daemon=True
    )
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        reader.join(timeout=KILL_GRACE_S)
        raise CaptureError(
            f"`{format_command(argv)}` did not finish within {timeout:g} s; "
            "stopped it and every process it started"
        ) from None
    except BaseException:
        _stop_group(proc)  # Ctrl-C or any error here: never leave the program running
        raise
    # A program may leave a daemon holding stderr open: do not wait for it forever.
    reader.join(timeout=KILL_GRACE_S)
    return Completed(
        argv=argv,
        returncode=returncode,
        wall_time_s=time.monotonic() - started,
        stderr_tail=_tail_text(bytes(tail)),
    )


def _pump_stderr(proc: subprocess.Popen[bytes], tail: bytearray, echo: bool) -> None:
    """Copy the child's stderr to ours as it arrives, keeping the last bytes."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    out = getattr(sys.stderr, "buffer", None)
    while True:
        try:
            chunk = os.read(fd, 65_536)
        except OSError:
            break
        if not chunk:
            break
        tail.extend(chunk)
        if len(tail) > TAIL_BYTES:
            del tail[: len(tail) - TAIL_BYTES]
        if echo:
            try:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stderr.write(chunk.decode("utf-8", "replace"))
                    sys.stderr.flush()
            except (OSError, ValueError):
                echo = False  # our stderr went away; keep collecting the tail
    proc.stderr.close()


def _tail_text(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").replace("\r\n", "\n").split("\n")
    return "\n".join(lines[-TAIL_LINES:]).strip("\n")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it after the grace period, reap the leader.

    The group id is the leader's pid (``start_new_session``); it stays valid
    while any member lives, so SIGKILL still reaches grandchildren after the
    leader died.
    """
    pgid = proc.pid
    _killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _killpg(pgid, signal.SIGKILL)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        pass


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
