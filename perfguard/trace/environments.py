"""The environment a capture records, per format: what each reader puts in ``Trace.environment``.

Each format says a different part, and only that part is filled (the rest stays unknown,
so comparing two captures never reports a field neither recorded):

* **nsys** (``TARGET_INFO_SYSTEM_ENV``, ``TARGET_INFO_GPU``): the driver (``NvDriverVersion``,
  ``52510517`` in older exports = 525.105.17), the CUDA version the driver supports
  (``CudaDriverVersion``, ``12080`` = 12.8), the CPU (``CpuDescription``) and each GPU's
  maximum SM clock (``clockRate``, Hz: the CUDA device property);
* **Kineto** (the JSON's header): the CUDA runtime and the driver's CUDA version
  (``cuda_runtime_version``/``cuda_driver_version``, ``12040`` = 12.4), NCCL
  (``distributedInfo.nccl_version``), and where a harness added torch's
  ``collect_env`` report (``metadata.system.torch_env_info``): torch, the driver, cuDNN,
  cuBLAS and NCCL wheels, the CPU model and SMT. ``deviceProperties`` name the GPUs (the
  fingerprint's part) and hold no clock;
* **XSpace**: each ``/device:GPU:N`` plane's ``clock_rate`` stat (kHz), and JAX's version
  on the ``/host:metadata`` plane.
"""

from __future__ import annotations

import re
from typing import Any

from perfguard.environment import Environment

__all__ = ["from_kineto", "from_nsys", "from_xspace"]


def _distinct(values: list[str]) -> str:
    return ", ".join(dict.fromkeys(v for v in values if v))


def _mhz(hz: Any, per_mhz: float) -> str:
    try:
        value = float(hz) / per_mhz
    except (TypeError, ValueError):
        return ""
    return f"{value:.0f} MHz" if value > 0 else ""


def _cuda(code: Any) -> str:
    """A CUDA version as CUDA codes it (1000 x major + 10 x minor): 12040 → 12.4."""
    try:
        v = int(code)
    except (TypeError, ValueError):
        return ""
    return f"{v // 1000}.{v % 1000 // 10}" if v >= 1000 else ""


def _driver(text: Any) -> str:
    """nsys's ``NvDriverVersion``: ``565.57.01``, or packed digits in older exports."""
    text = str(text or "").strip()
    if re.fullmatch(r"\d{8}", text):  # 52510517: 3 digits major, 3 minor, 2 patch
        return f"{int(text[:3])}.{int(text[3:6])}.{text[6:]}"
    return text if re.fullmatch(r"\d+(\.\d+)+", text) else ""


def from_nsys(system_env: dict[str, str], gpu_clock_hz: list[Any]) -> Environment:
    """From ``TARGET_INFO_SYSTEM_ENV`` (name → value) and ``TARGET_INFO_GPU.clockRate``."""
    cpu = system_env.get("CpuDescription", "")
    return Environment(
        driver=_driver(system_env.get("NvDriverVersion")),
        driver_cuda=_cuda(system_env.get("CudaDriverVersion")),
        cpu="" if cpu.strip().lower() in ("", "unknown") else cpu,
        max_sm_clock=_distinct([_mhz(hz, 1e6) for hz in gpu_clock_hz]),
    )


def _wheel(packages: list[Any], names: tuple[str, ...]) -> str:
    for line in packages:
        name, _, version = str(line).partition("==")
        if name.strip().lower() in names:
            return version.strip()
    return ""


def _env_info(data: dict[str, Any]) -> dict[str, Any]:
    """torch's ``collect_env`` report when a harness put it in the trace, else {}."""
    meta = data.get("metadata")
    system = meta.get("system") if isinstance(meta, dict) else None
    info = system.get("torch_env_info") if isinstance(system, dict) else None
    return info if isinstance(info, dict) else {}


def _lscpu(lines: Any, key: str) -> str:
    for line in lines if isinstance(lines, list) else []:
        name, _, value = str(line).partition(":")
        if name.strip() == key:
            return value.strip()
    return ""


def from_kineto(data: dict[str, Any]) -> Environment:
    """From a Kineto trace's header (everything outside ``traceEvents``)."""
    dist = data.get("distributedInfo")
    nccl = str(dist.get("nccl_version") or "") if isinstance(dist, dict) else ""
    info = _env_info(data)
    listed = info.get("pip_packages")
    pip: list[Any] = listed if isinstance(listed, list) else []
    threads = _lscpu(info.get("cpu_info"), "Thread(s) per core")
    return Environment(
        cuda_runtime=_cuda(data.get("cuda_runtime_version")),
        driver_cuda=_cuda(data.get("cuda_driver_version")),
        nccl=nccl or _wheel(pip, ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")),
        driver=str(info.get("nvidia_driver_version") or ""),
        torch=str(info.get("torch_version") or ""),
        cudnn=str(info.get("cudnn_version") or "")
        or _wheel(pip, ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu11")),
        cublas=_wheel(pip, ("nvidia-cublas-cu12", "nvidia-cublas-cu13", "nvidia-cublas-cu11")),
        cpu=_lscpu(info.get("cpu_info"), "Model name"),
        smt=("on" if int(threads) > 1 else "off") if threads.isdigit() else "",
    )


def from_xspace(planes: dict[str, dict[str, Any]]) -> Environment:
    """From the XSpace planes' stats (plane name → stat name → value)."""
    gpus = sorted(
        (p for p in planes if p.startswith("/device:GPU:")),
        key=lambda p: int(re.sub(r"\D", "", p) or 0),
    )
    meta = planes.get("/host:metadata", {})
    return Environment(
        max_sm_clock=_distinct([_mhz(planes[p].get("clock_rate"), 1e3) for p in gpus]),
        jax=str(meta.get("jax_version") or ""),
    )
