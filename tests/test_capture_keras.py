"""Real Keras 3 (TensorFlow backend) and ``tf.keras``: the NVTX callback in ``model.fit``.

NVTX is observed through a recording domain put in place of the real one
(no nsys here; with no tool attached the real calls are no-ops). Skipped
without TensorFlow and Keras (``pip install -e ".[tf]"``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason='TensorFlow is not installed: pip install -e ".[tf]"')
keras = pytest.importorskip("keras", reason='Keras is not installed: pip install -e ".[tf]"')

from perfguard import load_trace  # noqa: E402
from perfguard.analysis import analyze  # noqa: E402
from perfguard.capture import ranges as annotate_mod  # noqa: E402
from perfguard.capture.frameworks import make_capturer  # noqa: E402

keras_cb = importlib.import_module("perfguard.capture.keras")

EPOCHS, SAMPLES, BATCH = 2, 48, 16  # 3 train batches per epoch


class Recorder:
    """An ``nvtx.Domain`` stand-in that keeps (push|pop, message, payload)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any, Any]] = []

    def get_event_attributes(self, message: Any = None, **kw: Any) -> dict[str, Any]:
        return {"message": message, "payload": kw.get("payload")}

    def push_range(self, attributes: dict[str, Any]) -> None:
        self.log.append(("push", attributes["message"], attributes["payload"]))

    def pop_range(self) -> None:
        self.log.append(("pop", None, None))


@pytest.fixture
def nvtx(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(annotate_mod, "_nvtx_domain", lambda name: rec)
    return rec


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype("float32")
    return x, x[:, :1] * 2.0


def _model(api: Any) -> Any:
    model = api.Sequential(
        [api.Input((8,)), api.layers.Dense(4, activation="relu"), api.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model


def _pushes(rec: Recorder, message: str) -> list[Any]:
    return [p for kind, m, p in rec.log if kind == "push" and m == message]


@pytest.mark.parametrize("api", ["keras", "tf.keras"])
def test_fit_and_evaluate_give_nvtx_ranges(api: str, nvtx: Recorder) -> None:
    module = keras if api == "keras" else tf.keras
    cb = keras_cb.NvtxCallback()
    assert isinstance(cb, module.callbacks.Callback)  # the real base class, not the stand-in
    model, (x, y) = _model(module), _data()
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=[cb])
    model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=[cb])
    model.predict(x, batch_size=24, verbose=0, callbacks=[cb])
    assert _pushes(nvtx, "keras.train") == [None]
    assert _pushes(nvtx, "keras.epoch") == [0, 1]
    assert _pushes(nvtx, "perfguard.iteration") == [0, 1, 2] * EPOCHS
    assert _pushes(nvtx, "keras.test_batch") == [0, 1, 2]
    assert _pushes(nvtx, "keras.predict_batch") == [0, 1]
    depth = 0
    for kind, _, _ in nvtx.log:  # balanced, never below zero
        depth += 1 if kind == "push" else -1
        assert depth >= 0
    assert depth == 0


def test_fit_under_the_tensorflow_profiler_has_one_iteration_per_batch(tmp_path: Path) -> None:
    model, (x, y) = _model(keras), _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # trace the train function first
    cap = make_capturer("tf", tmp_path / "fit", "cpu")
    cap.start()
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        verbose=0,
        callbacks=[keras_cb.NvtxCallback(profiler_steps=True)],
    )
    cap.stop()
    assert cap.error is None, cap.error
    a = analyze(load_trace(cap.path))
    assert list(a.iterations["iteration"]) == list(range(3 * EPOCHS))
    inst = a.instances
    dense = inst[inst["name"].str.contains(r"sequential\w*/dense\w*/", regex=True)]
    grads = inst[inst["name"].str.contains("gradient_tape/")]
    assert not dense.empty and set(grads["direction"]) == {"bprop"}
    # every batch runs the same train-step graph: the same graph ops once each (the input
    # pipeline's ops run on its own threads, and land in whichever batch is running)
    graph = inst[inst["name"].str.startswith("StatefulPartitionedCall/")]
    per_batch = graph.groupby("iteration")["name"].apply(sorted)
    assert len(per_batch) == 3 * EPOCHS and len(per_batch.iloc[0]) >= 10
    assert all(names == per_batch.iloc[0] for names in per_batch)
    # the step body is a function the step calls (StatefulPartitionedCall): its ops have
    # their graph's FLOPs; the first layer, 8 -> 4 on 16 rows, its bias and ReLU fused in
    ops = a.ops.set_index("op_name")
    (relu,) = [n for n in ops.index if n.endswith("sequential/dense/Relu")]
    assert ops.loc[relu, "flops"] == 3 * EPOCHS * (2 * BATCH * 8 * 4 + 2 * BATCH * 4)
