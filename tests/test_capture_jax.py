"""Real JAX 0.10 (CPU): a jitted step captured with ``jax.profiler`` through ``make_capturer``.

Skipped without JAX (``pip install -e ".[jax]"``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

jax = pytest.importorskip("jax", reason='JAX is not installed: pip install -e ".[jax]"')
jnp = pytest.importorskip("jax.numpy")

from framework_helpers import calls_per_iteration, capture_steps, compare  # noqa: E402

from perfguard.capture.frameworks import framework_for  # noqa: E402


def _step(matmuls: int):
    @jax.jit
    def step(w, x):
        def loss(w):
            y = x
            for _ in range(matmuls):
                y = jnp.tanh(y @ w)
            return jnp.sum(y)

        return w - 0.01 * jax.grad(loss)(w)

    state = {"w": jnp.full((64, 64), 0.01), "x": jnp.ones((32, 64))}

    def run() -> None:
        state["w"] = step(state["w"], state["x"])

    return run


def test_jitted_step_gives_hlo_ops_and_iterations(tmp_path: Path) -> None:
    a, gp = capture_steps("jax", tmp_path / "jax_step", _step(1), iterations=5)
    assert (tmp_path / "jax_step.xplane.pb").is_file()
    assert list(a.iterations["iteration"]) == [0, 1, 2, 3, 4]
    assert a.trace.meta["jax_version"] == jax.__version__
    ops = a.ops
    assert (ops["op_name"].str.startswith("jit_step::")).all()
    assert (ops["calls"] == 5).all()  # one instance of each HLO op per step
    assert (a.iterations["op_calls"] == len(ops)).all()
    assert (ops["cpu_time_total"] > 0).all()
    # XLA:CPU 0.10 keeps one of the matmul's dot products a ``dot`` and fuses the other
    # (``ynn_fusion``, YNNPACK): one of each per step; a fusion's type says what it holds
    # (its HLO opcodes, from the module's HLO in the capture)
    assert calls_per_iteration(a, "dot").tolist() == [1] * 5
    assert calls_per_iteration(a, "ynn_fusion (dot)").tolist() == [1] * 5
    kinds = set(ops["op_type"])
    assert any(k.endswith("_fusion (tanh, subtract, multiply, add)") for k in kinds), kinds


def test_doubling_a_matmul_shows_in_the_per_op_figures(tmp_path: Path) -> None:
    base = capture_steps("jax", tmp_path / "one", _step(1), iterations=5)
    head = capture_steps("jax", tmp_path / "two", _step(2), iterations=5)
    dots = calls_per_iteration(base[0], "dot"), calls_per_iteration(head[0], "dot")
    assert (dots[0] == 1).all() and (dots[1] == 2 * dots[0]).all()
    assert (head[0].iterations["op_calls"] > base[0].iterations["op_calls"]).all()
    ops = compare(base, head)
    new = ops[ops["calls_baseline"].isna() & ops["op_name"].str.contains("dot")]
    assert len(new) > 0  # the added matmul's HLO ops are new ops of the verdict


def test_framework_for_a_jax_test_module() -> None:
    assert framework_for(sys.modules[__name__]) == "jax"


def test_perfguard_profile_with_the_jax_backend(tmp_path: Path) -> None:
    """``perfguard profile --backend jax -- python train.py``: the program's own steps."""
    from perfguard.cli import main

    script = tmp_path / "train.py"
    script.write_text(
        "import jax, jax.numpy as jnp\n"
        "@jax.jit\n"
        "def step(w, x):\n"
        "    return w - 0.01 * jnp.tanh(x.T @ (x @ w))\n"
        "w, x = jnp.ones((16, 16)), jnp.ones((8, 16))\n"
        "for i in range(4):\n"
        "    with jax.profiler.StepTraceAnnotation('train', step_num=i):\n"
        "        w = step(w, x).block_until_ready()\n"
    )
    out = tmp_path / "out"
    rc = main(
        [
            "profile",
            "--backend",
            "jax",
            "--output-path",
            str(out),
            "--formats",
            "csv",
            "--reports",
            "detail,iteration",
            "--",
            sys.executable,
            str(script),
        ]
    )
    assert rc == 0 and (out / "capture.xplane.pb").is_file()
    iterations = pd.read_csv(out / "dlprof_iteration.csv")
    assert list(iterations["Iteration"]) == [0, 1, 2, 3]
    detail = pd.read_csv(out / "dlprof_detail.csv")
    steps = detail[detail["Op Name"].str.startswith("jit_step::")]
    assert len(steps) >= 2 and (steps["No. Calls"] == 4).all()  # once per step
    # the rest: jnp.ones' own small jitted computations, before the first step
    assert detail["Op Name"].str.contains("::").all()
