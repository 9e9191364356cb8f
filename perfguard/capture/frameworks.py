"""Which framework's profiler captures a test, and the capturer for it.

:func:`make_capturer` is the one place the plugin (and ``perfguard
profile``) asks for a capturer: ``"torch"`` (the PyTorch profiler),
``"tf"`` (:mod:`perfguard.capture.tensorflow`, also for Keras on its
TensorFlow backend) or ``"jax"`` (:mod:`perfguard.capture.jax`).
:func:`framework_for` picks one for a test: the ``gpuprofile`` marker's
``framework=`` argument when given, else what the test's module imported.

The plugin decides when the test's loop starts (:class:`DeferredCapturer`), not when
its module is imported: ``tf = pytest.importorskip("tensorflow")`` or ``import jax``
inside the test leaves nothing in the module, so the loop's caller's local names
count too, and then what the process has imported by then. A capture that saw no
op at all is never judged silently: :func:`empty_capture_reason` says what was
likely missed (another framework ran, or the test is pure Python).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import Any

from perfguard.capture.capturers import TorchCapturer
from perfguard.capture.jax import JaxCapturer
from perfguard.capture.tensorflow import TensorFlowCapturer

FRAMEWORKS = ("torch", "tf", "jax")
#: spellings accepted for each framework (marker argument, CLI option)
ALIASES = {
    "torch": "torch",
    "pytorch": "torch",
    "tf": "tf",
    "tensorflow": "tf",
    "keras": "tf",
    "jax": "jax",
    "flax": "jax",
}
#: top-level module -> framework, for modules a test imported
_MODULE_FRAMEWORK = {
    "torch": "torch",
    "tensorflow": "tf",
    "jax": "jax",
    "flax": "jax",
    "optax": "jax",
}
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
        return TensorFlowCapturer(Path(path), device)
    if fw == "jax":
        return JaxCapturer(Path(path), device)
    return TorchCapturer(Path(path), device)


def framework_for(
    module: ModuleType | None,
    requested: str | None = None,
    local_values: Iterable[Any] = (),
    *,
    loaded: bool = False,
) -> str:
    """The framework that captures a test: ``requested`` (the marker's ``framework=``), else
    the one the test's ``module`` imported or its loop's caller holds (``local_values``:
    ``tf = pytest.importorskip("tensorflow")``); with ``loaded``, else the one framework
    the process has imported by now; ``"torch"`` otherwise.

    A test that names several (say torch for data and JAX for the model) must say
    which: ValueError, naming them.
    """
    if requested:
        return normalise(requested)
    found = set()
    values = [*(vars(module).values() if module is not None else ()), *local_values]
    for value in values:
        fw = _framework_of(value)
        if fw:
            found.add(fw)
    if len(found) > 1:
        name = getattr(module, "__name__", "the test module")
        raise ValueError(
            f"{name} uses {' and '.join(sorted(found))}: say which one to profile with "
            f"@pytest.mark.gpuprofile(framework=...)"
        )
    if not found and loaded:
        found = set(loaded_frameworks())
        if len(found) > 1:
            return "torch"  # the default; an empty capture then names the others
    return found.pop() if found else "torch"


#: what a reason calls each framework
LABELS = {"torch": "PyTorch", "tf": "TensorFlow", "jax": "JAX"}
#: top-level module whose presence in ``sys.modules`` means the framework is loaded
_LOADED = {"torch": "torch", "tf": "tensorflow", "jax": "jax"}


def loaded_frameworks() -> list[str]:
    """The frameworks this process has imported, in :data:`FRAMEWORKS` order."""
    return [fw for fw in FRAMEWORKS if _LOADED[fw] in sys.modules]


def empty_capture_reason(framework: str | None) -> str:
    """Why a capture by ``framework``'s profiler may hold no op, in one line naming the fix
    (``None``: not a framework's profiler, e.g. nsys: no op range at all)."""
    if framework is None:
        return (
            "captured no ops: the capture holds no op range in its recorded iterations "
            "(no NVTX or framework ranges): nothing to attribute or gate"
        )
    fw = normalise(framework)
    label = LABELS[fw]
    others = [f for f in loaded_frameworks() if f != fw]
    if others:
        names = " and ".join(LABELS[o] for o in others)
        return (
            f"captured no ops: the {label} profiler saw no {label} op in the recorded "
            f"iterations, and {names} is loaded: if the test runs it, say so with "
            f'@pytest.mark.gpuprofile(framework="{others[0]}")'
        )
    return (
        f"captured no ops: the test ran no {label} op in its recorded iterations "
        "(pure Python?): nothing to attribute, gate or judge"
    )


class DeferredCapturer:
    """A test's capturer whose framework is decided when its loop starts
    (:meth:`decide`, from the loop's caller), not when the fixture is set up.

    ``where`` is the capture's path without a suffix; the torch capturer adds
    ``torch_suffix``, the XSpace ones ``.xplane.pb``. Until decided it delegates
    nothing; :meth:`decide` is idempotent.
    """

    def __init__(
        self,
        requested: str | None,
        module: ModuleType | None,
        where: Path,
        device: str,
        torch_suffix: str,
    ) -> None:
        self.requested = requested
        self.module = module
        self.where = Path(where)
        self.device = device
        self.torch_suffix = torch_suffix
        self.framework: str | None = None
        self.inner: Any = None

    def decide(self, local_values: Iterable[Any] = ()) -> str:
        """Pick the framework (:func:`framework_for`, what is loaded by now included) and
        make its capturer; ValueError (one line) when the test names several."""
        if self.inner is None:
            fw = framework_for(self.module, self.requested, local_values, loaded=True)
            where = self.where
            if fw == "torch":
                where = where.with_name(where.name + self.torch_suffix)
            self.framework = fw
            self.inner = make_capturer(fw, where, self.device)
        return str(self.framework)

    @property
    def path(self) -> Path:
        return Path(getattr(self._decided(), "path", self.where))

    @property
    def error(self) -> str | None:
        return None if self.inner is None else self.inner.error

    @property
    def separate_timing(self) -> bool:
        return bool(getattr(self._decided(), "separate_timing", False))

    @property
    def site_pass(self) -> Any:
        """The framework capturer's call-site pass (torch's), else None."""
        return getattr(self._decided(), "site_pass", None)

    @property
    def site_run(self) -> Any:
        return getattr(self.inner, "site_run", None)

    def _decided(self) -> Any:
        if self.inner is None:
            self.decide()
        return self.inner

    def start(self) -> None:
        self._decided().start()

    def stop(self) -> None:
        if self.inner is not None:
            self.inner.stop()

    def sync(self) -> None:
        self._decided().sync()

    def iteration(self) -> AbstractContextManager[object]:
        return self._decided().iteration()


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
