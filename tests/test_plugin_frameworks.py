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


def git(path: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


def sessions(tmp_path: Path, source: str, body: str, slower: str) -> tuple[dict, dict, str]:
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
    return docs[0]["tests"][0], docs[1]["tests"][0], done.stdout


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
