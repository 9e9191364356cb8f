"""perfguard's FLOPs of XLA ops (from the HLO in the XSpace) against XLA's cost analysis.

For a few jitted steps, captures ``--iterations`` steps with the JAX capturer the
plugin uses, reads the XSpace, and compares the FLOPs the analysis gives per
iteration (summed over ops) with ``jax.jit(f).lower(*args).compile().cost_analysis()``.
perfguard counts dots and convolutions; XLA also counts elementwise ops (one FLOP
per element), so the two agree exactly on a step of dots and differ by the
elementwise work elsewhere, which the table shows.

    PYTHONPATH=. python benchmarks/xla_flops.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

from perfguard.analysis import analyze
from perfguard.capture.jax import JaxCapturer
from perfguard.trace import load_trace


def steps() -> dict[str, tuple]:
    k = jax.random.PRNGKey(0)
    x, w1, w2 = jax.random.normal(k, (32, 256)), jnp.ones((256, 512)), jnp.ones((512, 256))
    img, ker = jnp.ones((8, 32, 32, 16)), jnp.ones((3, 3, 16, 32))

    def conv(a, b):
        return jax.lax.conv_general_dilated(
            a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    return {
        "two matmuls": (lambda x, a, b: (x @ a) @ b, (x, w1, w2)),
        "mlp (matmul, tanh, matmul)": (lambda x, a, b: jnp.tanh(x @ a) @ b, (x, w1, w2)),
        "mlp + bias + sum": (lambda x, a, b: (jnp.tanh(x @ a + 1.0) @ b).sum(), (x, w1, w2)),
        "conv 3x3": (conv, (img, ker)),
    }


def main(iterations: int = 3) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; jax {jax.__version__}, {jax.default_backend()}")
    print(f"{'step':30s} {'perfguard':>14s} {'XLA cost':>14s} {'ratio':>7s}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, (fn, args)) in enumerate(steps().items()):
            f = jax.jit(fn)
            xla = float(f.lower(*args).compile().cost_analysis()["flops"])
            f(*args).block_until_ready()
            cap = JaxCapturer(Path(tmp) / f"step{i}", "cpu")
            cap.start()
            for _ in range(iterations):
                with cap.iteration():
                    f(*args).block_until_ready()
            cap.stop()
            a = analyze(load_trace(cap.path))
            ours = float(a.ops["flops"].fillna(0).sum()) / iterations
            print(f"{label:30s} {ours:14.0f} {xla:14.0f} {ours / xla:7.4f}")


if __name__ == "__main__":
    main()
