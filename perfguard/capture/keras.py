"""A Keras callback that marks training batches and epochs as NVTX ranges.

What nvtx-plugins-tf's callback offered: ``model.fit(..., callbacks=[NvtxCallback()])``
and the nsys timeline shows each epoch and each batch, so kernels can be
attributed per iteration. Train batches are named ``perfguard.iteration``,
the analysis's explicit iteration marker (the batch number rides in the
NVTX payload, so the message stays one registered string). The ranges go
through :mod:`perfguard.capture.ranges`, so under Keras 3's torch backend
a torch profiler sees them too.

With ``profiler_steps=True`` each train batch is also a TensorFlow profiler
step (``tf.profiler.experimental.Trace("perfguard.iteration", step_num=N,
_r=1)``, N counted across epochs), so a ``tf.profiler`` or TensorBoard
capture of ``model.fit`` has one iteration per batch (the XSpace reader
turns steps into ``ProfilerStep#N``); it needs TensorFlow loaded and is off
by default, since a capturer that marks its own steps around ``fit`` would
then see two sets of steps.

NVTX ranges *inside* a ``tf.function`` graph (per op, as nvtx-plugins-tf's
compiled ``NvtxStart``/``NvtxEnd`` ops did) cannot come from Python: a graph
runs in TensorFlow's C++ executor, and the only Python hook inside it,
``tf.py_function``, serialises the graph and holds the GIL around every op it
wraps. TensorFlow itself emits one NVTX range per op when run with
``TF_ENABLE_NVTX_RANGES=1`` (its CUDA builds, ``tensorflow/core/profiler``
``nvtx_utils``; ``perfguard profile --backend nsys`` sees them), and its own
profiler records every graph op: capture with
:mod:`perfguard.capture.tensorflow` for per-op figures of graphs.

Importable without TensorFlow or Keras: the base class is
``keras.callbacks.Callback`` when Keras imports, else a plain stand-in with
the same hook methods (enough to call them directly, as the tests do).
Importing this module imports Keras when it is installed, so import it
only where a Keras callback is wanted.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from perfguard.capture import ranges as _annotate

#: The analysis's explicit iteration marker (``perfguard.trace.names.ITERATION_NAMES``;
#: not imported from there: capture code stays free of the readers and pandas).
ITERATION_RANGE = "perfguard.iteration"

__all__ = ["LoopCallback", "NvtxCallback"]


def _keras_callback_base() -> type:
    for module in ("keras.callbacks", "tensorflow.keras.callbacks"):
        try:
            return importlib.import_module(module).Callback
        except Exception:  # noqa: BLE001 - absent or broken installs both mean "no Keras"
            continue
    return _CallbackStandIn


class _CallbackStandIn:
    """The hook surface of ``keras.callbacks.Callback``, for use without Keras."""

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict[str, Any] = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None: ...
    def on_train_end(self, logs: dict[str, Any] | None = None) -> None: ...
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None: ...
    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None: ...
    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None: ...
    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None: ...
    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None: ...
    def on_test_end(self, logs: dict[str, Any] | None = None) -> None: ...
    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None: ...
    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None: ...
    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None: ...
    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None: ...
    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None: ...
    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None: ...


_Base: Any = _keras_callback_base()


class NvtxCallback(_Base):
    """NVTX ranges (and torch-profiler mirrors) around Keras phases, epochs and batches.

    Range names: ``keras.train``/``keras.test``/``keras.predict`` around a whole
    ``fit``/``evaluate``/``predict``, ``keras.epoch`` per epoch,
    ``perfguard.iteration`` per train batch, ``keras.test_batch`` and
    ``keras.predict_batch`` per evaluation and prediction batch. Epoch and batch
    numbers are the NVTX payload. ``batches=False`` keeps only phases and epochs
    (per-batch ranges cost a few microseconds each). ``profiler_steps=True``
    also marks train batches as TensorFlow profiler steps (module docstring).
    """

    TRAIN_BATCH = ITERATION_RANGE

    def __init__(
        self,
        *,
        domain: str | None = None,
        color: str | int | None = None,
        batches: bool = True,
        profiler_steps: bool = False,
    ) -> None:
        super().__init__()
        self.domain = domain
        self.color = color
        self.batches = batches
        self.profiler_steps = profiler_steps
        self._steps = 0
        self._step: Any = None
        self._open: dict[str, list[tuple[Any, Any]]] = {}
        self._ranges: dict[tuple[str, int | None], Any] = {}

    def _begin(self, name: str, number: int | None = None) -> None:
        key = (name, number)
        rng = self._ranges.get(key)
        if rng is None:
            rng = _annotate._Range(name, self.color, self.domain, None, number)
            if number is None or len(self._ranges) < 4096:
                self._ranges[key] = rng
        self._open.setdefault(name, []).append((rng, rng.begin()))

    def _end(self, name: str) -> None:
        stack = self._open.get(name)
        if stack:  # an end without a begin (callback added mid-run) is ignored
            rng, token = stack.pop()
            rng.end(token)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._begin("keras.train")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._end("keras.train")

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._begin("keras.epoch", epoch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._end("keras.epoch")

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.batches:
            self._begin(self.TRAIN_BATCH, batch)
        if self.profiler_steps:
            self._begin_step()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
        if self.batches:
            self._end(self.TRAIN_BATCH)

    def _begin_step(self) -> None:
        tf = sys.modules.get("tensorflow")
        if tf is None or self._step is not None:
            return
        self._step = tf.profiler.experimental.Trace(ITERATION_RANGE, step_num=self._steps, _r=1)
        self._step.__enter__()
        self._steps += 1

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._begin("keras.test")

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._end("keras.test")

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.batches:
            self._begin("keras.test_batch", batch)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.batches:
            self._end("keras.test_batch")

    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._begin("keras.predict")

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self._end("keras.predict")

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.batches:
            self._begin("keras.predict_batch", batch)

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.batches:
            self._end("keras.predict_batch")


class LoopCallback(_Base):
    """Drives a ``gpuprofile`` loop from Keras's own batches: ``model.fit`` (or
    ``predict``, ``evaluate``) runs the test's steps, one batch each, and perfguard times
    and profiles them as it does a ``for`` loop's (warm-up, timing rounds, the profiled
    round). Made by ``gpuprofile.keras_callback(phase)``; pass it in ``callbacks=`` with
    ``steps_per_epoch=cb.max_steps`` (``steps=`` for predict and evaluate) over a
    dataset that lasts that long (``.repeat()``): training stops once the loop is done.

    A step is the time from the end of one batch to the end of the next: the batch's
    step function and Keras's work between batches (its callbacks, the input
    pipeline's next element), as a user's step is.
    """

    PHASES = ("fit", "predict", "evaluate")

    def __init__(self, loop: Any, phase: str = "fit", max_steps: int = 0) -> None:
        super().__init__()
        if phase not in self.PHASES:
            raise ValueError(f"phase {phase!r} is not one of {', '.join(self.PHASES)}")
        self.phase = phase
        self.loop = loop
        self.max_steps = max_steps
        self._it: Any = None
        self.done = False
        self.batches = 0

    def _first(self) -> None:
        if self._it is None:
            self._it = iter(self.loop)
            next(self._it)  # into the first (warm-up) step: this batch is it

    def _next(self) -> None:
        self.batches += 1
        try:
            next(self._it)
        except StopIteration:
            self.done = True
            if self.model is not None:  # Keras 3 stops each phase at its own flag
                flag = {"fit": "stop_training", "predict": "stop_predicting"}
                setattr(self.model, flag.get(self.phase, "stop_evaluating"), True)

    def _check(self) -> None:
        if not self.done:
            raise RuntimeError(
                f"gpuprofile.keras_callback({self.phase!r}): Keras ran {self.batches} "
                f"batch(es) but the loop needs up to {self.max_steps}: give "
                f"{'steps_per_epoch' if self.phase == 'fit' else 'steps'}=callback.max_steps "
                "and a dataset that lasts (.repeat())"
            )

    # each Keras phase's hooks: only the phase this callback drives moves the loop
    def _batch_begin(self, phase: str) -> None:
        if self.phase == phase and not self.done:
            self._first()

    def _batch_end(self, phase: str) -> None:
        if self.phase == phase and not self.done:
            self._next()

    def _phase_end(self, phase: str) -> None:
        if self.phase == phase:
            self._check()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin("fit")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end("fit")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._phase_end("fit")

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin("predict")

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end("predict")

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self._phase_end("predict")

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin("evaluate")

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end("evaluate")

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._phase_end("evaluate")
