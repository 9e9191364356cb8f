"""The torch backend: the PyTorch profiler (Kineto), in-process or around a Python program.

Two ways in:

* :func:`profile_torch` — a context manager for code you run yourself (a
  notebook, a benchmark): ``torch.profiler.profile`` with the CUDA activity
  when ``torch.cuda.is_available()`` (else CPU only), shapes, stacks and
  FLOPs recorded, and the Kineto JSON written on exit — also when the body
  raises.
* :class:`TorchBackend` — for a *command*. It runs::

      sys.executable -m perfguard.capture.torch_runner --output OUT --device DEV
          [--no-record-shapes] (--with-stack | --no-stack) [--no-flops] [--profile-memory]
          --warmup N --iterations N|all [--key-node NAME] --fallback-seconds S
          --report FILE -- (SCRIPT.py | -m MODULE | -c CODE) [ARGS...]

  which executes the Python program in that process, recording a window of
  its iterations (:mod:`perfguard.capture.torch_window`; ``--iterations all``:
  the whole run under :func:`profile_torch`; see
  :mod:`perfguard.capture.torch_runner`). Only
  Python commands qualify (``python script.py``, ``python -m mod``,
  ``python -c code``, or a bare ``script.py``); the program runs under this
  interpreter (``sys.executable``), whatever ``python`` the command named.
  Other programs need the nsys backend.

Iterations. A program marks each iteration with a ``perfguard.iteration``
range, e.g. ``with torch.profiler.record_function("perfguard.iteration"):
train_step()``, and the analysis numbers them 0, 1, ...; a program that does
not is cut into iterations by its optimizer's steps, which the runner's window
marks ``ProfilerStep#N``; or a key node is named (``--key-node NAME``). A
program may start its own ``torch.profiler`` under the runner: Kineto allows
one session per process, so perfguard's steps aside and the program's session
becomes the capture (see :class:`_StepAside`). The
runner sets ``PERFGUARD_CAPTURE=torch`` so a program can skip its own
profiling instead.

A program that fails (non-zero exit or an exception) still leaves its
trace; :meth:`TorchBackend.capture` then raises :class:`CaptureError` whose
``result`` points at it, the same as the nsys backend for a failed command.

``torch`` is imported lazily: perfguard imports without it installed.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from perfguard.capture.base import (
    Backend,
    CaptureResult,
    RunOptions,
    RunPlan,
    python_runner_env,
    python_target,
)
from perfguard.errors import CaptureError

Device = Literal["auto", "cuda", "cpu"]
DEVICES = ("auto", "cuda", "cpu")
INSTALL_HINT = "install it with `pip install perfguard[torch]` (or install torch)"
#: set in the profiled program's environment by the runner
CAPTURE_ENV = "PERFGUARD_CAPTURE"
TRACE_SUFFIX = ".pt.trace.json.gz"
RUNNER_MODULE = "perfguard.capture.torch_runner"
#: the runner's window (:mod:`perfguard.capture.torch_window`), as torch's own tutorial
#: schedules one (``schedule(wait=1, warmup=1, active=3)``): two iterations run
#: unrecorded, three are recorded
DEFAULT_WARMUP = 2
DEFAULT_ITERATIONS = 3
#: ``iterations`` for the whole run from the start, no window
WHOLE_RUN = 0
#: seconds the provisional capture runs from the start while no window has opened
DEFAULT_FALLBACK_S = 10.0


def torch_available() -> tuple[bool, str]:
    """Whether ``torch`` can be imported here, without importing it (cheap)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return False, f"PyTorch is not installed: {INSTALL_HINT}"
    return True, "PyTorch is installed"


def torch_cuda_available() -> bool:
    """``torch.cuda.is_available()`` (imports torch: call only when a GPU is likely)."""
    try:
        return bool(_import_torch().cuda.is_available())
    except CaptureError:
        return False


def _import_torch() -> Any:
    try:
        import torch
        import torch.profiler  # noqa: F401  (a submodule; make sure it loads)
    except ImportError as exc:
        raise CaptureError(f"PyTorch cannot be imported ({exc}): {INSTALL_HINT}") from None
    return torch


def resolve_device(device: str, torch: Any) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without one is an error."""
    if device not in DEVICES:
        raise CaptureError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    has_cuda = bool(torch.cuda.is_available())
    if device == "cuda" and not has_cuda:
        raise CaptureError(
            "device 'cuda' was asked for but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); use device 'cpu' or 'auto'"
        )
    if device == "auto":
        return "cuda" if has_cuda else "cpu"
    return device


#: Inductor's switch for a profiler range around each C++ kernel it generates (torch.compile
#: on a CPU); its Triton kernels get one from their launcher whatever it says
INDUCTOR_CPP_PROFILE_ENV = "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"


def record_compiled_kernels() -> bool:
    """Have ``torch.compile``'s C++ kernels compiled from now on open a profiler range each.

    Without one a compiled CPU model's kernels are invisible: their time is the
    ``CompiledFxGraph`` range's own, and no op they fuse can be named
    (:mod:`perfguard.trace.compiled`). Code compiled earlier is not changed, so
    this is called before the program compiles (the runner: before it runs; the
    plugin: at session start). The environment variable also reaches child
    processes; a user's own ``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=0`` is kept.
    Returns whether the ranges are on. Does not import torch.
    """
    os.environ.setdefault(INDUCTOR_CPP_PROFILE_ENV, "1")
    on = os.environ[INDUCTOR_CPP_PROFILE_ENV] == "1"
    config = sys.modules.get("torch._inductor.config")  # read the variable at its import
    if config is not None and on:
        config.cpp.enable_kernel_profile = True
    return on


@dataclass
class TorchProfile:
    """What :func:`profile_torch` yields: where the trace goes, the device, the profiler."""

    path: Path
    device: str
    profiler: Any
    #: what the capture should say about itself (the program's own profiler took over)
    notes: list[str] = field(default_factory=list)


@contextmanager
def profile_torch(
    output_path: str | os.PathLike[str],
    *,
    device: Device = "auto",
    record_shapes: bool = True,
    with_stack: bool = True,
    with_flops: bool = True,
    profile_memory: bool = False,
) -> Iterator[TorchProfile]:
    """Profile the ``with`` body with ``torch.profiler`` and write a Kineto JSON trace on exit.

    ``output_path`` ending in ``.gz`` is compressed. The trace is written even
    when the body raises (then the body's exception propagates). Shapes are on
    by default because FLOP and Tensor Core figures need them.
    """
    record_compiled_kernels()
    torch = _import_torch()
    dev = resolve_device(device, torch)
    out = trace_path(output_path)
    prof = new_profiler(
        torch,
        dev,
        record_shapes=record_shapes,
        with_stack=with_stack,
        with_flops=with_flops,
        profile_memory=profile_memory,
    )
    handle = TorchProfile(path=out, device=dev, profiler=prof)

    def step_aside() -> None:
        prof.stop()
        _export(prof, out)

    guard = _StepAside(torch, lambda session: session is prof.profiler, step_aside, out)
    handle.notes = guard.notes
    with guard:
        start_profiler(torch, prof)
        guard.active = True
        try:
            yield handle
        except BaseException:
            try:
                _finish(guard, prof, out)
            except CaptureError as exc:  # keep the body's exception; say why there is no trace
                print(f"perfguard: {exc}", file=sys.stderr)
            raise
        _finish(guard, prof, out)


def _finish(guard: _StepAside, prof: Any, out: Path) -> None:
    """Stop ours and write its trace, unless it stepped aside already."""
    if guard.active:
        guard.active = False
        prof.stop()
        _export(prof, out)


def trace_path(output_path: str | os.PathLike[str]) -> Path:
    """``output_path`` made absolute, its folder created."""
    out = Path(output_path).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def new_profiler(
    torch: Any,
    device: str,
    *,
    record_shapes: bool,
    with_stack: bool,
    with_flops: bool,
    profile_memory: bool,
) -> Any:
    """A ``torch.profiler.profile`` (not started) with the CUDA activity on ``device`` cuda."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        record_shapes=record_shapes,
        with_stack=with_stack,
        with_flops=with_flops,
        profile_memory=profile_memory,
    )


def start_profiler(torch: Any, prof: Any) -> None:
    """``prof.start()`` without importing Inductor (see :func:`inductor_left_unloaded`)."""
    with inductor_left_unloaded(torch):
        prof.start()


@contextmanager
def inductor_left_unloaded(torch: Any) -> Iterator[None]:
    """``torch.profiler.profile.start`` asks ``hasattr(torch, "_inductor")`` to read one
    Inductor setting (CUDA graphs); torch's lazy module attribute then imports Inductor,
    1.4 s of CPU on this project's VM, in a session that never compiles. While the profiler
    starts, the lazy attribute is hidden when Inductor is not loaded yet (the setting then
    keeps its default, which is what a process that never loaded Inductor runs with)."""
    lazy = torch.__dict__.get("__getattr__")
    if lazy is None or "torch._inductor" in sys.modules:
        yield
        return

    def getattr_without_inductor(name: str) -> Any:
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = getattr_without_inductor
    try:
        yield
    finally:
        torch.__getattr__ = lazy


class _StepAside:
    """Lets the profiled program run its own ``torch.profiler`` (or
    ``torch.autograd.profiler.profile``) under ours.

    Kineto holds one session per process. A second one started inside ours
    used to take the session over; ours then stopped a session that was no
    longer there and the process died (SIGSEGV) writing the trace. Now, while
    installed, the first profiler session the program prepares makes ours step
    aside: ``stop`` stops ours and writes what it has (the run up to there), the
    program's runs as the program asked, and when it stops its trace replaces
    ours as the capture (the last session, when it runs several). A note on
    stderr says so: the capture then has the program's profiler settings.
    ``ours(session)`` tells perfguard's own sessions from the program's (the
    window of :mod:`perfguard.capture.torch_window` runs more than one).
    """

    def __init__(
        self, torch: Any, ours: Callable[[Any], bool], stop: Callable[[], None], out: Path
    ) -> None:
        self.cls = torch.autograd.profiler.profile
        self.ours = ours
        self.stop = stop
        self.out = out
        #: ours has its capture to write (and is recording, or will be); the owner sets it
        self.active = False
        self.displaced = False  # the program's profiler took over
        self.notes: list[str] = []
        self._saved: dict[str, Any] = {}
        self._files: list[Path] = []  # the program's sessions, saved once (see _save_session)

    def __enter__(self) -> _StepAside:
        prepare, leave = self.cls._prepare_trace, self.cls.__exit__
        self._saved = {"_prepare_trace": prepare, "__exit__": leave}
        guard = self

        def _prepare_trace(session: Any) -> Any:
            if guard.active and not guard.ours(session):
                guard.step_aside()
            return prepare(session)

        def __exit__(session: Any, *exc: Any) -> Any:
            result = leave(session, *exc)
            if guard.displaced and not guard.ours(session):
                guard.take(session)
            return result

        self.cls._prepare_trace = _prepare_trace
        self.cls.__exit__ = __exit__
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._saved.items():
            setattr(self.cls, name, fn)
        for f in self._files:
            f.unlink(missing_ok=True)

    def step_aside(self) -> None:
        """Stop ours and write what it has, before the program's session starts."""
        self.active = False
        self.displaced = True
        self.stop()
        note = (
            "the program started its own torch profiler: perfguard's stepped aside (one "
            "profiler session per process), and the capture is the program's own session"
        )
        self.notes.append(note)
        print(f"perfguard: note: {note}", file=sys.stderr)

    def take(self, session: Any) -> None:
        """The program's session ended: its trace becomes the capture (and its names and
        call sites the sidecar: ours described the trace it replaces)."""
        try:
            self._files.append(_save_session(session, self.out))
            _write_sidecar(session, self.out)
        except Exception as exc:  # noqa: BLE001 - ours (written at step-aside) stays
            print(
                f"perfguard: note: the program's profiler trace could not be kept "
                f"({type(exc).__name__}: {exc}); the capture stops where it started",
                file=sys.stderr,
            )


def _save_session(session: Any, out: Path) -> Path:
    """Write an ``autograd.profiler.profile`` session's Kineto trace to ``out`` (gzip
    when it ends in ``.gz``), replacing it only once the new trace is whole.

    Kineto saves a session's results once only ("Trace is already saved"), and
    the program will want to export them itself: they are saved here to a
    plain JSON file first, and the session's results are wrapped so that the
    program's own later save copies that file instead. Returns that file (the
    caller removes it once the program is done).
    """
    plain = out.with_name(f".{out.name}.{os.getpid()}.{id(session)}.json")
    session.kineto_results.save(str(plain))
    session.kineto_results = _SavedResults(session.kineto_results, plain)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        if out.name.endswith(".gz"):
            with open(plain, "rb") as src, gzip.open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(plain, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return plain


class _SavedResults:
    """Kineto results already saved to ``plain``: ``save`` copies that file, anything
    else goes to the real results (events, start time, ...)."""

    def __init__(self, results: Any, plain: Path) -> None:
        self._results = results
        self._plain = plain

    def save(self, path: str) -> None:
        shutil.copyfile(self._plain, path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._results, name)


#: gzip level of a written trace. torch gzips a ``.gz`` export line by line at level 9:
#: 0.21 s a test of the session_overhead walk (x-transformers' decoder, a 5 MB training-step
#: trace); one write at level 3 takes 0.02 s of it, for a file 1.46 times level 9's
GZIP_LEVEL = 3


def _export(prof: Any, out: Path, *, rename: Sequence[tuple[str, str]] = ()) -> None:
    """Write ``prof``'s trace to ``out`` and its sidecar; ``rename`` (old, new) renames
    ranges in the JSON (the window's steps that are no iteration: names are unique
    there, ``ProfilerStep#N``, so each quoted name is matched whole). torch writes the
    JSON; this module gzips it (:data:`GZIP_LEVEL`)."""
    gz = out.name.endswith(".gz")
    target = out if not (rename or gz) else out.with_name(f".{out.name}.{os.getpid()}.json")
    try:
        prof.export_chrome_trace(str(target))
        if target != out:
            text = target.read_bytes()
            for old, new in rename:
                text = text.replace(json.dumps(old).encode(), json.dumps(new).encode())
            if gz:
                with gzip.open(out, "wb", compresslevel=GZIP_LEVEL) as f:
                    f.write(text)
            else:
                out.write_bytes(text)
    except Exception as exc:  # torch raises RuntimeError/AssertionError/OSError here
        raise CaptureError(f"{out}: the torch profiler could not write its trace: {exc}") from None
    finally:
        if target != out:
            target.unlink(missing_ok=True)
    _write_sidecar(prof, out)


def _write_sidecar(prof: Any, out: Path) -> None:
    """Exact names and call sites from the in-memory results beside the trace
    (:mod:`perfguard.capture.torch_results`); the JSON stands without them."""
    # numpy and pandas: this module is loaded by the plugin's import (test_light_imports.py)
    from perfguard.capture.torch_results import sidecar_path, write_sidecar

    try:
        write_sidecar(prof, out)
    except Exception as exc:  # noqa: BLE001 - a torch without these results: a note only
        sidecar_path(out).unlink(missing_ok=True)
        print(
            f"perfguard: note: names and call sites not kept beside {out.name}: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )


def torch_runner_argv(
    output: str | Path,
    target: Sequence[str],
    *,
    device: Device = "auto",
    record_shapes: bool = True,
    with_stack: bool = False,
    with_flops: bool = True,
    profile_memory: bool = False,
    warmup: int = DEFAULT_WARMUP,
    iterations: int = DEFAULT_ITERATIONS,
    key_node: str | None = None,
    fallback_s: float = DEFAULT_FALLBACK_S,
    report: str | Path | None = None,
) -> list[str]:
    """The runner command line of the module contract (see the module docstring)."""
    argv = [sys.executable, "-m", RUNNER_MODULE, "--output", str(output), "--device", device]
    if not record_shapes:
        argv.append("--no-record-shapes")
    argv.append("--with-stack" if with_stack else "--no-stack")
    if not with_flops:
        argv.append("--no-flops")
    if profile_memory:
        argv.append("--profile-memory")
    argv += ["--warmup", str(warmup), "--iterations", str(iterations or "all")]
    if key_node is not None:
        argv += ["--key-node", key_node]
    argv += ["--fallback-seconds", repr(float(fallback_s))]
    if report is not None:
        argv += ["--report", str(report)]
    return argv + ["--", *target]


class TorchBackend(Backend):
    """Profile a Python program with the PyTorch profiler; returns a Kineto JSON trace.

    By default a window of iterations, without Python stacks (see
    :mod:`perfguard.capture.torch_window`); ``iterations=WHOLE_RUN`` records the
    whole run. The :class:`RunOptions` ``warmup``, ``iterations``, ``with_stack``,
    ``fallback_s`` and ``key_node`` override the constructor's for one capture.
    """

    name = "torch"
    takes = frozenset({"warmup", "iterations", "with stack", "fallback seconds"})

    def __init__(
        self,
        *,
        device: Device = "auto",
        record_shapes: bool = True,
        with_stack: bool = False,
        with_flops: bool = True,
        profile_memory: bool = False,
        warmup: int = DEFAULT_WARMUP,
        iterations: int = DEFAULT_ITERATIONS,
        fallback_s: float = DEFAULT_FALLBACK_S,
        why: str = "",
    ) -> None:
        super().__init__(why=why)
        if device not in DEVICES:
            raise CaptureError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
        self.device: Device = device
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.profile_memory = profile_memory
        self.warmup = warmup
        self.iterations = iterations
        self.fallback_s = fallback_s

    def available(self) -> tuple[bool, str]:
        """Whether torch is importable (checked without importing it)."""
        return torch_available()

    def plan(
        self, command: list[str], out: Path, options: RunOptions, env: Mapping[str, str] | None
    ) -> RunPlan:
        """The torch runner over the Python ``command``, writing ``.pt.trace.json.gz``."""
        target = python_target(command, self.name)
        ok, reason = torch_available()
        if not ok:
            raise CaptureError(reason)
        report = _report_path(out)
        out = out.with_name(out.name + TRACE_SUFFIX)
        argv = torch_runner_argv(
            out,
            target,
            device=self.device,
            record_shapes=self.record_shapes,
            with_stack=_given(options.with_stack, self.with_stack),
            with_flops=self.with_flops,
            profile_memory=self.profile_memory,
            warmup=_given(options.warmup, self.warmup),
            iterations=_given(options.iterations, self.iterations),
            key_node=options.key_node,
            fallback_s=_given(options.fallback_s, self.fallback_s),
            report=report,
        )
        return RunPlan(
            argv=argv, env=python_runner_env(env), path=out, what="trace", stale=(report,)
        )

    def finish(self, result: CaptureResult, plan: RunPlan, timeout: float | None) -> CaptureResult:
        """What the runner said the capture holds, as ``result.detail``."""
        return replace(result, detail=read_report(plan.stale[0]).get("detail", ""))


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _report_path(out: Path) -> Path:
    """Where the runner says what the capture holds (read and removed by the backend)."""
    return out.with_name(f".{out.name}.capture.json")


def read_report(path: Path) -> dict[str, Any]:
    """The runner's report (``{}`` when it wrote none), removed once read."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    path.unlink(missing_ok=True)
    return doc if isinstance(doc, dict) else {}
