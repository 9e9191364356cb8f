"""One test measured without pytest: a step run under a spec with a capturer, to a record.

``measure(spec, capturer, step)`` is what the plugin does for a ``gpuprofile`` test, with
the step a plain callable instead of the body of ``for step in gpuprofile.iterations()``:
the core's loop (:class:`~perfguard.core.loop.Loop`), then :func:`~perfguard.core.record.
loop_result` and :func:`~perfguard.core.record.analyse`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from perfguard.baseline.record import TestRecord
from perfguard.capture.capturers import Capturer
from perfguard.core.loop import Loop
from perfguard.core.record import TestCapture, analyse, loop_result, timing_record
from perfguard.core.spec import ProfileSpec
from perfguard.errors import PerfguardError


def measure(
    spec: ProfileSpec,
    capturer: Capturer,
    step: Callable[[], object],
    *,
    nodeid: str = "measured",
    backend: str = "cpu",
    scope: Iterable[object] = (),
) -> TestRecord:
    """The record of ``step`` run under ``spec`` (warm-up, timed rounds, the profiled round)
    with ``capturer``, whose ``path`` is the capture it writes. ``scope``: what the step
    uses (its models, optimizers), from which the framework and the model's facts are
    read. :class:`PerfguardError` when nothing could be measured."""
    loop = Loop(spec, capturer)
    for _ in loop.iterations(scope=list(scope)):
        step()
    path = Path(getattr(capturer, "path", "") or ".")
    capture = loop_result(loop, spec, TestCapture(path, backend))
    if capture.error:
        raise PerfguardError(f"{nodeid}: {capture.error}")
    if capture.timing_only:
        return timing_record(spec, capture, nodeid)
    return analyse(spec, capture, nodeid).record
