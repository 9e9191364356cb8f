"""Each reader fills the environment its capture records (``Trace.environment``), from the
team's real captures: nsys ``TARGET_INFO_*``, Kineto's header, XSpace planes. A field the
capture does not record stays unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfguard.environment import Environment
from perfguard.trace import load_trace
from perfguard.trace.environments import from_xspace
from perfguard.trace.xspace_proto import xspace_class

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        (
            "nsys/nsys2021.2.1_gpu-db-query_no-nvtx_quadro-rtx6000.sqlite",
            Environment(max_sm_clock="1770 MHz"),
        ),
        (
            "nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite",  # NvDriverVersion packed: 52510517
            Environment(
                driver="525.105.17",
                driver_cuda="12.0",
                max_sm_clock="1410 MHz",
                cpu="AMD EPYC 7763 64-Core Processor",
            ),
        ),
        (
            "nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite",
            Environment(
                driver="565.57.01",
                driver_cuda="12.8",
                max_sm_clock="1980 MHz",
                cpu="AMD EPYC 7413 24-Core Processor",
            ),
        ),
        (
            "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite",
            Environment(driver="580.95.05", driver_cuda="13.0"),
        ),  # no GPU table; CPU "unknown"
        (
            "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
            Environment(
                driver="575.51.03",
                driver_cuda="12.9",
                cuda_runtime="12.4",
                cudnn="9.1.0.70",
                cublas="12.4.5.8",
                nccl="2.21.5",
                torch="2.6.0+cu124",
                cpu="AMD EPYC 9654 96-Core Processor",
                smt="on",
            ),
        ),
        ("kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz", Environment(nccl="2.17.1")),
        ("kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz", Environment()),
        ("kineto/v100_dlrm_8rank_nccl_shapes", Environment()),  # eight ranks, none says any
    ],
)
def test_shared_captures(fixture_file, cached_trace, capture, expected):
    assert cached_trace(fixture_file(capture)).environment == expected


def test_the_multi_gpu_export_names_one_clock_for_its_four_a100s(fixture_file, cached_trace):
    env = cached_trace(fixture_file("nsys/nsys2024.5.1_cloverleaf_no-nvtx-rows_a100x4.sqlite"))
    assert env.environment.max_sm_clock == "1410 MHz"
    assert env.environment.driver == "525.105.17"


def test_this_projects_h200_kineto_capture():
    env = load_trace(DATA / "gpu_h200" / "eager.pt.trace.json.gz").environment
    assert env == Environment(driver_cuda="13.0", cuda_runtime="13.0")


def test_a_jax_xspace_names_jax():
    env = load_trace(DATA / "xplane" / "jax_jit_step.xplane.pb").environment
    assert env.jax and env.jax[0].isdigit() and env.driver == ""


def test_an_xspace_gpu_plane_gives_its_clock(tmp_path):
    """The layout TensorFlow/XLA write: a ``clock_rate`` stat (kHz) on each GPU plane."""
    space = xspace_class()()
    host, gpu = space.planes.add(), space.planes.add()
    host.name, gpu.name = "/host:CPU", "/device:GPU:0"
    host.event_metadata.add(key=1).value.name = "MatMul:MatMul"
    line = host.lines.add(id=7, name="python", timestamp_ns=0)
    line.events.add(metadata_id=1, offset_ps=1_000_000, duration_ps=4_000_000)
    entry = gpu.stat_metadata.add(key=1)
    entry.value.id, entry.value.name = 1, "clock_rate"
    gpu.stats.add(metadata_id=1, int64_value=1_410_000)
    path = tmp_path / "gpu.xplane.pb"
    path.write_bytes(space.SerializeToString())
    assert load_trace(path).environment.max_sm_clock == "1410 MHz"
    assert from_xspace(
        {"/device:GPU:1": {"clock_rate": 1_755_000}, "/device:GPU:0": {"clock_rate": 1_410_000}}
    ).max_sm_clock == ("1410 MHz, 1755 MHz")
