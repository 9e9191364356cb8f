"""Which framework's profiler captures a test, and the capturer for it.

:func:`make_capturer` is the one place the plugin (and ``perfguard
profile``) asks for a capturer: ``"torch"`` (the PyTorch profiler),
``"tf"`` (:mod:`perfguard.capture.tensorflow`, also for Keras on its
TensorFlow backend) or ``"jax"`` (:mod:`perfguard.capture.jax`).
:func:`framework_for` picks one for a test: the ``gpuprofile`` marker's
``framework=`` argument when given, else what the test's module imported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

FRAMEWORKS = ("torch", "tf", "jax")
#: spellings accepted for each framework (marker argument, CLI option)
ALIASES = {
    "torch": "torch", "pytorch": "torch",
    "tf": "tf", "tensorflow": "tf", "keras": "tf",
    "jax": "jax", "flax": "jax",
}  # fmt: skip
#: top-level module -> framework, for modules a test imported
_MODULE_FRAMEWORK = {"torch": "torch", "tensorflow": "tf", "jax": "jax", "flax": "jax",
                     "optax": "jax"}  # fmt: skip
#: Keras 3 backend name -> framework
_KERAS_BACKEND = {"tensorflow": "tf", "jax": "jax", "torch": "torch"}


def normalise(framework: str) -> str:
    """``framework`` as one of :data:`FRAMEWORKS`; ValueError (one line) otherwise."""
    key = str(framework).strip().lower()
    if key not in ALIASES:
        raise ValueError(
            f"unknown framework {framework!r}: expected one of {', '.join(sorted(ALIASES))}"
        )
    return ALIASES[key]


def make_capturer(framework: str, path: Path, device: str = "cpu") -> Any:
    """A capturer (the plugin's ``Capturer`` protocol) for ``framework`` writing ``path``.

    TensorFlow and JAX write ``path`` as ``*.xplane.pb`` (the suffix is added
    when missing; the capturer's ``path`` attribute is the file to load).
    """
    fw = normalise(framework)
    if fw == "tf":
        from perfguard.capture.tensorflow import TensorFlowCapturer

        return TensorFlowCapturer(Path(path), device)
    if fw == "jax":
        from perfguard.capture.jax import JaxCapturer

        return JaxCapturer(Path(path), device)
    from perfguard.capture.capturers import TorchCapturer

    return TorchCapturer(Path(path), device)


def framework_for(module: ModuleType | None, requested: str | None = None) -> str:
    """The framework that captures a test: ``requested`` (the marker's ``framework=``), else
    the one the test's ``module`` imported; ``"torch"`` when it imported none.

    A module that imported several (say torch for data and JAX for the model)
    must say which: ValueError, naming them.
    """
    if requested:
        return normalise(requested)
    found = set()
    for value in vars(module).values() if module is not None else ():
        fw = _framework_of(value)
        if fw:
            found.add(fw)
    if len(found) > 1:
        name = getattr(module, "__name__", "the test module")
        raise ValueError(
            f"{name} imports {' and '.join(sorted(found))}: say which one to profile with "
            f"@pytest.mark.gpuprofile(framework=...)"
        )
    return found.pop() if found else "torch"


def _framework_of(value: Any) -> str | None:
    mod = value if isinstance(value, ModuleType) else None
    name = mod.__name__ if mod else getattr(value, "__module__", None)
    if not isinstance(name, str):
        return None
    root = name.split(".", 1)[0]
    if root == "keras" or name.startswith("tensorflow.keras"):
        return _keras_framework()
    return _MODULE_FRAMEWORK.get(root)


def _keras_framework() -> str:
    """Keras 3 runs on TensorFlow, JAX or torch: the backend decides the profiler."""
    keras = sys.modules.get("keras")
    try:
        backend = keras.backend.backend() if keras is not None else "tensorflow"
    except Exception:  # noqa: BLE001 - Keras 2 / tf.keras: TensorFlow
        backend = "tensorflow"
    return _KERAS_BACKEND.get(backend, "tf")
