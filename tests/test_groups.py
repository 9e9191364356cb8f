"""Group nodes: inclusive roll-ups, by hand and against a containment walk on real traces."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from kineto_builder import KinetoBuilder

import perfguard
from perfguard.analysis.groups import aggregate_groups

US = 1000


def test_inclusive_rollup_by_hand(tmp_path: Path) -> None:
    """A module with two linears (one kernel each) and a stream-overlapping kernel of its own.

    Times in µs::

        model [0, 100)
          launch [1,2) -> k [10, 30)  (owned by model itself)
          aten::linear [5, 20)  -> aten::addmm [6, 18): launch [7,8) -> k [20, 35)
          aten::linear [40, 60) -> aten::addmm [41, 58): launch [42,43) -> k [60, 65)
    """
    b = KinetoBuilder()
    b.op("ProfilerStep#3", 0, 200, cat="user_annotation")  # transparent
    b.op("model", 0, 100, cat="user_annotation")
    b.launch((1, 1), (10, 20), kernel="own", stream=8)
    for t0, k in ((5, (20, 15)), (40, (60, 5))):
        b.op("aten::linear", t0, 15 if t0 == 5 else 20)
        b.op("aten::addmm", t0 + 1, 12 if t0 == 5 else 17)
        b.launch((t0 + 2, 1), k, kernel="gemm")
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "groups.json")))
    g = aggregate_groups(a.trace, a.activities, a.instances).set_index("op_name")
    assert set(g.index) == {"model", "model/aten::linear"}  # addmm is a leaf, not a group
    model = g.loc["model"]
    assert model["calls"] == 1 and model["child_ops"] == 1 and model["kernel_count"] == 3
    assert model["gpu_time_total"] == (20 + 15 + 5) * US
    # union of [10,30), [20,35), [60,65) = 25 + 5; span 10..65 = 55
    assert model["gpu_time_flattened"] == 30 * US
    assert model["gpu_idle_total"] == 25 * US
    lin = g.loc["model/aten::linear"]
    assert lin["calls"] == 2 and lin["gpu_time_total"] == 20 * US
    assert lin["cpu_time_total"] == 35 * US
    assert lin["gpu_time_flattened"] == 20 * US and lin["gpu_idle_total"] == 0


@pytest.mark.parametrize(
    "name",
    [
        "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz",
        "kineto/a100_alexnet_tiny_cudasync.pt.trace.json.gz",
        "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite",
    ],
)
def test_group_gpu_time_is_the_work_launched_inside_it(name, fixture_file, cached_trace) -> None:
    """Independent check: a group's GPU time is the summed duration of every activity whose
    launching call starts inside one of its instances on the same thread (time containment,
    no tree walk)."""
    trace = cached_trace(fixture_file(name))
    a = perfguard.analyze(trace)
    got = aggregate_groups(trace, a.activities, a.instances)
    inst = a.instances[a.instances["instance"] >= 0]
    groups = inst[inst["op_name"].isin(set(got["op_name"]))]
    launched = a.activities[a.activities["launch_start"].notna()]
    calls = list(
        zip(
            launched["rank"],
            launched["pid"],
            launched["launch_tid"],
            launched["launch_start"],
            launched["end"] - launched["start"],
            launched["range_id"] >= 0,
            strict=True,
        )
    )
    by_thread: dict = {}
    for rank, pid, tid, t, dur, owned in calls:
        if owned:
            by_thread.setdefault((rank, pid, int(tid)), []).append((int(t), int(dur)))
    expected: Counter = Counter()
    for row in groups.itertuples(index=False):
        for t, dur in by_thread.get((row.rank, row.pid, row.tid), []):
            if row.start <= t <= row.end:
                expected[(row.op_name, row.direction)] += dur
    ours = {(r.op_name, r.direction): r.gpu_time_total for r in got.itertuples(index=False)}
    assert len(ours) > 5
    diff = {k: (expected[k], v) for k, v in ours.items() if expected[k] != v}
    assert not diff, f"{len(diff)} groups differ, e.g. {list(diff.items())[:3]}"
    assert (got["gpu_time_flattened"] <= got["gpu_time_total"]).all()


def test_shallow_anchor_is_the_ancestor_above_the_cut() -> None:
    """A range nested MAX_OP_PATH_DEPTH deep or more anchors at its ancestor at depth
    MAX_OP_PATH_DEPTH - 1 (where the walk up to the groups starts); every other range
    at itself. Random forests, against a walk up each range's parents."""
    import numpy as np

    from perfguard.analysis.groups import _shallow_anchor
    from perfguard.analysis.ops import MAX_OP_PATH_DEPTH

    rng = np.random.default_rng(5)
    past_the_cut = 0
    for _ in range(20):
        n = int(rng.integers(1, 600))
        parent = np.full(n, -1, dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        for i in range(1, n):  # mostly chains, so some ranges nest past the cut
            if rng.random() < 0.995:
                parent[i] = i - 1 if rng.random() < 0.97 else int(rng.integers(0, i))
                depth[i] = depth[parent[i]] + 1
        order = rng.permutation(n)  # rows in any order: parents need not come first
        where = np.empty(n, dtype=np.int64)
        where[order] = np.arange(n)
        p = np.where(parent[order] >= 0, where[np.clip(parent[order], 0, None)], -1)
        d = depth[order]
        anchor = _shallow_anchor(p, d)
        if not (d >= MAX_OP_PATH_DEPTH).any():
            assert anchor is None
            continue
        past_the_cut += 1
        for row in range(n):
            want = row
            while d[want] >= MAX_OP_PATH_DEPTH:
                want = p[want]
            assert anchor[row] == want
    assert past_the_cut >= 10  # the cases really nest past the cut
