"""Capture: produce a raw capture that :func:`perfguard.load_trace` reads.

This layer knows the outside tools (nsys, the PyTorch profiler) and nothing
of perfguard's analysis or reports (``DESIGN.md``). The entry point is
:func:`profile_command`; every backend implements :class:`Backend`.

* ``nsys`` (:mod:`perfguard.capture.nsys`): any command under ``nsys profile``,
  exported to SQLite. Its argv is documented there as the contract.
* ``torch`` (:mod:`perfguard.capture.torch_profiler`): the PyTorch profiler,
  in-process (:func:`profile_torch`) or around a Python program
  (``python -m perfguard.capture.torch_runner``), giving Kineto JSON.
* ``auto`` (:mod:`perfguard.capture.select`): nsys with a GPU, else torch.

Nothing here imports torch at import time, and the package itself imports nothing: names
load on first use (PEP 562), so the pytest plugin reads its child-process constants
(:mod:`perfguard.capture.capturers`) without numpy or pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfguard.capture.base import Backend, CaptureResult
    from perfguard.capture.instrument import (
        Instrumentation,
        encode_message,
        instrument,
        kineto_dtype,
    )
    from perfguard.capture.nsys import (
        NsysBackend,
        find_nsys,
        nsys_export_argv,
        nsys_profile_argv,
        parse_capture_range,
    )
    from perfguard.capture.ranges import (
        annotate,
        annotate_function,
        name_thread,
        unannotate_function,
    )
    from perfguard.capture.select import BACKENDS, gpu_present, profile_command, select_backend
    from perfguard.capture.torch_profiler import (
        TorchBackend,
        TorchProfile,
        profile_torch,
        torch_available,
    )
    from perfguard.errors import CaptureError

#: where each name lives
_HOME = {
    "BACKENDS": "perfguard.capture.select",
    "Backend": "perfguard.capture.base",
    "CaptureError": "perfguard.errors",
    "CaptureResult": "perfguard.capture.base",
    "NsysBackend": "perfguard.capture.nsys",
    "TorchBackend": "perfguard.capture.torch_profiler",
    "TorchProfile": "perfguard.capture.torch_profiler",
    "find_nsys": "perfguard.capture.nsys",
    "gpu_present": "perfguard.capture.select",
    "nsys_export_argv": "perfguard.capture.nsys",
    "nsys_profile_argv": "perfguard.capture.nsys",
    "parse_capture_range": "perfguard.capture.nsys",
    "profile_command": "perfguard.capture.select",
    "profile_torch": "perfguard.capture.torch_profiler",
    "select_backend": "perfguard.capture.select",
    "torch_available": "perfguard.capture.torch_profiler",
    "Instrumentation": "perfguard.capture.instrument",
    "annotate": "perfguard.capture.ranges",
    "annotate_function": "perfguard.capture.ranges",
    "encode_message": "perfguard.capture.instrument",
    "instrument": "perfguard.capture.instrument",
    "kineto_dtype": "perfguard.capture.instrument",
    "name_thread": "perfguard.capture.ranges",
    "unannotate_function": "perfguard.capture.ranges",
}

__all__ = [
    "BACKENDS",
    "Backend",
    "CaptureError",
    "CaptureResult",
    "NsysBackend",
    "TorchBackend",
    "TorchProfile",
    "find_nsys",
    "gpu_present",
    "nsys_export_argv",
    "nsys_profile_argv",
    "parse_capture_range",
    "profile_command",
    "profile_torch",
    "select_backend",
    "torch_available",
    "Instrumentation",
    "annotate",
    "annotate_function",
    "encode_message",
    "instrument",
    "kineto_dtype",
    "name_thread",
    "unannotate_function",
]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'perfguard.capture' has no attribute {name!r}")
