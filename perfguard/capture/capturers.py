"""Capturing one test: the :class:`Capturer` protocol the plugin's loop drives, the torch
profiler in process, or nsys around a child pytest.

* :class:`TorchCapturer` — ``torch.profiler`` (CPU activities, plus CUDA when
  the backend runs on a GPU) around the recorded iterations, in this process;
  the Kineto JSON goes to ``OUTPUT/captures/<test>.pt.trace.json.gz``.
* nsys — nsys cannot attach to a running process, so the test is run again,
  alone, in a child pytest under::

      nsys profile ... --capture-range=cudaProfilerApi --capture-range-end=stop \\
          PYTHON -m pytest ROOTDIR/FILE::TEST -p no:cacheprovider [-n0] -q --rootdir ROOTDIR

  (argv list, never a shell; :func:`child_argv`). The child sees
  ``PERFGUARD_CHILD=<result.json>`` and loads :class:`ChildCapturer`, which calls
  ``cudaProfilerStart``/``cudaProfilerStop`` around the recorded iterations and
  wraps each in an NVTX ``perfguard.iteration`` range; it writes the test's
  outcome and per-iteration wall times to ``result.json`` (:func:`write_child_result`).
  The parent runs the child while setting the test up (a crash, hang or
  profiler failure is then an *error* of that test, with the reason) and
  does not run the test body itself.

Imports torch, nvtx, and the capture modules that load numpy and pandas, lazily: the
child process and every pytest run (the plugin's import) load this module with nothing
heavy loaded (tests/test_light_imports.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, Protocol

from perfguard.capture.torch_profiler import profile_torch
from perfguard.errors import CaptureError

#: environment variable that puts a pytest process in child mode; its value is the result file
CHILD_ENV = "PERFGUARD_CHILD"
ITERATION_RANGE = "perfguard.iteration"


class Capturer(Protocol):
    """A capture around recorded iterations: the plugin's loop drives one, and
    :func:`perfguard.capture.frameworks.make_capturer` makes it for a test's framework.

    ``start``/``stop`` never raise: a failure is kept in ``error`` and the
    test goes on uncaptured; the plugin reports it when the test ends.
    """

    @property
    def error(self) -> str | None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def sync(self) -> None: ...

    @property
    def separate_timing(self) -> bool:
        """True: timing rounds run with the capture off (an in-process profiler on the CPU)."""
        ...

    def iteration(self) -> AbstractContextManager[object]: ...


def capture_name(nodeid: str) -> str:
    """A file name for ``nodeid``: readable, unique (hash suffix), no path separators."""
    plain = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("._")[:100] or "test"
    return f"{plain}-{hashlib.sha1(nodeid.encode()).hexdigest()[:8]}"


def _cuda_ready() -> bool:
    """True when torch is loaded and has a CUDA context (never creates one)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # a broken CUDA install must not fail the test
        return False


class _Syncing:
    """Device synchronisation at iteration edges, only when CUDA is in use."""

    def sync(self) -> None:
        if _cuda_ready():
            sys.modules["torch"].cuda.synchronize()


class TorchCapturer(_Syncing):
    """``torch.profiler`` around the recorded iterations; ``path`` is the Kineto trace."""

    def __init__(self, path: str | Path, device: str) -> None:
        self.path = Path(path)
        self.device = device
        self.error: str | None = None
        self.started = False
        self._stack = ExitStack()
        #: the call-site pass of this capture, once run (its ``error`` is a note)
        self.site_run: Any = None
        #: the pass was skipped (compiled code): the profiled round takes torch's stacks
        self.pass_skipped = False

    @property
    def separate_timing(self) -> bool:
        """On the CPU Kineto's per-op cost is the size of a small op: time without it."""
        return self.device == "cpu"

    def start(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
            # no Python tracer: the user's line behind each op comes from the call-site
            # pass (site_pass), one step before the profiled rounds, not from a trace of
            # every Python call of every profiled step; where the pass was skipped (code
            # Dynamo compiled) the CPU's one profiled round keeps torch's stacks, which
            # name the function a compiled region ran in
            stacks = self.separate_timing and self.pass_skipped
            self._stack.enter_context(
                profile_torch(self.path, device=self.device, with_stack=stacks)  # type: ignore[arg-type]
            )
            self.started = True
        except (CaptureError, RuntimeError, OSError) as exc:
            self.error = f"the torch profiler did not start: {_one_line(exc)}"

    def site_pass(self) -> AbstractContextManager[object]:
        """The call-site pass over one step (:mod:`perfguard.capture.sites`), its file
        beside the capture; nothing where Dynamo compiled code (the mode would make it
        recompile)."""
        # numpy and pandas: not at the plugin's import (tests/test_light_imports.py)
        from perfguard.capture.sites import SitePassRun, compiled_anything
        from perfguard.trace.site_pass import sites_path

        sites_path(self.path).unlink(missing_ok=True)  # an earlier capture's must not outlive it
        if compiled_anything():
            self.pass_skipped = True
            return contextlib.nullcontext()
        run = SitePassRun(self.path)
        self.site_run = run
        return run

    def iteration(self) -> AbstractContextManager[object]:
        if not self.started:
            return contextlib.nullcontext()
        import torch.profiler  # optional and heavy: only when a torch capture runs

        return torch.profiler.record_function(ITERATION_RANGE)

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            self._stack.close()  # exports the trace
        except Exception as exc:  # CaptureError from the export, or the profiler's own
            self.error = _one_line(exc)
            return
        if not self.path.is_file():
            self.error = f"the torch profiler wrote no trace: expected {self.path}"


class ChildCapturer(_Syncing):
    """In the nsys child: the CUDA profiler API around recorded iterations, NVTX per iteration."""

    #: nsys samples from outside the process: every round is profiled (GPU time is there)
    separate_timing = False

    def __init__(self) -> None:
        self.error: str | None = None
        self.started = False

    def start(self) -> None:
        try:
            _cuda_profiler("Start")
            self.started = True
        except RuntimeError as exc:
            self.error = str(exc)

    def iteration(self) -> AbstractContextManager[object]:
        try:
            import nvtx
        except ImportError:  # a declared dependency; without it nsys sees no iterations
            return contextlib.nullcontext()
        return nvtx.annotate(ITERATION_RANGE)

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            _cuda_profiler("Stop")
        except RuntimeError as exc:
            self.error = str(exc)


def _cuda_profiler(which: str) -> None:
    """``cudaProfilerStart``/``Stop`` through torch when it has CUDA, else libcudart."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                fn = torch.cuda.profiler.start if which == "Start" else torch.cuda.profiler.stop
                fn()
                return
        except Exception as exc:
            raise RuntimeError(f"cudaProfiler{which} through torch failed: {exc}") from None
    names = [ctypes.util.find_library("cudart"), "libcudart.so", "libcudart.so.12"]
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        status = getattr(lib, f"cudaProfiler{which}")()
        if status != 0:
            raise RuntimeError(
                f"cudaProfiler{which} (from {name}) returned CUDA error {status}, "
                "so nsys's capture range never opens: is a GPU and its driver usable here?"
            )
        return
    raise RuntimeError(
        f"cannot call cudaProfiler{which}: neither torch with CUDA nor libcudart is loadable, "
        "so nsys's capture range never opens"
    )


# --- the nsys child contract -------------------------------------------------------------


def child_argv(
    nodeid: str,
    rootdir: Path,
    *,
    inifile: Path | None = None,
    xdist: bool = False,
    plugin_args: tuple[str, ...] = (),
) -> list[str]:
    """The pytest command that runs ``nodeid`` alone (see the module docstring);
    ``plugin_args``: the parent session's ``-p`` options, so the child loads perfguard and
    the other plugins as the parent did."""
    path, sep, rest = nodeid.partition("::")
    target = str((rootdir / path).resolve()) + (sep + rest if sep else "")
    argv = [sys.executable, "-m", "pytest", target, *plugin_args, "-p", "no:cacheprovider"]
    argv += ["-q", f"--rootdir={rootdir}"]
    if inifile is not None:
        argv += ["-c", str(inifile)]
    if xdist:
        argv.append("-n0")
    return argv


def write_child_result(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """The child's report to its parent (JSON, written atomically)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(target)


def read_child_result(path: Path) -> dict[str, Any] | None:
    """The child's report, or None when it wrote none (it crashed or never ran the test)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_nsys_child(
    nodeid: str,
    *,
    rootdir: Path,
    inifile: Path | None,
    output_dir: Path,
    timeout: float,
    xdist: bool,
    plugin_args: tuple[str, ...] = (),
) -> tuple[Path, dict[str, Any]]:
    """Run ``nodeid`` in a child pytest under nsys; return the export and the child's report.

    Raises :class:`perfguard.errors.CaptureError` (one line) when nsys or the
    child fails, times out, or the child reports no result.
    """
    from perfguard.capture.nsys import usable_nsys  # the trace layer: not at the plugin's import

    name = capture_name(nodeid)
    result_file = output_dir / f"{name}.child.json"
    result_file.unlink(missing_ok=True)
    env = dict(os.environ)
    env[CHILD_ENV] = str(result_file)
    backend = usable_nsys(why="the nsys backend was requested")
    argv = child_argv(nodeid, rootdir, inifile=inifile, xdist=xdist, plugin_args=plugin_args)
    try:
        done = backend.capture(
            argv,
            output_dir=output_dir,
            name=name,
            capture_range="cudaProfilerApi",
            timeout=timeout,
            env=env,
        )
    except CaptureError as exc:
        report = read_child_result(result_file)
        if report is not None and report.get("outcome") == "failed":
            # the test failed in the child: that is the test's failure, not the capture's
            return Path(str(getattr(exc.result, "path", ""))), report
        raise
    report = read_child_result(result_file)
    if report is None:
        raise CaptureError(
            f"the child pytest under nsys reported nothing for {nodeid} (was the test collected?)"
        )
    return done.path, report


@contextlib.contextmanager
def whole_call(capturer: Any) -> Iterator[list[int]]:
    """One recorded iteration around a whole test call (a marked test without the fixture)."""

    walls: list[int] = []
    capturer.sync()
    capturer.start()
    try:
        t0 = time.perf_counter_ns()
        with capturer.iteration():
            yield walls
            capturer.sync()
        walls.append(time.perf_counter_ns() - t0)
    finally:
        capturer.stop()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = [
    "CHILD_ENV",
    "ChildCapturer",
    "TorchCapturer",
    "capture_name",
    "child_argv",
    "read_child_result",
    "run_nsys_child",
    "whole_call",
    "write_child_result",
]
