"""``pytest --perfguard`` decides the profiler when the test's loop starts, and never judges
an empty capture silently.

Each test runs two real sessions of a small project (baseline saved, then a changed
commit): TensorFlow and JAX tests written the common way, with
``pytest.importorskip`` inside the test function (nothing in the module says which
framework), a pure-Python test, and a torch step whose float64 change is named with
its ``file:line``. The frameworks are imported only by the child sessions.
"""

from __future__ import annotations

import html
import importlib.util
from pathlib import Path

import pytest
from test_plugin_frameworks import sessions

import perfguard

TF_TEST = """
import pytest


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3)
def test_tf_step(gpuprofile):
    tf = pytest.importorskip("tensorflow")
    w = tf.ones((64, 64))

    @tf.function
    def step(x):
        for _ in range({body}):
            x = tf.tanh(x @ w)
        return x

    x = tf.ones((16, 64))
    for _ in gpuprofile.iterations():
        step(x).numpy()
"""

JAX_TEST = """
import pytest


@pytest.mark.gpuprofile(iterations=3, warmup=2, rounds=3)
def test_jax_step(gpuprofile):
    jax = pytest.importorskip("jax")
    step = jax.jit(lambda w, x: jax.numpy.tanh(x @ w).sum())
    w, x = jax.numpy.ones((64, {body})), jax.numpy.ones((16, 64))
    for _ in gpuprofile.iterations():
        step(w, x).block_until_ready()
"""

PURE_TEST = """
import pytest


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=2)
def test_pure(gpuprofile):
    for _ in gpuprofile.iterations():
        sum(range({body}))
"""

TORCH_TEST = """
import pytest
import torch

model = torch.nn.Linear(32, 32)


def forward(x):
    with torch.profiler.record_function('attn "q<k>&v" naïve→∑'):
        return torch.softmax(model(x){body}, -1)


@pytest.mark.gpuprofile(iterations=3, warmup=1, rounds=3)
def test_step(gpuprofile):
    x = torch.ones(8, 32)
    for _ in gpuprofile.iterations():
        forward(x)
"""


EXOTIC = 'attn "q<k>&v" naïve→∑'


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def _op_names(entry: dict) -> set[str]:
    return {str(op.get("op_name")) for op in entry.get("ops") or []}


def test_tf_imported_inside_the_test_is_profiled_by_tensorflow(tmp_path: Path) -> None:
    _needs("tensorflow")
    first, second, _ = sessions(tmp_path, TF_TEST, "1", "3")
    assert first["capture"].endswith(".xplane.pb"), first
    ranges = perfguard.load_trace(tmp_path / second["capture"]).ranges  # (absolute: as is)
    types = ranges["op_type"].astype(str)  # MatMul (_MklMatMul with oneDNN on a CPU)
    assert types.str.endswith("MatMul").any(), types.unique()
    assert second["outcome"] == "regressed", second["message"]
    assert {f["gate"] for f in second["gates"]["regressions"]} & {"calls", "flops"}


def test_jax_imported_inside_the_test_fails_the_flops_gate(tmp_path: Path) -> None:
    _needs("jax")
    first, second, _ = sessions(tmp_path, JAX_TEST, "64", "128")
    assert first["capture"].endswith(".xplane.pb"), first
    assert second["outcome"] == "regressed", second["message"]
    flops = [f for f in second["gates"]["regressions"] if f["gate"] == "flops"]
    assert flops, second["gates"]
    # the op's FLOPs from the module's HLO doubled with the matmul: 2*16*64*64 -> 2*16*64*128
    op = next(f for f in flops if f.get("op_name"))
    assert float(op["current"]) == pytest.approx(2 * float(op["baseline"]))
    # the jitted function's line, from the HLO's stack frames in the XSpace
    line = JAX_TEST.splitlines().index(
        "    step = jax.jit(lambda w, x: jax.numpy.tanh(x @ w).sum())"
    )
    sites = {str(o.get("call_site")) for o in second["ops"]}
    assert any(s.endswith(f"test_step.py:{line + 1}") for s in sites), sites


def test_a_pure_python_test_reads_captured_no_ops_never_unchanged(tmp_path: Path) -> None:
    _needs("torch")
    first, second, _ = sessions(tmp_path, PURE_TEST, "1000", "1000 + 0")
    assert first["outcome"] == "no-baseline" and "captured no ops" in first["message"], first
    # the same work: never "unchanged" (the timing alone would say so on a quiet machine:
    # then "not-judged"; on a busy one "noisy"), and always said why
    assert second["outcome"] != "unchanged", second
    assert second["message"].startswith("captured no ops: the test ran no PyTorch op"), second


def test_a_float64_culprit_is_named_with_its_line_and_exact_names_survive(tmp_path: Path) -> None:
    """The culprit reads ``<op> at test_step.py:N in forward: input dtypes fp32 → fp64`` in
    summary.md, N the line of the softmax (the call-site pass), not the ``def`` line;
    the ``record_function`` name torch's JSON writer loses is exact in results.json, the
    HTML report and the store."""
    _needs("torch")
    _, second, _ = sessions(tmp_path, TORCH_TEST, "", ".double()")
    assert second["outcome"] == "regressed", second["message"]
    line = next(i for i, text in enumerate(TORCH_TEST.splitlines(), 1) if "torch.softmax" in text)
    summary = (tmp_path / ".perfguard" / "summary.md").read_text().replace("\\_", "_")
    summary = html.unescape(summary)  # Markdown with HTML entities for <, & and "
    site = f"test_step.py:{line} in forward"
    culprit = f"{EXOTIC}/aten::softmax at {site}: input dtypes fp32 → fp64"
    assert culprit in summary, summary
    assert f"{EXOTIC}/aten::softmax" in _op_names(second)
    page = html.unescape((tmp_path / ".perfguard" / "report.html").read_text("utf-8"))
    assert f"{EXOTIC}/aten::softmax" in page
    assert f"<code>{site}</code>" in page  # the op table's Call site column
    assert any(op.get("call_site") == site for op in second["ops"])
    from perfguard.baseline.store import Store

    with Store(tmp_path / "baselines" / "perfguard.db", create=False) as store:
        _, records = store.load_run(1)
    stored = {str(n) for rec in records.values() for n in rec.ops["op_name"]}
    assert EXOTIC in stored and "unknown" not in stored, sorted(stored)
