"""FLOPs and bytes per op (perfguard.analysis.flops).

The end-to-end cases run a computation on the CPU under ``torch.profiler`` (record_shapes),
export the Kineto JSON, read it with ``perfguard.load_trace``, apply ``op_flops`` and
``count_once`` over the trace's ranges, and compare the sum with
``torch.utils.flop_counter.FlopCounterMode`` on the same computation. FlopCounterMode counts only
matmul / convolution / attention ops, so only those families (``CONTRACTION_FAMILIES``) are
summed on our side. Where the two legitimately differ the expected value is derived from the
FlopCounterMode figure and the reason is stated with the case.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from perfguard import load_trace  # noqa: E402
from perfguard.analysis.flops import (  # noqa: E402
    CONTRACTION_FAMILIES,
    FORMULAS,
    LEAF_POLICY,
    count_once,
    op_flops,
)

# --------------------------------------------------------------------------- harness


def _leaf_contraction_flops(trace_path) -> tuple[float, int]:
    r = load_trace(trace_path).ranges
    f = op_flops(r)
    once = count_once(f["flops"], r["parent_id"], r["range_id"], f["family"])
    mask = f["family"].isin(CONTRACTION_FAMILIES)
    return float(once[mask].sum()), int(once[mask].isna().sum())


def _ours(run: Callable[[], None], tmp_path) -> tuple[float, int]:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    path = tmp_path / "case.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return _leaf_contraction_flops(path)


def _fcm(run: Callable[[], None]) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def _t(*shape, grad=False, dtype=None):
    return torch.randn(*shape, dtype=dtype or torch.float32, requires_grad=grad)


def _bwd(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    return lambda: fn().sum().backward()


def _conv_fwd_count(n: int, spatial: list[int], w_shape: tuple[int, ...]) -> int:
    """2*N*prod(spatial)*numel(W): the reference §3.2 forward (= dgrad = wgrad) count."""
    return 2 * n * math.prod(spatial) * math.prod(w_shape)


def _sdpa(b, h, s_q, s_k, d, dv=None, bwd=False, causal=False) -> float:
    dv = dv or d
    fwd = 2 * b * h * s_q * s_k * (d + dv)
    back = 2 * b * h * s_q * s_k * (3 * d + 2 * dv) if bwd else 0
    return (fwd + back) * (0.5 if causal else 1.0)


@dataclass
class Case:
    id: str
    run: Callable[[], None]
    # expected perfguard total from FlopCounterMode's total; None = equal
    expect: Callable[[int], float] | None = None
    math_sdpa: bool = False


def _grouped_wgrad_excess(g: int, count: int) -> Callable[[int], float]:
    # FlopCounterMode's conv_backward_flop counts grad_weight as conv(t(x), t(grad_out)) with the
    # full C_in (C_out when transposed), ignoring groups: g x the true wgrad count. Reference
    # §3.2: wgrad = the forward count, which already carries C_in/g.
    return lambda fcm: fcm - (g - 1) * count


def _fcm_is_zero_then(value: float) -> Callable[[int], float]:
    def check(fcm: int) -> float:
        assert fcm == 0
        return value

    return check


CASES = [
    # --- GEMM family (forward)
    Case("mm_fp32", lambda: torch.mm(_t(33, 17), _t(17, 9))),
    Case(
        "mm_bf16",
        lambda: torch.mm(_t(16, 24, dtype=torch.bfloat16), _t(24, 8, dtype=torch.bfloat16)),
    ),
    Case("mm_fp64", lambda: torch.mm(_t(5, 7, dtype=torch.float64), _t(7, 3, dtype=torch.float64))),
    Case("addmm_bias", lambda: torch.addmm(_t(9), _t(12, 10), _t(10, 9))),
    Case("addmm_beta0", lambda: torch.addmm(_t(12, 9), _t(12, 10), _t(10, 9), beta=0)),
    Case("bmm", lambda: torch.bmm(_t(3, 7, 5), _t(3, 5, 4))),
    Case("baddbmm", lambda: torch.baddbmm(_t(3, 7, 4), _t(3, 7, 5), _t(3, 5, 4), alpha=0.5)),
    Case("linear_3d_bias", lambda: F.linear(_t(2, 7, 16), _t(12, 16), _t(12))),
    Case("linear_nobias", lambda: F.linear(_t(10, 16), _t(12, 16))),
    Case("matmul_broadcast", lambda: torch.matmul(_t(3, 1, 4, 5), _t(2, 5, 6))),
    Case("matmul_vec_mat", lambda: torch.matmul(_t(5), _t(5, 6))),
    Case("einsum_bmm", lambda: torch.einsum("bij,bjk->bik", _t(2, 3, 4), _t(2, 4, 5))),
    # --- GEMM forward + backward (dA, dB GEMMs)
    Case(
        "linear_fwd_bwd",
        _bwd(lambda: F.linear(_t(6, 16, grad=True), _t(8, 16, grad=True), _t(8, grad=True))),
    ),
    Case("matmul_fwd_bwd", _bwd(lambda: torch.matmul(_t(2, 3, 4, grad=True), _t(4, 5, grad=True)))),
    Case("bmm_fwd_bwd", _bwd(lambda: torch.bmm(_t(3, 4, 6, grad=True), _t(3, 6, 2, grad=True)))),
    # --- convolution forward
    Case(
        "conv1d_stride_pad_dil",
        lambda: F.conv1d(_t(2, 4, 20), _t(6, 4, 3), stride=2, padding=1, dilation=2),
    ),
    Case(
        "conv2d_stride_pad_dil",
        lambda: F.conv2d(
            _t(2, 4, 11, 9), _t(6, 4, 3, 2), _t(6), stride=(2, 1), padding=(1, 2), dilation=(1, 2)
        ),
    ),
    Case(
        "conv2d_groups2",
        lambda: F.conv2d(_t(2, 4, 9, 9), _t(6, 2, 3, 3), stride=2, padding=1, groups=2),
    ),
    Case(
        "conv2d_depthwise", lambda: F.conv2d(_t(2, 8, 10, 10), _t(8, 1, 3, 3), padding=1, groups=8)
    ),
    Case("conv2d_padding_same", lambda: F.conv2d(_t(2, 4, 9, 9), _t(6, 4, 3, 3), padding="same")),
    Case("conv2d_unbatched", lambda: F.conv2d(_t(4, 9, 9), _t(6, 4, 3, 3), stride=2)),
    Case(
        "conv2d_bf16",
        lambda: F.conv2d(
            _t(2, 4, 9, 9, dtype=torch.bfloat16),
            _t(6, 4, 3, 3, dtype=torch.bfloat16),
            stride=2,
            padding=1,
        ),
    ),
    Case(
        "conv3d_stride_pad",
        lambda: F.conv3d(_t(2, 3, 5, 6, 7), _t(4, 3, 3, 3, 3), stride=(1, 2, 1), padding=1),
    ),
    Case(
        "conv_transpose1d",
        lambda: F.conv_transpose1d(
            _t(2, 4, 10), _t(4, 3, 3), stride=2, padding=1, output_padding=1
        ),
    ),
    Case(
        "conv_transpose2d_dil",
        lambda: F.conv_transpose2d(
            _t(2, 4, 6, 7),
            _t(4, 3, 3, 2),
            stride=(2, 3),
            padding=1,
            output_padding=(1, 0),
            dilation=(1, 2),
        ),
    ),
    Case(
        "conv_transpose2d_groups2",
        lambda: F.conv_transpose2d(_t(2, 4, 6, 6), _t(4, 3, 3, 3), stride=2, groups=2),
    ),
    # --- convolution forward + backward (dgrad + wgrad per output_mask)
    Case(
        "conv1d_fwd_bwd",
        _bwd(
            lambda: F.conv1d(_t(2, 4, 20, grad=True), _t(6, 4, 5, grad=True), stride=3, padding=2)
        ),
    ),
    Case(
        "conv2d_fwd_bwd_bias",
        _bwd(
            lambda: F.conv2d(
                _t(2, 4, 9, 9, grad=True),
                _t(6, 4, 3, 3, grad=True),
                _t(6, grad=True),
                stride=2,
                padding=1,
            )
        ),
    ),
    Case(
        "conv2d_fwd_bwd_first_layer",
        _bwd(lambda: F.conv2d(_t(2, 3, 12, 12), _t(5, 3, 3, 3, grad=True), padding=1, dilation=2)),
    ),
    Case(
        "conv3d_fwd_bwd",
        _bwd(
            lambda: F.conv3d(
                _t(2, 3, 5, 6, 7, grad=True),
                _t(4, 3, 3, 3, 3, grad=True),
                stride=(1, 2, 1),
                padding=1,
            )
        ),
    ),
    Case(
        "conv_transpose1d_fwd_bwd",
        _bwd(
            lambda: F.conv_transpose1d(
                _t(2, 4, 10, grad=True),
                _t(4, 3, 3, grad=True),
                stride=2,
                padding=1,
                output_padding=1,
            )
        ),
    ),
    Case(
        "conv_transpose2d_fwd_bwd",
        _bwd(
            lambda: F.conv_transpose2d(
                _t(2, 4, 6, 6, grad=True), _t(4, 3, 3, 3, grad=True), stride=2, padding=1
            )
        ),
    ),
    # grouped backward: FlopCounterMode's wgrad ignores groups (see _grouped_wgrad_excess)
    Case(
        "conv1d_fwd_bwd_groups2",
        _bwd(lambda: F.conv1d(_t(2, 4, 20, grad=True), _t(6, 2, 3, grad=True), stride=2, groups=2)),
        expect=_grouped_wgrad_excess(2, _conv_fwd_count(2, [9], (6, 2, 3))),
    ),
    Case(
        "conv2d_fwd_bwd_groups2",
        _bwd(
            lambda: F.conv2d(
                _t(2, 4, 9, 9, grad=True), _t(6, 2, 3, 3, grad=True), stride=2, padding=1, groups=2
            )
        ),
        expect=_grouped_wgrad_excess(2, _conv_fwd_count(2, [5, 5], (6, 2, 3, 3))),
    ),
    Case(
        "conv_transpose2d_fwd_bwd_groups2",
        _bwd(
            lambda: F.conv_transpose2d(
                _t(2, 4, 6, 6, grad=True), _t(4, 3, 3, 3, grad=True), stride=2, groups=2
            )
        ),
        expect=_grouped_wgrad_excess(2, _conv_fwd_count(2, [6, 6], (4, 3, 3, 3))),
    ),
    # --- attention, math backend: decomposes into matmul/bmm (both sides count those)
    Case(
        "sdpa_math",
        lambda: F.scaled_dot_product_attention(_t(2, 3, 5, 8), _t(2, 3, 7, 8), _t(2, 3, 7, 4)),
        math_sdpa=True,
    ),
    Case(
        "sdpa_math_causal",
        lambda: F.scaled_dot_product_attention(
            _t(2, 3, 6, 8), _t(2, 3, 6, 8), _t(2, 3, 6, 8), is_causal=True
        ),
        math_sdpa=True,
    ),
    Case(
        "sdpa_math_gqa",
        lambda: F.scaled_dot_product_attention(
            _t(1, 4, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8), enable_gqa=True
        ),
        math_sdpa=True,
    ),
    Case(
        "sdpa_math_fwd_bwd",
        _bwd(
            lambda: F.scaled_dot_product_attention(
                _t(2, 3, 5, 8, grad=True), _t(2, 3, 7, 8, grad=True), _t(2, 3, 7, 8, grad=True)
            )
        ),
        math_sdpa=True,
    ),
    # --- FlopCounterMode counts 0 for these (no formula for the CPU kernel): hand value
    # CPU fused flash attention (aten::_scaled_dot_product_flash_attention_for_cpu)
    Case(
        "sdpa_cpu_flash",
        lambda: F.scaled_dot_product_attention(_t(2, 4, 6, 8), _t(2, 4, 6, 8), _t(2, 4, 6, 8)),
        expect=_fcm_is_zero_then(_sdpa(2, 4, 6, 6, 8)),
    ),
    Case(
        "sdpa_cpu_flash_causal_fwd_bwd",
        _bwd(
            lambda: F.scaled_dot_product_attention(
                _t(2, 4, 6, 8, grad=True),
                _t(2, 4, 6, 8, grad=True),
                _t(2, 4, 6, 8, grad=True),
                is_causal=True,
            )
        ),
        expect=_fcm_is_zero_then(_sdpa(2, 4, 6, 6, 8, bwd=True, causal=True)),
    ),
    # aten::mv (matmul of a matrix and a vector) has no FlopCounterMode formula
    Case(
        "matmul_mat_vec", lambda: torch.matmul(_t(4, 5), _t(5)), expect=_fcm_is_zero_then(2 * 4 * 5)
    ),
    # addbmm has a CPU kernel (loops of addmm_ that FlopCounterMode does not see)
    Case(
        "addbmm",
        lambda: torch.addbmm(_t(3, 5), _t(2, 3, 4), _t(2, 4, 5)),
        expect=_fcm_is_zero_then(2 * 2 * 3 * 5 * 4),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_flop_counter_mode_end_to_end(case: Case, tmp_path) -> None:
    torch.manual_seed(0)
    if case.math_sdpa:
        with sdpa_kernel(SDPBackend.MATH):
            expected_fcm = _fcm(case.run)
            ours, unknown = _ours(case.run, tmp_path)
    else:
        expected_fcm = _fcm(case.run)
        ours, unknown = _ours(case.run, tmp_path)
    expected = expected_fcm if case.expect is None else case.expect(expected_fcm)
    assert unknown == 0, "a counted contraction op has unknown FLOPs"
    assert expected > 0
    assert ours == pytest.approx(expected, rel=1e-12)


def test_enough_flop_counter_cases() -> None:
    assert len(CASES) >= 30
    assert sum(c.expect is None for c in CASES) >= 30  # strictly equal to FlopCounterMode


# --------------------------------------------------------------------------- hand-computed


def _one(name, shapes, dtypes, concrete=None) -> pd.Series:
    row = {
        "name": name,
        "input_shapes": None if shapes is None else json.dumps(shapes, separators=(",", ":")),
        "dtypes": None if dtypes is None else json.dumps(dtypes),
        "concrete_inputs": None if concrete is None else json.dumps(concrete),
    }
    return op_flops(pd.DataFrame([row])).iloc[0]


F32, F16, BF16, I64 = "float", "c10::Half", "c10::BFloat16", "long int"

HAND = [
    # (id, name, shapes, dtypes, concrete, flops, bytes)
    # elementwise: numel(broadcast output), bytes = operands + output (reference §3.3)
    (
        "add_broadcast",
        "aten::add",
        [[4, 1, 3], [5, 1], []],
        [F32, F32, "Scalar"],
        ["", "", "1"],
        60,
        (12 + 5 + 60) * 4,
    ),
    (
        "add_bf16_f32_promotes",
        "aten::add",
        [[10], [10], []],
        [BF16, F32, "Scalar"],
        ["", "", "1"],
        10,
        20 + 40 + 40,
    ),
    ("relu", "aten::relu", [[2, 3]], [F32], [""], 6, 48),
    (
        "gelu_fp16",
        "aten::gelu",
        [[1, 141, 2048], []],
        [F16, ""],
        ["", ""],
        141 * 2048,
        2 * 141 * 2048 * 2,
    ),
    ("compare_writes_bool", "aten::gt", [[2, 3], []], [F32, "Scalar"], ["", "0"], 6, 24 + 6),
    (
        "addcmul_ternary",
        "aten::addcmul_",
        [[10], [10], [10], []],
        [F32] * 3 + ["Scalar"],
        ["", "", "", "0.5"],
        30,
        160,
    ),
    (
        "mul_out_variant",
        "aten::mul",
        [[], [4, 3], [4, 3]],
        ["double", F32, F32],
        ["", "", ""],
        12,
        8 + 48 + 48,
    ),
    (
        "threshold_backward",
        "aten::threshold_backward",
        [[8], [8], []],
        [F16, F16, "Scalar"],
        ["", "", "0"],
        8,
        3 * 16,
    ),
    (
        "dropout_eval_noop",
        "aten::dropout",
        [[4, 4], [], []],
        [F32, "Scalar", "Scalar"],
        ["", "0.1", "False"],
        0,
        0,
    ),
    (
        "native_dropout_train",
        "aten::native_dropout",
        [[4, 4], [], []],
        [F32, "Scalar", "Scalar"],
        ["", "0.1", "True"],
        80,
        64 + 64 + 16,
    ),
    # reductions: sum numel, mean numel + 1, L2 norm 2*numel + 1 (reference §3.4)
    ("sum_full", "aten::sum", [[2, 3, 4], []], [F32, ""], ["", ""], 24, 96 + 4),
    (
        "sum_dims",
        "aten::sum",
        [[2, 3, 4], [], [], []],
        [F32, "ScalarList", "Scalar", ""],
        ["", "[0, 2]", "False", ""],
        24,
        96 + 12,
    ),
    (
        "sum_out_variant",
        "aten::sum",
        [[2, 3, 4], [], [], [], [2, 3, 1]],
        [F32, "ScalarList", "Scalar", "Scalar", F32],
        ["", "[2]", "True", "6", ""],
        24,
        96 + 24,
    ),
    ("mean_full", "aten::mean", [[2, 3, 4], []], [F32, ""], ["", ""], 25, 100),
    (
        "mean_dim",
        "aten::mean",
        [[2, 3, 4], [], [], []],
        [F32, "ScalarList", "Scalar", ""],
        ["", "[-1]", "True", ""],
        24 + 6,
        96 + 24,
    ),
    (
        "amax",
        "aten::amax",
        [[2, 3, 4], [], []],
        [F32, "ScalarList", "Scalar"],
        ["", "[-1]", "False"],
        24,
        96 + 24,
    ),
    (
        "max_dim_with_indices",
        "aten::max",
        [[2, 3, 4], [], []],
        [F32, "Scalar", "Scalar"],
        ["", "1", "False"],
        24,
        96 + 32 + 64,
    ),
    ("maximum_binary", "aten::max", [[2, 3], [2, 3]], [F32, F32], ["", ""], 6, 72),
    (
        "l2_norm",
        "aten::linalg_vector_norm",
        [[2, 3, 4], [], [], [], []],
        [F32, "Scalar", "ScalarList", "Scalar", ""],
        ["", "2", "[-1]", "False", ""],
        54,
        96 + 24,
    ),
    # softmax: 5*numel (reference's middle estimate); fused single pass bytes
    (
        "softmax_fp16",
        "aten::softmax",
        [[4, 10], [], []],
        [F16, "Scalar", ""],
        ["", "-1", ""],
        200,
        80 + 80,
    ),
    (
        "softmax_half_to_float",
        "aten::_softmax",
        [[4, 10], [], []],
        [F16, "Scalar", "Scalar"],
        ["", "-1", "True"],
        200,
        80 + 160,
    ),
    (
        "log_softmax_backward",
        "aten::_log_softmax_backward_data",
        [[4, 10], [4, 10], [], []],
        [F32, F32, "Scalar", "Scalar"],
        ["", "", "-1", "6"],
        160,
        3 * 160,
    ),
    # norms: DeepSpeed 5*numel (affine) / 4*numel; bytes in + out + params + rows*4 B stats
    (
        "layer_norm_bf16",
        "aten::native_layer_norm",
        [[1, 141, 512], [], [512], [512], []],
        [BF16, "ScalarList", BF16, BF16, "Scalar"],
        ["", "[512]", "", "", "9.9999999999999998e-13"],
        5 * 141 * 512,
        2 * 141 * 512 * 2 + 1024 + 1024 + 2 * 141 * 4,
    ),
    (
        "layer_norm_no_affine",
        "aten::native_layer_norm",
        [[2, 3, 4], [], [], [], []],
        [F32, "ScalarList", "", "", "Scalar"],
        ["", "[4]", "", "", "1e-05"],
        96,
        192 + 2 * 6 * 4,
    ),
    (
        "batch_norm_train",
        "aten::native_batch_norm",
        [[2, 4, 3], [4], [4], [4], [4], [], [], []],
        [F32] * 5 + ["Scalar"] * 3,
        ["", "", "", "", "", "True", "0.1", "1e-05"],
        5 * 24,
        192 + 16 + 16 + 32 + (2 * 4 * 4 + 32),
    ),
    (
        "batch_norm_eval",
        "aten::native_batch_norm",
        [[2, 4, 3], [4], [4], [4], [4], [], [], []],
        [F32] * 5 + ["Scalar"] * 3,
        ["", "", "", "", "", "False", "0.1", "1e-05"],
        2 * 24,
        192 + 16 + 16 + 32,
    ),
    (
        "group_norm",
        "aten::native_group_norm",
        [[2, 4, 3], [4], [4], [], [], [], [], []],
        [F32, F32, F32] + ["Scalar"] * 5,
        ["", "", "", "2", "4", "3", "2", "1e-05"],
        5 * 24,
        192 + 16 + 16 + 2 * 2 * 2 * 4,
    ),
    (
        "rms_norm",
        "aten::_fused_rms_norm",
        [[2, 3, 4], [], [4], []],
        [F32, "ScalarList", F32, ""],
        ["", "[4]", "", ""],
        4 * 24,
        192 + 16 + 6 * 4,
    ),
    # embedding: FLOPs 0, bytes = index + 2*n_idx*D*s (reference §3.5)
    (
        "embedding",
        "aten::embedding",
        [[30522, 512], [1, 141], [], [], []],
        [BF16, I64, "Scalar", "Scalar", "Scalar"],
        ["", "", "-1", "False", "False"],
        0,
        141 * 8 + 2 * 141 * 512 * 2,
    ),
    (
        "embedding_dense_backward",
        "aten::embedding_dense_backward",
        [[141, 512], [141], [], [], []],
        [BF16, I64, "Scalar", "Scalar", "Scalar"],
        ["", "", "30522", "-1", "False"],
        141 * 512,
        141 * 8 + 3 * 141 * 512 * 2 + 30522 * 512 * 2,
    ),
    # GEMM bytes: A + B + C (+ bias unless beta == 0)
    (
        "mm_bf16_bytes",
        "aten::mm",
        [[64, 32], [32, 16]],
        [BF16, BF16],
        ["", ""],
        2 * 64 * 32 * 16,
        (64 * 32 + 32 * 16 + 64 * 16) * 2,
    ),
    (
        "addmm_beta0_no_bias_read",
        "aten::addmm",
        [[12, 9], [12, 10], [10, 9], [], []],
        [F32] * 3 + ["Scalar"] * 2,
        ["", "", "", "0", "1"],
        2 * 12 * 9 * 10,
        (120 + 90 + 108) * 4,
    ),
    (
        "scaled_mm_fp8",
        "aten::_scaled_mm",
        [[16, 32], [32, 8], [], [], [], [], [], []],
        ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F32, F32, "", "", "Scalar", "Scalar"],
        ["", "", "", "", "", "", "15", "False"],
        2 * 16 * 8 * 32,
        512 + 256 + 4 + 4 + 16 * 8 * 2,
    ),
    # copies: 0 FLOPs, numel*(s_src + s_dst)
    (
        "to_copy_f32_to_f16",
        "aten::_to_copy",
        [[2, 3, 4], [], [], [], [], [], []],
        [F32, "Scalar", "", "", "", "Scalar", ""],
        ["", "5", "", "", "", "False", ""],
        0,
        24 * 6,
    ),
    (
        "copy_",
        "aten::copy_",
        [[2, 3, 4], [2, 3, 4], []],
        [F16, F32, "Scalar"],
        ["", "", "False"],
        0,
        24 * 6,
    ),
    # convolution bytes: input + weight + bias + output (PyProf conv_bytes_flops)
    (
        "conv2d_bytes",
        "aten::conv2d",
        [[2, 4, 9, 9], [6, 2, 3, 3], [6], [], [], [], []],
        [F32, F32, F32, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
        ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "2"],
        2 * 2 * 25 * 108,
        (648 + 108 + 6 + 2 * 6 * 25) * 4,
    ),
    # attention: causal counts half (reference §3.6, FlashAttention benchmark convention)
    (
        "sdpa_flash_causal",
        "aten::_scaled_dot_product_flash_attention",
        [[1, 8, 128, 64]] * 3 + [[], [], [], []],
        [BF16] * 3 + ["Scalar"] * 4,
        ["", "", "", "0.", "True", "False", ""],
        0.5 * 4 * 8 * 128 * 128 * 64,
        3 * 8 * 128 * 64 * 2 + 8 * 128 * 64 * 2 + 8 * 128 * 4,
    ),
]


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "concrete", "flops", "nbytes"),
    [h[1:] for h in HAND],
    ids=[h[0] for h in HAND],
)
def test_hand_computed(name, shapes, dtypes, concrete, flops, nbytes) -> None:
    got = _one(name, shapes, dtypes, concrete)
    assert got["flops"] == pytest.approx(flops)
    assert got["bytes"] == nbytes
    assert isinstance(got["flop_formula"], str) and got["flop_formula"]
    assert not got["flop_formula"].startswith("unknown")


OPT_SHAPES = [[[4, 3], [5]]] * 4 + [[], [[], []]] + [[]] * 9
OPT_TYPES = ["TensorList"] * 6 + ["Scalar"] * 7 + ["", ""]


@pytest.mark.parametrize(
    ("name", "concrete", "per_element"),
    [
        # Adam: m 3 + v 4 + bias correction 2 + sqrt/eps 2 + div 1 + lr/update 2 = 14 (ref §3.7)
        ("aten::_fused_adam_", ["0.001", "0.9", "0.999", "0.", "1e-08", "False", "False"], 14),
        ("aten::_fused_adam_", ["0.001", "0.9", "0.999", "0.01", "1e-08", "True", "False"], 17),
        ("aten::_fused_adamw_", ["0.001", "0.9", "0.999", "0.01", "1e-08", "False", "False"], 16),
    ],
)
def test_fused_adam(name, concrete, per_element) -> None:
    got = _one(name, OPT_SHAPES, OPT_TYPES, [""] * 6 + concrete + ["", ""])
    assert got["flops"] == per_element * 17
    assert pd.isna(got["bytes"])  # Kineto records no dtype for TensorList arguments
    assert got["family"] == "optimizer"


def test_sgd_and_foreach() -> None:
    sgd = _one(
        "aten::_fused_sgd_",
        [[[4, 3], [5]]] * 3 + [[]] * 9,
        ["TensorList"] * 3 + ["Scalar"] * 7 + ["", ""],
        ["", "", "", "0.", "0.9", "0.1", "0.", "False", "False", "False", "", ""],
    )
    assert sgd["flops"] == 4 * 17  # momentum SGD ~4 FLOPs per element (reference §3.7)
    add = _one("aten::_foreach_add_", [[[4, 3], [5]], []], ["TensorList", "Scalar"], ["", "1"])
    assert add["flops"] == 17
    lerp = _one(
        "aten::_foreach_lerp_",
        [[[4, 3], [5]], [[4, 3], [5]], []],
        ["TensorList", "TensorList", "Scalar"],
        ["", "", "0.1"],
    )
    assert lerp["flops"] == 3 * 17


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "concrete", "why"),
    [
        ("aten::mm", [[], []], ["", ""], None, "mm operands"),
        ("aten::mm", None, None, None, "not recorded"),
        ("aten::addmm", [[4], [3, 4], [5, 4], [], []], [F32] * 3 + ["Scalar"] * 2, None, "addmm"),
        # legacy Kineto (torch 1.9): no Concrete Inputs, so stride/padding are unknown
        (
            "aten::cudnn_convolution",
            [[32, 3, 224, 224], [64, 3, 7, 7]] + [[]] * 7,
            [F32, F32, "GenericList", "GenericList", "GenericList", "Int", "Bool", "Bool", "Bool"],
            None,
            "stride/padding/dilation",
        ),
        (
            "aten::cudnn_convolution_backward",
            [[32, 512, 7, 7], [32, 2048, 7, 7], [2048, 512, 1, 1]] + [[]] * 8,
            [F32] * 3 + ["GenericList"] * 3 + ["Int"] + ["Bool"] * 3 + ["GenericList"],
            None,
            "output_mask",
        ),
        (
            "aten::cudnn_batch_norm",
            [[32, 64, 56, 56], [64], [64], [64], [64], [], [], []],
            [F32] * 5 + ["Bool", "Double", "Double"],
            None,
            "'training'",
        ),
        (
            "aten::mean",
            [[2, 3, 4], [], [], []],
            [F32, "GenericList", "Bool", ""],
            None,
            "reduced dims",
        ),
        (
            "aten::_flash_attention_forward",
            [[282, 8, 64]] * 3 + [[3], [3]] + [[]] * 10,
            [BF16] * 3 + ["int", "int"] + ["Scalar"] * 10,
            ["", "", "", "", "", "141", "141", "0.", "False"] + [""] * 6,
            "variable-length",
        ),
        (
            "aten::einsum",
            [[], [[2, 3, 4], [2, 4, 5]], []],
            ["", "TensorList", ""],
            ["", "", ""],
            "equation",
        ),
        ("aten::_fused_adam_", OPT_SHAPES, OPT_TYPES, None, "not recorded"),
    ],
)
def test_unknown_is_na_never_zero(name, shapes, dtypes, concrete, why) -> None:
    got = _one(name, shapes, dtypes, concrete)
    assert pd.isna(got["flops"])
    assert got["flop_formula"].startswith("unknown") and why in got["flop_formula"]


def test_no_formula_and_bad_records() -> None:
    ops = pd.DataFrame(
        {
            "name": ["aten::view", "ProfilerStep#3", "aten::mm", "c10d::allreduce_", None],
            "input_shapes": ["[[2,3],[]]", None, "not json", "[[1]]", None],
            "dtypes": ['["float","ScalarList"]', None, '["float"]', '["float"]', None],
        },
        index=[10, 11, 12, 13, 14],
    )
    out = op_flops(ops)
    assert list(out.index) == [10, 11, 12, 13, 14]
    assert out["flops"].isna().all() and out["bytes"].isna().all()
    assert out.loc[12, "flop_formula"].startswith("unknown")
    assert out.loc[[10, 11, 13, 14], "flop_formula"].isna().all()
    assert str(out["flops"].dtype) == "Float64" and str(out["bytes"].dtype) == "Int64"


def test_unrecorded_shapes_keep_the_family() -> None:
    """Captures without record_shapes: NA figures, but the op's family is still known."""
    ops = pd.DataFrame({"name": ["aten::conv2d", "aten::mm", "aten::add_", "aten::_fused_adam_"]})
    out = op_flops(ops)
    assert out["flops"].isna().all()
    assert list(out["family"]) == ["conv", "gemm", "elementwise", "optimizer"]
    assert (out["flop_formula"] == "unknown: input shapes/dtypes not recorded").all()


def test_clang_type_names() -> None:
    """Kineto type names are the compiler's demangled C++ types: clang writes ``long``."""
    got = _one("aten::add_", [[3, 4], [3, 4], []], ["long", "long", "Scalar"], None)
    assert got["flops"] == 12 and got["bytes"] == 3 * 96 and got["compute_dtype"] == "int64"


def test_op_type_column_and_compute_dtypes() -> None:
    ops = pd.DataFrame(
        {
            "op_type": ["mm", "mm", "mm", "_int_mm", "_scaled_mm"],
            "input_shapes": ["[[4,4],[4,4]]"] * 4 + ["[[4,4],[4,4],[],[],[],[],[],[]]"],
            "dtypes": [
                '["float","float"]',
                '["c10::Half","c10::Half"]',
                '["double","double"]',
                '["signed char","signed char"]',
                '["c10::Float8_e5m2","c10::Float8_e4m3fn","float","float","","","",""]',
            ],
        }
    )
    out = op_flops(ops)
    assert list(out["compute_dtype"]) == ["fp32", "fp16", "fp64", "int8", "fp8"]
    assert (out["flops"] == 128).all()


def test_unique_records_parsed_once(monkeypatch) -> None:
    calls = []
    real = FORMULAS["mm"]
    monkeypatch.setitem(FORMULAS, "mm", lambda a: calls.append(1) or real(a))
    n = 5000
    ops = pd.DataFrame(
        {
            "name": ["aten::mm", "aten::mm"] * (n // 2),
            "input_shapes": ["[[4,4],[4,4]]", "[[8,4],[4,4]]"] * (n // 2),
            "dtypes": ['["float","float"]'] * n,
            "concrete_inputs": ['["",""]'] * n,
        }
    )
    out = op_flops(ops)
    assert len(calls) == 2
    assert out["flops"].tolist() == [128.0, 256.0] * (n // 2)


def test_to_copy_dtype_codes_match_torch(tmp_path) -> None:
    """``ScalarType`` arguments are recorded as c10 enum codes: check the ones we decode."""
    x = torch.randn(3, 5)
    targets = [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for dt in targets:
            x.to(dt)
    path = tmp_path / "to.pt.trace.json"
    prof.export_chrome_trace(str(path))
    r = load_trace(path).ranges
    r = r[r["name"] == "aten::_to_copy"]
    got = op_flops(r)["bytes"].tolist()
    assert got == [15 * (4 + dt.itemsize) for dt in targets]


def test_formula_arg_positions_match_torch_schemas() -> None:
    """The argument positions in the conv / attention specs name the right schema arguments."""
    from perfguard.analysis import flops as fl

    def arg(op: str, i: int) -> set[str]:
        packet = getattr(torch.ops.aten, op)
        return {
            getattr(packet, ov)._schema.arguments[i].name
            for ov in packet.overloads()
            if i < len(getattr(packet, ov)._schema.arguments)
        }

    conv_fields = {
        "stride": {"stride"},
        "padding": {"padding"},
        "dilation": {"dilation"},
        "groups": {"groups"},
        "output_padding": {"output_padding"},
        "bias": {"bias"},
        "transposed": {"transposed"},
    }
    checked = 0
    for op, fn in fl.FORMULAS.items():
        closure = {c.cell_contents for c in (fn.__closure__ or ())}
        for spec in closure:
            if isinstance(spec, fl._ConvSpec) and hasattr(torch.ops.aten, op):
                for fname, names in conv_fields.items():
                    idx = getattr(spec, fname)
                    if isinstance(idx, int) and not isinstance(idx, bool):
                        assert arg(op, idx) & names, (op, fname, idx)
                        checked += 1
            if isinstance(spec, fl._AttnSpec) and hasattr(torch.ops.aten, op):
                assert arg(op, spec.q) & {"query"}, op
                assert arg(op, spec.k) & {"key"}, op
                if spec.causal is not None:
                    assert arg(op, spec.causal) & {"is_causal"}, op
                if spec.mask_type is not None:
                    assert arg(op, spec.mask_type) & {"custom_mask_type"}, op
                checked += 1
            if isinstance(spec, fl._ConvBwdSpec) and hasattr(torch.ops.aten, op):
                assert arg(op, spec.mask) & {"output_mask"}, op
                assert arg(op, spec.grad_out) & {"grad_output"}, op
                checked += 1
    assert checked > 60


# --------------------------------------------------------------------------- count_once


def _tree(rows: list[tuple[int, int, str, float | None, str | None]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["range_id", "parent_id", "name", "flops", "family"]).astype(
        {"flops": "Float64"}
    )


def test_count_once_linear_and_conv_chain() -> None:
    t = _tree(
        [
            (0, -1, "aten::linear", 240, "gemm"),
            (1, 0, "aten::t", None, None),
            (2, 0, "aten::addmm", 240, "gemm"),
            (3, 2, "aten::copy_", 0, "copy"),
            (10, -1, "aten::conv2d", None, "conv"),  # e.g. padding='same' not recorded
            (11, 10, "aten::convolution", 500, "conv"),
            (12, 11, "aten::_convolution", 500, "conv"),
            (13, 12, "aten::cudnn_convolution", 500, "conv"),
            (20, -1, "aten::conv_transpose2d", 70, "conv"),
            (21, 20, "aten::_convolution", 70, "conv"),
            (22, 21, "aten::copy_", 0, "copy"),  # 0 FLOPs below does not cover
        ]
    )
    for fam in (None, t["family"]):
        got = count_once(t["flops"], t["parent_id"], t["range_id"], fam)
        assert got[2] == 240 and got[0] == 0 and got[3] == 0
        assert got[4] == 0 and got[5] == 0 and got[6] == 0 and got[7] == 500
        assert got[8] == 0 and got[9] == 70 and got[10] == 0
        assert float(got.sum()) == 810
        assert pd.isna(got[1])


def test_count_once_family_rules() -> None:
    t = _tree(
        [
            # CUDA conv backward: bias grad in a child aten::sum, both real work
            (0, -1, "aten::convolution_backward", 1000, "conv"),
            (1, 0, "aten::sum", 50, "reduction"),
            # math SDPA: covered by its bmm children
            (10, -1, "aten::_scaled_dot_product_attention_math", 400, "attention"),
            (11, 10, "aten::matmul", 200, "gemm"),
            (12, 11, "aten::bmm", 200, "gemm"),
            (13, 10, "aten::_softmax", 30, "softmax"),
            (14, 10, "aten::bmm", 200, "gemm"),
            # CPU sum: the fill_ that initialises its output is not its work
            (20, -1, "aten::sum", 24, "reduction"),
            (21, 20, "aten::fill_", 4, "copy"),
            # clone -> copy_
            (30, -1, "aten::clone", 96, "copy"),
            (31, 30, "aten::copy_", 96, "copy"),
            # CPU-decomposed rms_norm: only the pieces count
            (40, -1, "aten::_fused_rms_norm", 96, "norm"),
            (41, 40, "aten::pow", 24, "elementwise"),
            (42, 40, "aten::mul", 24, "elementwise"),
            # an unregistered wrapper (autograd node) over a counted op
            (50, -1, "ConvolutionBackward0", None, None),
            (51, 50, "aten::convolution_backward", 300, "conv"),
        ]
    )
    got = count_once(t["flops"], t["parent_id"], t["range_id"], t["family"]).tolist()
    assert got == [1000, 50, 0, 0, 200, 30, 200, 24, 4, 0, 96, 0, 24, 24, 0, 300]
    plain = count_once(t["flops"], t["parent_id"], t["range_id"]).tolist()
    assert plain[0] == 0 and plain[7] == 0  # without families any positive descendant covers


def test_count_once_keeps_dtype_and_index() -> None:
    s = pd.Series(pd.array([5, 7, None], dtype="Int64"), index=[100, 200, 300])
    got = count_once(s, pd.Series([-1, 0, 0], index=s.index), pd.Series([0, 1, 2], index=s.index))
    assert str(got.dtype) == "Int64" and list(got.index) == [100, 200, 300]
    assert got.tolist()[:2] == [0, 7] and pd.isna(got.iloc[2])


def _naive_count_once(flops, parent, rid) -> list:
    """Reference implementation: a recursive walk per range."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)

    def has_positive_below(i: int) -> bool:
        for c in children.get(rid[i], []):
            v = flops[c]
            if (v is not None and v > 0) or has_positive_below(c):
                return True
        return False

    return [0 if has_positive_below(i) else flops[i] for i in range(len(rid))]


def test_count_once_matches_naive_on_random_trees() -> None:
    rng = random.Random(7)
    for _ in range(20):
        n = rng.randint(1, 60)
        rid = rng.sample(range(1000), n)
        parent = [-1] + [rid[rng.randrange(i)] if rng.random() < 0.8 else -1 for i in range(1, n)]
        flops = [rng.choice([None, 0, 1, 5]) for _ in range(n)]
        got = count_once(
            pd.Series(pd.array(flops, dtype="Float64")), pd.Series(parent), pd.Series(rid)
        )
        want = _naive_count_once(flops, parent, rid)
        assert [None if pd.isna(x) else x for x in got] == want


def test_count_once_is_vectorised_by_level() -> None:
    # a 200k-node forest: must not be a per-event Python loop
    n = 200_000
    rid = np.arange(n)
    parent = np.where(rid % 4 == 0, -1, rid - 1)  # chains of depth 3
    flops = pd.Series(pd.array(np.ones(n), dtype="Float64"))
    got = count_once(flops, pd.Series(parent), pd.Series(rid))
    assert float(got.sum()) == n // 4  # only the deepest of each chain of 4 counts
    assert "leaf level" in LEAF_POLICY


# --------------------------------------------------------------------------- real captures


def test_h100_bert_capture(fixture_file, cached_trace) -> None:
    r = cached_trace(
        fixture_file("kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz")
    ).ranges
    f = op_flops(r)
    once = count_once(f["flops"], r["parent_id"], r["range_id"], f["family"])
    name = r["name"]
    addmm = name == "aten::addmm"
    assert addmm.any()
    shapes = r.loc[addmm, "input_shapes"].astype(object).map(json.loads)  # coded text
    want = shapes.map(lambda s: 2 * s[1][0] * s[1][1] * s[2][1]).astype(float)
    assert (f.loc[addmm, "flops"].astype(float) == want).all()
    assert (once[addmm] == f.loc[addmm, "flops"]).all()  # addmm is the leaf
    assert (once[name == "aten::linear"] == 0).all()  # linear is covered by addmm
    flash = name == "aten::_flash_attention_forward"
    assert (f.loc[flash, "flops"] == 2 * 8 * 141 * 141 * (64 + 64)).all()
    assert (once[flash] > 0).all()
    assert (once[name == "aten::scaled_dot_product_attention"] == 0).all()
    counted = f["family"].isin(CONTRACTION_FAMILIES) & (once > 0)
    assert set(f.loc[counted, "compute_dtype"]) == {"bf16"}
    assert not (once.isna() & f["family"].isin(CONTRACTION_FAMILIES)).any()


def test_v100_resnet50_legacy_capture(fixture_file, cached_trace) -> None:
    """torch 1.9 capture: no Concrete Inputs, so forward convs are unknown (never 0), while
    dgrad (legacy cudnn_convolution_backward_input) and GEMMs are known."""
    r = cached_trace(
        fixture_file("kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz")
    ).ranges
    f = op_flops(r)
    once = count_once(f["flops"], r["parent_id"], r["range_id"], f["family"])
    name = r["name"]
    fwd = name == "aten::cudnn_convolution"
    assert fwd.any() and f.loc[fwd, "flops"].isna().all()
    assert f.loc[fwd, "flop_formula"].str.contains("stride").all()
    dgrad = name == "aten::cudnn_convolution_backward_input"
    assert dgrad.any() and (once[dgrad] > 0).all()
    # the parent with an unrecorded output_mask is covered by its dgrad child: 0, not NA
    assert (once[name == "aten::cudnn_convolution_backward"] == 0).all()
    mm = name == "aten::mm"
    assert (once[mm] > 0).all() and set(f.loc[mm, "compute_dtype"]) == {"fp32"}


def test_einsum_with_a_recorded_equation() -> None:
    """Reference §3.1 two-operand rules, for recorders that keep the equation string."""
    shapes, types = [[], [[2, 3, 4], [2, 4, 5]], []], ["", "TensorList", ""]
    bmm = _one("aten::einsum", shapes, types, ["bij,bjk->bik", "", ""])
    assert bmm["flops"] == 2 * 2 * 3 * 4 * 5  # 2*prod(every distinct index extent)
    outer = _one("aten::einsum", [[], [[3], [4]], []], types, ["i,j->ij", "", ""])
    assert outer["flops"] == 12  # no contracted index: prod(output extents)
    assert pd.isna(bmm["bytes"])  # TensorList element types are not recorded
