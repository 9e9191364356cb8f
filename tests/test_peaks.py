"""GPU peak table, device-name matching and efficiency figures (perfguard.analysis.peaks)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfguard.analysis import metrics
from perfguard.analysis.peaks import (
    PEAKS,
    match_gpu,
    peak_bandwidth,
    peak_flops,
    peak_flops_series,
    why_unknown,
)

#: Every device name recorded in shared/fixtures (nsys TARGET_INFO_GPU -> Trace.devices, Kineto
#: deviceProperties -> Trace.devices) and the key it must resolve to. None: not in the reference
#: table, with a reason.
FIXTURE_DEVICES = {
    "NVIDIA A100-PG509-200": "A100-SXM4-40GB",  # A100 SXM4 board; 42.3e9 B, 108 SMs, cc 8.0
    "NVIDIA H100 80GB HBM3": "H100-SXM",
    "Tesla V100-SXM2-32GB": "V100-SXM2",
    "Tesla V100-SXM2-16GB": "V100-SXM2",
    "Tesla V100-DGXS-32GB": None,  # DGX Station V100: no row in the reference
    "Quadro RTX 6000": None,  # Turing workstation card: no row in the reference
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA H200": "H200",
}


def _check_devices(trace) -> None:
    devices = trace.devices.dropna(subset=["name"])
    for name, mem in zip(devices["name"], devices["memory_bytes"], strict=True):
        assert name in FIXTURE_DEVICES, f"new fixture device {name!r}: add it to FIXTURE_DEVICES"
        expected = FIXTURE_DEVICES[name]
        assert match_gpu(name) == expected
        memory = None if pd.isna(mem) else int(mem)
        assert match_gpu(name, memory) == expected
        if expected is None:
            assert why_unknown(name)
        else:
            assert why_unknown(name) == ""
            assert peak_flops(name, "fp32", tensor_core=False) is not None


def test_kineto_fixture_devices(kineto_file, cached_trace) -> None:
    _check_devices(cached_trace(kineto_file))


def test_nsys_fixture_devices(nsys_file, cached_trace) -> None:
    _check_devices(cached_trace(nsys_file))


# Reference §4 "Reading the GPU name": the strings torch.cuda.get_device_name() / nvidia-smi give.
REFERENCE_NAMES = {
    "Tesla V100-SXM2-16GB": "V100-SXM2",
    "Tesla V100-SXM2-32GB": "V100-SXM2",
    "Tesla V100-PCIE-16GB": "V100-PCIe",
    "Tesla V100-PCIE-32GB": "V100-PCIe",
    "Tesla V100S-PCIE-32GB": "V100S-PCIe",
    "Tesla V100-FHHL-16GB": None,
    "Tesla T4": "T4",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": "A10G",
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB",
    "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB",
    "NVIDIA L4": "L4",
    "NVIDIA L40": None,
    "NVIDIA L40S": "L40S",
    "NVIDIA H100 80GB HBM3": "H100-SXM",
    "NVIDIA H100 PCIe": "H100-PCIe",
    "NVIDIA H100 NVL": "H100-NVL",
    "NVIDIA H200": "H200",
    "NVIDIA H200 NVL": "H200-NVL",
    "NVIDIA B200": "B200",
}


@pytest.mark.parametrize(("name", "key"), REFERENCE_NAMES.items())
def test_reference_name_list(name: str, key: str | None) -> None:
    assert match_gpu(name) == key
    assert match_gpu(name.upper()) == key  # matching is case-insensitive
    assert match_gpu(f"  {name} ") == key
    assert (why_unknown(name) == "") == (key is not None)


def test_name_pitfalls() -> None:
    # reference §4: the naive substring "l4" matches "L40S"; "a10" matches "A100"
    assert match_gpu("NVIDIA L40S") == "L40S"
    assert match_gpu("NVIDIA A100-SXM4-40GB") != "A10"
    assert match_gpu("NVIDIA H100 PCIe") != "H100-SXM"
    # PG509 boards: the suffix seen in the fixture is the 40 GB part; the memory size decides
    assert match_gpu("NVIDIA A100-PG509-210", memory_bytes=85_000_000_000) == "A100-SXM4-80GB"
    assert match_gpu("NVIDIA A100-PG509-210") is None
    assert "memory" in why_unknown("NVIDIA A100-PG509-210")
    # keys are accepted as names
    assert all(match_gpu(k) == k for k in PEAKS)


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "NVIDIA GH200 480GB",
        "NVIDIA H100",
        "AMD Instinct MI300X",
        "",
        "NVIDIA GeForce RTX 4090",
    ],
)
def test_unknown_names_have_a_reason(name: str) -> None:
    assert match_gpu(name) is None
    assert peak_flops(name, "bf16", tensor_core=True) is None
    assert peak_bandwidth(name) is None
    assert why_unknown(name)


T = 1e12
# (gpu, dtype, tensor_core, value) exactly as in reference §4 (dense rates).
SPOT = [
    ("A100-SXM4-40GB", "bf16", True, 312 * T),
    ("A100-SXM4-40GB", "fp16", True, 312 * T),
    ("A100-SXM4-40GB", "tf32", True, 156 * T),
    ("A100-SXM4-40GB", "fp32", True, 156 * T),  # fp32 operands on TC = TF32
    ("A100-SXM4-40GB", "fp32", False, 19.5 * T),
    ("A100-SXM4-40GB", "fp64", False, 9.7 * T),
    ("A100-SXM4-40GB", "fp64", True, 19.5 * T),
    ("A100-SXM4-40GB", "int8", True, 624 * T),
    ("A100-SXM4-80GB", "bf16", True, 312 * T),
    ("A100-PCIe-80GB", "bf16", True, 312 * T),
    ("H100-SXM", "bf16", True, 989.4 * T),
    ("H100-SXM", "tf32", True, 494.7 * T),
    ("H100-SXM", "fp8", True, 1979 * T),
    ("H100-SXM", "int8", True, 1979 * T),
    ("H100-SXM", "fp32", False, 67 * T),
    ("H100-SXM", "fp64", False, 34 * T),
    ("H100-SXM", "fp64", True, 67 * T),
    ("H100-SXM", "fp16", False, 133.8 * T),
    ("H100-PCIe", "bf16", True, 756 * T),
    ("H100-PCIe", "fp8", True, 1513 * T),
    ("H100-PCIe", "fp32", False, 51 * T),
    ("H100-NVL", "bf16", True, 835.5 * T),
    ("H200", "bf16", True, 989.4 * T),
    ("H200-NVL", "fp8", True, 1670 * T),
    ("B200", "bf16", True, 2250 * T),
    ("B200", "fp8", True, 4500 * T),
    ("B200", "fp32", False, 75 * T),
    ("V100-SXM2", "fp16", True, 125 * T),
    ("V100-SXM2", "fp32", False, 15.7 * T),
    ("V100-PCIe", "fp16", True, 112 * T),
    ("V100S-PCIe", "fp16", True, 130 * T),
    ("T4", "fp16", True, 65 * T),
    ("T4", "int8", True, 130 * T),
    ("T4", "fp32", False, 8.1 * T),
    ("A10", "tf32", True, 62.5 * T),
    ("A10", "bf16", True, 125 * T),
    ("L4", "tf32", True, 60 * T),  # not marin's sparse 120
    ("L4", "fp8", True, 242 * T),
    ("L40S", "bf16", True, 362 * T),
    ("L40S", "fp32", False, 91.6 * T),
]


@pytest.mark.parametrize(("gpu", "dtype", "tc", "value"), SPOT)
def test_spot_values_equal_the_reference(gpu, dtype, tc, value) -> None:
    assert peak_flops(gpu, dtype, tc) == pytest.approx(value, rel=1e-12)


def test_peak_by_device_name_and_dtype_spellings() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16", True) == pytest.approx(989.4 * T)
    assert peak_flops("NVIDIA A100-PG509-200", "torch.bfloat16", True) == pytest.approx(312 * T)
    assert peak_flops("NVIDIA H200", "c10::BFloat16", True) == pytest.approx(989.4 * T)
    assert peak_flops("A100-SXM4-40GB", "float", False) == pytest.approx(19.5 * T)


@pytest.mark.parametrize(
    ("gpu", "bandwidth"),
    [
        ("V100-SXM2", 900e9),
        ("T4", 320e9),
        ("A10", 600e9),
        ("A10G", 600e9),
        ("A100-SXM4-40GB", 1555e9),
        ("A100-SXM4-80GB", 2039e9),
        ("A100-PCIe-80GB", 1935e9),
        ("L4", 300e9),
        ("L40S", 864e9),
        ("H100-SXM", 3.35e12),
        ("H100-PCIe", 2.0e12),
        ("H200", 4.8e12),
        ("B200", 7.7e12),
        ("NVIDIA A100-PG509-200", 1555e9),
    ],
)
def test_bandwidth(gpu: str, bandwidth: float) -> None:
    assert peak_bandwidth(gpu) == pytest.approx(bandwidth)


@pytest.mark.parametrize(
    ("gpu", "dtype", "tc", "why"),
    [
        ("V100-SXM2", "bf16", True, "no Tensor-Core peak for bf16"),  # Volta: fp16 only
        ("T4", "tf32", True, "no Tensor-Core peak"),
        ("A100-SXM4-40GB", "fp8", True, "no Tensor-Core peak for fp8"),  # Hopper+ / Ada
        ("H100-SXM", "bf16", False, "no CUDA-core (non-Tensor-Core) path for bf16"),
        ("H100-SXM", "tf32", False, "no CUDA-core"),
        ("A10G", "bf16", True, "no Tensor-Core peak"),  # A10G is not an A10
        ("H100-SXM", "int4", True, "no peak for dtype"),
    ],
)
def test_missing_paths_are_none_with_reason(gpu, dtype, tc, why) -> None:
    assert peak_flops(gpu, dtype, tc) is None
    assert why in why_unknown(gpu, dtype, tc)


def test_table_is_dense_not_sparse() -> None:
    """Reference §0: datasheets print 2:4-sparse TC rates from Ampere on; the table halves them.
    A dense TF32 rate is half the dense FP16 rate on every part the reference lists both for."""
    for key, row in PEAKS.items():
        if row.tf32_tc and row.fp16_tc:
            assert row.tf32_tc == pytest.approx(row.fp16_tc / 2, rel=0.03), key
        if row.fp8_tc and row.fp16_tc:
            assert row.fp8_tc == pytest.approx(row.fp16_tc * 2, rel=0.03), key
        assert row.source, key


def test_efficiency_and_rates_are_na_safe() -> None:
    """The metrics' definitions on the peaks: no time or an unknown peak gives NaN."""
    flops = pd.Series([312e9, np.nan, 1e9, 5e9], index=[3, 4, 5, 6])
    seconds = metrics.gpu_seconds(pd.Series([1e6, 1e6, 0, np.nan], index=[3, 4, 5, 6]))
    a100 = peak_flops("A100-SXM4-40GB", "bf16", True)
    assert a100 is not None
    eff = metrics.flop_efficiency(flops, seconds * a100)
    assert eff.iloc[0] == pytest.approx(100.0)  # 312 GFLOP in 1 ms on a 312 TFLOP/s part
    assert eff.iloc[1:].isna().all()
    assert list(eff.index) == [3, 4, 5, 6]
    assert metrics.flop_efficiency(flops, seconds * np.nan).isna().all()  # unknown peak
    tf = metrics.achieved_tflops(flops, seconds)
    assert tf.iloc[0] == pytest.approx(312.0) and tf.iloc[1:].isna().all()
    bw = metrics.achieved_bandwidth(np.array([2e9]), metrics.gpu_seconds(np.array([1e6])))
    assert bw[0] == pytest.approx(2e12)
    h100 = peak_bandwidth("H100-SXM")
    assert h100 is not None
    be = metrics.flop_efficiency(3.35e9, metrics.gpu_seconds(1e6) * h100)
    assert be == pytest.approx(100.0)
    assert np.isnan(metrics.flop_efficiency(1e12, 0.0))


def test_peak_flops_series() -> None:
    dtypes = pd.Series(["bf16", "fp32", "fp32", None, "fp8"], index=list("abcde"))
    tc = pd.Series([True, True, False, True, True], index=dtypes.index)
    got = peak_flops_series("NVIDIA A100-SXM4-80GB", dtypes, tc)
    assert list(got.index) == list("abcde")
    assert got["a"] == 312e12 and got["b"] == 156e12 and got["c"] == 19.5e12
    assert pd.isna(got["d"]) and pd.isna(got["e"])  # no dtype; no FP8 on Ampere
    assert peak_flops_series("Quadro RTX 6000", dtypes, True).isna().all()
