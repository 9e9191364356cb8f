"""Capture with the TensorFlow profiler (``tf.profiler.experimental``) around recorded steps.

For custom training loops and ``model.fit`` alike: the profiler records
TensorFlow ops (eager and inside ``tf.function`` graphs), and on a GPU the
CUPTI kernels with their correlation ids; each recorded iteration is
``tf.profiler.experimental.Trace("perfguard.iteration", step_num=N, _r=1)``,
the annotation TensorFlow's own step tracking uses. ``device`` is only
reported: TensorFlow profiles every device it uses. Imports TensorFlow when
a capture starts.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from perfguard.capture.xspace_capture import ITERATION_RANGE, XSpaceCapturer


class TensorFlowCapturer(XSpaceCapturer):
    """``tf.profiler.experimental.start/stop`` around the recorded iterations."""

    framework = "TensorFlow"

    def __init__(self, path: Path, device: str = "cpu") -> None:
        super().__init__(path, device)
        self._gpus: bool | None = None

    def _start(self, logdir: str) -> None:
        import tensorflow as tf

        # TensorFlow's defaults: host ops, no Python tracer (far more events than ops, and
        # slower), device tracer on (CUPTI where there is a GPU)
        tf.profiler.experimental.start(logdir)

    def _stop(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()

    def _step(self, number: int) -> AbstractContextManager[Any]:
        import tensorflow as tf

        return tf.profiler.experimental.Trace(ITERATION_RANGE, step_num=number, _r=1)

    def _sync(self) -> None:
        # eager CPU ops finish before they return: only GPUs have queued work to wait for
        # (a sync is also an op, SyncDevice, that would show in every iteration)
        if self._gpus is None:
            tf = sys.modules.get("tensorflow")
            self._gpus = bool(tf is not None and tf.config.list_logical_devices("GPU"))
        if self._gpus:
            sys.modules["tensorflow"].test.experimental.sync_devices()
