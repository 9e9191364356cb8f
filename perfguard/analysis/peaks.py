"""GPU peak FLOP/s and DRAM bandwidth as data, and device-name matching.

Every number comes from ``shared/reference/tensor_cores_flops.md`` §4 ("the reference"); each
row names its source. Rates are **dense** (NVIDIA prints Ampere-and-later Tensor-Core rates "with
sparsity", 2x the dense rate; the table below is already halved). A figure the reference does not
give is None, and so is every figure of a GPU it has no row for: efficiency is then missing,
never guessed. Figures the reference itself tags ``[unverified]`` are kept and listed in the
row's ``unverified`` field.

Paths (see :func:`peak_flops`): ``tensor_core=False`` gives the CUDA-core rate (fp64, fp32,
fp16 where given); ``tensor_core=True`` gives the Tensor-Core rate (fp64 DMMA, TF32 for fp32
operands, fp16/bf16, fp8, int8). Reference §3.8: an fp32 op that ran a TC kernel is judged
against the TF32 peak, one that ran SIMT kernels against the FP32 CUDA-core peak.

Efficiency (reference §3.8): ``FLOPs / GPU time / peak * 100``; memory-bound ops:
``bytes / GPU time / bandwidth * 100``; the figures are defined in
:mod:`perfguard.analysis.metrics`, which divides by these peaks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = [
    "PEAKS",
    "GpuPeaks",
    "match_gpu",
    "peak_bandwidth",
    "peak_flops",
    "peak_flops_series",
    "why_unknown",
]

_T = 1e12  # TFLOP/s -> FLOP/s
_GB = 1e9  # GB/s -> B/s (decimal, as datasheets print them)


@dataclass(frozen=True)
class GpuPeaks:
    """Dense peak rates of one GPU model in FLOP/s (OP/s for int8) and DRAM bandwidth in B/s."""

    name: str
    compute_capability: str
    sms: int | None
    fp64: float | None = None  # CUDA cores
    fp32: float | None = None  # CUDA cores
    fp16: float | None = None  # CUDA cores (non-TC), only where the reference gives it
    fp64_tc: float | None = None
    tf32_tc: float | None = None
    fp16_tc: float | None = None
    bf16_tc: float | None = None
    fp8_tc: float | None = None
    int8_tc: float | None = None
    bandwidth: float | None = None
    unverified: tuple[str, ...] = ()  # fields the reference tags [unverified]
    source: str = ""
    notes: str = field(default="", compare=False)


def _row(key: str, **kw: object) -> tuple[str, GpuPeaks]:
    return key, GpuPeaks(name=key, **kw)  # type: ignore[arg-type]


PEAKS: dict[str, GpuPeaks] = dict(
    [
        # ref §4 row "V100 SXM2 16/32GB"; Lightning _CUDA_FLOPS V100-SXM 15.7e12 / 125e12
        _row(
            "V100-SXM2",
            compute_capability="7.0",
            sms=80,
            fp32=15.7 * _T,
            fp16_tc=125 * _T,
            bandwidth=900 * _GB,
            source="ref §4 V100 SXM2; Lightning _CUDA_FLOPS",
        ),
        # ref §4 row "V100 PCIe"; Lightning V100-PCIe 14e12 / 112e12
        _row(
            "V100-PCIe",
            compute_capability="7.0",
            sms=80,
            fp32=14 * _T,
            fp16_tc=112 * _T,
            bandwidth=900 * _GB,
            source="ref §4 V100 PCIe; Lightning _CUDA_FLOPS",
        ),
        # ref §4 row "V100S PCIe 32GB"; Lightning V100S 16.4e12 / 130e12; BW tagged [unverified]
        _row(
            "V100S-PCIe",
            compute_capability="7.0",
            sms=80,
            fp32=16.4 * _T,
            fp16_tc=130 * _T,
            bandwidth=1134 * _GB,
            unverified=("bandwidth",),
            source="ref §4 V100S PCIe; Lightning _CUDA_FLOPS",
        ),
        # ref §4 row "T4"; Lightning T4 8.1e12 / 65e12 / int8 130e12; BW 320 GB/s (sysrqmts)
        _row(
            "T4",
            compute_capability="7.5",
            sms=40,
            fp32=8.1 * _T,
            fp16_tc=65 * _T,
            int8_tc=130 * _T,
            bandwidth=320 * _GB,
            source="ref §4 T4; Lightning; sysrqmts",
        ),
        # ref §4 row "A10"; Lightning A10G (A10 datasheet) 31.2e12 / 125e12; marin tf32 62.5e12
        _row(
            "A10",
            compute_capability="8.6",
            sms=72,
            fp32=31.2 * _T,
            tf32_tc=62.5 * _T,
            fp16_tc=125 * _T,
            bf16_tc=125 * _T,
            int8_tc=250 * _T,
            bandwidth=600 * _GB,
            source="ref §4 A10; Lightning; marin; baseten (600 GB/s)",
        ),
        # ref §4 "A10G (AWS) is not an A10" (different CUDA-core/TC balance); memory the same
        _row(
            "A10G",
            compute_capability="8.6",
            sms=None,
            bandwidth=600 * _GB,
            source="ref §4 notes: baseten A10 vs A10G",
            notes="no A10G compute rates in the reference (Lightning/marin reuse A10's)",
        ),
        # ref §4 row "A100 SXM4 40GB" (FP64 9.7, FP64-TC 19.5); 1,555 GB/s (glennklockwood)
        _row(
            "A100-SXM4-40GB",
            compute_capability="8.0",
            sms=108,
            fp64=9.7 * _T,
            fp32=19.5 * _T,
            fp64_tc=19.5 * _T,
            tf32_tc=156 * _T,
            fp16_tc=312 * _T,
            bf16_tc=312 * _T,
            int8_tc=624 * _T,
            bandwidth=1555 * _GB,
            source="ref §4 A100 SXM4 40GB; Lightning; glennklockwood A100",
        ),
        # ref §4 row "A100 80GB SXM4 / PCIe" (same GA100 rates; FP64 as on the 40GB row);
        # 2,039 GB/s (glennklockwood)
        _row(
            "A100-SXM4-80GB",
            compute_capability="8.0",
            sms=108,
            fp64=9.7 * _T,
            fp32=19.5 * _T,
            fp64_tc=19.5 * _T,
            tf32_tc=156 * _T,
            fp16_tc=312 * _T,
            bf16_tc=312 * _T,
            int8_tc=624 * _T,
            bandwidth=2039 * _GB,
            source="ref §4 A100 80GB SXM4; glennklockwood A100",
        ),
        # ref §4 row "A100 80GB SXM4 / PCIe": 1,935 GB/s tagged [unverified]; Lightning "sxm and
        # pcie have same flop counts"
        _row(
            "A100-PCIe-80GB",
            compute_capability="8.0",
            sms=108,
            fp64=9.7 * _T,
            fp32=19.5 * _T,
            fp64_tc=19.5 * _T,
            tf32_tc=156 * _T,
            fp16_tc=312 * _T,
            bf16_tc=312 * _T,
            int8_tc=624 * _T,
            bandwidth=1935 * _GB,
            unverified=("bandwidth",),
            source="ref §4 A100 80GB PCIe; Lightning",
        ),
        # the reference names "NVIDIA A100-PCIE-40GB" but gives no bandwidth for it; compute
        # rates as every A100 (Lightning: "sxm and pcie have same flop counts")
        _row(
            "A100-PCIe-40GB",
            compute_capability="8.0",
            sms=108,
            fp64=9.7 * _T,
            fp32=19.5 * _T,
            fp64_tc=19.5 * _T,
            tf32_tc=156 * _T,
            fp16_tc=312 * _T,
            bf16_tc=312 * _T,
            int8_tc=624 * _T,
            bandwidth=None,
            source="ref §4 A100 rows; Lightning",
            notes="bandwidth not in the reference",
        ),
        # ref §4 row "L4" (marin's 120/242/485 are sparse, halved); 300 GB/s
        _row(
            "L4",
            compute_capability="8.9",
            sms=58,
            fp32=30.3 * _T,
            tf32_tc=60 * _T,
            fp16_tc=121 * _T,
            bf16_tc=121 * _T,
            fp8_tc=242 * _T,
            int8_tc=242 * _T,
            bandwidth=300 * _GB,
            source="ref §4 L4; marin (halved); sourcecode.com",
        ),
        # ref §4 row "L40S" (torchtitan bf16 362e12; marin fp16 733e12/2 = 366.5 differs)
        _row(
            "L40S",
            compute_capability="8.9",
            sms=142,
            fp32=91.6 * _T,
            tf32_tc=183 * _T,
            fp16_tc=362 * _T,
            bf16_tc=362 * _T,
            fp8_tc=733 * _T,
            int8_tc=733 * _T,
            bandwidth=864 * _GB,
            source="ref §4 L40S; torchtitan; marin; sourcecode.com",
        ),
        # ref §4 row "H100 SXM5 80GB" (FP64 34, FP64-TC 67); FP16 vector 133.8 (glennklockwood)
        _row(
            "H100-SXM",
            compute_capability="9.0",
            sms=132,
            fp64=34 * _T,
            fp32=67 * _T,
            fp16=133.8 * _T,
            fp64_tc=67 * _T,
            tf32_tc=494.7 * _T,
            fp16_tc=989.4 * _T,
            bf16_tc=989.4 * _T,
            fp8_tc=1979 * _T,
            int8_tc=1979 * _T,
            bandwidth=3350 * _GB,
            source="ref §4 H100 SXM5; Lightning; glennklockwood H100",
        ),
        # ref §4 row "H100 PCIe 80GB"; Lightning H100-PCIe 51e12 / 1.513e15/2; ">2,000 GB/s"
        _row(
            "H100-PCIe",
            compute_capability="9.0",
            sms=114,
            fp32=51 * _T,
            tf32_tc=378 * _T,
            fp16_tc=756 * _T,
            bf16_tc=756 * _T,
            fp8_tc=1513 * _T,
            int8_tc=1513 * _T,
            bandwidth=2000 * _GB,
            source="ref §4 H100 PCIe; Lightning; NVIDIA product brief",
        ),
        # ref §4 row "H100 NVL 94GB": FP32 and BW tagged [unverified]; torchtitan bf16 835e12
        _row(
            "H100-NVL",
            compute_capability="9.0",
            sms=None,
            fp32=60 * _T,
            tf32_tc=417.5 * _T,
            fp16_tc=835.5 * _T,
            bf16_tc=835.5 * _T,
            fp8_tc=1670 * _T,
            int8_tc=1670 * _T,
            bandwidth=3900 * _GB,
            unverified=("fp32", "bandwidth"),
            source="ref §4 H100 NVL; torchtitan",
        ),
        # ref §4 row "H200 SXM 141GB"; 4.8 TB/s (morphllm, lzwjava); torchtitan bf16 989e12
        _row(
            "H200",
            compute_capability="9.0",
            sms=132,
            fp32=67 * _T,
            tf32_tc=494.7 * _T,
            fp16_tc=989.4 * _T,
            bf16_tc=989.4 * _T,
            fp8_tc=1979 * _T,
            int8_tc=1979 * _T,
            bandwidth=4800 * _GB,
            source="ref §4 H200 SXM; torchtitan; morphllm",
        ),
        # ref §4 row "H200 NVL 141GB": FP32 tagged [unverified]; FP16 1,671 sparse (lzwjava)
        _row(
            "H200-NVL",
            compute_capability="9.0",
            sms=None,
            fp32=60 * _T,
            tf32_tc=417.5 * _T,
            fp16_tc=835.5 * _T,
            bf16_tc=835.5 * _T,
            fp8_tc=1670 * _T,
            int8_tc=1670 * _T,
            bandwidth=4800 * _GB,
            unverified=("fp32",),
            source="ref §4 H200 NVL; lzwjava",
        ),
        # ref §4 row "B200 (HGX, 1000 W)": HGX B200 table halved (TF32 2.2 PF sparse -> 1,100;
        # the row says ~1,100-1,125), FP32 75 (early sheets 80), FP64 37, 7.7 TB/s (early 8)
        _row(
            "B200",
            compute_capability="10.0",
            sms=148,
            fp64=37 * _T,
            fp32=75 * _T,
            tf32_tc=1100 * _T,
            fp16_tc=2250 * _T,
            bf16_tc=2250 * _T,
            fp8_tc=4500 * _T,
            int8_tc=4500 * _T,
            bandwidth=7700 * _GB,
            source="ref §4 B200; NVIDIA HGX B200 table (zdszero copy); torchtitan",
        ),
    ]
)

# (pattern on the lower-cased name, table key or None, reason when None). Specific names are
# tested before their substrings (reference §4 "Reading the GPU name"): h100 nvl before h100,
# a100 80gb pcie before a100, a10g before a10, l40s before l40 before l4.
_NOT_IN_TABLE = "{name!r} has no row in the reference peak table (shared/reference §4)"
_RULES: list[tuple[str, str | None, str]] = [
    (
        r"\bmig\b|\b\d+g\.\d+gb\b",
        None,
        "a MIG slice: its peak is the full GPU's scaled by its SM count, which the name lacks",
    ),
    (r"\bgh200\b|\bgb200\b|\bgb300\b|\bb300\b", None, _NOT_IN_TABLE),
    (r"h100.*\bnvl\b", "H100-NVL", ""),
    (r"h100.*(pcie|hbm2e)", "H100-PCIe", ""),  # Lightning: h100 + (pcie | hbm2e) -> PCIe
    (r"h100.*(hbm3|sxm)", "H100-SXM", ""),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"h100", None, "an H100 whose form factor (SXM, PCIe, NVL) the name does not tell"),
    (r"h200.*\bnvl\b", "H200-NVL", ""),
    (r"h200", "H200", ""),
    (r"\bb200\b", "B200", ""),
    (r"a100.*pg509", "", ""),  # resolved by _pg509()
    (r"a100.*(80gb.*pcie|pcie.*80gb)", "A100-PCIe-80GB", ""),
    (r"a100.*pcie", "A100-PCIe-40GB", ""),
    (r"a100.*80gb", "A100-SXM4-80GB", ""),
    (r"a100.*sxm4", "A100-SXM4-40GB", ""),
    (r"a100", None, "an A100 variant the name does not identify (memory size / form factor)"),
    (r"\ba10g\b", "A10G", ""),
    (r"\ba10\b", "A10", ""),
    (r"\bl40s\b", "L40S", ""),
    (r"\bl40\b", None, _NOT_IN_TABLE),
    (r"\bl4\b", "L4", ""),
    (r"\bt4\b", "T4", ""),
    (r"v100s", "V100S-PCIe", ""),
    (r"v100.*pcie", "V100-PCIe", ""),
    (r"v100.*sxm2", "V100-SXM2", ""),
    (
        r"v100.*dgxs",
        None,
        "the DGX Station V100 (DGXS) is not in the reference name list or peak table",
    ),
    (r"v100", None, "a V100 variant (e.g. FHHL) with no row in the reference peak table"),
    (r"quadro rtx 6000", None, "Turing, cc 7.5: " + _NOT_IN_TABLE),
]
_COMPILED = [(re.compile(p), key, why) for p, key, why in _RULES]

# A100-PG509-*: NVIDIA's board number of the A100 SXM4 module, reported by some drivers instead
# of "SXM4-40GB/80GB" (facebookincubator/AITemplate#749: "PG509 is reported for some A100 GPUs
# with Compute Capability 8.0"). The fixture "NVIDIA A100-PG509-200" reports 42.3e9 bytes,
# 108 SMs, cc 8.0, i.e. the 40 GB part. Other suffixes need the memory size.
_PG509_40GB_SUFFIXES = ("pg509-200",)
_GIB = 1 << 30


def _pg509(lname: str, memory_bytes: int | None) -> tuple[str | None, str]:
    if memory_bytes is not None and memory_bytes > 0:
        return ("A100-SXM4-80GB" if memory_bytes > 60 * _GIB else "A100-SXM4-40GB"), ""
    if any(s in lname for s in _PG509_40GB_SUFFIXES):
        return "A100-SXM4-40GB", ""
    return None, "an A100 SXM4 board (PG509) of unknown memory size: pass memory_bytes"


def _resolve(name: str | None, memory_bytes: int | None = None) -> tuple[str | None, str]:
    if name is None or not isinstance(name, str) or not name.strip():
        return None, "no device name recorded"
    if name in PEAKS:
        return name, ""
    lname = " ".join(name.lower().split())
    for pattern, key, why in _COMPILED:
        if pattern.search(lname):
            if key == "":
                return _pg509(lname, memory_bytes)
            return key, why.format(name=name)
    return None, f"{name!r} is not a GPU model the reference peak table knows"


def match_gpu(name: str, memory_bytes: int | None = None) -> str | None:
    """The :data:`PEAKS` key for a device name as nsys (``TARGET_INFO_GPU``) and Kineto
    (``deviceProperties``) record it, e.g. ``"NVIDIA H100 80GB HBM3"`` -> ``"H100-SXM"``; None
    when unknown (:func:`why_unknown` says why). ``memory_bytes`` (``Trace.devices``) resolves
    board-number names such as ``A100-PG509-*``."""
    return _resolve(name, memory_bytes)[0]


_DTYPE_ALIASES = {
    "fp64": "fp64",
    "float64": "fp64",
    "double": "fp64",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "c10::half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "c10::bfloat16": "bf16",
    "fp8": "fp8",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "int8": "int8",
    "signed char": "int8",
}
# (dtype, tensor_core) -> GpuPeaks field
_PATH = {
    ("fp64", False): "fp64",
    ("fp32", False): "fp32",
    ("fp16", False): "fp16",
    ("fp64", True): "fp64_tc",
    ("fp32", True): "tf32_tc",  # fp32 operands on Tensor Cores run as TF32 (reference §3.8)
    ("tf32", True): "tf32_tc",
    ("fp16", True): "fp16_tc",
    ("bf16", True): "bf16_tc",
    ("fp8", True): "fp8_tc",
    ("int8", True): "int8_tc",
}


def _field(dtype: str, tensor_core: bool) -> tuple[str | None, str]:
    d = _DTYPE_ALIASES.get(str(dtype).lower().replace("torch.", ""))
    if d is None:
        return None, f"no peak for dtype {dtype!r}"
    f = _PATH.get((d, bool(tensor_core)))
    if f is None:
        path = "Tensor-Core" if tensor_core else "CUDA-core (non-Tensor-Core)"
        return None, f"no {path} path for {d}"
    return f, ""


def peak_flops(gpu: str, dtype: str, tensor_core: bool) -> float | None:
    """Dense peak FLOP/s (OP/s for int8) of ``gpu`` (a :data:`PEAKS` key or a device name) for
    ``dtype`` (fp64/fp32/tf32/fp16/bf16/fp8/int8, or torch/Kineto spellings) on the Tensor-Core
    (``tensor_core=True``) or CUDA-core path; None when unknown (see :func:`why_unknown`)."""
    key = match_gpu(gpu)
    f, _ = _field(dtype, tensor_core)
    if key is None or f is None:
        return None
    return getattr(PEAKS[key], f)


def peak_bandwidth(gpu: str) -> float | None:
    """DRAM bandwidth of ``gpu`` in bytes/s; None when unknown."""
    key = match_gpu(gpu)
    return PEAKS[key].bandwidth if key is not None else None


def why_unknown(name: str, dtype: str | None = None, tensor_core: bool | None = None) -> str:
    """Why :func:`match_gpu` (or, with ``dtype``, :func:`peak_flops`) gives None; ``""`` when it
    does not."""
    key, why = _resolve(name)
    if key is None:
        return why
    if dtype is None:
        return ""
    f, why = _field(dtype, bool(tensor_core))
    if f is None:
        return f"{key}: {why}"
    if getattr(PEAKS[key], f) is None:
        path = "Tensor-Core" if tensor_core else "CUDA-core"
        return f"{key}: the reference gives no {path} peak for {dtype}"
    return ""


def peak_flops_series(gpu: str, dtype: pd.Series, tensor_core: pd.Series | bool) -> pd.Series:
    """:func:`peak_flops` per row (Float64, NA when unknown), vectorised over unique pairs."""
    tc = (
        pd.Series(tensor_core, index=dtype.index)
        if not isinstance(tensor_core, pd.Series)
        else tensor_core
    )
    key = pd.DataFrame({"d": dtype.astype(object), "t": tc.astype(object)}, index=dtype.index)
    out = np.full(len(key), np.nan)
    ok = key["d"].notna() & key["t"].notna()
    if ok.any():
        pairs = key[ok]
        codes, uniques = pd.factorize(pd.MultiIndex.from_frame(pairs))
        vals = np.array(
            [np.nan if (p := peak_flops(gpu, d, bool(t))) is None else p for d, t in uniques]
        )
        out[np.flatnonzero(ok.to_numpy())] = vals[codes]
    return pd.Series(pd.array(out, dtype="Float64"), index=dtype.index)
