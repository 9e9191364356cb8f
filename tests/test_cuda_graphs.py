"""Work replayed from CUDA graphs: never silently the work of the range around the replay.

The real capture is TorchRec training on a V100 (shared/fixtures, HTA's
``trace_diff/test``): its ``CompiledFunction`` (forward) and
``CompiledFunctionBackward`` ranges replay CUDA graphs through 12
``cudaGraphLaunch`` calls. A 2022 Kineto trace numbers no graphs and records no
capture, so nothing ties a replayed kernel to the op that recorded it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfguard.analysis import Analysis, analyze
from perfguard.analysis.attribution import GRAPH_REPLAY_PREFIX, enclosing_op
from perfguard.trace import load_trace

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


def test_replayed_work_goes_to_graph_replay_not_to_the_surrounding_range(torchrec) -> None:
    a = torchrec
    api = a.trace.api_calls
    launches = api[api["name"] == "cudaGraphLaunch"]
    assert len(launches) == 12
    acts = a.activities
    replayed = acts[acts["correlation_id"].isin(launches["correlation_id"])]
    assert acts["graph_replay"].sum() == len(replayed) == 5046
    assert replayed["activity"].value_counts().to_dict() == {"kernel": 4464, "memop": 582}
    assert (replayed["range_id"] == -1).all()
    assert set(replayed["op_name"].astype(str)) == {GRAPH_REPLAY_PREFIX + "unknown"}
    # by hand: the range open around each replay is the compiled function's, which is
    # where the launch rule alone would have put 27.7 % of the GPU time
    around = enclosing_op(
        a.trace,
        launches["rank"].to_numpy(),
        launches["pid"].to_numpy(),
        launches["tid"].to_numpy(),
        launches["start"].to_numpy(),
    )
    names = a.trace.ranges["name"].astype(str).to_numpy()[around]
    assert set(names) == {"CompiledFunction", "CompiledFunctionBackward"}
    ops = a.ops.set_index("op_name")
    compiled = ops[ops.index.str.endswith(("/CompiledFunction", "/CompiledFunctionBackward"))]
    assert (compiled["gpu_time_total"] == 0).all()
    split = graph_split(a)
    assert split["replayed_share"] == pytest.approx(267_126_000 / 963_762_000)
    assert split["replayed_named_share"] == 0.0  # nothing in the capture ties them
    note = [n for n in a.notes if "cudaGraphLaunch" in n]
    assert note == [
        "5046 GPU activities (27.7 % of GPU time) were replayed from CUDA graphs (the "
        "capture numbers none): their launching call is cudaGraphLaunch, and the capture "
        "does not say which op recorded them, so they are reported as "
        "graph_replay_<graph id>, not as work of the range around the replay"
    ]
    # the per-op figures lose nothing: every activity's time is somewhere
    assert int(ops["gpu_time_total"].sum()) == 963_762_000
