"""Work replayed from CUDA graphs: never silently the work of the range around the replay,
and the work of the op that recorded it where the capture was profiled; where it cannot be
tied, ``graph_replay_<id>`` under the range that launched the replay.

The real capture is TorchRec training on a V100 (shared/fixtures, HTA's
``trace_diff/test``): its ``CompiledFunction`` (forward) and
``CompiledFunctionBackward`` ranges replay CUDA graphs through 12
``cudaGraphLaunch`` calls. A 2022 Kineto trace numbers no graphs and records no
capture, so nothing ties a replayed kernel to the op that recorded it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfguard.analysis import Analysis, analyze
from perfguard.analysis.attribution import GRAPH_REPLAY_PREFIX, enclosing_op
from perfguard.trace import Trace, load_trace
from perfguard.trace.model import with_category

TORCHREC = "kineto/v100_torchrec_train_rank1_2022.pt.trace.json.gz"


def graph_split(a: Analysis) -> dict[str, object]:
    """How a capture's GPU time splits: the share replayed from CUDA graphs, the share of
    that replayed time named by an op, and the GPU time of each op as a share of all.

    For any capture, e.g. a CUDA-graph program and the same model run eagerly on a lent
    GPU: their ``per_op`` shares are what should agree once replayed work is tied to
    the ops that recorded it.
    """
    acts = a.activities
    dur = (acts["end"] - acts["start"]).to_numpy(np.int64)
    replay = acts["graph_replay"].to_numpy(bool)
    named = replay & (acts["range_id"].to_numpy() >= 0)
    total = int(dur.sum())
    by_op = pd.Series(dur, index=acts["op_name"].astype(str)).groupby(level=0).sum()
    return {
        "replayed_share": int(dur[replay].sum()) / total,
        "replayed_named_share": int(dur[named].sum()) / max(int(dur[replay].sum()), 1),
        "per_op": (by_op / total).sort_values(ascending=False),
    }


@pytest.fixture(scope="module")
def torchrec(fixtures_dir: Path) -> Analysis:
    path = fixtures_dir / TORCHREC
    if not path.exists():
        pytest.skip(f"fixture {TORCHREC} is not in {fixtures_dir}")
    return analyze(load_trace(path))


BACKWARD = "autograd::engine::evaluate_function: CompiledFunctionBackward/CompiledFunctionBackward"
FORWARD = "## forward ##/## forward:over_arch ##/CompiledFunction"


def test_replayed_work_stays_under_its_launcher_not_as_its_work(torchrec) -> None:
    """Untied replays are ``graph_replay_<id>`` under the range that launched them: the
    forward's and the backward's stay apart (top-level, 27.7 % of the GPU time read as one
    op of no region), and neither compiled function owns the replayed work itself."""
    a = torchrec
    api = a.trace.api_calls
    launches = api[api["name"] == "cudaGraphLaunch"]
    assert len(launches) == 12
    acts = a.activities
    replayed = acts[acts["correlation_id"].isin(launches["correlation_id"])]
    assert acts["graph_replay"].sum() == len(replayed) == 5046
    assert replayed["activity"].value_counts().to_dict() == {"kernel": 4464, "memop": 582}
    assert (replayed["range_id"] == -1).all()
    leaf = GRAPH_REPLAY_PREFIX + "unknown"
    assert set(replayed["op_name"].astype(str)) == {f"{BACKWARD}/{leaf}", f"{FORWARD}/{leaf}"}
    # by hand: the range open around each replay is the compiled function's, which is
    # where the launch rule alone put 27.7 % of the GPU time as its own
    around = enclosing_op(
        a.trace,
        launches["rank"].to_numpy(),
        launches["pid"].to_numpy(),
        launches["tid"].to_numpy(),
        launches["start"].to_numpy(),
    )
    names = a.trace.ranges["name"].astype(str).to_numpy()[around]
    assert set(names) == {"CompiledFunction", "CompiledFunctionBackward"}
    by_launch = dict(zip(launches["correlation_id"], names, strict=True))
    launcher = replayed["correlation_id"].map(by_launch)
    assert (replayed["op_name"].astype(str).str.rsplit("/", n=2).str[-2] == launcher).all()
    ops = a.ops.set_index("op_name")
    compiled = ops[ops.index.str.endswith(("/CompiledFunction", "/CompiledFunctionBackward"))]
    assert (compiled["gpu_time_total"] == 0).all()
    # each replay op reads its launcher's direction: the backward's are bprop
    replays = ops.loc[[f"{BACKWARD}/{leaf}", f"{FORWARD}/{leaf}"]]
    assert replays["direction"].tolist() == ["bprop", "fprop"]
    assert replays["gpu_time_total"].tolist() == [171_432_000, 95_694_000]  # 17.8 %, 9.9 %
    split = graph_split(a)
    assert split["replayed_share"] == pytest.approx(267_126_000 / 963_762_000)
    assert split["replayed_named_share"] == 0.0  # nothing in the capture ties them
    note = [n for n in a.notes if "cudaGraphLaunch" in n]
    assert note == [
        "5046 GPU activities (27.7 % of GPU time) were replayed from CUDA graphs (the "
        "capture numbers none): their launching call is cudaGraphLaunch, and the capture "
        "does not say which op recorded them, so they are reported as "
        "graph_replay_<graph id> under the op range that launched the replay "
        "(<range>/graph_replay_<graph id>), not as that range's own work"
    ]
    # the per-op figures lose nothing: every activity's time is somewhere
    assert int(ops["gpu_time_total"].sum()) == 963_762_000


# ------------------------------------------- a real capture profiled: H200, torch 2.11

H200 = Path(__file__).parent / "data" / "gpu_h200"  # tests/data/MANIFEST.md
#: the model's leaf ops (the copy_ into the static input and the buffers' fill_ are not
#: the model's)
MODEL_OPS = ("aten::addmm", "aten::native_layer_norm", "aten::gelu", "aten::add")


@pytest.fixture(scope="module")
def h200() -> dict[str, Trace]:
    names = ("graph_capture", "graph_replay", "eager", "compile_reduce_overhead")
    return {n: load_trace(H200 / f"{n}.pt.trace.json.gz") for n in names}


def leaf_split(a: Analysis) -> pd.Series:
    """Each model op's share of the model's GPU time in the iterations, by leaf op name:
    what the same model should show however its kernels were launched."""
    acts = a.activities[a.activities["iteration"].notna()]
    leaf = acts["op_name"].astype(str).str.rsplit("/", n=1).str[-1]
    dur = pd.Series((acts["end"] - acts["start"]).to_numpy(np.int64), index=leaf.to_numpy())
    by = dur.groupby(level=0).sum().reindex(list(MODEL_OPS))
    return by / by.sum()


def test_what_kineto_2_11_records_of_a_profiled_capture(h200) -> None:
    """The facts the tie rests on (perfguard/analysis/graphs.py): no graph or node ids,
    the capture's launch calls inside their ops, one cudaGraphLaunch per replay."""
    t = h200["graph_capture"]
    assert t.kernels["graph_id"].isna().all() and t.memops["graph_id"].isna().all()
    api = t.api_calls.sort_values("start")
    names = api["name"].astype(str).to_numpy()
    begin = int(np.flatnonzero(names == "cudaStreamBeginCapture")[0])
    end = int(np.flatnonzero(names == "cudaStreamEndCapture")[0])
    during = api.iloc[begin + 1 : end]
    launches = during[during["name"].isin(["cudaLaunchKernel", "cuLaunchKernelEx"])]
    assert launches["name"].astype(str).value_counts().to_dict() == {
        "cudaLaunchKernel": 9,
        "cuLaunchKernelEx": 6,
    }
    # nothing runs during a capture: no kernel carries those correlation ids
    assert not t.kernels["correlation_id"].isin(launches["correlation_id"]).any()
    assert names[end + 1 : end + 3].tolist() == [
        "cudaGraphGetNodes",
        "cudaGraphInstantiateWithFlags",
    ]
    graph_launches = api[api["name"] == "cudaGraphLaunch"]
    assert len(graph_launches) == 11  # graph.first_replay and 10 iterations
    per_launch = t.kernels[t.kernels["correlation_id"].isin(graph_launches["correlation_id"])]
    assert per_launch.groupby("correlation_id").size().eq(15).all()


def test_replayed_kernels_go_to_the_ops_that_recorded_them(h200) -> None:
    a = analyze(h200["graph_capture"])
    split = graph_split(a)
    print(
        f"\nH200 graph_capture: {100 * split['replayed_share']:.1f} % of GPU time replayed, "
        f"{100 * split['replayed_named_share']:.1f} % of it attributed to named ops"
    )
    assert split["replayed_named_share"] == 1.0
    acts = a.activities
    replayed = acts[acts["graph_replay"].to_numpy(bool)]
    assert len(replayed) == 165 and replayed["graph_recorded"].all()
    # by hand, against the eager run of the same model: each kernel name belongs to the
    # same leaf op there (an order shifted by one node would put the GEMMs under gelu)
    eager = analyze(h200["eager"]).activities
    eager_op = (
        eager.assign(leaf=eager["op_name"].astype(str).str.rsplit("/", n=1).str[-1])
        .groupby(eager["name"].astype(str))["leaf"]
        .agg(set)
    )
    leaf = replayed["op_name"].astype(str).str.rsplit("/", n=1).str[-1]
    for name, op in zip(replayed["name"].astype(str), leaf, strict=True):
        assert eager_op[name] == {op}, name
    assert set(replayed["op_name"].astype(str)) == {
        "graph.capture/aten::linear/aten::addmm",
        "graph.capture/aten::layer_norm/aten::native_layer_norm",
        "graph.capture/aten::gelu",
        "graph.capture/aten::add",
    }
    # the replay's iteration is kept: 15 kernels in each of the 10
    assert replayed["iteration"].value_counts().eq(15).all()
    assert [n for n in a.notes if "cudaGraphLaunch" in n] == [
        "165 GPU activities (97.4 % of GPU time) were replayed from CUDA graphs (the "
        "capture numbers none): their launching call is cudaGraphLaunch; 165 of them "
        "(100.0 % of the replayed GPU time) were tied to the op that recorded them, "
        "through the launches made during the graph's profiled capture, in capture order"
    ]


def test_the_graph_and_the_eager_run_split_gpu_time_alike(h200) -> None:
    graph = leaf_split(analyze(h200["graph_capture"]))
    eager = leaf_split(analyze(h200["eager"]))
    print("\nshare of the model's GPU time, graph_capture vs eager:")
    for op in MODEL_OPS:
        print(f"  {op:26} {100 * graph[op]:5.1f} %  {100 * eager[op]:5.1f} %")
    assert (graph - eager).abs().max() < 0.02  # within 2 points of the whole
    # the replays lose no FLOPs: per iteration, the op ran once per replay
    window = analyze(h200["graph_capture"], iter_start=2, iter_stop=5).ops
    eager_w = analyze(h200["eager"], iter_start=2, iter_stop=5).ops
    leaf_flops = [
        w.assign(leaf=w["op_name"].str.rsplit("/", n=1).str[-1])
        .groupby("leaf")[["flops", "kernel_count"]]
        .sum()
        .loc[list(MODEL_OPS)]
        for w in (window, eager_w)
    ]
    pd.testing.assert_frame_equal(*leaf_flops)


def test_a_replay_whose_capture_was_not_profiled_stays_graph_replay(h200) -> None:
    a = analyze(h200["graph_replay"])
    acts = a.activities
    replayed = acts[acts["graph_replay"].to_numpy(bool)]
    assert len(replayed) == 150 and not replayed["graph_recorded"].any()
    # replayed straight from the step, inside no op: on its own
    assert set(replayed["op_name"].astype(str)) == {GRAPH_REPLAY_PREFIX + "unknown"}
    assert (replayed["graph_launcher"] == -1).all()
    assert graph_split(a)["replayed_named_share"] == 0.0
    assert any(
        "the capture does not say which op recorded them" in n
        and n.endswith("outside any op range")
        for n in a.notes
    )


def test_compiled_reduce_overhead_replays_are_graph_replays(h200) -> None:
    """torch.compile(mode="reduce-overhead") records its graphs while warming up, before
    the profile: the 13 kernels of each replay are graph_replay work, never the
    compiled region's."""
    a = analyze(h200["compile_reduce_overhead"])
    acts = a.activities
    replayed = acts[acts["graph_replay"].to_numpy(bool)]
    assert len(replayed) == 130
    # under the compiled graph's call that replayed it
    assert set(replayed["op_name"].astype(str)) == {
        "Torch-Compiled Region: 0/0/## Call CompiledFxGraph ##/" + GRAPH_REPLAY_PREFIX + "unknown"
    }
    assert replayed["short_name"].astype(str).str.startswith(("triton_", "nvjet_")).all()
    assert any("130 GPU activities (78.6 % of GPU time) were replayed" in n for n in a.notes)


def _renamed(t: Trace, rows: np.ndarray, name: str) -> Trace:
    """``t`` with the API calls at ``rows`` renamed ``name``."""
    api = t.api_calls.copy()
    api["name"] = with_category(api["name"], name)
    api.loc[api.index[rows], "name"] = name
    return dataclasses.replace(t, api_calls=api)


def test_a_capture_that_does_not_fit_its_replays_ties_nothing(h200) -> None:
    """The tie is by order, so it is refused wherever order could mislead: a capture
    with a launch more or less than the replay has work, or one forked into branches."""
    t = h200["graph_capture"]
    names = t.api_calls["name"].astype(str).to_numpy()
    start = t.api_calls["start"].to_numpy()
    begin = start[names == "cudaStreamBeginCapture"][0]
    end = start[names == "cudaStreamEndCapture"][0]
    inside = (start > begin) & (start < end)
    one_launch = np.flatnonzero(inside & (names == "cudaLaunchKernel"))[:1]
    one_query = np.flatnonzero(inside & (names == "cudaStreamIsCapturing"))[:1]
    for changed in (
        _renamed(t, one_launch, "cudaStreamIsCapturing"),  # 14 nodes for 15 kernels
        _renamed(t, one_query, "cudaLaunchKernel"),  # 16 nodes
        _renamed(t, one_query, "cudaStreamWaitEvent"),  # a branch joins the capture
    ):
        acts = analyze(changed).activities
        replayed = acts[acts["graph_replay"].to_numpy(bool)]
        assert len(replayed) == 165 and not replayed["graph_recorded"].any()
        # the first replay ran inside a range of the script's, the other ten in none
        assert replayed["op_name"].astype(str).value_counts().to_dict() == {
            GRAPH_REPLAY_PREFIX + "unknown": 150,
            "graph.first_replay/" + GRAPH_REPLAY_PREFIX + "unknown": 15,
        }
