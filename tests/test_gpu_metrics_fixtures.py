"""Tensor Core utilization, FLOPs and FLOP efficiency on real GPU captures,
computed by hand from the raw JSON and the datasheet peak.

The hand computation shares nothing with perfguard: kernels are tied to
their op by the ``External id`` Kineto writes on every kernel (CUPTI's
external correlation), not by perfguard's correlation-id + time nesting;
Tensor Core use is read off the names with the reference's patterns
written out here; FLOPs of ``aten::addmm`` are 2*M*N*K from ``Input Dims``
(torch's FlopCounterMode counts the same, bias not counted); the peak is
the H100 SXM5 datasheet's dense BF16 Tensor Core rate, 989.4 TFLOP/s.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

import perfguard
from perfguard.analysis.ops import aggregate_op_types

# reference §2 (tensor_cores_flops.md): the families of TC kernel names these captures hold
HAND_TC = re.compile(
    r"tensorop|s1688|s16816|16816|161616|_tf32f32_|bf16bf16_bf16f32|warpgroupsize|flash_fwd_kernel"
    r"|ImplicitGemmConvolution"
)
H100_SXM_BF16_DENSE = 989.4e12  # NVIDIA H100 datasheet: 1,979 TFLOP/s BF16 with sparsity / 2


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def _kernels_by_external_id(events: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel":
            out[e["args"]["External id"]].append(e)
    return out


def _hand_op_type(events: list[dict], op: str) -> tuple[float, float, int]:
    """(kernel time in us, TC kernel time in us, instances) of every ``aten::<op>`` event."""
    kernels = _kernels_by_external_id(events)
    total = tc = 0.0
    n = 0
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] == f"aten::{op}":
            n += 1
            for k in kernels.get(e["args"]["External id"], []):
                total += k["dur"]
                tc += k["dur"] if HAND_TC.search(k["name"]) else 0.0
    return total, tc, n


@pytest.fixture(scope="module")
def h100(fixtures_dir: Path):
    path = fixtures_dir / "kineto" / "h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz"
    return _events(path), perfguard.analyze(perfguard.load_trace(path))


@pytest.fixture(scope="module")
def a100(fixtures_dir: Path):
    path = fixtures_dir / "kineto" / "a100_2rank_nccl_train_rank0.pt.trace.json.gz"
    return _events(path), perfguard.analyze(perfguard.load_trace(path))


def test_h100_top_gemm_flops_time_tc_and_efficiency(h100) -> None:
    events, analysis = h100
    kernels = _kernels_by_external_id(events)
    flops = gpu_us = tc_us = 0.0
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm":
            _, (m, k), (k2, n) = e["args"]["Input Dims"][:3]
            assert k == k2
            flops += 2.0 * m * n * k
            for kern in kernels[e["args"]["External id"]]:
                gpu_us += kern["dur"]
                tc_us += kern["dur"] if HAND_TC.search(kern["name"]) else 0.0
    top = analysis.ops.iloc[0]
    assert top["op_name"] == "aten::linear/aten::addmm"  # the top GEMM op by GPU time
    assert top["gpu_time_total"] == pytest.approx(gpu_us * 1e3, abs=1)  # us -> ns
    assert top["tc_utilization"] == pytest.approx(100.0 * tc_us / gpu_us)
    assert float(top["flops"]) == flops
    efficiency = 100.0 * flops / (gpu_us * 1e-6) / H100_SXM_BF16_DENSE
    assert float(top["flop_efficiency_pct"]) == pytest.approx(efficiency, rel=1e-9)
    assert float(top["achieved_tflops"]) == pytest.approx(flops / (gpu_us * 1e-6) / 1e12)
    assert top["data_type"] == "bf16" and bool(top["tc_eligible"]) and bool(top["using_tc"])
    # the parent aten::linear is not counted again
    linear = analysis.ops[analysis.ops["op_name"] == "aten::linear"].iloc[0]
    assert float(linear["flops"]) == 0.0


def test_h100_run_tc_utilization_and_peak_source(h100) -> None:
    events, analysis = h100
    hand_total = hand_tc = 0.0
    for op in ("addmm", "_flash_attention_forward"):
        t, tc, _ = _hand_op_type(events, op)
        hand_total, hand_tc = hand_total + t, hand_tc + tc
    # only GEMM and attention ops are eligible in this capture
    eligible = set(analysis.ops.loc[analysis.ops["tc_eligible"], "op_type"]) - {
        "linear",
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
    }
    assert eligible == {"addmm", "_flash_attention_forward"}
    figure = analysis.summary.tc_utilization
    assert figure == pytest.approx(100.0 * hand_tc / hand_total)
    assert analysis.notes == []  # the H100 is in the peak table: nothing to explain


@pytest.mark.parametrize("op", ["cudnn_convolution", "convolution_backward"])
def test_a100_conv_tc_utilization_by_hand(a100, op: str) -> None:
    events, analysis = a100
    total, tc, n = _hand_op_type(events, op)
    assert n > 0 and total > 0
    row = aggregate_op_types(analysis.instances).set_index("op_type").loc[op]
    assert row["calls"] == n
    # kernels only: gpu_time also counts the memsets cuDNN issues in backward
    assert row["kernel_time"] == pytest.approx(total * 1e3, abs=n)  # us -> ns rounding
    assert row["tc_utilization"] == pytest.approx(100.0 * tc / total, abs=1e-6)
    assert 0 < row["tc_utilization"] < 100  # a real mix: TF32 GEMMs and non-TC helpers


def test_a100_without_shapes_leaves_flops_empty_never_guessed(a100) -> None:
    _, analysis = a100
    gemm = analysis.ops[analysis.ops["tc_eligible"]]
    assert gemm["flops"].isna().all()
    assert gemm["flop_efficiency_pct"].isna().all()


def test_unknown_gpu_says_why_once(fixtures_dir: Path) -> None:
    path = fixtures_dir / "nsys" / "nsys2021.2.1_gpu-db-query_no-nvtx_quadro-rtx6000.sqlite"
    analysis = perfguard.analyze(perfguard.load_trace(path))
    notes = [n for n in analysis.notes if "FLOP efficiency" in n]
    assert len(notes) == 1, analysis.notes
    assert "Quadro RTX 6000" in notes[0]
