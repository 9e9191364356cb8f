"""Machine fingerprints: from a real trace's devices table, from this (GPU-less) machine.

This machine has CPU torch and no ``nvidia-smi``; the nvidia-smi tests put a
stand-in script on PATH, since a GPU driver cannot be had here: one that
answers like the real tool's CSV query, one that hangs, one that fails.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfguard import __version__
from perfguard.baseline import fingerprint as fp_mod
from perfguard.baseline.fingerprint import cpu_model, machine_fingerprint

REPO = Path(__file__).resolve().parents[1]
A100_8 = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"
A100_4 = "nsys/nsys2024.5.1_cloverleaf_no-nvtx-rows_a100x4.sqlite"


@pytest.mark.parametrize("capture", [A100_8, A100_4])
def test_gpus_come_from_the_trace_devices_table(capture, fixture_file, cached_trace):
    devices = cached_trace(fixture_file(capture)).devices
    fp = machine_fingerprint("nsys", devices=devices)
    lowest = devices[devices["rank"] == devices["rank"].min()]
    assert fp.gpu_count == lowest["device_id"].nunique() == (8 if capture == A100_8 else 4)
    assert fp.gpu_name == lowest["name"].iloc[0] and fp.gpu_name.startswith("NVIDIA A100")
    assert (fp.backend, fp.perfguard, fp.host) == ("nsys", __version__, platform.node())


def test_this_machine_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this test describes a machine without a GPU")
    fp = machine_fingerprint("torch")
    assert (fp.gpu_name, fp.gpu_count) == ("", 0)
    assert fp.torch == torch.__version__ and fp.cuda == (torch.version.cuda or "")
    assert fp.python == platform.python_version()
    if Path("/proc/cpuinfo").exists():
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        names = [ln.split(":", 1)[1] for ln in lines if ln.startswith("model name")]
        if names:
            assert fp.cpu == " ".join(names[0].split())
    assert fp.cpu == cpu_model() and fp.cpu
    # the same machine compares with itself; a GPU run never compares with it
    assert fp.incompatibility(machine_fingerprint("torch")) is None
    assert machine_fingerprint("torch", devices=None).incompatibility(
        fp.__class__(gpu_name="NVIDIA H100", gpu_count=1, backend="torch")
    )


def test_torch_is_not_imported_when_it_is_not_installed():
    code = (
        "import importlib.util as u, sys\n"
        "real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'torch' else real(name, *a)\n"
        "from perfguard.baseline.fingerprint import machine_fingerprint\n"
        "fp = machine_fingerprint('cpu')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(repr(fp.torch), repr(fp.cuda), fp.gpu_count)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["''", "''", "0"]


def _fake_smi(tmp_path: Path, body: str, monkeypatch) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_driver_and_gpus_from_nvidia_smi(tmp_path, monkeypatch):
    _fake_smi(
        tmp_path,
        'echo "NVIDIA H100 80GB HBM3, 550.54.15"\necho "NVIDIA H100 80GB HBM3, 550.54.15"',
        monkeypatch,
    )
    monkeypatch.setattr(fp_mod, "_torch_info", dict)  # as if torch were not installed
    fp = machine_fingerprint("nsys")
    assert (fp.gpu_name, fp.gpu_count, fp.driver) == ("NVIDIA H100 80GB HBM3", 2, "550.54.15")


@pytest.mark.parametrize("body", ["exec sleep 30", "echo 'NVIDIA-SMI has failed' >&2; exit 9"])
def test_a_hung_or_failing_nvidia_smi_does_not_fail_the_run(tmp_path, monkeypatch, body):
    _fake_smi(tmp_path, body, monkeypatch)
    monkeypatch.setattr(fp_mod, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    started = time.monotonic()
    fp = machine_fingerprint("torch")
    assert time.monotonic() - started < 10
    assert fp.driver == "" and fp.backend == "torch"
