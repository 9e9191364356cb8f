"""The expert systems: each detector fires on a capture built to show its
problem, stays quiet on one without it, and its evidence carries the
numbers and op names a reader needs. Plus what they say on real captures."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kineto_builder import KinetoBuilder

import perfguard
from perfguard.analysis.expert import DETECTORS, Thresholds, run_detectors

HALF = ["c10::Half", "c10::Half"]
TC_GEMM = "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn"
SIMT_GEMM = "ampere_sgemm_128x64_tn"


def _step(b: KinetoBuilder, i: int, t0: float, *, tc: bool, slow: float = 0.0) -> float:
    """One ProfilerStep: an fp16 mm with odd dims, an fp32 addmm, tiny adds, a copy,
    the data loader."""
    b.op(f"ProfilerStep#{i}", t0, 1000 + slow, cat="user_annotation")
    t = t0 + 10 + slow
    # fp16 GEMM 100x60 @ 60x30: dims not multiples of 8; TC kernel except when tc=False
    b.op("aten::mm", t, 20, args={"Input Dims": [[100, 60], [60, 30]], "Input type": HALF})
    b.launch((t + 2, 5), (t + 10, 30), TC_GEMM if tc else SIMT_GEMM)
    b.launch((t + 8, 5), (t + 45, 3), "splitKreduce_kernel<32, 16, float>")
    t += 60
    # fp32 GEMM, big: AMP not used
    b.op(
        "aten::addmm",
        t,
        20,
        args={"Input Dims": [[64], [128, 256], [256, 64]], "Input type": ["float"] * 3},
    )
    b.launch((t + 2, 5), (t + 10, 200), SIMT_GEMM)
    t += 260
    # 25 tiny kernels, far apart: launch-bound
    b.op("aten::add", t, 400)
    for k in range(25):
        b.launch((t + 1 + 15 * k, 3), (t + 5 + 15 * k, 2), "vectorized_elementwise_kernel")
    t += 420
    b.op("aten::copy_", t, 40)
    b.launch(
        (t + 1, 5),
        (t + 10, 20),
        "Memcpy HtoD (Pageable -> Device)",
        cat="gpu_memcpy",
        api="cudaMemcpyAsync",
    )
    # the next batch: 200 of the step's 1000 us in the data loader
    b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 45, 200)
    return t0 + 1000 + slow


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> perfguard.Analysis:
    b = KinetoBuilder()
    b.device("NVIDIA A100-SXM4-40GB", 8, 0)
    t = 0.0
    for i in range(1, 6):
        # step 1 is warm-up (3x slower); step 5 lost Tensor Cores
        t = _step(b, i, t, tc=i != 5, slow=2000 if i == 1 else 0) + 5
    path = b.write(tmp_path_factory.mktemp("expert") / "problems.json")
    return perfguard.analyze(perfguard.load_trace(path))


@pytest.fixture(scope="module")
def findings(problems: perfguard.Analysis) -> pd.DataFrame:
    return run_detectors(problems).set_index("check")


def test_every_planted_problem_is_found(findings: pd.DataFrame) -> None:
    assert set(findings.index) >= {
        "bad_iteration_range",
        "gpu_underutilized",
        "dataloader_bound",
        "bad_tensor_shape",
        "amp_not_used",
        "tc_lost_between_iterations",
        "splitk_fallback",
        "launch_bound_tiny_kernels",
        "memcpy_in_iterations",
    }
    assert "no_iterations" not in findings.index
    for col in ("problem", "evidence", "recommendation"):
        assert findings[col].str.len().min() > 10


def test_warm_up_iteration_names_its_number_and_ratio(findings: pd.DataFrame) -> None:
    text = findings.loc["bad_iteration_range"]
    assert "Iteration 1 looks like warm-up" in text["problem"]
    assert "3.0x" in text["problem"] and "--iter-start 2" in text["recommendation"]


def test_tc_lost_names_the_op_and_the_iteration(findings: pd.DataFrame) -> None:
    text = findings.loc["tc_lost_between_iterations"]
    assert "aten::mm: no TC kernel in iteration(s) [5]" in text["evidence"]


def test_bad_shape_names_the_dims(findings: pd.DataFrame) -> None:
    text = findings.loc["bad_tensor_shape"]
    assert "multiples of 8" in text["problem"] and "aten::mm" in text["evidence"]
    assert "[100, 60, 30]" in text["evidence"]


def test_amp_share_is_the_fp32_gemm_share_of_gpu_time(problems, findings) -> None:
    inst = problems.instances
    share = inst.loc[inst["op_type"] == "addmm", "gpu_time"].sum() / inst["gpu_time"].sum()
    assert f"{100 * share:.0f}% of GPU time is in fp32" in findings.loc["amp_not_used", "problem"]


def test_launch_bound_and_copies_carry_counts(findings: pd.DataFrame) -> None:
    assert "aten::add: 125 kernels" in findings.loc["launch_bound_tiny_kernels", "evidence"]
    assert findings.loc["memcpy_in_iterations", "problem"].startswith("1.0 host<->device")
    assert "5 kernels are split-K" in findings.loc["splitk_fallback", "problem"]


def test_thresholds_silence_detectors(problems: perfguard.Analysis) -> None:
    lax = Thresholds(
        warmup_ratio=10,
        gpu_utilization_pct=0,
        dataloader_share=1,
        tiny_kernel_min_count=10**6,
        fp32_gemm_share=1.01,
        min_gpu_share=1.0,
        min_iterations=1,
    )
    quiet = set(run_detectors(problems, lax)["check"])
    assert quiet.isdisjoint(
        {
            "bad_iteration_range",
            "gpu_underutilized",
            "dataloader_bound",
            "amp_not_used",
            "launch_bound_tiny_kernels",
            "splitk_fallback",
        }
    )


def test_amp_is_not_suggested_without_a_known_tensor_core_gpu(tmp_path: Path) -> None:
    b = KinetoBuilder()  # no deviceProperties: the GPU is unknown
    t = 0.0
    for i in range(1, 4):
        t = _step(b, i, t, tc=True) + 5
    analysis = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "t.json")))
    checks = set(run_detectors(analysis)["check"])
    assert "amp_not_used" not in checks and "tc_lost_between_iterations" not in checks


def test_no_iterations_and_missing_op_ranges(tmp_path: Path) -> None:
    b = KinetoBuilder()
    for k in range(4):
        b.launch((10 * k, 2), (10 * k + 3, 5), "k")  # kernels, no op ranges, no steps
    analysis = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "bare.json")))
    checks = run_detectors(analysis).set_index("check")
    assert "no_iterations" in checks.index
    assert "no op ranges at all" in checks.loc["emit_nvtx_missing", "problem"]


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        (
            "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
            {"gpu_underutilized", "bad_tensor_shape", "memcpy_in_iterations"},
        ),
        (
            "nsys/nsys2024.5.1_cloverleaf_no-nvtx-rows_a100x4.sqlite",
            {"no_iterations", "emit_nvtx_missing"},
        ),
    ],
)
def test_findings_on_real_captures(fixture_file, fixture: str, expected: set[str]) -> None:
    analysis = perfguard.analyze(perfguard.load_trace(fixture_file(fixture)))
    table = run_detectors(analysis)
    assert expected <= set(table["check"]), table
    assert run_detectors(analysis) is not table  # cached, but callers get their own copy
    assert len(DETECTORS) >= 12
