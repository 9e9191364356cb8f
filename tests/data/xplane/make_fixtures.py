"""Regenerate the XSpace fixtures beside this file (real CPU captures, a few KB each).

Run with TensorFlow and JAX installed (``pip install -e ".[tf,jax]"``)::

    python tests/data/xplane/make_fixtures.py

* ``tf_custom_loop.xplane.pb``: a ``tf.function`` training step (matmul, relu,
  sum, gradient, assign) run 3 times as ``Trace("train", step_num=N, _r=1)``;
* ``jax_jit_step.xplane.pb`` and ``jax_jit_step.perfetto_trace.json.gz``: one
  ``jax.profiler.trace(create_perfetto_trace=True)`` of a jitted gradient step
  run 3 times as ``StepTraceAnnotation("train", step_num=N)``;
* ``keras_fit.xplane.pb``: Keras 3 ``model.fit`` (2 epochs of 4 batches) under
  ``tf.profiler.experimental`` with perfguard's ``NvtxCallback(profiler_steps=True)``
  (Keras' own ``TensorBoard(profile_batch=...)`` needs the tensorboard package).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

TF = """
import tensorflow as tf
x = tf.random.normal((64, 128), seed=1); w = tf.Variable(tf.random.normal((128, 32), seed=2))
@tf.function
def step(x):
    with tf.GradientTape() as t:
        y = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)))
    w.assign_sub(0.01 * t.gradient(y, w))
    return y
step(x)
tf.profiler.experimental.start(LOGDIR)
for i in range(3):
    with tf.profiler.experimental.Trace("train", step_num=i, _r=1):
        step(x)
tf.profiler.experimental.stop()
"""
JAX = """
import jax, jax.numpy as jnp
@jax.jit
def step(w, x):
    return w - 0.01 * jax.grad(lambda w: jnp.sum(jax.nn.relu(x @ w)))(w)
x = jnp.ones((64, 128)); w = jnp.ones((128, 32))
w = step(w, x).block_until_ready()
with jax.profiler.trace(LOGDIR, create_perfetto_trace=True):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w = step(w, x).block_until_ready()
"""
KERAS = """
import numpy as np, keras
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32"); y = x[:, :1]
import tensorflow as tf
from perfguard.capture.keras import NvtxCallback
model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # compile the train function first
tf.profiler.experimental.start(LOGDIR)
model.fit(x, y, batch_size=16, epochs=2, verbose=0,
          callbacks=[NvtxCallback(profiler_steps=True)])
tf.profiler.experimental.stop()
"""


def capture(code: str, outputs: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", f"LOGDIR = {tmp!r}\n" + code], check=True)
        for pattern, name in outputs.items():
            (found,) = Path(tmp).rglob(pattern)
            shutil.copy(found, HERE / name)


if __name__ == "__main__":
    capture(TF, {"*.xplane.pb": "tf_custom_loop.xplane.pb"})
    capture(
        JAX,
        {
            "*.xplane.pb": "jax_jit_step.xplane.pb",
            "perfetto_trace.json.gz": "jax_jit_step.perfetto_trace.json.gz",
        },
    )
    capture(KERAS, {"*.xplane.pb": "keras_fit.xplane.pb"})
