"""TensorFlow ops as one identity across sessions, with their FLOPs: real Keras models run
on the CPU under the TensorFlow capturer, compared as a PR would be.

Skipped without TensorFlow and Keras (``pip install -e ".[tf]"``).
"""

from __future__ import annotations

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
        ("gradient_tape/sequential_3/dense_1/MatMul/MatMul_1",
         "gradient_tape/sequential/dense/MatMul/MatMul"),
        ("sequential/conv2d/Conv2D", "sequential/conv2d/Conv2D"),  # digits of a name stay
        ("model/h0/x2_1/layer_norm/add", "model/h0/x2/layer_norm/add"),
        ("AddN_5", "AddN"),
        ("_1", "_1"),
    ],
)  # fmt: skip
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
    model = keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2),
    ])  # fmt: skip
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


def _record(tmp_path: Path, calls: int) -> Any:
    a, gp = capture_steps("tf", tmp_path / f"x{calls}", _keras_step(calls), iterations=3)
    return record_from_analysis(
        "test_step", a,
        wall_times_ns=np.asarray(gp.wall_times_ns), cpu_times_ns=np.asarray(gp.cpu_times_ns),
        rounds=np.asarray(gp.round_of), profiled=np.asarray(gp.profiled),
    )  # fmt: skip


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
