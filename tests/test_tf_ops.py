"""TensorFlow ops as one identity across sessions, with their FLOPs: real Keras models run
on the CPU under the TensorFlow capturer, compared as a PR would be.

Skipped without TensorFlow and Keras (``pip install -e ".[tf]"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfguard.trace.tf_names import op_identities

tf = pytest.importorskip("tensorflow", reason='TensorFlow is not installed: pip install -e ".[tf]"')
keras = pytest.importorskip("keras", reason='Keras is not installed: pip install -e ".[tf]"')

from framework_helpers import capture_steps  # noqa: E402

from perfguard.baseline.record import record_from_analysis  # noqa: E402
from perfguard.compare import compare_records  # noqa: E402


@pytest.mark.parametrize(
    ("name", "identity"),
    [
        ("sequential_5/dense_1_2/BiasAdd", "sequential/dense/BiasAdd"),
        (
            "gradient_tape/sequential_3/dense_1/MatMul/MatMul_1",
            "gradient_tape/sequential/dense/MatMul/MatMul",
        ),
        ("sequential/conv2d/Conv2D", "sequential/conv2d/Conv2D"),  # digits of a name stay
        ("model/h0/x2_1/layer_norm/add", "model/h0/x2/layer_norm/add"),
        ("AddN_5", "AddN"),
        ("_1", "_1"),
    ],
)
def test_uniquifying_suffixes_go_and_names_stay(name: str, identity: str) -> None:
    assert op_identities(pd.Series([name])).tolist() == [identity]


def test_a_series_numbered_from_zero_keeps_its_numbers() -> None:
    names = ["block_0/dense/MatMul", "block_1/dense/MatMul", "block_1_1/dense_2/MatMul"]
    got = op_identities(pd.Series(names)).tolist()
    assert got == ["block_0/dense/MatMul", "block_1/dense/MatMul", "block_1/dense/MatMul"]


def _keras_step(calls: int) -> Any:
    """A Keras CNN trained by a custom loop whose ``tf.function`` calls the model ``calls``
    times (built in a fresh model, as a new session would)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(2),
        ]
    )
    opt = keras.optimizers.Adam()
    x = tf.random.normal((4, 8, 8, 3), seed=1)
    y = tf.random.normal((4, 2), seed=2)

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.constant(0.0)
            for _ in range(calls):
                loss = loss + tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    step()  # traced before the capture, as warm-up would
    return step


def _record(folder: Path, calls: int) -> Any:
    a, gp = capture_steps("tf", folder / f"x{calls}", _keras_step(calls), iterations=3)
    return record_from_analysis(
        "test_step",
        a,
        wall_times_ns=np.asarray(gp.wall_times_ns),
        cpu_times_ns=np.asarray(gp.cpu_times_ns),
        rounds=np.asarray(gp.round_of),
        profiled=np.asarray(gp.profiled),
    )


def test_the_model_called_three_times_is_the_same_ops_three_times(tmp_path: Path) -> None:
    once, thrice = _record(tmp_path, 1), _record(tmp_path, 3)
    c = compare_records(thrice, once, tolerance=0.05)
    ops = c.ops.set_index("op_name")
    layer = ops[ops.index.str.contains(r"^(?:gradient_tape/)?sequential/", regex=True)]
    assert len(layer) >= 10
    # every op of the model's layers is the same op, three times as often; none added
    assert set(layer["status"]) - {"added", "removed"} == set(layer["status"])
    assert (layer["calls_current"] == 3 * layer["calls_baseline"]).all()
    assert "sequential/dense/MatMul" in ops.index or "sequential/dense/Relu" in ops.index
    # ... with three times the FLOPs, GEMMs and convolutions costed from the graph's shapes
    flops_b, flops_c = (r.ops.set_index("op_id")["flops"] for r in (once, thrice))
    ids = [i for i in layer["op_id"] if pd.notna(flops_b.get(i)) and flops_b[i] > 0]
    assert len(ids) >= 8
    assert all(flops_c[i] == 3 * flops_b[i] for i in ids)
    assert c.gates is not None and c.gates.outcome.value == "regressed"
    gated = {f.gate for f in c.gates.regressions}
    assert "flops" in gated and "dtypes" not in gated  # one name, several nodes' dtypes
    assert c.outcome.value == "regressed"


def test_the_same_step_in_two_sessions_reads_unchanged(tmp_path: Path) -> None:
    """A/A: the second model of the process runs under other scope numbers
    (``sequential_3``), its ops are the same ops with the same counters."""
    first, second = _record(tmp_path / "a", 1), _record(tmp_path / "b", 1)
    c = compare_records(second, first, tolerance=0.05)
    assert c.gates is not None and c.gates.outcome.value == "unchanged", c.gates.message
    assert not set(c.ops["status"]) & {"added", "removed"}


@contextmanager
def _remapping(on: bool) -> Iterator[None]:
    """Grappler's remapper (the pass that fuses ``MatMul -> BiasAdd -> Relu``) on or off for
    the functions first run inside (Grappler optimises a function when it first runs)."""
    tf.config.optimizer.set_experimental_options({"remapping": on})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"remapping": True})


def test_gemm_and_conv_flops_equal_tensorflows_own_count(tmp_path: Path) -> None:
    """TensorFlow's graph profiler (``float_ops``, on the graph the step traced) and the
    layers' sizes by hand give the FLOPs of the GEMMs and the forward convolution the
    capture's ops carry, each op unfused. (Its backprop convolutions it counts as if the
    output kept the input's size: 55296 for this 3x3 VALID filter gradient, where the work is
    2 x 576 x 27 = 31104, so those are left out.)"""
    from tensorflow.python.profiler import model_analyzer, option_builder

    with _remapping(False):
        step = _keras_step(1)
        a, _ = capture_steps("tf", tmp_path / "own", step, iterations=3)
    graph = step.get_concrete_function().graph
    options = (
        option_builder.ProfileOptionBuilder(option_builder.ProfileOptionBuilder.float_operation())
        .with_empty_output()
        .build()
    )
    counted = {n.name: n.float_ops for n in model_analyzer.profile(graph, options=options).children}
    kinds = {op.name: op.type for op in graph.get_operations()}
    theirs = sum(v for k, v in counted.items() if kinds.get(k) in ("MatMul", "Conv2D"))
    # conv 4x6x6x4 out, 3x3x3 window; dense 144->16, 16->2 on 4 rows: forward, then dx and dW
    conv, dense = 2 * 576 * 27, 2 * 4 * 144 * 16 + 2 * 4 * 16 * 2
    assert theirs == conv + 3 * dense == 87168
    # oneDNN runs the convolution and its bias as one op even with the remapper off
    # (``_MklNativeConv2DWithBias``): that op counts the bias as TF's profiler does, 1 per output
    (conv_bias,) = [k for k in counted if kinds[k] == "BiasAdd" and "conv2d" in k]
    assert counted[conv_bias] == 576
    ops = a.ops
    kind = ops["op_type"].astype(str)
    assert not kind.str.contains("Fused").any()
    forward = kind.str.contains(r"MatMul|Conv2D", regex=True) & ~kind.str.contains("Backprop")
    assert float(ops.loc[forward, "flops"].sum()) / 3 == theirs + counted[conv_bias]


def test_a_grappler_fusion_moves_calls_not_the_steps_flops_and_is_no_improvement(
    tmp_path: Path,
) -> None:
    """The same step unfused (remapper off) and fused: fewer op calls, the same FLOPs per
    step (a fused op counts the bias and activation it took in), and the verdict does not
    call the fall in calls an improvement, nor the FLOPs that moved into the fused op a
    regression."""
    records = []
    for on in (False, True):
        with _remapping(on):
            records.append(_record(tmp_path / str(on), 1))
    unfused, fused = records
    ran = fused.ops["op_type"].astype(str)
    assert ran.str.contains("FusedMatMul").any() and ran.str.contains("FusedConv2D").any()
    assert unfused.meta["compiled_ops"] and fused.meta["compiled_ops"]
    assert fused.ops["calls"].sum() < unfused.ops["calls"].sum()
    assert fused.ops["flops"].sum() == unfused.ops["flops"].sum()
    gates = compare_records(fused, unfused, tolerance=0.05).gates
    assert gates is not None
    assert "calls" not in {f.gate for f in gates.improvements}
    assert not {"calls", "flops"} & {f.gate for f in gates.regressions}


def test_flops_of_batched_matmul_strided_conv_mean_and_adam_by_hand(tmp_path: Path) -> None:
    """Op by op against hand counts: a batched matmul with its first operand adjoint
    (K from the transposed side), a stride-2 SAME convolution (the output's size, not the
    input's), a mean, and TensorFlow's fused Adam update (14 per element)."""
    a = tf.random.normal((2, 16, 8), seed=1)
    b = tf.random.normal((2, 16, 4), seed=2)
    image = tf.random.normal((1, 9, 9, 3), seed=3)
    kernel = tf.random.normal((3, 3, 3, 5), seed=4)
    var, m, v = (tf.Variable(tf.zeros((16, 4))) for _ in range(3))
    grad = tf.ones((16, 4))

    @tf.function
    def step() -> Any:
        prod = tf.linalg.matmul(a, b, adjoint_a=True)  # (2, 8, 4), K = 16
        conv = tf.nn.conv2d(image, kernel, strides=2, padding="SAME")  # (1, 5, 5, 5)
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=0.9,
            beta2_power=0.999,
            lr=0.01,
            beta1=0.9,
            beta2=0.999,
            epsilon=1e-7,
            grad=grad,
        )
        return tf.reduce_mean(prod) + tf.reduce_mean(conv)

    step()
    analysis, _ = capture_steps("tf", tmp_path / "ops", step, iterations=2)
    inst = analysis.instances
    per_type = inst.groupby(inst["op_type"].astype(str))["flops"].first()
    matmul = [k for k in per_type.index if "BatchMatMul" in k]
    conv = [k for k in per_type.index if k.endswith("Conv2D")]
    assert len(matmul) == 1 and per_type[matmul[0]] == 2 * 2 * 8 * 4 * 16
    assert len(conv) == 1 and per_type[conv[0]] == 2 * 25 * 5 * 3 * 3 * 3
    assert per_type["ResourceApplyAdam"] == 14 * 64
    means = inst.loc[inst["op_type"] == "Mean", "flops"]
    assert sorted(means.unique()) == [64, 125]


def test_a_node_whose_runtime_name_differs_by_its_numbers_is_found_once_unambiguous() -> None:
    from perfguard.trace.tf_graph import _by_identity, facts_of

    # model.fit's step runs ``sequential/hidden/Relu``; its traced graph names the node
    # ``sequential_1/hidden_1/Relu``: the same identity, one node, so its facts
    relu = {"type": "Relu", "in": [[16, 64]], "src": []}
    nodes = {"sequential_1/hidden_1/Relu": relu, "sequential_1/head_1/BiasAdd": {"type": "BiasAdd"}}
    canon = _by_identity(nodes)
    found = facts_of("StatefulPartitionedCall/sequential/hidden/Relu", "Relu", nodes, canon)
    assert found is not None and found["in"] == [[16, 64]]
    # two Keras layers ``dense`` and ``dense_1`` share the identity: no guess, no facts
    twins = {"s_1/dense_1/MatMul": {"type": "MatMul"}, "s_1/dense_2/MatMul": {"type": "MatMul"}}
    assert facts_of("s/dense/MatMul", "MatMul", twins, _by_identity(twins)) is None
    assert facts_of("s_1/dense_2/MatMul", "MatMul", twins, _by_identity(twins)) is not None


def test_a_step_bytes_move_under_the_tolerance_is_the_compilers_not_an_improvement(
    tmp_path: Path,
) -> None:
    """Grappler's optimizers run to a deadline, so two sessions of the same step can run
    different rewrites (the A/A catalogue, round 22: an SGD update's bytes 812 kB -> 775 kB,
    read ``improved``). On a compiled capture the step's bytes or FLOPs moving by less than
    the tolerance gate neither way; beyond it, or under a strict gate, they do."""
    import copy

    base = _record(tmp_path, 1)
    assert base.meta["compiled_ops"]

    def scaled(factor: float) -> Any:
        rec = copy.deepcopy(base)
        rows = rec.counters["counter"] == "bytes"
        rec.counters.loc[rows, "value"] = rec.counters.loc[rows, "value"] * factor
        return rec

    def found(factor: float, **gates: Any) -> set[str]:
        verdict = compare_records(scaled(factor), base, tolerance=0.05, gates=gates or None)
        assert verdict.gates is not None
        return {f.gate for f in (*verdict.gates.regressions, *verdict.gates.improvements)}

    assert "bytes" not in found(0.955) | found(1.045)
    assert "bytes" in found(1.3) and "bytes" in found(0.7)
    assert "bytes" in found(1.045, strict=["bytes"])
