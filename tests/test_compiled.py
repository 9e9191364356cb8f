"""torch.compile'd code under perfguard: Inductor kernels named by the aten ops they fuse.

The names come from real captures: the CPU ones from torch 2.13's Inductor C++
backend here (the plugin test compiles for real, with Debian's g++), the Triton
ones as Inductor names them on a GPU (``triton_<kind>_fused_<ops>_<n>``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from perfguard.analysis import analyze
from perfguard.trace import load_trace
from perfguard.trace.compiled import expand_compiled, fused_ops, stable_name

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("name", "ops"),
    [
        # a real C++ kernel of the plugin test's model (relu(x @ w) * 2 + 1, softmax)
        (
            "graph_0_cpp_fused__softmax_add_mul_relu_0",
            ["aten::_softmax", "aten::add", "aten::mul", "aten::relu"],
        ),
        ("triton_poi_fused_add_mul_0", ["aten::add", "aten::mul"]),
        ("triton_red_fused__softmax_1", ["aten::_softmax"]),
        # op names with "_" inside are one op, not several
        ("triton_per_fused_native_layer_norm_3", ["aten::native_layer_norm"]),
        ("cpp_fused__to_copy_add_tanh_1", ["aten::_to_copy", "aten::add", "aten::tanh"]),
        (
            "triton_poi_fused__native_batch_norm_legit_functional_relu_5",
            ["aten::_native_batch_norm_legit_functional", "aten::relu"],
        ),
        (
            "cpp_fused_convolution_backward_threshold_backward_4",
            ["aten::convolution_backward", "aten::threshold_backward"],
        ),
        ("triton_tem_fused_addmm_relu_2", ["aten::addmm", "aten::relu"]),
        ("triton_poi_fused_0", []),  # descriptive names off: nothing to name
        ("aten::add", None),
        ("triton_helper", None),
        ("cpp_CppMicroGemmFP32Vec_0", None),
    ],
)
def test_fused_ops_from_kernel_names(name: str, ops: list[str] | None) -> None:
    assert fused_ops(name) == ops


def test_names_that_change_between_equal_runs_are_made_stable() -> None:
    assert stable_name("graph_3_cpp_fused_add_0") == "cpp_fused_add_0"
    assert stable_name("## Call CompiledFxGraph fdo3crhp7hiifrvxob2u ##") == (
        "## Call CompiledFxGraph ##"
    )
    assert stable_name("aten::mm") == "aten::mm"


def test_expansion_adds_zero_length_ops_at_their_kernels_end() -> None:
    ranges = pd.DataFrame(
        {
            "name": ["## Call CompiledFxGraph abc ##", "aten::mm", "graph_0_cpp_fused_add_mul_0"],
            "start": [0, 10, 50],
            "end": [100, 40, 60],
            "kind": "op",
            "source": "kineto",
            "op_type": None,
            "bprop": False,
            "call_site": "out.py(1): call",
        }
    )
    out, notes = expand_compiled(ranges)
    assert out["name"].tolist() == [
        "## Call CompiledFxGraph ##",
        "aten::mm",
        "cpp_fused_add_mul_0",
        "aten::add",
        "aten::mul",
    ]
    assert out["start"].tolist() == [0, 10, 50, 60, 60]
    assert out["end"].tolist() == [100, 40, 60, 60, 60]
    assert out["source"].tolist()[-2:] == ["inductor", "inductor"]
    assert out["op_type"].tolist()[-2:] == ["add", "mul"]
    assert out["call_site"].tolist()[-2:] == [None, None]
    assert len(notes) == 1 and "1 compiled kernel call(s)" in notes[0]
    plain = ranges.assign(name=["a", "b", "c"])
    assert expand_compiled(plain)[0] is plain  # nothing compiled: untouched


def test_real_triton_capture_names_its_aten_ops_and_keeps_the_kernel_time() -> None:
    """A real GPU capture of a compiled step (HTA's, tests/data/MANIFEST.md): the Triton
    kernel stays with the launcher's range; add, cos and sin are calls beside it."""
    path = Path(__file__).parent / "data" / "hta_triton_example.pt.trace.json.gz"
    ops = analyze(load_trace(path)).ops.set_index("op_name")
    region = "Torch-Compiled Region: 0/0/"
    kernel = ops.loc[region + "triton_poi_fused_add_cos_sin_0"]
    assert (kernel["kernel_count"], kernel["gpu_time_total"]) == (1, 1760)  # 1.76 us
    fused = ops.loc[[region + f"aten::{op}" for op in ("add", "cos", "sin")]]
    assert (fused["calls"] == 1).all()
    assert (fused[["kernel_count", "gpu_time_total", "cpu_time_total"]] == 0).all().all()
    assert ops["gpu_time_total"].sum() == 1760  # no GPU time made or lost


def test_real_h200_compiled_kernels_name_the_aten_ops_inductor_says_they_fuse() -> None:
    """Our own H200 run (tests/data/MANIFEST.md, torch 2.11): each Triton kernel's fused
    ops, read from its name, are the ``Original ATen`` ops Inductor's output code lists
    for it, and the per-op table holds those ops with every kernel's time kept."""
    h200 = Path(__file__).parent / "data" / "gpu_h200"
    code = (h200 / "inductor_default" / "output_code.py.txt").read_text()
    # "# ... Original ATen: [aten.view, aten.gelu]", comment lines, then
    # "triton_poi_fused_gelu_view_1 = async_compile.triton(..."
    said = {
        m.group(2): sorted({f"aten::{op.strip()[5:]}" for op in m.group(1).split(",")})
        for m in re.finditer(
            r"Original ATen: \[([^\]]*)\]\n(?:#.*\n)*(triton_\w+) = async_compile", code
        )
    }
    a = analyze(load_trace(h200 / "compile_default.pt.trace.json.gz"))
    triton = sorted(set(a.trace.kernels["name"].astype(str)) - {""})
    triton = [k for k in triton if k.startswith("triton_")]
    assert len(triton) == 5 and set(triton) <= set(said)
    for kernel in triton:
        assert sorted(fused_ops(kernel)) == said[kernel], kernel
    ops = a.ops.set_index("op_name")
    graph = "Torch-Compiled Region: 0/0/## Call CompiledFxGraph ##/"
    calls = {
        op: int(ops.loc[graph + op, "calls"])
        for op in ("aten::native_layer_norm", "aten::gelu", "aten::add", "aten::view")
    }
    # 10 iterations: layer norm in 3 kernels, gelu in 3 (one kernel run 3 times), add in
    # 3, view in 6
    assert calls == {
        "aten::native_layer_norm": 30,
        "aten::gelu": 30,
        "aten::add": 30,
        "aten::view": 60,
    }
    assert int(ops.loc[graph + "aten::addmm", "kernel_count"]) == 60  # cuBLAS, not fused
    acts = a.activities
    assert int(ops["gpu_time_total"].sum()) == int((acts["end"] - acts["start"]).sum())


# ------------------------------------------------------------- a real torch.compile


MODEL = """
import pytest
import torch

torch.set_num_threads(1)
DTYPE = torch.{dtype}
W = torch.randn(16, 16, dtype=DTYPE)


@torch.compile
def step(x):
    y = torch.relu(x @ W) * 2 + 1
    return {tail}.softmax(-1)


@pytest.mark.gpuprofile(iterations=2, rounds=2, warmup=1)
def test_compiled(gpuprofile):
    x = torch.randn(8, 16, dtype=DTYPE)
    for _ in gpuprofile.iterations():
        step(x)
"""
#: what the plugin is to call at session start (the capture layer's switch)
CONFTEST = """
from perfguard.capture.torch_profiler import record_compiled_kernels

record_compiled_kernels()
"""


def _git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _commit(pytester: pytest.Pytester, *, dtype: str, tail: str) -> None:
    pytester.makepyfile(test_model=MODEL.format(dtype=dtype, tail=tail))
    _git(pytester.path, "add", "-A", "--", ".", ":!baselines", ":!.perfguard")
    _git(pytester.path, "commit", "-q", "-m", f"{dtype} {tail}")


def _run(pytester: pytest.Pytester, *args: str) -> dict:
    # a fresh interpreter per session, as in CI: torch.compile state is per process
    r = pytester.runpytest_subprocess("--perfguard", "-p", "no:cacheprovider", *args)
    assert r.ret in (0, 1), "\n".join(r.outlines[-30:] + r.errlines[-30:])
    doc = json.loads((pytester.path / ".perfguard" / "results.json").read_text())
    (entry,) = doc["tests"]
    return entry


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on a CPU needs g++")
def test_compiled_model_in_aten_ops_and_regressions_inside_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a cache of this test's own: compiled code of another test or run is not reused
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(CONFTEST)
    for args in (
        ("init", "-q", "-b", "main"),
        ("config", "user.email", "ci@example.com"),
        ("config", "user.name", "CI"),
        ("config", "commit.gpgsign", "false"),
    ):
        _git(pytester.path, *args)

    _commit(pytester, dtype="float32", tail="y")
    base = _run(pytester, "--perfguard-save")
    assert base["outcome"] == "no-baseline"
    # the per-op table of the saved capture speaks in the model's aten ops, beside the
    # kernel that fused them (which keeps the time): one call each per recorded iteration
    trace = load_trace(base["capture"])
    table = analyze(trace).ops.set_index("op_name")
    graph = "Torch-Compiled Region: 0/0/## Call CompiledFxGraph ##/"
    kernel = "cpp_fused__softmax_add_mul_relu_0"
    fused = table.loc[
        [graph + op for op in ("aten::_softmax", "aten::add", "aten::mul", "aten::relu")]
    ]
    assert (fused["calls"] == 2).all() and (fused["cpu_time_total"] == 0).all()
    assert table.at[graph + kernel, "calls"] == 2 and table.at[graph + kernel, "cpu_time_total"] > 0
    assert table.at[graph + "aten::mm", "calls"] == 2  # a matmul stays an aten call
    assert any("compiled kernel call(s)" in n for n in trace.notes)

    # an extra op inside the compiled function: fused into the same kernel, so only the
    # kernel's name changes; the gates see one more aten op call per iteration
    _commit(pytester, dtype="float32", tail="y.tanh()")
    extra = _run(pytester)
    assert extra["outcome"] == "regressed", extra["message"]
    calls = [f for f in extra["gates"]["regressions"] if f["gate"] == "calls"]
    assert calls, extra["gates"]
    assert calls[0]["current"] - calls[0]["baseline"] == pytest.approx(1.0)
    assert "aten::tanh 0 → 1" in extra["gates"]["message"], extra["gates"]["message"]

    # float64 inside the compiled function: the matmul it keeps as an aten call changes
    # its input dtypes (same op: the graph's hash is not part of its name)
    _commit(pytester, dtype="float64", tail="y")
    wide = _run(pytester)
    assert wide["outcome"] == "regressed", wide["message"]
    dtypes = [f for f in wide["gates"]["regressions"] if f["gate"] == "dtypes"]
    assert dtypes and dtypes[0]["op_name"].endswith("/aten::mm"), wide["gates"]
    assert (dtypes[0]["baseline"], dtypes[0]["current"]) == ("fp32", "fp64")
