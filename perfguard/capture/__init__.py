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

Nothing here imports torch at import time.
"""

# Do not import perfguard.capture.torch_runner here: it runs as `python -m`,
# and importing it with the package would make runpy warn.
# framework instrumentation; the Keras callback (keras.py) is imported where wanted,
# since importing it imports Keras when that is installed
from perfguard.capture.annotate import (
    annotate,
    annotate_function,
    name_thread,
    unannotate_function,
)
from perfguard.capture.base import Backend, CaptureResult
from perfguard.capture.instrument import Instrumentation, encode_message, instrument, kineto_dtype
from perfguard.capture.nsys import (
    NsysBackend,
    find_nsys,
    nsys_export_argv,
    nsys_profile_argv,
    parse_capture_range,
)
from perfguard.capture.select import BACKENDS, gpu_present, profile_command, select_backend
from perfguard.capture.torch_profiler import (
    TorchBackend,
    TorchProfile,
    profile_torch,
    torch_available,
)
from perfguard.errors import CaptureError

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
