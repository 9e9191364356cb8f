"""This machine's :class:`~perfguard.environment.Environment`, gathered once per session.

Cheap and never failing: every source is a file read, a package's metadata, one
``git --version`` and the one ``nvidia-smi -q`` the session makes anyway
(:mod:`perfguard.baseline.nvidia_smi`); any that is missing or fails leaves its fields
unknown. Nothing is imported that the tests would not import themselves: torch only when
the process has imported it already (its cuDNN and NCCL are asked then), TensorFlow and
JAX never (their versions come from the installed packages' metadata).
"""

from __future__ import annotations

import glob
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from importlib import metadata
from pathlib import Path

from perfguard import __version__
from perfguard.baseline.fingerprint import cpu_model
from perfguard.baseline.nvidia_smi import SmiReport
from perfguard.environment import Environment

__all__ = ["cpu_quota", "governor", "machine_environment", "smt"]

#: pip distributions that ship a library, newest CUDA first (the first installed one counts)
_WHEELS = {
    "cudnn": ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11"),
    "cublas": ("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11", "nvidia-cublas"),
    "nccl": ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"),
    "torch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"),
    "jax": ("jax",),
}


def _quiet(read: Callable[[], str]) -> str:
    """``read()``, or "" when it fails in any way: no probe may fail a run."""
    try:
        return read() or ""
    except Exception:  # a broken package, an odd /sys: the field stays unknown
        return ""


def _wheel(names: tuple[str, ...]) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


def _torch_libraries() -> dict[str, str]:
    """CUDA runtime, cuDNN and NCCL of the torch this process imported (none when it did not:
    importing torch costs the session seconds)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    out = {
        "torch": _quiet(lambda: str(torch.__version__)),
        "cuda_runtime": _quiet(lambda: str(torch.version.cuda or "")),
    }

    def cudnn() -> str:
        v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v and v >= 10000 else ""

    def nccl() -> str:
        if not torch.cuda.is_available():
            return ""
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)

    out["cudnn"], out["nccl"] = _quiet(cudnn), _quiet(nccl)
    return out


def _git_version() -> str:
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, timeout=5.0)
    return out.stdout.strip().removeprefix("git version ").strip()


def governor(root: str = "/sys/devices/system/cpu") -> str:
    """The CPUs' frequency governor(s), distinct, in CPU order (``performance``)."""
    files = sorted(
        glob.glob(f"{root}/cpu[0-9]*/cpufreq/scaling_governor"),
        key=lambda p: int(Path(p).parent.parent.name[3:]),
    )
    seen = dict.fromkeys(Path(f).read_text().strip() for f in files)
    return ", ".join(g for g in seen if g)


def smt(root: str = "/sys/devices/system/cpu") -> str:
    """Simultaneous multithreading: ``on``/``off`` (the kernel's ``smt/active``)."""
    active = Path(root, "smt", "active")
    if active.is_file():
        return {"1": "on", "0": "off"}.get(active.read_text().strip(), "")
    return ""


def _quota_text(cpus: float) -> str:
    return f"{cpus:g} CPUs" if cpus != 1 else "1 CPU"


def cpu_quota(proc_cgroup: str = "/proc/self/cgroup", mount: str = "/sys/fs/cgroup") -> str:
    """The container's CPU quota: the tightest of this process's cgroup and its parents
    (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cfs_period_us``), ``2 CPUs``, or
    ``none`` when no level sets one; "" when there is no cgroup to read."""
    lines = Path(proc_cgroup).read_text().splitlines()
    v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
    limits: list[float] = []
    read_any = False
    if v2 is not None and Path(mount, "cgroup.controllers").exists():
        here = Path(mount, v2.lstrip("/"))
        for level in [here, *here.parents]:
            f = level / "cpu.max"
            if f.is_file():
                read_any = True
                parts = f.read_text().split()
                if len(parts) >= 2 and parts[0] != "max":
                    limits.append(int(parts[0]) / int(parts[1]))
            if level == Path(mount):
                break
    else:
        cpu = next(
            (ln.split(":", 2)[2] for ln in lines if "cpu" in ln.split(":", 2)[1].split(",")), None
        )
        for base in (Path(mount, "cpu,cpuacct"), Path(mount, "cpu")):
            for level in [base / cpu.lstrip("/"), base] if cpu else [base]:
                q, p = level / "cpu.cfs_quota_us", level / "cpu.cfs_period_us"
                if q.is_file() and p.is_file():
                    read_any = True
                    quota = int(q.read_text())
                    if quota > 0:
                        limits.append(quota / int(p.read_text()))
            if read_any:
                break
    if limits:
        return _quota_text(min(limits))
    return "none" if read_any else ""


def machine_environment(smi: SmiReport | None = None) -> Environment:
    """This machine's environment; ``smi``: the session's ``nvidia-smi -q`` report (None
    where there is no NVIDIA driver)."""
    gpu = smi.environment() if smi is not None else Environment()
    libs = _torch_libraries()
    for name, wheels in _WHEELS.items():  # the installed package, where torch did not say
        libs[name] = libs.get(name) or _quiet(partial(_wheel, wheels))
    host = Environment(
        **libs,
        git=_quiet(_git_version),
        cpu=_quiet(cpu_model),
        governor=_quiet(governor),
        smt=_quiet(smt),
        cpu_quota=_quiet(cpu_quota),
        perfguard=__version__,
    )
    return gpu.filled_from(host)
