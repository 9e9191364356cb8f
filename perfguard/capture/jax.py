"""Capture with the JAX profiler (``jax.profiler.start_trace``) around recorded steps.

The profiler records the XLA HLO ops of jitted computations (on a GPU with
their kernels and correlation ids); each recorded iteration is
``jax.profiler.StepTraceAnnotation("perfguard.iteration", step_num=N)``.
JAX dispatches asynchronously and has no device-wide barrier, so ``sync``
waits for every live array (``jax.block_until_ready(jax.live_arrays())``):
the step's work then ends inside its iteration. Imports JAX when a capture
starts.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import Any

from perfguard.capture.xspace_capture import ITERATION_RANGE, XSpaceCapturer


class JaxCapturer(XSpaceCapturer):
    """``jax.profiler.start_trace/stop_trace`` around the recorded iterations."""

    framework = "JAX"

    def _start(self, logdir: str) -> None:
        import jax  # an optional framework: loaded only when a JAX test is captured

        jax.profiler.start_trace(logdir)

    def _stop(self) -> None:
        import jax  # an optional framework: loaded only when a JAX test is captured

        jax.profiler.stop_trace()

    def _step(self, number: int) -> AbstractContextManager[Any]:
        import jax  # an optional framework: loaded only when a JAX test is captured

        return jax.profiler.StepTraceAnnotation(ITERATION_RANGE, step_num=number)

    def _sync(self) -> None:
        jax = sys.modules.get("jax")
        if jax is not None:
            jax.block_until_ready(jax.live_arrays())
