"""The ``gpuprofile`` marker: its documented signature and the check of its arguments,
which make a :class:`~perfguard.core.spec.ProfileSpec`.

``@pytest.mark.gpuprofile(iterations=30, warmup=5, tolerance="5%",
metrics=("gpu_time",), key_node=None, backend=None)``. Arguments are
keyword-only; anything else is a one-line error naming the test, reported
when the test is set up (the rest of the session runs).

Standard library and pytest only: imported whenever the plugin loads.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguard.compare.tolerance import parse_tolerance
from perfguard.core.spec import INSTRUCTIONS, ProfileSpec
from perfguard.plugin.options import BACKEND_CHOICES

__all__ = ["MARKER", "MARKER_HELP", "METRIC_NAMES", "ProfileSpec", "parse_marker"]

MARKER = "gpuprofile"
#: the metric names a marker may ask for: the timings (keys of
#: perfguard.baseline.record.METRICS), and the host instructions counted under Callgrind
#: (perfguard.plugin.valgrind_child), gated beside them
METRIC_NAMES = ("gpu_time", "wall_time", "cpu_time", INSTRUCTIONS)
MARKER_HELP = (
    "gpuprofile(iterations=30, warmup=5, rounds=5, tolerance='5%', metrics=('gpu_time',), "
    "gates=None, framework=None, key_node=None, backend=None): profile this benchmark test "
    "with perfguard "
    "(pytest --perfguard): `warmup` unrecorded steps, then `rounds` rounds of `iterations` "
    "recorded steps of `for step in gpuprofile.iterations(): ...`, compared with the "
    "baseline: a slowdown beyond both `tolerance` and the noise between runs fails the "
    "test, and so does a deterministic counter (calls, launches, FLOPs, syncs, copies, "
    "Tensor Cores, dtypes, peak memory) beyond its budget in `gates`."
)


def _count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def parse_marker(mark: pytest.Mark | None) -> ProfileSpec:
    """The :class:`ProfileSpec` of ``mark`` (defaults when None). Raises ValueError."""
    if mark is None:
        return ProfileSpec(marked=False)
    if mark.args:
        raise ValueError(
            f"takes keyword arguments only (iterations=, warmup=, ...), got {mark.args!r}"
        )
    known = {
        "iterations",
        "warmup",
        "rounds",
        "tolerance",
        "metrics",
        "key_node",
        "backend",
        "gates",
        "framework",
    }
    unknown = sorted(set(mark.kwargs) - known)
    if unknown:
        names, allowed = ", ".join(unknown), ", ".join(sorted(known))
        raise ValueError(f"unknown argument(s) {names}; known: {allowed}")
    kw = mark.kwargs
    iterations = _count(kw.get("iterations", 30), "iterations", 1)
    warmup = _count(kw.get("warmup", 5), "warmup", 0)
    rounds = _count(kw.get("rounds", 5), "rounds", 1)
    gates = kw.get("gates")
    if gates is not None:
        if not isinstance(gates, dict):
            raise ValueError(f"gates must be a dict such as {{'syncs': 0}}, got {gates!r}")
        from perfguard.compare.gates import parse_gates

        parse_gates(gates)  # a bad key or budget is the marker's error, at set-up
    tolerance = None
    if "tolerance" in kw:
        tolerance = parse_tolerance(kw["tolerance"], "tolerance")
    metrics_arg = kw.get("metrics", ("gpu_time",))
    if isinstance(metrics_arg, str):
        metrics_arg = (metrics_arg,)
    if not isinstance(metrics_arg, (tuple, list)) or not metrics_arg:
        raise ValueError(
            f"metrics must be a non-empty tuple of {METRIC_NAMES}, got {metrics_arg!r}"
        )
    bad = [m for m in metrics_arg if m not in METRIC_NAMES]
    if bad:
        raise ValueError(f"unknown metric(s) {bad!r}: choose from {', '.join(METRIC_NAMES)}")
    key_node = kw.get("key_node")
    if key_node is not None and (not isinstance(key_node, str) or not key_node.strip()):
        raise ValueError(f"key_node must be a range name (a non-empty string), got {key_node!r}")
    framework = kw.get("framework")
    if framework is not None:
        from perfguard.capture.frameworks import normalise

        framework = normalise(framework)  # ValueError names the accepted spellings
    backend = kw.get("backend")
    if backend is not None:
        if not isinstance(backend, str) or backend.strip().lower() not in BACKEND_CHOICES:
            choices = ", ".join(BACKEND_CHOICES)
            raise ValueError(f"backend must be one of {choices}, got {backend!r}")
        backend = backend.strip().lower()
    return ProfileSpec(
        iterations=iterations,
        warmup=warmup,
        rounds=rounds,
        rounds_given="rounds" in kw,
        gates=dict(gates) if gates is not None else None,
        framework=framework,
        tolerance=tolerance,
        metrics=tuple(metrics_arg),
        key_node=key_node,
        backend=backend,
    )
