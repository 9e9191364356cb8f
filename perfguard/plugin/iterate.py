"""What the ``gpuprofile`` fixture gives a test: :class:`GpuProfile`, the core's loop
(:class:`perfguard.core.loop.Loop`) with what perfguard's child processes add to it: an
A/B pair child's turn before each timed step (:mod:`perfguard.plugin.interleave`), and the
Callgrind child's counted steps (:mod:`perfguard.plugin.valgrind_child`).

``for step in gpuprofile.iterations(): train_step()``: see :mod:`perfguard.core.loop`.
Standard library only: imported whenever the plugin loads.
"""

from __future__ import annotations

from collections.abc import Generator

from perfguard.capture.capturers import Capturer
from perfguard.core.loop import Loop
from perfguard.core.spec import ProfileSpec
from perfguard.plugin.interleave import handoff, in_pair


class GpuProfile(Loop):
    """The ``gpuprofile`` fixture's value: the marker's settings and the iteration loop."""

    def __init__(self, spec: ProfileSpec, capturer: Capturer | None = None) -> None:
        super().__init__(spec, capturer)
        if in_pair():  # made in the side's own thread, which runs its loop
            self.handoff = handoff

    def _plain(self) -> Generator[int, None, None]:
        from perfguard.plugin.valgrind_child import block_name, callgrind_child, counted_steps

        if not callgrind_child():
            yield from super()._plain()
            return
        from perfguard.capture.valgrind import measured, uncounted

        # the session's Callgrind child: only the recorded steps are counted, under the
        # test's node id and heap layout (perfguard.plugin.valgrind_child)
        yield from self._steps(range(-self.spec.warmup, 0))
        with measured(block_name()):
            yield from self._steps(range(counted_steps(self.spec.iterations)), uncounted)
        self.completed = True
