"""The fingerprint of the machine a run is measured on.

The GPU comes from the capture itself when the caller has it (the trace's
``devices`` table names the GPUs the program saw), else from torch on this
machine. Nothing here may fail a run: a missing torch, a missing or hung
``nvidia-smi`` just leaves that field empty. torch is imported only when it
is installed (``find_spec``) and the machine could show it a GPU: importing it
is what costs time, and without a GPU its version file says all it would.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from perfguard import __version__
from perfguard.baseline.nvidia_smi import SmiReport
from perfguard.baseline.record import Fingerprint

__all__ = ["cpu_model", "machine_fingerprint"]

NVIDIA_SMI_TIMEOUT_S = 10.0


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("model name", "hardware", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus_from_devices(devices: pd.DataFrame) -> tuple[str, int]:
    """GPU model(s) and count seen by the lowest rank of a trace's devices table."""
    if "rank" in devices and devices["rank"].notna().any():
        devices = devices[devices["rank"] == devices["rank"].min()]
    key = "device_id" if "device_id" in devices else None
    count = int(devices[key].nunique()) if key else len(devices)
    names = sorted(
        {str(n).strip() for n in devices.get("name", pd.Series(dtype=object)).dropna()} - {""}
    )
    return ", ".join(names), count


def _gpu_possible() -> bool:
    """Whether this machine could show torch a GPU: an NVIDIA driver's tool or device
    nodes, or ROCm's. Where none is, torch need not be imported to say so."""
    dev = Path("/dev")
    return (
        shutil.which("nvidia-smi") is not None
        or any(dev.glob("nvidia[0-9]*"))
        or (dev / "kfd").exists()
    )


def _torch_version_file(spec: importlib.machinery.ModuleSpec) -> dict[str, Any]:
    """torch's version and CUDA version read from its ``version.py`` without importing it
    (an import costs 1.6 s on the 2-core VM, most of a session's start, issue 53; on a
    machine without a GPU it would only have said these two strings)."""
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        return {}
    try:
        tree = ast.parse((Path(locations[0]) / "version.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") and value:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                return {}
    if "__version__" not in found:
        return {}
    return {"torch": str(found["__version__"]), "cuda": str(found.get("cuda") or "")}


def _torch_info() -> dict[str, Any]:
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return {}
    if "torch" not in sys.modules and not _gpu_possible():
        read = _torch_version_file(spec)
        if read:
            return read
    try:
        import torch
    except Exception:  # a broken install must not fail the run
        return {}
    info: dict[str, Any] = {"torch": str(torch.__version__)}
    info["cuda"] = str(torch.version.cuda or "")
    try:
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
            info["gpu_name"], info["gpu_count"] = ", ".join(names), count
    except Exception:  # driver trouble: record no GPU rather than fail
        pass
    return info


def _nvidia_smi() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[p.strip() for p in line.split(",")] for line in out.splitlines() if "," in line]
    if not rows:
        return {}
    return {
        "gpu_name": ", ".join(sorted({r[0] for r in rows})),
        "gpu_count": len(rows),
        "driver": rows[0][1],
    }


def machine_fingerprint(
    backend: str,
    *,
    devices: pd.DataFrame | None = None,
    workers: int = 1,
    smi: SmiReport | None = None,
) -> Fingerprint:
    """This machine's :class:`Fingerprint` for a run measured with ``backend``.

    ``devices`` is a trace's devices table; when it lists GPUs they name
    the GPU model and count (they are what the measured program saw).
    ``workers``: test processes measuring at once (pytest-xdist's ``-n``).
    ``smi``: the session's ``nvidia-smi -q`` report, when it has one (its GPUs and driver,
    without asking ``nvidia-smi`` a second time).
    """
    torch_info = _torch_info()
    smi_info: dict[str, Any] = {}
    if smi is not None:
        names = smi.gpu_names
        if names or smi.driver:
            smi_info = {
                "gpu_name": ", ".join(sorted(set(names))),
                "gpu_count": len(names),
                "driver": smi.driver,
            }
    else:
        smi_info = _nvidia_smi()
    gpu_name, gpu_count = "", 0
    if devices is not None and len(devices):
        gpu_name, gpu_count = _gpus_from_devices(devices)
    elif torch_info.get("gpu_count"):
        gpu_name, gpu_count = torch_info["gpu_name"], torch_info["gpu_count"]
    elif smi_info.get("gpu_count"):
        gpu_name, gpu_count = smi_info["gpu_name"], smi_info["gpu_count"]
    return Fingerprint(
        gpu_name=gpu_name,
        gpu_count=gpu_count,
        driver=smi_info.get("driver", ""),
        cuda=torch_info.get("cuda", ""),
        torch=torch_info.get("torch", ""),
        perfguard=__version__,
        backend=backend,
        workers=max(int(workers), 1),
        host=platform.node(),
        python=platform.python_version(),
        cpu=cpu_model(),
    )
