"""What the real-framework capture tests share: run a step under a capturer, read it back.

The loop is the plugin's own (:class:`perfguard.plugin.iterate.GpuProfile`,
what ``for _ in gpuprofile.iterations()`` runs) with the capturer from
:func:`perfguard.capture.frameworks.make_capturer`: wiring a framework into
the plugin is choosing that capturer for a test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from perfguard import load_trace
from perfguard.analysis import Analysis, analyze
from perfguard.baseline.record import record_from_analysis
from perfguard.capture.frameworks import make_capturer
from perfguard.compare import compare_records
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import ProfileSpec


def capture_steps(
    framework: str, path: Path, step: Callable[[], object], *, iterations: int = 4, warmup: int = 1
) -> tuple[Analysis, GpuProfile]:
    """``step`` run as a marked test's loop under ``framework``'s capturer, analysed."""
    cap = make_capturer(framework, path, "cpu")
    gp = GpuProfile(ProfileSpec(iterations=iterations, warmup=warmup, rounds=1), cap)
    for _ in gp.iterations():
        step()
    assert cap.error is None, cap.error
    # on the CPU one timing round runs with the profiler off, then the profiled round
    assert gp.completed and gp.profiled == [False] * iterations + [True] * iterations
    return analyze(load_trace(cap.path)), gp


def calls_per_iteration(a: Analysis, op_type: str) -> pd.Series:
    """Instances of ops of ``op_type`` per iteration (every recorded iteration listed)."""
    inst = a.instances[a.instances["op_type"] == op_type]
    per = inst.groupby("iteration").size()
    return per.reindex(a.iterations["iteration"], fill_value=0)


def compare(base: tuple[Analysis, GpuProfile], head: tuple[Analysis, GpuProfile]) -> pd.DataFrame:
    """The verdict's per-op table for ``head`` against ``base`` (what a PR would be shown)."""
    records = [
        record_from_analysis(
            "test_step",
            a,
            wall_times_ns=np.asarray(gp.wall_times_ns),
            cpu_times_ns=np.asarray(gp.cpu_times_ns),
            rounds=np.asarray(gp.round_of),
            profiled=np.asarray(gp.profiled),
        )
        for a, gp in (base, head)
    ]
    return compare_records(records[1], records[0], tolerance=0.05).ops
