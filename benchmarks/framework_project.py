"""The TensorFlow/Keras and JAX project ``culprits.py --project frameworks`` regresses.

Four benchmarks on the CPU, tiny sizes so a session is seconds: a Keras CNN trained by a
custom ``tf.function`` loop over a ``tf.data`` pipeline, a small Keras transformer trained
by ``model.fit`` (``gpuprofile.keras_callback()``), a JAX MLP's jitted gradient step and a
JAX attention block. Each regression of :data:`CASES` (eight per framework: the model
called twice, a layer widened, a precision change, a host sync in the step, a retrace per
step, the compiler taken away, a loop unrolled deeper, a slower input or an extra op) is an
exact text edit, with the names a reviewer should be pointed to written before any run.
A TF op is a path of its scopes (``sequential/conv2d/Conv2D``): it is right when a
component is expected. A JAX op is ``jit_<function>::<fusion>``, and XLA's fusions do not
say what they hold, so a JAX case expects its jitted function (``jit_mlp_loss::``).
"""

from __future__ import annotations

TF_MODELS = '''"""Keras models: the code under benchmark."""

import keras
import tensorflow as tf

keras.utils.set_random_seed(0)


def cnn(width=8):
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(width, 3, activation="relu", name="conv"),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(10, name="logits"),
        ]
    )


class Block(keras.layers.Layer):
    """A pre-norm transformer block: self-attention and an MLP."""

    def __init__(self, dim=32, heads=2, **kw):
        super().__init__(**kw)
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.attn = keras.layers.MultiHeadAttention(heads, dim // heads, name="attn")
        self.mlp = keras.layers.Dense(dim, activation="gelu", name="mlp")

    def call(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h)
        return x + self.mlp(self.norm(x))


def transformer(depth=2, tokens=8, dim=32):
    x = inputs = keras.Input((tokens, dim))
    for i in range(depth):
        x = Block(dim, name=f"block{i}")(x)
    out = keras.layers.Dense(4, name="head")(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse")
    return model


def images(n=64):
    x = tf.random.stateless_normal((n, 16, 16, 3), seed=(1, 2))
    y = tf.random.stateless_uniform((n,), seed=(3, 4), maxval=10, dtype=tf.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()


def sequences(n=64, tokens=8, dim=32):
    x = tf.random.stateless_normal((n, tokens, dim), seed=(5, 6))
    y = tf.random.stateless_normal((n, 4), seed=(7, 8))
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
'''

JAX_MODELS = '''"""JAX models: the code under benchmark."""

import jax
import jax.numpy as jnp

DTYPE = jnp.float32


def mlp_params(width=64, key=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(key))
    return {
        "w1": jax.random.normal(k1, (32, width), DTYPE) * 0.1,
        "w2": jax.random.normal(k2, (width, 10), DTYPE) * 0.1,
    }


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"])
    return h @ params["w2"]


def mlp_loss(params, x, y):
    logits = mlp(params, x)
    return jnp.mean((logits - y) ** 2)


@jax.jit
def mlp_step(params, x, y):
    grads = jax.grad(mlp_loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


def attention(x, depth=2):
    for _ in range(depth):
        q, k, v = x, x, x
        w = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / jnp.sqrt(x.shape[-1]), axis=-1)
        x = x + w @ v
    return x


attention_step = jax.jit(attention)
'''

TESTS = '''"""Benchmark tests: a Keras CNN and transformer, a JAX MLP and attention block."""

import jax
import jax.numpy as jnp
import pytest
import tensorflow as tf

import models_jax
import models_tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
TF, JAX = "tf", "jax"


@pytest.mark.gpuprofile(iterations={iterations}, rounds={rounds}, warmup={warmup}, framework=TF)
def test_tf_cnn(gpuprofile):
    model = models_tf.cnn()
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = iter(models_tf.images())

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        weights = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, weights), weights))
        return loss

    for _ in gpuprofile.iterations():
        x, y = next(data)
        step(x, y)


@pytest.mark.gpuprofile(iterations={iterations}, rounds={rounds}, warmup={warmup}, framework=TF)
def test_tf_transformer_fit(gpuprofile):
    model = models_tf.transformer()
    data = models_tf.sequences()
    cb = gpuprofile.keras_callback()
    model.fit(data, epochs=1, steps_per_epoch=cb.max_steps, callbacks=[cb], verbose=0)


@pytest.mark.gpuprofile(iterations={iterations}, rounds={rounds}, warmup={warmup}, framework=JAX)
def test_jax_mlp(gpuprofile):
    params = models_jax.mlp_params()
    x = jnp.ones((16, 32), models_jax.DTYPE)
    y = jnp.zeros((16, 10), models_jax.DTYPE)
    for _ in gpuprofile.iterations():
        params = models_jax.mlp_step(params, x, y)
        jax.block_until_ready(params)


@pytest.mark.gpuprofile(iterations={iterations}, rounds={rounds}, warmup={warmup}, framework=JAX)
def test_jax_attention(gpuprofile):
    x = jnp.ones((2, 8, 16), models_jax.DTYPE)
    for _ in gpuprofile.iterations():
        models_jax.attention_step(x).block_until_ready()
'''

TESTS_FILE = "test_frameworks.py"
MODELS_FILE = "models_tf.py"
HELPERS_FILE = "models_jax.py"
NAMES = ("test_tf_cnn", "test_tf_transformer_fit", "test_jax_mlp", "test_jax_attention")


def files(iterations: int, rounds: int, warmup: int) -> dict[str, str]:
    """The base commit's files: culprit_project's layout (its pytest.ini, .gitignore) with
    these models and tests."""
    from culprit_project import files as torch_files

    sizes = {"iterations": iterations, "rounds": rounds, "warmup": warmup}
    base = torch_files(iterations, rounds, warmup)
    kept = {k: v for k, v in base.items() if k in ("pytest.ini", ".gitignore")}
    return {
        MODELS_FILE: TF_MODELS,
        HELPERS_FILE: JAX_MODELS,
        TESTS_FILE: TESTS.format(**sizes),
    } | kept
