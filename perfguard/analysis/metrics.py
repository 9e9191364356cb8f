"""Every figure perfguard reports, defined once (docs/design.md "Metrics", the table).

The pipeline (ops, op types, iterations, the run summary, ranks) aggregates
sums and then calls these definitions; the tests pin each one against an
independent computation on real captures. They take numpy arrays, pandas
Series or scalars and use only arithmetic, so one definition serves a run,
an op, an iteration or a rank. A share whose whole is 0 (no time, no peak)
is NaN: the capture cannot tell, and no figure is guessed.

Times are in ns. Which activities count, which ops are Tensor Core eligible
and how many FLOPs an op does are definitions of their own:
:mod:`perfguard.analysis.tensor_cores` and :mod:`perfguard.analysis.flops`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

#: a figure per row (a numpy array or a pandas Series) or one scalar: the definitions use
#: only arithmetic, so each returns the kind it is given
Figure = Any


def _positive(whole: Figure) -> Figure:
    """``whole`` with values <= 0 (and missing ones) as NaN/NA: a share of nothing."""
    if isinstance(whole, pd.Series):
        return whole.where(whole > 0)
    if isinstance(whole, np.ndarray):
        return np.where(whole > 0, whole, np.nan)
    return whole if whole > 0 else float("nan")


def percent(part: Figure, whole: Figure) -> Figure:
    """``100 x part / whole``, NaN where ``whole <= 0``."""
    return 100.0 * part / _positive(whole)


def gpu_time(activities: pd.DataFrame) -> np.ndarray:
    """GPU time of each activity (kernel or memory operation): end - start, in ns.

    An op's, iteration's or run's GPU time is the sum over its activities
    (accumulated: overlapping activities count each)."""
    return (activities["end"] - activities["start"]).to_numpy()


def cpu_time(start: np.ndarray, end: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """CPU time of an op range: its duration (0 for unassociated GPU work; ``out``: write
    into it, for tables of millions of ranges)."""
    return np.subtract(end, start, out=out)


def cpu_overhead(cpu: np.ndarray, api: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """CPU overhead: CPU time minus the CUDA API time that starts inside the range on its
    thread, clipped at 0 (``out``: write into it, for tables of millions of ranges)."""
    result = np.subtract(cpu, api, out=out)
    return np.clip(result, 0, None, out=result)


def gpu_idle(capacity: Figure, busy: Figure) -> Figure:
    """GPU idle time: the time the GPU could have worked minus its flattened busy time
    (an op: the span of its activities; a rank: wall time x GPUs used), clipped at 0."""
    idle = capacity - busy
    if isinstance(idle, pd.Series):
        return idle.clip(lower=0)
    return np.maximum(idle, 0)


def gpu_utilization(busy: Figure, capacity: Figure) -> Figure:
    """GPU utilization in %: flattened busy time over wall time x GPUs used."""
    return percent(busy, capacity)


def tc_utilization(tc_kernel_time: Figure, eligible_kernel_time: Figure) -> Figure:
    """Tensor Core utilization in % (DLProf): kernel time on Tensor Cores over the
    kernel time of the TC-eligible ops (unknown kernels count in the whole only, so the
    figure is a lower bound); NaN without eligible kernel time."""
    return percent(tc_kernel_time, eligible_kernel_time)


def gpu_seconds(gpu_time_ns: Figure) -> Figure:
    """GPU time in seconds, the denominator of the rates."""
    return gpu_time_ns * 1e-9


def achieved_tflops(flops: Figure, seconds: Figure) -> Figure:
    """Achieved TFLOP/s: FLOPs over the GPU seconds they took (NaN for no time)."""
    return flops / _positive(seconds) * 1e-12


def achieved_bandwidth(nbytes: Figure, seconds: Figure) -> Figure:
    """Achieved bytes/s: bytes moved over the GPU seconds they took (NaN for no time)."""
    return nbytes / _positive(seconds)


def flop_efficiency(flops: Figure, peak_flops_x_seconds: Figure) -> Figure:
    """FLOP efficiency in %: FLOPs over what the GPU's peak could do in the same time
    (sum of seconds x peak FLOP/s; FLOPs / seconds / peak for one GPU and path)."""
    return percent(flops, peak_flops_x_seconds)
