"""Real TensorFlow 2.21 (CPU): custom training loops captured with ``tf.profiler``.

Through ``make_capturer("tf", ...)`` and the plugin's iteration loop; the
reader's op totals are checked against TensorFlow's own XSpace protobuf
classes. Skipped without TensorFlow (``pip install -e ".[tf]"``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow", reason='TensorFlow is not installed: pip install -e ".[tf]"')

from framework_helpers import calls_per_iteration, capture_steps, compare  # noqa: E402

from perfguard.capture.frameworks import framework_for  # noqa: E402
from perfguard.trace.xplane import read_xplane  # noqa: E402


def _eager_step(matmuls: int):
    x = tf.random.normal((32, 64), seed=1)
    w = tf.Variable(tf.random.normal((64, 64), seed=2) * 0.1)

    def step() -> None:
        with tf.GradientTape() as tape:
            y = x
            for _ in range(matmuls):
                y = tf.matmul(y, w)
            loss = tf.reduce_sum(y)
        w.assign_sub(0.001 * tape.gradient(loss, w))

    return step


def _graph_step():
    x = tf.random.normal((32, 64), seed=1)
    w = tf.Variable(tf.random.normal((64, 16), seed=2))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)))
        w.assign_sub(0.01 * tape.gradient(loss, w))

    step()  # traced before the capture, as warm-up would
    return step


def test_custom_loop_eager_ops_and_iterations(tmp_path: Path) -> None:
    a, _ = capture_steps("tf", tmp_path / "eager", _eager_step(1), iterations=4)
    assert list(a.iterations["iteration"]) == [0, 1, 2, 3]
    ops = a.ops.set_index("op_name")
    # forward matmul, and the gradient's matmul for the variable (the input needs none)
    assert calls_per_iteration(a, "MatMul").tolist() == [2] * 4
    assert ops.loc["AssignSubVariableOp", "calls"] == 4
    assert (a.iterations["op_calls"] == a.iterations["op_calls"].iloc[0]).all()
    assert "SyncDevice" not in ops.index  # no device sync on a CPU-only machine


def test_custom_loop_tf_function_graph_ops(tmp_path: Path) -> None:
    a, _ = capture_steps("tf", tmp_path / "graph", _graph_step(), iterations=3)
    assert list(a.iterations["iteration"]) == [0, 1, 2]
    inst = a.instances
    by_name = inst.groupby("name").size()
    assert by_name["MatMul"] == 3 and by_name["gradient_tape/MatMul/MatMul"] == 3
    assert set(inst.loc[inst["name"].str.startswith("gradient_tape/"), "direction"]) == {"bprop"}
    assert inst["iteration"].notna().all()
    assert set(inst.loc[inst["name"] == "Relu", "op_type"]) == {"Relu"}


def test_doubling_a_matmul_shows_in_the_per_op_figures(tmp_path: Path) -> None:
    base = capture_steps("tf", tmp_path / "one", _eager_step(1), iterations=5)
    head = capture_steps("tf", tmp_path / "two", _eager_step(2), iterations=5)
    # forward 1 -> 2 matmuls, gradient 1 -> 3 (two for the weight, one through the chain)
    assert calls_per_iteration(base[0], "MatMul").tolist() == [2] * 5
    assert calls_per_iteration(head[0], "MatMul").tolist() == [5] * 5
    ops = compare(base, head).set_index("op_name")
    assert ops.loc["MatMul", "calls_baseline"] == 2 and ops.loc["MatMul", "calls_current"] == 5


def test_reader_totals_equal_tensorflows_own_protobuf_classes(tmp_path: Path) -> None:
    a, _ = capture_steps("tf", tmp_path / "own", _graph_step(), iterations=3)
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString((tmp_path / "own.xplane.pb").read_bytes())
    (host,) = [p for p in space.planes if p.name == "/host:CPU"]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for line in host.lines:
        for ev in line.events:
            md = host.event_metadata[ev.metadata_id]
            if md.display_name and md.name.endswith(":" + md.display_name):
                t = totals[md.name[: -len(md.display_name) - 1]]
                t[0] += 1
                t[1] += (ev.offset_ps + ev.duration_ps) // 1000 - ev.offset_ps // 1000
    r = read_xplane(tmp_path / "own.xplane.pb").ranges
    tf_ops = r[(r["category"] == "tf_op")]
    got = (
        tf_ops.assign(ns=tf_ops["end"] - tf_ops["start"]).groupby("name")["ns"].agg(["size", "sum"])
    )
    assert {k: [int(v["size"]), int(v["sum"])] for k, v in got.iterrows()} == dict(totals)
    assert len(totals) >= 6


def test_framework_for_a_tensorflow_test_module() -> None:
    import sys

    assert framework_for(sys.modules[__name__]) == "tf"
