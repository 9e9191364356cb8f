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

from contextlib import AbstractContextManager
from typing import Any

from perfguard.capture.xspace_capture import ITERATION_RANGE, XSpaceCapturer


class TensorFlowCapturer(XSpaceCapturer):
    """``tf.profiler.experimental.start/stop`` around the recorded iterations."""

    framework = "TensorFlow"

    def _start(self, logdir: str) -> None:
        import tensorflow as tf

        # the Python tracer records every Python call: far more events than ops, and slower
        options = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=2, python_tracer_level=0, device_tracer_level=1
        )
        tf.profiler.experimental.start(logdir, options=options)

    def _stop(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()

    def _step(self, number: int) -> AbstractContextManager[Any]:
        import tensorflow as tf

        return tf.profiler.experimental.Trace(ITERATION_RANGE, step_num=number, _r=1)

    def _sync(self) -> None:
        import sys

        tf = sys.modules.get("tensorflow")
        if tf is not None:  # never import TensorFlow just to wait for nothing
            tf.test.experimental.sync_devices()
