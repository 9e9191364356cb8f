"""What a test asked to be measured with: the marker's checked arguments, with the
session's options filled in where the marker left them.

Standard library only: the plugin's marker and loop import it whenever pytest starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfguard.compare.tolerance import TOLERANCE

#: the host instructions, counted under Callgrind beside a timing, never instead of one
INSTRUCTIONS = "instructions"


@dataclass(frozen=True)
class ProfileSpec:
    """A marker's checked arguments; ``tolerance`` None leaves it to the session's option
    (``session_tolerance``, which the plugin fills in: :attr:`judged_tolerance`)."""

    iterations: int = 30
    warmup: int = 5
    rounds: int = 5  # the session's --perfguard-rounds wins over the default, not a marker's
    rounds_given: bool = False
    gates: dict[str, Any] | None = None
    framework: str | None = None  # torch | tf | jax; None: what the test's module imported
    tolerance: float | None = None
    metrics: tuple[str, ...] = ("gpu_time",)
    key_node: str | None = None
    backend: str | None = None
    marked: bool = True
    #: the session's ``--perfguard-tolerance`` (not the marker's: never in :meth:`to_dict`)
    session_tolerance: float = TOLERANCE

    @property
    def judged_tolerance(self) -> float:
        """The test's tolerance, resolved once: the marker's, else the session's. The record
        carries it (``meta["tolerance"]``) and every later verdict reads it from there."""
        return self.session_tolerance if self.tolerance is None else self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return {
            "iterations": self.iterations,
            "warmup": self.warmup,
            "rounds": self.rounds,
            "gates": self.gates,
            "framework": self.framework,
            "tolerance": self.tolerance,
            "metrics": list(self.metrics),
            "key_node": self.key_node,
            "backend": self.backend,
        }
