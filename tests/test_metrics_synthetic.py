"""Per-op, per-iteration and run metrics on small hand-made traces, computed by hand.

The real fixtures check the attribution at scale; these cases pin the
definitions of DESIGN.md ("Metrics") on numbers small enough to work out on
paper: CPU overhead, GPU idle, the key-node N+1 rule, inclusive iteration
bounds, flattened busy time and utilization, unassociated work, nesting.

Each trace is a real Kineto JSON file written to ``tmp_path`` and read with
:func:`perfguard.load_trace`, so the whole path from file to figure runs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kineto_builder import KinetoBuilder

import perfguard
from perfguard.errors import AnalysisError

US = 1000  # ns per µs: the hand computations below are in µs


def _op(a: perfguard.Analysis, name: str) -> pd.Series:
    hit = a.ops[a.ops["op_name"] == name]
    assert len(hit) == 1, f"{name!r} not one op in {a.ops['op_name'].tolist()}"
    return hit.iloc[0]


# --------------------------------------------------------------------------- one op, by hand


@pytest.fixture
def two_step_trace(tmp_path: Path) -> perfguard.Trace:
    """Two ProfilerSteps; an mm with two kernels and a memcpy; a nested add; an orphan.

    Times in µs::

        ProfilerStep#0 [0, 100)        ProfilerStep#1 [100, 200)
          aten::mm [10, 40)               model.block [105, 150)  (user annotation)
            launch [12,15) -> k [30,40)     aten::add [125, 135)
            launch [20,22) -> k [50,55)       launch [126,127) -> k [140,146)
            memcpy [30,32) -> copy [60,64)  launch [160,161) -> orphan [170,172)
    """
    b = KinetoBuilder()
    b.op("ProfilerStep#0", 0, 100, cat="user_annotation")
    b.op("aten::mm", 10, 30)
    b.launch((12, 3), (30, 10), kernel="gemm_a")
    b.launch((20, 2), (50, 5), kernel="gemm_b")
    b.launch((30, 2), (60, 4), cat="gpu_memcpy", kernel="Memcpy HtoD", api="cudaMemcpyAsync")
    b.op("ProfilerStep#1", 100, 100, cat="user_annotation")
    b.op("model.block", 105, 45, cat="user_annotation")
    b.op("aten::add", 125, 10)
    b.launch((126, 1), (140, 6), kernel="add_kernel")
    b.launch((160, 1), (170, 2), kernel="stray_kernel")
    return perfguard.load_trace(b.write(tmp_path / "two_step.json"))


def test_op_metrics_by_hand(two_step_trace) -> None:
    a = perfguard.analyze(two_step_trace)
    mm = _op(a, "aten::mm")
    assert mm["calls"] == 1 and mm["kernel_count"] == 2
    assert mm["cpu_time_total"] == 30 * US
    # kernels 10 + 5 and the memcpy 4: accumulated
    assert mm["gpu_time_total"] == 19 * US
    # CPU time minus the three runtime calls inside it (3 + 2 + 2)
    assert mm["cpu_overhead_total"] == 23 * US
    # span 30..64 = 34, busy 10 + 5 + 4 = 19
    assert mm["gpu_idle_total"] == 15 * US


def test_innermost_range_owns_the_kernel_and_names_are_hierarchical(two_step_trace) -> None:
    a = perfguard.analyze(two_step_trace)
    add = _op(a, "model.block/aten::add")  # the ProfilerStep is transparent
    assert add["gpu_time_total"] == 6 * US
    block = _op(a, "model.block")
    assert block["gpu_time_total"] == 0  # the kernel went to the innermost range only
    assert block["cpu_overhead_total"] == 44 * US  # 45 minus the 1 µs launch inside aten::add


def test_work_outside_every_op_is_unassociated(two_step_trace) -> None:
    a = perfguard.analyze(two_step_trace)
    stray = _op(a, "unassociated_stray_kernel")
    assert stray["gpu_time_total"] == 2 * US and stray["calls"] == 1
    assert a.summary.unassociated_activities == 1
    assert a.summary.unassociated_gpu_time == 2 * US


def test_profiler_steps_are_iterations_not_ops(two_step_trace) -> None:
    a = perfguard.analyze(two_step_trace)
    assert not a.ops["op_name"].str.contains("ProfilerStep").any()
    it = a.iterations.set_index("iteration")
    assert list(it.index) == [0, 1]
    assert it.loc[0, "duration"] == 100 * US and it.loc[1, "duration"] == 100 * US
    assert it.loc[0, "kernel_count"] == 2 and it.loc[0, "memop_count"] == 1
    # the orphan was launched at 160 µs, inside step 1
    assert it.loc[1, "kernel_count"] == 2
    assert it.loc[0, "gpu_time"] == 19 * US and it.loc[1, "gpu_time"] == 8 * US


def test_run_summary_by_hand(two_step_trace) -> None:
    s = perfguard.analyze(two_step_trace).summary
    assert s.wall_time == 200 * US  # 0 .. 200 µs (ProfilerStep#1 ends last)
    assert s.kernel_time == (10 + 5 + 6 + 2) * US
    assert s.memop_time == 4 * US
    assert s.gpu_busy == 27 * US
    assert s.gpu_utilization == pytest.approx(100 * 27 / 200)
    assert s.iterations == 2 and s.iteration_range == "0-1"


def test_iteration_bounds_are_inclusive(two_step_trace) -> None:
    a = perfguard.analyze(two_step_trace, iter_start=1, iter_stop=1)
    assert set(a.ops["op_name"]) == {
        "model.block",
        "model.block/aten::add",
        "unassociated_stray_kernel",
    }
    assert a.summary.wall_time == 100 * US
    assert a.summary.kernel_time == 8 * US
    both = perfguard.analyze(two_step_trace, iter_start=0, iter_stop=1)
    assert both.ops["gpu_time_total"].sum() == 27 * US


@pytest.mark.parametrize(
    "bounds, message",
    [((5, None), "iteration range 5..1 is empty"), ((1, 0), "is after --iter-stop 0")],
)
def test_iteration_bounds_that_select_nothing(two_step_trace, bounds, message) -> None:
    with pytest.raises(AnalysisError, match=message):
        perfguard.analyze(two_step_trace, iter_start=bounds[0], iter_stop=bounds[1])


# --------------------------------------------------------------------------- key node (DLProf 7)


def test_key_node_gives_n_plus_one_intervals(tmp_path: Path) -> None:
    """Three ``step`` ranges: intervals [t0, e1), [e1, e2), [e2, e3), [e3, t_last]."""
    b = KinetoBuilder()
    b.launch((0, 1), (2, 1), kernel="warmup")  # t0 = 0: before the first key node ends
    for i in range(3):
        t = 10 + 100 * i
        b.op("step", t, 50, cat="user_annotation")
        b.op("aten::mul", t + 5, 10)
        b.launch((t + 6, 1), (t + 20, 3 + i), kernel="mul_kernel")
    b.launch((400, 1), (405, 5), kernel="tail")  # after the last key node: interval 3
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "keynode.json")), "step")
    iv = a.window.set_index("iteration")
    assert list(iv.index) == [0, 1, 2, 3]
    assert list(iv["start"]) == [0, 60 * US, 160 * US, 260 * US]
    assert list(iv["end"]) == [60 * US, 160 * US, 260 * US, 410 * US]
    it = a.iterations.set_index("iteration")
    # launches at 0 and 16 fall in interval 0; the kernel of step i (launched at
    # 16 + 100 i) in interval i, since interval i ends where step i ends
    assert it.loc[0, "gpu_time"] == (1 + 3) * US
    assert it.loc[1, "gpu_time"] == 4 * US and it.loc[2, "gpu_time"] == 5 * US
    assert it.loc[3, "gpu_time"] == 5 * US
    sel = perfguard.analyze(a.trace, "step", iter_start=1, iter_stop=2)
    assert sel.summary.kernel_time == (4 + 5) * US
    assert sel.summary.wall_time == 200 * US


def test_unknown_key_node_suggests_close_names(two_step_trace) -> None:
    with pytest.raises(AnalysisError, match=r"'aten::m' not found.*did you mean 'aten::mm'"):
        perfguard.analyze(two_step_trace, key_node="aten::m")


# --------------------------------------------------------------------------- overlap and flattening


def test_overlapping_kernels_accumulate_per_op_and_flatten_per_gpu(tmp_path: Path) -> None:
    """Two streams overlap: GPU time sums both, busy time takes the union."""
    b = KinetoBuilder()
    b.op("aten::conv2d", 0, 20)
    b.launch((1, 1), (10, 10), kernel="conv_a", stream=7)  # [10, 20)
    b.launch((3, 1), (15, 10), kernel="conv_b", stream=8)  # [15, 25)
    b.launch((5, 1), (40, 5), kernel="conv_c", stream=7)  # [40, 45)
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "overlap.json")))
    conv = _op(a, "aten::conv2d")
    assert conv["gpu_time_total"] == 25 * US
    assert conv["gpu_idle_total"] == (35 - 20) * US  # span 10..45, union 15 + 5
    assert a.summary.gpu_busy == 20 * US
    assert a.summary.gpu_utilization == pytest.approx(100 * 20 / 45)


def test_stats_over_instances(tmp_path: Path) -> None:
    """Three calls of one op: total / avg / min / max of each metric across them."""
    b = KinetoBuilder()
    for i, (cpu, gpu) in enumerate([(10, 2), (20, 4), (30, 9)]):
        t = 100 * i
        b.op("aten::linear", t, cpu)
        b.launch((t + 1, 1), (t + 2, gpu), kernel="gemm")
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "stats.json")))
    lin = _op(a, "aten::linear")
    assert lin["calls"] == 3
    assert [lin[f"cpu_time_{s}"] for s in ("total", "avg", "min", "max")] == [
        60 * US,
        20 * US,
        10 * US,
        30 * US,
    ]
    assert [lin[f"gpu_time_{s}"] for s in ("total", "avg", "min", "max")] == [
        15 * US,
        5 * US,
        2 * US,
        9 * US,
    ]
    assert lin["cpu_overhead_total"] == 57 * US
    kern = a.kernels[a.kernels["name"] == "gemm"].iloc[0]
    assert kern["calls"] == 3 and kern["gpu_time_total"] == 15 * US
    assert kern["gpu_time_min"] == 2 * US and kern["gpu_time_max"] == 9 * US


def test_threads_do_not_share_ranges(tmp_path: Path) -> None:
    """A launch on thread 2 is not owned by an op on thread 1 that spans it in time."""
    b = KinetoBuilder()
    b.op("aten::mm", 0, 100, tid=1)
    b.launch((10, 1), (20, 5), kernel="mine", tid=1)
    b.op("aten::add", 30, 10, tid=2)
    b.launch((31, 1), (50, 3), kernel="theirs", tid=2)
    b.launch((60, 1), (70, 2), kernel="lost", tid=2)
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "threads.json")))
    assert _op(a, "aten::mm")["gpu_time_total"] == 5 * US
    assert _op(a, "aten::add")["gpu_time_total"] == 3 * US
    assert _op(a, "unassociated_lost")["gpu_time_total"] == 2 * US


def test_backward_direction_propagates_down(tmp_path: Path) -> None:
    """Ops under an autograd backward node are ``bprop``; the same name outside is ``fprop``."""
    b = KinetoBuilder()
    b.op("aten::mm", 0, 10)
    b.launch((1, 1), (2, 3), kernel="gemm")
    b.op("autograd::engine::evaluate_function: MmBackward0", 20, 30)
    b.op("aten::mm", 25, 10)
    b.launch((26, 1), (30, 4), kernel="gemm")
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "bwd.json")))
    dirs = a.ops.set_index("op_name")["direction"]
    assert dirs["aten::mm"] == "fprop"
    nested = "autograd::engine::evaluate_function: MmBackward0/aten::mm"
    assert dirs[nested] == "bprop"
    assert a.ops.set_index("op_name").loc[nested, "gpu_time_total"] == 4 * US


def test_trace_without_gpu_work(tmp_path: Path) -> None:
    """A CPU-only capture analyses to ops with CPU time and zero GPU figures."""
    b = KinetoBuilder()
    b.op("aten::add", 0, 10)
    b.op("aten::mul", 20, 5)
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "cpu.json")))
    assert set(a.ops["op_name"]) == {"aten::add", "aten::mul"}
    assert a.ops["gpu_time_total"].sum() == 0
    assert a.summary.gpu_utilization == 0.0 and a.summary.kernels == 0


def test_kernel_report_geometry_is_each_groups_first_launch_that_has_it() -> None:
    """The kernel report reads launch geometry from the trace's kernels table (the
    activities do not carry it); like a groupby "first", a launch without a value is
    skipped for the group's next launch that has one."""
    from perfguard.analysis.kernels import aggregate_kernels

    example = Path(__file__).resolve().parents[1] / "examples" / "captures"
    a = perfguard.analyze(
        perfguard.load_trace(example / "a100_alexnet_tiny_cudasync.pt.trace.json.gz")
    )
    kernels = a.trace.kernels.copy()
    kernels.loc[kernels.index[::2], "grid_x"] = pd.NA  # every other launch loses its grid_x
    got = aggregate_kernels(a.activities, kernels).set_index(["name", "op_id"])["grid_x"]
    k = a.activities[a.activities["activity"] == "kernel"]
    want = (
        pd.DataFrame(
            {
                "name": k["name"].to_numpy(),
                "op_id": k["op_id"].to_numpy(),
                "grid_x": kernels["grid_x"].array.take(k["kernel_row"].to_numpy()),
            }
        )
        .groupby(["name", "op_id"], sort=False)["grid_x"]
        .first()
    )
    first_launch = (
        pd.DataFrame(
            {
                "name": k["name"].to_numpy(),
                "op_id": k["op_id"].to_numpy(),
                "na": kernels["grid_x"].isna().to_numpy()[k["kernel_row"].to_numpy()],
            }
        )
        .groupby(["name", "op_id"], sort=False)["na"]
        .first()
    )
    assert first_launch.any() and got[first_launch[first_launch].index].notna().any()
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
