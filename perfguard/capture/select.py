"""Choosing a backend, and the one call the CLI and the plugin make: :func:`profile_command`.

``auto`` picks, in order:

1. ``nsys`` when it is found (``--nsys``, ``PERFGUARD_NSYS``, ``PATH``) *and* a
   GPU is present: it sees every kernel, memcpy and NVTX range of any program;
2. ``torch`` with CUDA when a GPU is present and torch sees it;
3. ``torch`` on the CPU (ops, shapes and CPU times; no kernels).

The GPU check is cheap on purpose: ``nvidia-smi`` on ``PATH`` or an NVIDIA
driver listing a GPU in ``/proc/driver/nvidia/gpus``. torch is imported
only to confirm CUDA when that check found a GPU. The reasoning is kept in
``CaptureResult.why``.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from perfguard.capture import nsys as _nsys
from perfguard.capture import torch_profiler as _torch
from perfguard.capture.base import Backend, CaptureResult, RunOptions, command_list
from perfguard.capture.nsys import ExportMode, NsysBackend, usable_nsys
from perfguard.capture.torch_profiler import TorchBackend
from perfguard.capture.xspace_runner import XSpaceBackend
from perfguard.errors import CaptureError

BACKENDS = ("auto", "nsys", "torch", "tf", "jax")
_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


def gpu_present() -> tuple[bool, str]:
    """Whether an NVIDIA GPU looks present, without importing torch or running anything."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        return True, f"nvidia-smi is at {smi}"
    try:
        if any(_DRIVER_GPUS.iterdir()):
            return True, f"the NVIDIA driver lists a GPU in {_DRIVER_GPUS}"
    except OSError:
        pass
    return False, "no NVIDIA GPU found (no nvidia-smi on PATH, no GPU in /proc/driver/nvidia)"


def select_backend(
    name: str = "auto", nsys: str | None = None, *, export_mode: ExportMode = "inline"
) -> Backend:
    """The backend called ``name`` (``auto``, ``nsys`` or ``torch``), checked to be usable here.

    Raises :class:`CaptureError` naming what to install when it is not.
    """
    key = (name or "").strip().lower()
    if key == "nsys":
        return usable_nsys(nsys, export_mode=export_mode, why="the nsys backend was requested")
    if key == "torch":
        ok, reason = _torch.torch_available()
        if not ok:
            raise CaptureError(reason)
        return TorchBackend(why="the torch backend was requested")
    if key in ("tf", "jax"):  # the TensorFlow / JAX profiler around a Python program
        xspace = XSpaceBackend(key, why=f"the {key} backend was requested")
        ok, reason = xspace.available()
        if not ok:
            raise CaptureError(reason)
        return xspace
    if key == "auto":
        return _auto(nsys, export_mode)
    raise CaptureError(f"unknown capture backend {name!r}: choose from {', '.join(BACKENDS)}")


def _auto(nsys: str | None, export_mode: ExportMode) -> Backend:
    found, nsys_how = _nsys.find_nsys(nsys)
    gpu, gpu_how = gpu_present()
    if found is not None and gpu:
        return NsysBackend(
            nsys,
            export_mode=export_mode,
            why=f"auto: nsys found at {nsys_how} and a GPU is present ({gpu_how})",
        )
    no_nsys = f"nsys found at {nsys_how} but {gpu_how}" if found else "nsys not found"
    has_torch, torch_how = _torch.torch_available()
    if not has_torch:
        raise CaptureError(
            f"no capture backend is available: {no_nsys}, and PyTorch is not installed; "
            f"{_nsys.INSTALL_HINT} (nsys needs an NVIDIA GPU), or install PyTorch with "
            "`pip install perfguard[torch]`"
        )
    if gpu and _torch.torch_cuda_available():
        return TorchBackend(
            device="cuda", why=f"auto: {no_nsys}; torch with CUDA (a GPU is present: {gpu_how})"
        )
    if gpu:
        cpu_why = f"a GPU is present ({gpu_how}) but this torch has no CUDA"
    else:
        cpu_why = gpu_how
    return TorchBackend(device="cpu", why=f"auto: {no_nsys}; torch on the CPU ({cpu_why})")


def profile_command(
    command: Sequence[str],
    *,
    backend: str = "auto",
    output_dir: str | Path,
    name: str = "capture",
    delay: float | None = None,
    duration: float | None = None,
    capture_range: str | None = None,
    nsys: str | None = None,
    timeout: float | None = None,
    export_mode: ExportMode = "inline",
    env: Mapping[str, str] | None = None,
    options: RunOptions | None = None,
) -> CaptureResult:
    """Profile ``command`` (an argv list, never a shell string) and return the capture.

    ``result.path`` loads with :func:`perfguard.load_trace`. ``capture_range``
    is ``"cudaProfilerApi"`` or ``"nvtx:NAME"``; it, ``delay`` and ``duration``
    (whole seconds) need nsys; ``options`` carries the torch window's
    (``warmup``, ``iterations``, ``with_stack``, ``fallback_s``, ``key_node``).
    ``timeout`` (seconds, ``None`` = no limit) stops the whole process tree and
    raises. Every failure is a one-line :class:`CaptureError`.
    """
    command = command_list(command)
    if capture_range is not None:
        _nsys.parse_capture_range(capture_range)  # a typo fails before anything runs
    chosen = select_backend(backend, nsys, export_mode=export_mode)
    return chosen.capture(
        command,
        output_dir=output_dir,
        name=name,
        delay=delay,
        duration=duration,
        capture_range=capture_range,
        timeout=timeout,
        env=env,
        options=options,
    )
