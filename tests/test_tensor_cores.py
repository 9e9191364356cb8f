"""Tensor Cores: kernel-name rules, op eligibility, resolving unknowns, TC utilization.

The expected answers never come from perfguard:

* ``data/tc_kernel_labels.csv`` holds real kernel names copied verbatim from
  the fixtures, each labelled by reading the name against
  ``shared/reference/tensor_cores_flops.md`` (§1.2 name decoding, §1.3
  patterns per generation and library, §1.5 false positives); ``uses_tc`` is
  ``True``/``False`` or empty for "the name cannot tell". A test checks that
  every name really occurs in the fixture it names, and another that every
  kernel name of every shared capture is in the table (459 names).
* ``data/tc_kernel_labels_public.csv`` holds current GPUs' names (Blackwell
  trtllm-gen ``bmm_*``/``fmhaSm100*``, CUTLASS 3.x ``sm100``, TensorRT,
  nvFuser, DeepGEMM) copied from public traces and sources, each with its
  reason and where it was found.
* The synthetic names below (marked SYNTHETIC) cover patterns no fixture has
  (Volta/Turing TC kernels, Blackwell nvjet, int8, WMMA, Triton, fmha, FA
  helpers); they are built from the reference's examples.
* The utilization case is computed by hand in the test.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfguard.analysis.tensor_cores import (
    KERNEL_RULES,
    NOT_MATRIX_REASON,
    OP_RULES,
    classify_kernels,
    eligible_by_kernels,
    op_tc_eligible,
    resolve_unknown,
    tc_utilization,
)

LABELS_CSV = Path(__file__).resolve().parent / "data" / "tc_kernel_labels.csv"
#: current GPUs' names (Blackwell trtllm-gen, CUTLASS 3.x sm100, TensorRT, nvFuser) copied from
#: public traces and sources, each with its reason and where it was found
PUBLIC_CSV = Path(__file__).resolve().parent / "data" / "tc_kernel_labels_public.csv"
_TRUTH = {"True": True, "False": False, "": None}


def _labels() -> pd.DataFrame:
    table = pd.read_csv(LABELS_CSV, dtype=str, keep_default_na=False)
    table["expected"] = table["uses_tc"].map(_TRUTH)
    return table


LABELS = _labels()
PUBLIC = pd.read_csv(PUBLIC_CSV, dtype=str, keep_default_na=False)
PUBLIC["expected"] = PUBLIC["uses_tc"].map(_TRUTH)


def _as_objects(flags: pd.Series) -> list[bool | None]:
    return [None if pd.isna(v) else bool(v) for v in flags]


# ---- the labelled table of real names --------------------------------------------------------


def test_label_table_is_real_sized_and_diverse() -> None:
    assert list(LABELS.columns[:4]) == ["name", "uses_tc", "reason", "fixture"]
    assert len(LABELS) >= 150
    assert LABELS["name"].is_unique
    assert set(LABELS["uses_tc"]) == {"True", "False", ""}
    assert (LABELS["reason"].str.len() > 0).all()
    fixtures = " ".join(LABELS["fixture"].unique())
    for gpu in ("v100", "quadro-rtx6000", "a100", "h100", "h200"):  # Volta Turing Ampere Hopper
        assert gpu in fixtures, gpu
    names = " ".join(LABELS["name"])
    libraries = [
        "volta_sgemm",
        "scudnn",
        "splitKreduce",
        "gemv",
        "gemmSN",
        "cutlass_80_",
        "sm80_xmma_",
        "sm90_xmma_",
        "nvjet_",
        "flash_fwd_kernel",
        "ncclKernel",
        "nvfuser_",
        "elementwise_kernel",
        "wmma_tensorop",
        "cutlass_cudnn",
    ]
    for library in libraries:
        assert library in names, library


def test_classifier_agrees_with_every_labelled_name() -> None:
    got = classify_kernels(LABELS["name"])
    wrong = [
        (row.name[:120], row.expected, flag, reason)
        for row, flag, reason in zip(
            LABELS.itertuples(), _as_objects(got["uses_tc"]), got["tc_reason"], strict=True
        )
        if flag is not row.expected
    ]
    assert wrong == []


def test_classifier_agrees_with_every_public_name_of_current_gpus() -> None:
    assert len(PUBLIC) >= 20 and PUBLIC["name"].is_unique
    assert (PUBLIC["reason"].str.len() > 0).all() and (PUBLIC["source"].str.len() > 0).all()
    got = classify_kernels(PUBLIC["name"])
    wrong = [
        (name[:100], expected, flag, reason)
        for name, expected, flag, reason in zip(
            PUBLIC["name"],
            PUBLIC["expected"],
            _as_objects(got["uses_tc"]),
            got["tc_reason"],
            strict=True,
        )
        if flag is not expected
    ]
    assert wrong == []


def test_unknown_only_where_the_name_cannot_tell() -> None:
    """Every labelled name is decided except nvFuser's manually scheduled kernels
    (``nvfuser_none_*``: the scheduler, hence MMA or not, is not in the name)."""
    names = pd.concat([LABELS["name"], PUBLIC["name"]])
    got = classify_kernels(names)
    unknown = names[got["uses_tc"].isna().to_numpy()]
    assert len(unknown) == 2
    assert unknown.str.contains(r"(?:^|::)nvfuser_none_f\d", regex=True).all()


def _assert_all_labelled(path: Path, cached_trace) -> None:
    names = set(cached_trace(path).kernels["name"].dropna())
    assert names - set(LABELS["name"]) == set(), path.name


def test_every_kernel_name_of_every_nsys_fixture_is_labelled(nsys_file, cached_trace) -> None:
    """The 100 % agreement above covers all of the shared captures, not a sample."""
    _assert_all_labelled(nsys_file, cached_trace)


def test_every_kernel_name_of_every_kineto_fixture_is_labelled(kineto_file, cached_trace) -> None:
    _assert_all_labelled(kineto_file, cached_trace)


@pytest.mark.parametrize("fixture", sorted(LABELS["fixture"].unique()))
def test_labelled_names_occur_in_their_fixture(fixture, fixture_file, cached_trace) -> None:
    trace = cached_trace(fixture_file(fixture))
    present = set(trace.kernels["name"])
    wanted = set(LABELS.loc[LABELS["fixture"] == fixture, "name"])
    assert wanted - present == set()


# ---- synthetic names: patterns the fixtures do not have ----------------------------------------

# SYNTHETIC: built from the examples and rules of the reference (section in the comment).
SYNTHETIC = [
    # §1.1/§1.3 Volta and Turing cuBLAS/cuDNN
    ("volta_h884gemm_256x128_ldg8_nn", True),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_tn", True),
    ("volta_fp16_s884cudnn_fp16_256x64_ldg8_relu_exp_small_nhwc2nchw_tn_v1", True),
    ("volta_s884cudnn_fp16_128x128_ldg8_wgrad_idx_exp_interior_nhwc_nt", True),
    ("turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_filter1x1_stg8_interior_nchw_nn_v1", True),
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", True),
    ("turing_h1688gemm_256x128_ldg8_tn", True),
    ("turing_int8_i8816gemm_int8_128x128_ldg16_nn", True),  # imma int8
    ("maxwell_scudnn_winograd_128x128_ldg1_ldg4_tile148n_nt", False),
    (
        "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1>(int)",
        False,
    ),
    # §1.3 Ampere / Ada
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_relu_f2f_stages_64x4_nn", True),
    ("ampere_tf32_s1688gemm_tf32_128x128_16x3_nn", True),
    ("ampere_int8_i16832gemm_int8_256x128_128x3_nn", True),
    ("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_32x1_tn_align8", True),
    ("cutlass_tensorop_f16_s16816gemm_f16_256x128_32x3_nn_align8", True),
    ("cutlass_75_tensorop_i8816gemm_s8_128x128_64x2_tn_align16", True),
    ("cutlass_tensorop_d884gemm_64x64_16x4_nn_align1", True),  # FP64 DMMA
    ("cutlass_simt_sgemm_128x128_8x2_nn_align1", False),
    (
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize256x64x8_stage3_warpsize2x2x1_ffma_aligna4_"
        "alignc4_execute_kernel__5x_cublas",
        False,
    ),
    (
        "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_stage3_"
        "warpsize4x1x1_g1_tensor16x8x16_execute_kernel__5x_cudnn",
        True,
    ),
    (
        "sm80_xmma_wgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_"
        "stage3_warpsize2x2x1_g1_execute_kernel__5x_cudnn",
        True,
    ),  # dtype tag only
    (
        "sm89_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x64_stage3_warpsize2x2x1_cublas",
        True,
    ),
    # §1.3 Hopper / Blackwell
    (
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize2x1x1_"
        "execute_segment_k_off_kernel__5x_cublas",
        True,
    ),  # TF32
    (
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_"
        "warpgroupsize2x1x1_g1_execute_kernel__5x_cudnn",
        True,
    ),
    ("nvjet_tst_128x128_64x4_1x2_h_bz_coopA", True),
    ("nvjet_sm90_hss_320x128_64x3_2x1_v_bz_coopB_NTN", True),
    ("nvjet_sm100_tst_256x128_64x4_2x1_v_bz_coopA_NNT", True),  # Blackwell
    ("nvjet_sm103_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT", True),  # FP8 on B300
    ("nvjet_sm120_tst_mma_128x128_64x3_1x1_h_bz_NNN", True),
    ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_align8", True),
    ("cutlass3x_sm100_tensorop_gemm_f16_f16_f32_void_f16_256x128x64_2x1x1_0_tnn_align8", True),
    (
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int,"
        " int>, cutlass::gemm::collective::CollectiveMma<"
        "cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<4, cute::tuple<cute::C<1>>>>>>"
        "(T1::Params)",
        True,
    ),
    ("device_kernel", None),  # nsys short name of a CUTLASS 3 kernel
    # §1.3 attention
    (
        "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>"
        "(flash::Flash_bwd_params)",
        True,
    ),
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>(Flash_fwd_params)", True),
    (
        "void flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128>>"
        "(flash::Flash_bwd_params)",
        False,
    ),
    (
        "void flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128>>(Flash_bwd_params)",
        False,
    ),
    (
        "void flash::flash_bwd_clear_dkvaccum_kernel<Flash_bwd_kernel_traits<128>>"
        "(Flash_bwd_params)",
        False,
    ),
    (
        "void flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128>, 4>(params)",
        False,
    ),
    (
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
        "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>>>>>>(T1::Params)",
        True,
    ),
    (
        "void cutlass::device_kernel<flash::FlashAttnBwdPostprocessConvertdQ<cute::tuple<>, "
        "cutlass::bfloat16_t, float, cutlass::arch::Sm90, 256, cute::TiledMMA<cute::MMA_Atom<"
        "cute::SM90_64x128x16_F32BF16BF16_RS>>>>(T1::Params)",
        False,
    ),
    ("void flash::prepare_varlen_num_blocks_kernel(flash::Flash_fwd_params)", False),
    (
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
        "cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        True,
    ),
    (
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)",
        True,
    ),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", True),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm75(PyTorchMemEffAttention::AttentionKernel)", False),
    ("fmha_cutlassB_f32_notaligned_64x64_k65536_sm50(PyTorchMemEffAttention::Kernel)", False),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm50(PyTorchMemEffAttention::AttentionKernel)", False),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm70(PyTorchMemEffAttention::AttentionKernel)", True),
    ("fmha_fwd_f32_kernel", None),  # f32 without an arch: TC only on sm80+
    (
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64_4x1x1_"
        "cga1x1x1_kernel0_0",
        True,
    ),
    # §1.3 Triton, code generators
    ("triton_tem_fused_addmm_0", None),
    ("triton_mm", None),
    ("triton_poi_fused_add_0", False),
    ("triton_red_fused_sum_1", False),
    ("triton_per_fused_native_layer_norm_2", False),
    ("triton_for_fused_0", False),
    ("matmul_kernel", None),  # user @triton.jit kernel from the Triton tutorial
    ("_attn_fwd", None),
    ("nvfuser_pointwise_f0_c1_r0_g0", False),  # Fuser scheduler_types.cpp: no MMA
    ("nvfuser_inner_outer_persistent_f2_c1_r0_g3", False),
    ("nvfuser_transpose_f0_c1_r0_g0", False),
    ("nvfuser_cutlass_f0_c1_r0_g0", True),  # Fuser cutlass scheduler: GEMMs on cc 10.0 only
    # FlashInfer: decode is vector FMA, prefill uses mma (include/flashinfer/attention/*.cuh)
    (
        "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u,"
        " 8u, 16u, 1u, 4u, flashinfer::DefaultAttention<false, false, false, false>,"
        " flashinfer::BatchDecodeParams<__half, __half, __half, int>>"
        "(flashinfer::BatchDecodeParams<__half, __half, __half, int>)",
        False,
    ),
    (
        "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<"
        "(flashinfer::MaskMode)1, 128u, 1u, 4u>>(flashinfer::BatchPrefillPagedParams<__half>)",
        True,
    ),
    ("void flashinfer::MergeStatesKernel<8u, 16u, 8u, 4u, __half, __half>(__half*)", False),
    (
        "GemmGatedActKernel_Bfloat16_E2m1_Fp32_tile128x8x256_epilogueTile128x8_mma128x8x64_"
        "cluster1x1x4_splitK4_transposeMmaOutput_sm100a",
        True,
    ),  # TRT-LLM trtllm-gen gated GEMM (cubin symbol without its _cubin suffix)
    ("void genericReformat::copyPackedKernel<float, float, true, true>(int)", False),
    ("__myl_bb0_1_Gemm", None),
    # §1.5 false positives of broad patterns
    (
        "void gemvx::kernel<int, int, float, float, float, float, false, true, true, false, 6>()",
        False,
    ),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4>()", False),
    ("void splitKreduce_kernel<32, 16, int, __half, __half, float, __half, true, false>()", False),
    ("_Z10foo_kernelILi1688EEvPf", False),  # a template argument 1688 is not an MMA shape
    ("void at::native::im2col_kernel<float>(long, float const*, long, long)", False),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", False),
]


@pytest.mark.parametrize(("name", "expected"), SYNTHETIC, ids=lambda v: str(v)[:60])
def test_synthetic_names(name: str, expected: bool | None) -> None:
    got = classify_kernels(pd.Series([name]))
    assert _as_objects(got["uses_tc"]) == [expected], got["tc_reason"].iloc[0]


# ---- the rule table and the function's contract ----------------------------------------------


def test_rules_are_data_with_sources() -> None:
    assert isinstance(KERNEL_RULES, tuple) and isinstance(OP_RULES, tuple)
    for rule in KERNEL_RULES:
        re.compile(rule.pattern)
        assert rule.uses_tc in (True, False, None)
        assert rule.reason and "§" in rule.source
    for rule in OP_RULES:
        re.compile(rule.pattern)
        assert rule.source
    # reference §7: explicit non-TC rules come before every TC rule, unknown ones last
    order = [r.uses_tc for r in KERNEL_RULES]
    first_tc = order.index(True)
    assert False not in order[first_tc:]
    assert True not in order[order.index(None) :]
    with pytest.raises(AttributeError):
        KERNEL_RULES[0].uses_tc = True  # frozen


def test_classify_keeps_the_index_and_handles_missing_names() -> None:
    names = pd.Series(
        ["nvjet_tst_96x64_64x10_1x2_h_bz_bias_TNN", None, "saxpy", "triton_mm"],
        index=[10, 20, 30, 40],
    )
    got = classify_kernels(names)
    assert list(got.index) == [10, 20, 30, 40]
    assert list(got.columns) == ["uses_tc", "tc_reason"]
    assert got["uses_tc"].dtype == "boolean"
    assert _as_objects(got["uses_tc"]) == [True, None, False, None]
    assert got.loc[30, "tc_reason"] == NOT_MATRIX_REASON
    assert got.loc[20, "tc_reason"] == "no kernel name"
    empty = classify_kernels(pd.Series([], dtype=object))
    assert empty.empty and empty["uses_tc"].dtype == "boolean"


def test_a_million_names_classify_in_one_pass() -> None:
    """Vectorisation sanity (no timing): 1,000,000 events made of the real names."""
    base = LABELS["name"].to_numpy(dtype=object)
    names = pd.Series(np.resize(base, 1_000_000))
    got = classify_kernels(names)
    once = classify_kernels(pd.Series(base))
    expected = np.resize(np.asarray(_as_objects(once["uses_tc"]), dtype=object), 1_000_000)
    assert len(got) == 1_000_000
    assert (got["uses_tc"].isna().to_numpy() == pd.isna(expected)).all()
    assert (got["uses_tc"].fillna(False).to_numpy(bool) == (expected == True)).all()  # noqa: E712


# ---- op eligibility --------------------------------------------------------------------------

# Real op names, each seen in a Kineto/nsys fixture (checked below).
REAL_ELIGIBLE = [
    (
        "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
        [
            "aten::addmm",
            "aten::linear",
            "aten::scaled_dot_product_attention",
            "aten::_scaled_dot_product_flash_attention",
            "aten::_flash_attention_forward",
        ],
    ),
    (
        "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz",
        [
            "aten::mm",
            "aten::conv2d",
            "aten::convolution",
            "aten::_convolution",
            "aten::cudnn_convolution",
            "aten::convolution_backward",
            "AddmmBackward0",
            "ConvolutionBackward0",
        ],
    ),
    (
        "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz",
        [
            "CudnnConvolutionBackward",
            "AddmmBackward",
            "aten::cudnn_convolution_backward_input",
            "aten::cudnn_convolution_backward_weight",
        ],
    ),
    ("kineto/v100_dlrm_8rank_nccl_shapes/rank-0.pt.trace.json.gz", ["aten::bmm", "BmmBackward0"]),
    (
        "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite",
        ["FlashAttnFunc", "flash_attn::_flash_attn_forward"],
    ),
]
REAL_NOT_ELIGIBLE = [
    (
        "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
        ["aten::add", "aten::layer_norm", "aten::gelu", "aten::embedding", "aten::index_select"],
    ),
    (
        "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz",
        [
            "aten::max_pool2d",
            "aten::cudnn_batch_norm",
            "nccl:all_reduce",
            "TBackward0",
            "torch::autograd::AccumulateGrad",
            "ProfilerStep#4",
            "autograd::engine::evaluate_function: AddmmBackward0",
        ],
    ),
]


@pytest.mark.parametrize(
    ("fixture", "names", "eligible"),
    [(f, n, True) for f, n in REAL_ELIGIBLE] + [(f, n, False) for f, n in REAL_NOT_ELIGIBLE],
)
def test_real_op_names(fixture, names, eligible, fixture_file, cached_trace) -> None:
    trace = cached_trace(fixture_file(fixture))
    assert set(names) <= set(trace.ranges["name"])
    got = op_tc_eligible(pd.Series(names))
    assert dict(zip(names, got, strict=True)) == dict.fromkeys(names, eligible)
    # the same answer from the op_type column (the name without its namespace)
    types = trace.ranges.drop_duplicates("name").set_index("name").loc[names, "op_type"]
    assert op_tc_eligible(types.reset_index(drop=True)).tolist() == [eligible] * len(names)


MADE_UP_OPS = [
    # TensorFlow, xprof IsOpTensorCoreEligible (§2)
    ("model/dense/MatMul", True),
    ("model/dense/MatMul_1", True),
    ("model/dense/_FusedMatMul", True),
    ("gradient_tape/model/conv2d/Conv2DBackpropInput", True),
    ("gradient_tape/model/conv2d/Conv2DBackpropFilter", True),
    ("model/conv2d/_FusedConv2D", True),
    ("model/conv3d/Conv3D", True),
    ("gradient_tape/model/conv3d/Conv3DBackpropInputV2", True),  # gap of the xprof list
    ("model/dw/depthwise/DepthwiseConv2dNative", True),
    ("model/attention/BatchMatMulV2", True),
    ("model/attention/BatchMatMulV3", True),
    ("model/bert/einsum/Einsum", True),
    ("model/lstm/CudnnRNNV3", True),
    ("model/dense/BiasAdd", False),
    ("model/dense/Relu", False),
    ("model/softmax/Softmax", False),
    # NVTX / nn.Module / ONNX names
    ("/model/fc1/linear", True),
    ("/Net/fc1/aten::addmm(2)", True),  # perfguard.capture's own names, repeat count
    ("/Net/fc1/aten::addmm/aten::mm", True),
    ("/Net/block(2)/aten::relu", False),
    ("Gemm", True),
    ("conv1d", True),
    ("/encoder/layer.0/MultiheadAttention", True),
    ("Conv_12", True),
    ("/model/relu", False),
    ("LayerNorm", False),
    # XLA HLO
    ("dot.3", True),
    ("convolution.12", True),
    ("__cublas$lt$matmul", True),
    ("fusion.5", False),
    # PyTorch ops absent from the fixtures
    ("aten::_scaled_mm", True),
    ("aten::baddbmm", True),
    ("aten::einsum", True),
    ("aten::conv_transpose2d", True),
    ("aten::_efficient_attention_backward", True),
    ("aten::_scaled_dot_product_efficient_attention", True),
    ("MmBackward0", True),
    ("ScaledDotProductFlashAttentionBackward0", True),
    ("ConvolutionBackwardBackward0", True),
    ("aten::prelu", False),  # on the autocast list for dtype policy, not a GEMM (§2)
    ("aten::softmax", False),
    ("aten::embedding_bag", False),
]


def test_made_up_op_names() -> None:
    names = [n for n, _ in MADE_UP_OPS]
    got = op_tc_eligible(pd.Series(names))
    assert dict(zip(names, got, strict=True)) == dict(MADE_UP_OPS)


def test_eligibility_keeps_the_index_and_missing_is_not_eligible() -> None:
    got = op_tc_eligible(pd.Series(["aten::mm", None, "aten::add"], index=[5, 6, 7]))
    assert got.dtype == bool
    assert got.to_dict() == {5: True, 6: False, 7: False}


def test_xprof_rule_an_op_with_a_tc_kernel_is_eligible() -> None:
    # xprof's test case: an op not on the list is eligible because its kernel used TC
    ops = pd.Series(["my_einsum", "aten::add", "aten::mm", "custom_op"])
    kernels = classify_kernels(
        pd.Series(
            [
                "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_tn",
                "volta_h884gemm_64x64_nn",
                "volta_sgemm_64x64_nt",
                "triton_tem_fused_mm_0",
            ]
        )
    )
    by_type = op_tc_eligible(ops)
    assert by_type.tolist() == [False, False, True, False]
    got = eligible_by_kernels(by_type, kernels["uses_tc"])
    assert got.tolist() == [True, True, True, False]  # unknown (NA) does not make it eligible


# ---- resolving unknown kernels ---------------------------------------------------------------

BF16_ADDMM = '["c10::BFloat16","c10::BFloat16","c10::BFloat16","Scalar","Scalar"]'
FP16_MM = '["c10::Half","c10::Half"]'
FP32_MM = '["float","float"]'
FP8_SCALED_MM = '["c10::Float8_e4m3fn","c10::Float8_e4m3fn","float","float","",""]'
INT8_MM = '["signed char","signed char"]'
FP64_MM = '["double","double"]'


@pytest.mark.parametrize(
    ("dtypes", "cc", "allow_tf32", "expected"),
    [
        (BF16_ADDMM, "8.0", None, True),
        (BF16_ADDMM, None, None, True),
        (BF16_ADDMM, "7.0", None, False),  # no bf16 TC before Ampere
        (FP16_MM, "7.0", None, True),
        (FP16_MM, 6.1, None, False),
        (FP32_MM, "8.0", None, None),  # TF32 setting unknown: never guessed
        (FP32_MM, None, None, None),
        (FP32_MM, "8.0", True, True),
        (FP32_MM, None, True, None),  # TF32 allowed but the GPU is unknown
        (FP32_MM, "9.0", False, False),
        (FP32_MM, "7.5", None, False),  # fp32 on Volta/Turing never uses TC
        (FP8_SCALED_MM, "9.0", None, True),
        (FP8_SCALED_MM, "8.0", None, None),  # no FP8 TC on A100; upcast cannot be told
        (INT8_MM, "7.5", None, True),
        (INT8_MM, "7.0", None, False),
        (FP64_MM, "8.0", None, None),
        (FP64_MM, "8.6", None, False),
        ('["long int","Scalar"]', "9.0", None, None),
        (None, "9.0", None, None),
        (["c10::Half", "c10::Half"], "8.0", None, True),  # list instead of JSON text
    ],
)
def test_resolve_unknown(dtypes, cc, allow_tf32, expected) -> None:
    unknown = pd.Series([pd.NA], dtype="boolean")
    got = resolve_unknown(unknown, pd.Series([dtypes], dtype=object), cc, allow_tf32=allow_tf32)
    assert _as_objects(got) == [expected]


def test_resolve_unknown_changes_only_unknowns_and_only_eligible_ops() -> None:
    uses_tc = pd.Series([False, True, pd.NA, pd.NA, pd.NA], dtype="boolean", index=list("abcde"))
    dtypes = pd.Series([BF16_ADDMM, FP32_MM, BF16_ADDMM, BF16_ADDMM, FP32_MM], index=list("abcde"))
    cc = pd.Series(["9.0", "9.0", "9.0", "9.0", "7.0"], index=list("abcde"))
    eligible = pd.Series([True, True, True, False, True], index=list("abcde"))
    got = resolve_unknown(uses_tc, dtypes, cc, eligible=eligible)
    assert got.dtype == "boolean"
    assert list(got.index) == list("abcde")
    assert _as_objects(got) == [False, True, True, None, False]


# ---- TC utilization --------------------------------------------------------------------------


def test_tc_utilization_by_hand() -> None:
    acts = pd.DataFrame(
        {
            "op_key": ["A", "A", "B", "B", "C", "D"],
            "dur": [100, 50, 30, 70, 40, 20],
            "uses_tc": pd.array([True, False, pd.NA, True, False, True], dtype="boolean"),
            "eligible": [True, True, True, True, False, False],
        }
    )
    per_op, run = tc_utilization(acts)
    assert per_op.loc["A", "tc_utilization"] == pytest.approx(100 * 100 / 150)
    assert per_op.loc["B", "tc_utilization"] == pytest.approx(70.0)  # NA: denominator only
    assert per_op.loc["B", "unknown_time"] == 30
    assert np.isnan(per_op.loc["C", "tc_utilization"])  # not eligible
    assert np.isnan(per_op.loc["D", "tc_utilization"])
    assert per_op["kernel_time"].to_dict() == {"A": 150, "B": 100, "C": 40, "D": 20}
    assert run == pytest.approx(100 * (100 + 70) / (150 + 100))

    # xprof's rule first: D's TC kernel makes D eligible
    op_has_tc = acts.groupby("op_key")["uses_tc"].transform(lambda s: s.fillna(False).any())
    acts["eligible"] = eligible_by_kernels(acts["eligible"], op_has_tc)
    per_op, run = tc_utilization(acts)
    assert per_op.loc["D", "tc_utilization"] == pytest.approx(100.0)
    assert run == pytest.approx(100 * 190 / 270)


def test_tc_utilization_without_eligible_time_is_nan() -> None:
    acts = pd.DataFrame(
        {"op_key": ["x"], "dur": [5], "uses_tc": pd.array([pd.NA], "boolean"), "eligible": [False]}
    )
    per_op, run = tc_utilization(acts)
    assert np.isnan(run) and np.isnan(per_op.loc["x", "tc_utilization"])
