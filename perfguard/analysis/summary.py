"""Run-level and per-iteration figures (summary and iteration reports).

GPU utilization is flattened busy time (union of kernel and memop intervals
on one device) over wall time, averaged over the GPUs that ran any work in
the window. DESIGN.md says "visible GPUs"; idle GPUs that the process could
see but never used (4 visible A100s, work on one) would turn a saturated GPU
into "25 %", so only GPUs with activity count, and their number is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import cast

import numpy as np
import pandas as pd

from perfguard.analysis.cpu_only import CpuOnly
from perfguard.analysis.intervals import covered_within, union_length
from perfguard.analysis.iterations import rank_spans
from perfguard.analysis.metrics import gpu_time, gpu_utilization, tc_utilization
from perfguard.arrays import factorize, unique_first, unique_sorted
from perfguard.trace.model import Trace


def _busy(acts: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Flattened busy time per group of ``keys``."""
    if acts.empty:
        return pd.Series(dtype=np.int64)
    codes = _first_seen_codes(acts[keys])
    if codes is None:
        codes, uniq = pd.factorize(pd.MultiIndex.from_frame(acts[keys]))
    else:  # the distinct key rows, in order of first appearance (as factorize numbers them)
        first = unique_first(codes)[1]
        uniq = pd.MultiIndex.from_frame(acts[keys].iloc[first])
    u = union_length(acts["start"].to_numpy(), acts["end"].to_numpy(), codes)
    return pd.Series(u.to_numpy(), index=uniq[u.index.to_numpy()])


def _first_seen_codes(keys: pd.DataFrame) -> np.ndarray | None:
    """Codes of the key rows numbered in order of first appearance, for plain integer
    columns (None otherwise): per-column codes packed into one int64."""
    combined: np.ndarray | None = None
    for col in keys.columns:
        values = keys[col]
        if not (isinstance(values.dtype, np.dtype) and values.dtype.kind in "iu"):
            return None
        codes, uniques = pd.factorize(values.to_numpy())
        codes = codes.astype(np.int64)
        if combined is not None and (int(combined.max()) + 1) * len(uniques) >= 2**62:
            return None  # pragma: no cover
        combined = codes if combined is None else combined * len(uniques) + codes
    if combined is None:
        return None
    return pd.factorize(combined)[0].astype(np.int64)


def busy_in_windows(acts: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """GPU busy time inside each window, per device: ``rank, iteration, device_id,
    busy`` (the union of the device's activity intervals clipped to the window of
    its rank, whoever launched them). One merge of intervals per (rank, device)."""
    cols = ["rank", "iteration", "device_id", "busy"]
    if acts.empty or windows.empty:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in cols})
    start, end = acts["start"].to_numpy(np.int64), acts["end"].to_numpy(np.int64)
    parts = []
    for key, rows in acts.groupby(["rank", "device_id"], sort=True).indices.items():
        rank, device = cast(tuple[int, int], key)
        w = windows[windows["rank"] == rank]
        if w.empty:
            continue
        busy = covered_within(start[rows], end[rows], w["start"].to_numpy(), w["end"].to_numpy())
        parts.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "iteration": w["iteration"].to_numpy(np.int64),
                    "device_id": device,
                    "busy": busy,
                }
            )
        )
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in cols})
    return pd.concat(parts, ignore_index=True)[cols]


def iteration_table(
    window: pd.DataFrame,
    inst: pd.DataFrame,
    acts: pd.DataFrame,
    timeline: pd.DataFrame | None = None,
    cpu_only: CpuOnly | None = None,
) -> pd.DataFrame:
    """Per (rank, iteration): time, op instances, kernels, GPU time and busy time.

    ``cpu_only``: the instances folded out of ``inst``, which count as op calls.

    Counts and GPU time are of the work each iteration *launched* (``acts``);
    busy time and utilization are of the GPU *during* the iteration's interval,
    whoever launched the work (``timeline``: every activity, also those of
    iterations outside the window; ``acts`` when None). The two differ
    because the GPU runs behind the CPU: the kernels an iteration launches
    often finish in the next one, so their busy time over the launching
    iteration's duration could exceed 100 %.

    Output: ``rank, iteration, start, end, duration, op_calls, kernel_count,
    memop_count, gpu_time, kernel_time, tc_kernel_time, gpu_busy, gpus,
    gpu_utilization``.
    """
    cols = [
        "rank",
        "iteration",
        "start",
        "end",
        "duration",
        "op_calls",
        "kernel_count",
        "memop_count",
        "gpu_time",
        "kernel_time",
        "tc_kernel_time",
        "gpu_busy",
        "gpus",
        "gpu_utilization",
    ]
    if window.empty:
        return pd.DataFrame(columns=cols)
    t = window[["rank", "iteration", "start", "end"]].copy()
    t["duration"] = t["end"] - t["start"]
    t = t.set_index(["rank", "iteration"])
    # only the columns needed: a row filter of the whole table would copy all of it
    real_ops = inst.loc[inst["instance"] >= 0, ["rank", "iteration"]].dropna(subset=["iteration"])
    calls = real_ops.groupby(["rank", "iteration"]).size()
    if cpu_only is not None and len(cpu_only):
        calls = calls.add(cpu_only.calls_per_iteration(), fill_value=0).astype(np.int64)
    t["op_calls"] = calls
    a = acts[["rank", "iteration", "device_id", "start", "end", "activity"]]
    a = a.dropna(subset=["iteration"]).assign(
        dur=gpu_time, kernel=lambda d: d["activity"] == "kernel"
    )
    a["iteration"] = a["iteration"].astype(np.int64)
    g = a.groupby(["rank", "iteration"])
    t["kernel_count"] = g["kernel"].sum()
    t["memop_count"] = g.size() - g["kernel"].sum()
    t["gpu_time"] = g["dur"].sum()
    t["kernel_time"] = a[a["kernel"]].groupby(["rank", "iteration"])["dur"].sum()
    if "uses_tc" in acts.columns:
        tc = a["kernel"] & acts.loc[a.index, "uses_tc"].fillna(False).astype(bool)
        t["tc_kernel_time"] = a[tc].groupby(["rank", "iteration"])["dur"].sum()
    else:
        t["tc_kernel_time"] = 0
    dev = busy_in_windows(acts if timeline is None else timeline, window)
    dev = dev[dev["busy"] > 0]
    if len(dev):
        dg = dev.groupby(["rank", "iteration"])
        t["gpu_busy"] = dg["busy"].sum()
        t["gpus"] = dg.size()
    else:
        t["gpu_busy"] = 0
        t["gpus"] = 0
    t = t.fillna(0)
    ints = [c for c in cols[2:-1]]
    t[ints] = t[ints].astype(np.int64)
    t["gpu_utilization"] = gpu_utilization(t["gpu_busy"], t["duration"] * t["gpus"]).fillna(0.0)
    return t.reset_index()[cols]


def rank_walls(spans: pd.DataFrame, window: pd.DataFrame | None) -> pd.Series:
    """Wall time per rank: its span (``rank_spans``) for the whole run, else the summed
    duration of its iterations in ``window``."""
    if window is None:
        return (spans["t1"] - spans["t0"]).set_axis(spans["rank"])
    return (window["end"] - window["start"]).groupby(window["rank"]).sum()


def busy_by(acts: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Flattened busy time of ``acts`` per group of ``keys`` (a Series on those keys)."""
    return _busy(acts, keys)


@dataclass(frozen=True)
class RunSummary:
    """The run's figures under snake_case names (times in ns, shares in %); the order
    of the fields is the summary report's. :mod:`perfguard.report.dlprof` alone maps
    them to DLProf's headers, so a detector or a page never reads a display label.
    ``None``: the capture cannot tell (no iterations, no Tensor Core columns)."""

    profile_name: str  # the capture's path
    capture_format: str  # reader format and version
    gpu_names: str  # the devices' names, sorted, comma-separated
    ranks: int
    gpus_used: int  # (rank, device) pairs with any GPU activity
    wall_time: int  # longest rank's span, or its summed iterations in a window
    iterations: int
    iteration_range: str  # "first-last", "" without iterations
    iteration_time_avg: int | None
    gpu_utilization: float  # gpu_utilization(): mean over the GPUs used
    kernel_time: int  # gpu_time() of the kernels
    memop_time: int  # gpu_time() of the memory operations
    gpu_busy: int  # flattened busy time of every activity, summed over GPUs
    kernel_busy: int  # the same of the kernels alone
    memop_only_busy: int  # gpu_busy - kernel_busy
    kernels: int
    memops: int
    unique_kernels: int
    op_instances: int  # op calls, CPU-only ones folded in included
    unique_ops: int
    unassociated_activities: int
    unassociated_gpu_time: int
    tc_utilization: float | None  # tc_utilization() over the TC-eligible ops
    tc_kernel_time: int | None

    def values(self) -> list[object]:
        """The figures in field order (the summary report's rows)."""
        return [getattr(self, f.name) for f in fields(self)]


def run_summary(
    trace: Trace,
    window: pd.DataFrame | None,
    acts: pd.DataFrame,
    inst: pd.DataFrame,
    iterations: pd.DataFrame,
    timeline: pd.DataFrame | None = None,
    cpu_only: CpuOnly | None = None,
) -> RunSummary:
    """The summary report's figures.

    ``window`` is None for the whole run, else the selected iterations: wall
    time is then the summed duration of those iterations (per rank; the
    longest rank counts), and busy time the GPU's inside them (``timeline``:
    every activity, see :func:`iteration_table`).
    """
    spans = rank_spans(trace)
    wall_by_rank = rank_walls(spans, window)
    wall = int(wall_by_rank.max()) if len(wall_by_rank) else 0

    dur = gpu_time(acts)
    kernel = (acts["activity"] == "kernel").to_numpy()
    if window is None:
        busy_all = _busy(acts, ["rank", "device_id"])
        busy_kernel = _busy(
            acts.loc[kernel, ["rank", "device_id", "start", "end"]], ["rank", "device_id"]
        )
    else:  # busy inside the selected iterations only, as their wall time is
        line = acts if timeline is None else timeline
        busy_all = _window_busy(line, window)
        busy_kernel = _window_busy(line[(line["activity"] == "kernel").to_numpy()], window)
    util = pd.Series(dtype=float)
    if len(busy_all):
        ranks = busy_all.index.get_level_values(0)
        walls = wall_by_rank.reindex(ranks).to_numpy(dtype=float)
        util = pd.Series(gpu_utilization(busy_all.to_numpy(), walls))
    n_ops = int((inst["instance"] >= 0).sum()) + (len(cpu_only) if cpu_only is not None else 0)
    unassoc = inst["instance"] < 0
    busy_total = int(busy_all.sum()) if len(busy_all) else 0
    kernel_busy = int(busy_kernel.sum()) if len(busy_kernel) else 0
    n_iter = len(iterations)
    return RunSummary(
        profile_name=str(trace.meta.get("path", "")),
        capture_format=f"{trace.meta.get('format', '')} {trace.meta.get('version') or ''}",
        gpu_names=", ".join(sorted(set(trace.devices["name"].dropna().astype(str)))),
        ranks=int(spans["rank"].nunique()) if len(spans) else 0,
        gpus_used=int(len(busy_all)),
        wall_time=wall,
        iterations=n_iter,
        iteration_range=(
            f"{int(iterations['iteration'].min())}-{int(iterations['iteration'].max())}"
            if n_iter
            else ""
        ),
        iteration_time_avg=int(round(iterations["duration"].mean())) if n_iter else None,
        gpu_utilization=float(util.mean()) if len(util) else 0.0,
        kernel_time=int(dur[kernel].sum()),
        memop_time=int(dur[~kernel].sum()),
        gpu_busy=busy_total,
        kernel_busy=kernel_busy,
        memop_only_busy=busy_total - kernel_busy,
        kernels=int(kernel.sum()),
        memops=int((~kernel).sum()),
        unique_kernels=len(factorize(acts.loc[kernel, "name"])[1]),
        op_instances=n_ops,
        unique_ops=_unique_ops(inst, unassoc.to_numpy(bool), cpu_only),
        unassociated_activities=int(unassoc.sum()),
        unassociated_gpu_time=int(inst.loc[unassoc, "gpu_time"].sum()),
        tc_utilization=_tc_utilization(inst),
        tc_kernel_time=int(inst["tc_kernel_time"].sum()) if "tc_kernel_time" in inst else None,
    )


def _window_busy(acts: pd.DataFrame, window: pd.DataFrame) -> pd.Series:
    """Busy time per (rank, device) summed over the windows, devices with any."""
    dev = busy_in_windows(acts, window)
    per = dev.groupby(["rank", "device_id"])["busy"].sum()
    return per[per > 0]


def _unique_ops(inst: pd.DataFrame, unassoc: np.ndarray, cpu_only: CpuOnly | None) -> int:
    """Distinct ops of the op ranges, folded instances included (``unassoc``: the
    unassociated rows of ``inst``, which are not ops of a range)."""
    if "op_key" not in inst:
        return _distinct_pairs(inst.loc[~unassoc, "op_name"], inst.loc[~unassoc, "direction"])
    keys = inst["op_key"].to_numpy(np.int64)[~unassoc]
    if cpu_only is not None:
        keys = np.concatenate([keys, cpu_only.op_key.astype(np.int64)])
    return len(unique_sorted(keys))


def _tc_utilization(inst: pd.DataFrame) -> float | None:
    """Run-level TC utilization over the eligible op instances, None when none ran."""
    if "tc_eligible" not in inst.columns:
        return None
    eligible = inst["tc_eligible"].fillna(False).astype(bool)
    total = int(inst.loc[eligible, "kernel_time"].sum())
    tc = int(inst.loc[eligible, "tc_kernel_time"].sum())
    return float(tc_utilization(tc, total)) if total else None


def _distinct_pairs(a: pd.Series, b: pd.Series) -> int:
    """Number of distinct ``(a, b)`` pairs (NA equal to NA, as ``drop_duplicates``)."""
    ca, _ = factorize(a, use_na_sentinel=False)
    cb, ub = factorize(b, use_na_sentinel=False)
    return len(unique_sorted(ca.astype(np.int64) * max(len(ub), 1) + cb))
