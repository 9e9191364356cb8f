"""``pytest --perfguard`` on JAX and TensorFlow tests: the framework's profiler captures
the marked loop (the marker's ``framework=`` or what the test imported), the XSpace is
read into the Trace model, and a change to the framework code is caught by the gates.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

JAX_TEST = """
import jax
import jax.numpy as jnp
import pytest


@jax.jit
def step(w, x):
    return {body}


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3)
def test_jax_step(gpuprofile):
    w, x = jnp.ones((64, 64)), jnp.ones((16, 64))
    for _ in gpuprofile.iterations():
        step(w, x).block_until_ready()
"""

TF_TEST = """
import pytest
import tensorflow as tf

W = tf.ones((64, 64))


@tf.function
def step(x):
    return {body}


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3, framework="tf")
def test_tf_step(gpuprofile):
    x = tf.ones((16, 64))
    for _ in gpuprofile.iterations():
        step(x).numpy()
"""


KERAS_TEST = """
import keras
import numpy as np
import pytest
import tensorflow as tf


def model():
    m = keras.Sequential([keras.Input((32,)), *{body}, keras.layers.Dense(8)])
    m.compile(optimizer="sgd", loss="mse")
    return m


def data(*arrays):
    return tf.data.Dataset.from_tensor_slices(arrays).batch(16).repeat()


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3, framework="tf")
def test_fit(gpuprofile):
    m, ds = model(), data(np.ones((64, 32), "float32"), np.ones((64, 8), "float32"))
    cb = gpuprofile.keras_callback()
    m.fit(ds, epochs=1, steps_per_epoch=cb.max_steps, callbacks=[cb], verbose=0)


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3, framework="tf")
def test_predict(gpuprofile):
    m, ds = model(), data(np.ones((64, 32), "float32"))
    cb = gpuprofile.keras_callback("predict")
    m.predict(ds, steps=cb.max_steps, callbacks=[cb], verbose=0)
"""

JAX_TRANSFORMS_TEST = """
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, PartitionSpec as P


def loss(w, x):
    return jnp.sum({body})


grad = jax.jit(jax.grad(loss))
mapped = jax.pmap(lambda w, x: jnp.tanh(x @ w))
mesh = Mesh(jax.devices(), ("x",))
sharded = jax.jit(
    jax.shard_map(lambda w, x: jnp.tanh(x @ w), mesh=mesh, in_specs=(P(), P("x")), out_specs=P("x"))
)


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3)
def test_grad(gpuprofile):
    w, x = jnp.ones((64, 64)), jnp.ones((16, 64))
    for _ in gpuprofile.iterations():
        grad(w, x).block_until_ready()


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3)
def test_pmap(gpuprofile):
    w, x = jnp.ones((1, 64, 64)), jnp.ones((1, 16, 64))
    for _ in gpuprofile.iterations():
        mapped(w, x).block_until_ready()


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3)
def test_shard_map(gpuprofile):
    w, x = jnp.ones((64, 64)), jnp.ones((16, 64))
    for _ in gpuprofile.iterations():
        sharded(w, x).block_until_ready()
"""


def git(path: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


def sessions(tmp_path: Path, source: str, body: str, slower: str) -> tuple[dict, dict, str]:
    """The first test's entry of a saved session of ``body`` and of one of ``slower``."""
    docs, out = both_sessions(tmp_path, source, body, slower)
    return docs[0]["tests"][0], docs[1]["tests"][0], out


def both_sessions(tmp_path: Path, source: str, body: str, slower: str) -> tuple[list[dict], str]:
    """``results.json`` of a saved session of ``source`` with ``body``, then of one with
    ``slower``, in a new git repository; the second session's terminal output."""
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "config", "user.email", "ci@example.com")
    git(tmp_path, "config", "user.name", "CI")
    (tmp_path / ".gitignore").write_text(".perfguard/\nbaselines/\n")
    test = tmp_path / "test_step.py"
    docs = []
    for i, b in enumerate((body, slower)):
        test.write_text(source.format(body=b))
        git(tmp_path, "add", "-A")
        git(tmp_path, "commit", "-q", "-m", f"c{i}")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "--perfguard",
                *(["--perfguard-save"] if i == 0 else []),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
        )
        docs.append(json.loads((tmp_path / ".perfguard" / "results.json").read_text()))
    return docs, done.stdout


def test_jax_step_is_captured_and_a_changed_step_regresses(tmp_path: Path) -> None:
    if importlib.util.find_spec("jax") is None:  # the sessions import it, never this process
        pytest.skip('JAX is not installed: pip install -e ".[jax]"')
    first, second, out = sessions(
        tmp_path, JAX_TEST, "jnp.tanh(x @ w) @ w.T", "jnp.tanh(jnp.tanh(x @ w) @ w) @ w.T"
    )
    assert first["outcome"] == "no-baseline" and first["capture"].endswith(".xplane.pb")
    assert len(first["samples_current"]) == 9 and first["timing"]["n_current"] == 3
    assert second["outcome"] == "regressed", second["message"]
    # the second dot: its FLOPs always count against the step's; its op call only where the
    # capture saw it take the tolerance's share of the step's time (compare/weigh.py)
    found = [f for f in second["gates"]["regressions"] if f["gate"] in ("calls", "flops")]
    assert found and found[0]["op_name"].startswith("jit_step::"), second["gates"]
    assert "test_step.py::test_jax_step" in out


def test_tf_function_is_captured_and_a_changed_step_regresses(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip('TensorFlow is not installed: pip install -e ".[tf]"')
    first, second, _ = sessions(tmp_path, TF_TEST, "tf.tanh(x @ W)", "tf.tanh(tf.tanh(x @ W) @ W)")
    assert first["outcome"] == "no-baseline" and first["capture"].endswith(".xplane.pb")
    assert second["outcome"] == "regressed", second["message"]
    assert {f["gate"] for f in second["gates"]["regressions"]} & {"calls", "flops"}
    # the graph ops' creation tracebacks: the line inside the tf.function that made them
    line = next(i for i, text in enumerate(TF_TEST.splitlines(), 1) if "return {body}" in text)
    where = f"at test_step.py:{line} in step"
    first_culprit = second["explanation"]["culprits"][0]
    assert first_culprit["site"] == where, first_culprit


def by_name(doc: dict) -> dict[str, dict]:
    return {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}


def test_keras_fit_and_predict_run_the_loop_and_a_second_layer_regresses(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip('TensorFlow is not installed: pip install -e ".[tf]"')
    dense = 'keras.layers.Dense(64, activation="relu")'
    docs, out = both_sessions(tmp_path, KERAS_TEST, f"[{dense}]", f"[{dense}, {dense}]")
    first, second = by_name(docs[0]), by_name(docs[1])
    for name in ("test_fit", "test_predict"):
        t = first[name]
        assert t["outcome"] == "no-baseline" and t["capture"].endswith(".xplane.pb")
        # Keras's own batches ran the loop: 3 timed rounds of 3 steps, then the profiled one
        assert len(t["samples_current"]) == 9 and t["timing"]["n_current"] == 3
        ops = {op["op_name"].rsplit("/", 1)[-1] for op in t["profile"]["ops"]}
        assert {"MatMul", "Relu"} & ops or any("dense" in op for op in ops), ops
        # the tf.data pipeline's part of the step, its own figure
        assert t["profile"]["input_ns"] > 0
    assert "input pipeline" in (tmp_path / ".perfguard" / "report.html").read_text()
    for name in ("test_fit", "test_predict"):
        assert second[name]["outcome"] == "regressed", (name, second[name]["message"])
        assert second[name]["gates"]["regressions"], second[name]["gates"]


def test_jax_grad_pmap_and_shard_map_steps_are_captured_and_judged(tmp_path: Path) -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip('JAX is not installed: pip install -e ".[jax]"')
    docs, _ = both_sessions(
        tmp_path, JAX_TRANSFORMS_TEST, "jnp.tanh(x @ w)", "jnp.tanh(jnp.tanh(x @ w) @ w)"
    )
    first, second = by_name(docs[0]), by_name(docs[1])
    for name in ("test_grad", "test_pmap", "test_shard_map"):
        t = first[name]
        assert t["capture"].endswith(".xplane.pb") and t["profile"]["ops"], (name, t["message"])
        assert len(t["samples_current"]) == 9
    assert any(
        op["op_name"].startswith("jit_loss") or "loss" in op["op_name"]
        for op in first["test_grad"]["profile"]["ops"]
    ), first["test_grad"]["profile"]
    # only the gradient's code changed: its step regressed, the others' exact half held
    assert second["test_grad"]["outcome"] == "regressed", second["test_grad"]["message"]
    for name in ("test_pmap", "test_shard_map"):
        assert second[name]["gates"]["outcome"] == "unchanged", second[name]["gates"]
