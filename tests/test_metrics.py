"""The metric definitions (perfguard/analysis/metrics.py): their rules on small inputs,
and the figures the pipeline reports recomputed here, row by row in plain Python from
the instance and activity tables, on real captures."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

import perfguard
from perfguard.analysis import metrics

H100 = "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz"
TORCHREC = "kineto/v100_torchrec_train_rank1_2022.pt.trace.json.gz"


def test_a_share_of_nothing_is_nan_for_arrays_series_and_scalars() -> None:
    assert metrics.percent(1, 4) == 25.0
    assert math.isnan(metrics.percent(1, 0))
    arr = metrics.percent(np.array([1, 3, 0]), np.array([2, 0, -1]))
    assert arr[0] == 50.0 and np.isnan(arr[1:]).all()
    s = metrics.tc_utilization(
        pd.Series([5, 5], index=["a", "b"]), pd.Series([10, 0], index=["a", "b"])
    )
    assert s["a"] == 50.0 and np.isnan(s["b"]) and list(s.index) == ["a", "b"]
    assert math.isnan(metrics.achieved_tflops(1e12, 0.0))
    assert metrics.achieved_tflops(2e12, metrics.gpu_seconds(1e9)) == pytest.approx(2.0)


def test_idle_and_overhead_never_go_below_zero() -> None:
    assert list(metrics.gpu_idle(np.array([10, 5]), np.array([4, 7]))) == [6, 0]
    assert list(metrics.gpu_idle(pd.Series([3]), pd.Series([1]))) == [2]
    cpu = metrics.cpu_time(np.array([0, 10]), np.array([5, 12]))
    assert list(cpu) == [5, 2]
    assert list(metrics.cpu_overhead(cpu, np.array([1, 9]))) == [4, 0]


def _union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def test_op_figures_match_a_plain_recount(fixture_file, cached_trace) -> None:
    """Per op: TC utilization, achieved TFLOP/s and FLOP efficiency from the instances,
    summed in Python in the order the rows come (a real H100 BERT capture with shapes)."""
    a = perfguard.analyze(cached_trace(fixture_file(H100)))
    inst = a.instances
    sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in inst.itertuples(index=False):
        acc = sums[r.op_id]
        if bool(r.tc_eligible):
            acc["el_tc"] += r.tc_kernel_time
            acc["el_k"] += r.kernel_time
        if not pd.isna(r.flops) and r.gpu_time > 0:
            acc["f"] += float(r.flops)
            acc["t"] += r.gpu_time * 1e-9
            if not pd.isna(r.peak_flops):
                acc["fr"] += float(r.flops)
                acc["tp"] += r.gpu_time * 1e-9 * float(r.peak_flops)
    checked = 0
    for op in a.ops.itertuples(index=False):
        acc = sums[op.op_id]
        tc = 100 * acc["el_tc"] / acc["el_k"] if acc["el_k"] else math.nan
        tf = acc["f"] / acc["t"] / 1e12 if acc["t"] else math.nan
        eff = 100 * acc["fr"] / acc["tp"] if acc["tp"] else math.nan
        for got, want in (
            (op.tc_utilization, tc),
            (op.achieved_tflops, tf),
            (op.flop_efficiency_pct, eff),
        ):
            if math.isnan(want):
                assert pd.isna(got), op.op_name
            else:
                assert float(got) == pytest.approx(want, rel=1e-9), op.op_name
                checked += 1
    assert checked >= 5


def test_gpu_idle_and_utilization_match_a_plain_recount(fixture_file, cached_trace) -> None:
    """Per op instance: idle = span - union of its activities; per iteration: busy inside
    it over its duration; the run: busy over wall time (a real V100 TorchRec capture)."""
    a = perfguard.analyze(cached_trace(fixture_file(TORCHREC)))
    acts = a.activities
    per_instance: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row, s, e in zip(acts["instance_row"], acts["start"], acts["end"], strict=True):
        if row >= 0:
            per_instance[int(row)].append((int(s), int(e)))
    inst = a.kept_instances
    for row, iv in list(per_instance.items())[:2000]:
        span = max(e for _, e in iv) - min(s for s, _ in iv)
        assert inst["gpu_idle"].iat[row] == span - _union(iv)
    everything = list(zip(acts["start"].astype(int), acts["end"].astype(int), strict=True))
    busy = _union(everything)
    assert a.summary.gpus_used == 1  # one device: the run's union is that GPU's
    assert a.summary.gpu_busy == busy
    assert a.summary.gpu_utilization == pytest.approx(100 * busy / a.summary.wall_time)
    assert len(a.iterations) >= 2
    for it in a.iterations.itertuples(index=False):
        inside = [
            (max(s, it.start), min(e, it.end)) for s, e in everything if s < it.end and e > it.start
        ]
        want = 100 * _union(inside) / it.duration
        assert it.gpu_utilization == pytest.approx(want, rel=1e-12)
