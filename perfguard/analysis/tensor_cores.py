"""Tensor Cores: which kernels used them, which ops could, and TC utilization.

Why this module exists, and the definitions it follows:

* DLProf (NVIDIA, 1.8.0) reported per op whether it is *TC eligible* and
  whether *TC kernels* ran for it, and a run-level *Tensor Core utilization*.
  DESIGN.md ("Metrics") fixes that figure as
  ``100 x time of TC kernels / time of all kernels in eligible ops``.
* A kernel *uses TC* is decided from its full demangled name, per GPU
  generation and library (cuBLAS, cuBLASLt ``nvjet``, cuDNN, ``xmma``,
  CUTLASS, FlashAttention, PyTorch memory-efficient attention, cuDNN SDPA,
  Triton). The rules are data (:data:`KERNEL_RULES`), tried in the decision
  order of ``shared/reference/tensor_cores_flops.md`` section 7: explicit
  non-TC rules first (``ffma``, ``sgemm``, ``scudnn``, GEMV, SIMT, FA helper
  kernels, ``splitKreduce``, Inductor pointwise/reduction kernels), then TC
  rules, then "unknown" rules for code-generated kernels whose name cannot
  tell (Triton templates, user Triton kernels, nvFuser, Myelin, bare CUTLASS
  ``device_kernel``), and finally *not a matrix kernel*. Each rule names its
  source (a reference section and the public material behind it).
* The result is three-valued: ``True``, ``False`` or ``<NA>`` (unknown from
  the name). :func:`resolve_unknown` settles an unknown kernel from its op's
  input dtypes and the GPU's compute capability (reference section 5.1), and
  never guesses TF32: fp32 on Ampere+ stays unknown unless the caller knows
  the TF32 setting.
* An op is *TC eligible* by its type (reference section 2: the PyTorch
  autocast lower-precision list as the Kineto TensorBoard plugin used it,
  the SDPA/FP8/backward additions, xprof's ``IsOpTensorCoreEligible`` for
  TensorFlow, XLA ``dot``/``convolution``), again as data
  (:data:`OP_RULES`). xprof's fallback rule ("Detected new Op using
  TensorCores": an op whose kernel uses TC is eligible) is
  :func:`eligible_by_kernels`.

Unknown kernels in :func:`tc_utilization` count in the denominator and not in
the numerator. DLProf's classification was binary, so a kernel it could not
recognise as TC was non-TC time; keeping that makes the figure a lower bound
that cannot overstate TC use, and ``unknown_time`` is reported beside it so a
reader sees how loose the bound is.

Everything is vectorised: names are factorised, each rule runs once with
``Series.str.contains`` over the still-unmatched *unique* names, and the
answer is mapped back by code. There is no Python loop per event.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfguard.analysis import metrics
from perfguard.arrays import factorize
from perfguard.trace.pyprof import PYTHON_OP, python_op

__all__ = [
    "KERNEL_RULES",
    "NOT_MATRIX_REASON",
    "OP_RULES",
    "KernelRule",
    "OpRule",
    "classify_kernels",
    "eligible_by_kernels",
    "op_leaf",
    "op_tc_eligible",
    "resolve_unknown",
    "tc_utilization",
]

REF = "tensor_cores_flops.md"
NOT_MATRIX_REASON = "not a matrix kernel"


@dataclass(frozen=True)
class KernelRule:
    """One kernel-name rule: a regex searched in the full demangled name.

    ``uses_tc`` is ``True``/``False``, or ``None`` for "the name cannot tell".
    """

    pattern: str
    uses_tc: bool | None
    reason: str
    source: str


# Tokens reused by several rules. A token "starts" where the previous
# character is not alphanumeric (``_``, ``<``, space, ``::`` or the start).
_START = r"(?<![A-Za-z0-9])"
# MMA instruction shapes of legacy cuBLAS/cuDNN/CUTLASS names, after the
# accumulator letter (h fp16, s fp32, i int32, d fp64, c/z complex).
_MMA_SHAPES = "884|8816|1688|16816|16832|16864|168256|161616"

#: The kernel-name rules, first match wins. Order follows reference section 7:
#: explicit non-TC rules, then TC rules, then unknown; no match means
#: :data:`NOT_MATRIX_REASON`.
KERNEL_RULES: tuple[KernelRule, ...] = (
    # ---- 2. explicit non-TC rules -------------------------------------------------------------
    KernelRule(
        _START + r"nccl[A-Z_]",
        False,
        "NCCL communication kernel",
        f"{REF} §1.1 (HTA get_kernel_type: ^nccl, ncclKernel)",
    ),
    KernelRule(
        r"^(?:Memcpy|Memset|dma)",
        False,
        "memory copy/set",
        f"{REF} §1.1 (HTA get_kernel_type: ^Memcpy, ^Memset, ^dma)",
    ),
    KernelRule(
        r"splitKreduce|ReduceSplitK|splitk_reduce",
        False,
        "split-K reduction: belongs to the GEMM op, is itself a reduction",
        f"{REF} §1.5 (PyProf prof/linear.py lists splitKreduce_kernel under gemmKernels)",
    ),
    KernelRule(
        r"epilogue::impl::globalKernel|cublasLt::epilogue",
        False,
        "cuBLASLt epilogue kernel (bias/activation after the GEMM), no MMA",
        f"{REF} §1.2 [own]: no MMA shape or TC dtype in the name",
    ),
    KernelRule(
        r"flash_fwd_splitkv_combine_kernel|flash_bwd_dot_do_o_kernel"
        r"|flash_bwd_clear_dkvaccum_kernel|flash_bwd_convert_dq_kernel"
        r"|flash_bwd_convert_dkv_kernel|prepare_varlen_num_blocks|FlashAttnFwdCombine"
        r"|FlashAttnBwdPreprocess|FlashAttnBwdPostprocess",
        False,
        "FlashAttention helper kernel (combine/convert/preprocess), not a matmul",
        f"{REF} §1.3 (Dao-AILab flash_{{fwd,bwd}}_launch_template.h; "
        "hopper/flash_bwd_launch_template.h)",
    ),
    KernelRule(
        r"(?<![A-Za-z])ffma(?![a-z])",
        False,
        "SIMT mark ffma (FP32 FMA on CUDA cores)",
        f"{REF} §1.2, §1.5",
    ),
    KernelRule(
        r"^(?!.*tf32).*f32f32_f32f32",
        False,
        "fp32 xmma dtypes (f32f32_f32f32) without tf32: FFMA kernel",
        f"{REF} §1.5",
    ),
    KernelRule(
        r"fmha_cutlass[FB]_\w*?_sm[56]\d(?!\d)",
        False,
        "memory-efficient attention built for sm5x/6x: SIMT",
        f"{REF} §1.3 (PyTorch mem_eff_attention gemm_kernel_utils.h DefaultGemmType)",
    ),
    KernelRule(
        r"fmha_cutlass[FB]_f32_\w*?_sm7\d(?!\d)",
        False,
        "memory-efficient attention, f32 below sm80: SIMT",
        f"{REF} §1.3 (gemm_kernel_utils.h: f32 uses TensorOp only on sm80+)",
    ),
    KernelRule(
        r"_simt_|OpClassSimt|MmaSimt",
        False,
        "CUTLASS SIMT kernel",
        f"{REF} §1.2 (cutlass_[<arch>_]simt_*), §1.5",
    ),
    KernelRule(
        _START + r"(?:[sdhcz]|gc|gz)gemm(?![a-z])",
        False,
        "SIMT GEMM: no MMA shape (sgemm/hgemm/cgemm/gcgemm)",
        f"{REF} §1.2 (names without an MMA shape run on CUDA cores), §1.5",
    ),
    KernelRule(
        _START + r"[sdhczi]cudnn(?![a-z])",
        False,
        "SIMT cuDNN kernel: no MMA shape (scudnn; icudnn is int8x4 DP4A)",
        f"{REF} §1.2 (volta_scudnn_*, maxwell_scudnn_winograd_*)",
    ),
    KernelRule(
        _START + r"(?:gemv|gemmSN_|gemmk1_|dot_kernel)",
        False,
        "cuBLAS GEMV / small-N GEMM / dot: SIMT",
        f"{REF} §1.5 (gemv2T_kernel, gemmSN_TN_kernel, gemmk1_kernel, dot_kernel), §5.4",
    ),
    KernelRule(
        r"dgrad_engine|wgrad_alg\d+_engine|cudnn::winograd|fft2d_|fft_r2c|fft_c2r"
        + r"|"
        + _START
        + r"im2col",
        False,
        "cuDNN SIMT convolution path (direct/Winograd/FFT/im2col), no MMA shape",
        f"{REF} §1.2 (cudnn::winograd_nonfused::*, implicit_convolve_sgemm)",
    ),
    KernelRule(
        r"[Cc]ompute\w*Offsets\w*Kernel|nchwToNhwcKernel|nhwcToNchwKernel|scalePackedTensor"
        r"|reduce_wgrad|genericTranspose",
        False,
        "cuDNN helper (offsets, layout transpose, scaling, wgrad reduction)",
        f"{REF} §5.5 (nchwToNhwcKernel/nhwcToNchwKernel around TC convs) [own for the rest]",
    ),
    KernelRule(
        r"grouped_direct_kernel|spatialDepthwiseConvolution|conv_depthwise",
        False,
        "grouped/depthwise direct convolution: SIMT",
        f"{REF} §5.7 (PyProf prof/conv.py)",
    ),
    KernelRule(
        _START + r"nvfuser_(?:pointwise|reduction|inner_persistent|outer_persistent"
        r"|inner_outer_persistent|transpose|resize|greedy|no_op)_",
        False,
        "nvFuser kernel of a non-matmul scheduler (pointwise/reduction/persistent/...): no MMA",
        f"{REF} §7 order; "
        "NVIDIA/Fuser csrc/runtime/compiled_kernel.cpp createKernelId"
        " (nvfuser_<scheduler>_f_c_r_g),"
        " csrc/scheduler/scheduler_types.cpp; only the matmul/cutlass schedulers emit MMA",
    ),
    KernelRule(
        r"xmma_pooling|genericReformat::|fmhaReductionKernel",
        False,
        "TensorRT pooling/reformat kernel or TRT-LLM FMHA multi-CTA reduction: no MMA",
        f"{REF} §7 order; "
        "public TensorRT profiles"
        " (sm50_xmma_pooling_coalescedC_NHWC_kMAX_3_False_execute_kernel_trt,"
        " genericReformat::copyPackedKernel); TRT-LLM trtllm-gen fmhaReductionKernel [own]",
    ),
    KernelRule(
        r"flashinfer::\w*(?:Decode\w*Kernel|MergeStates\w*Kernel)",
        False,
        "FlashInfer decode (vector FMA on CUDA cores) or merge-states kernel",
        f"{REF} §7 order; "
        "flashinfer include/flashinfer/attention/decode.cuh (vec_size/bdx/bdy FMA), cascade.cuh",
    ),
    KernelRule(
        _START + r"triton_(?:poi|red|per|for|spl)_",
        False,
        "Inductor pointwise/reduction/persistent/foreach/scan Triton kernel",
        f"{REF} §1.3 (torch/_inductor/codegen/triton.py define_kernel)",
    ),
    # ---- 3. TC rules --------------------------------------------------------------------------
    KernelRule(
        _START + r"nvjet_",
        True,
        "cuBLAS(Lt) 12.x nvjet GEMM (Hopper/Blackwell)",
        f"{REF} §1.2, §1.3 (nsys-ai#575, DCGM#251)",
    ),
    KernelRule(
        _START + r"nvfuser_(?:matmul|cutlass)_",
        True,
        "nvFuser matmul/CUTLASS scheduler kernel: always an MMA macro (Turing..Blackwell)",
        f"{REF} §7 order; "
        "NVIDIA/Fuser csrc/scheduler/matmul.cpp (mma->setMacro), csrc/scheduler/cutlass.cpp"
        " (GEMMs on cc 10.0 only)",
    ),
    KernelRule(
        r"(?i:fmhaSm1\d\d)",
        True,
        "TensorRT-LLM/FlashInfer trtllm-gen FMHA for Blackwell (fmhaSm100f..., tcgen05 MMA)",
        f"{REF} §7 order; "
        "public B200 traces (fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKv...); TensorRT-LLM"
        " cpp/tensorrt_llm/kernels/trtllmGenKernels/fmha/cubin/FmhaSm100aKernel_QE4m3KvE2m1...",
    ),
    KernelRule(
        r"(?<![A-Za-z])(?:bmm|[Gg]emm\w*?Kernel)_\w*?(?:E4m3|E5m2|E2m1|Bfloat16|Fp16)"
        r"\w*?_(?:m|mma)\d+x\d+x\d+",
        True,
        "trtllm-gen (batched) GEMM with a block-scaled/16-bit dtype and an MMA shape (Blackwell)",
        f"{REF} §7 order; "
        "public B200 traces (bmm_E4m3_E4m3E4m3_Fp32_t128x8x128u2_s8_et64x8_m64x8x32_..._sm100f,"
        " bmm_Bfloat16_E2m1E2m1_Fp32_...); TensorRT-LLM GemmGatedActKernel_..._mma128x8x64_...",
    ),
    KernelRule(
        r"deep_gemm::\w*gemm\w*_impl",
        True,
        "DeepGEMM FP8/BF16 GEMM (Hopper WGMMA / Blackwell UMMA)",
        f"{REF} §7 order; "
        "deepseek-ai/DeepGEMM kernel names (deep_gemm::sm100_fp8_gemm_1d1d_impl<cute::UMMA...>)",
    ),
    KernelRule(
        r"flashinfer::\w*Prefill\w*Kernel",
        True,
        "FlashInfer prefill attention (mma_sync / WGMMA)",
        f"{REF} §7 order; "
        "flashinfer include/flashinfer/attention/prefill.cuh (mma::mma_sync_m16n16k16...)",
    ),
    KernelRule(
        r"flash_fwd_kernel|flash_fwd_splitkv_kernel"
        r"|flash_bwd_dq_dk_dv_loop(?:_seqk_parallel)?_kernel|FlashAttn(?:Fwd|Bwd)Sm\d+",
        True,
        "FlashAttention main kernel (built for sm80+, MMA)",
        f"{REF} §1.3 (Dao-AILab launch templates; FA3 FlashAttnFwdSm90)",
    ),
    KernelRule(
        r"fmha_cutlass[FB]_(?:f16|bf16)_",
        True,
        "memory-efficient attention, 16-bit: TensorOp (sm70+ builds)",
        f"{REF} §1.3 (gemm_kernel_utils.h DefaultGemmType)",
    ),
    KernelRule(
        r"fmha_cutlass[FB]_f32_\w*?_sm(?:[89]\d|1\d\d)(?!\d)",
        True,
        "memory-efficient attention, f32 on sm80+: TensorOp (3xTF32)",
        f"{REF} §1.3 (gemm_kernel_utils.h: OpMultiplyAddFastF32)",
    ),
    KernelRule(
        r"cudnn_generated_fort_native_sdpa",
        True,
        "cuDNN SDPA (flash) kernel, 16-bit only",
        f"{REF} §1.3 (HF blog: ..._sdpa_sm80_flash_fprop_wmma_f16_...)",
    ),
    KernelRule(
        r"(?<![A-Za-z])fmha\w*?(?:bf16|fp16|f16|e4m3|e5m2|fp8)",
        True,
        "fused MHA kernel with a 16-bit/fp8 dtype tag",
        f"{REF} §1.3 (attention kernels by dtype)",
    ),
    KernelRule(
        r"tensor\d+x\d+x\d+",
        True,
        "MMA instruction shape tensorMxNxK (xmma)",
        f"{REF} §1.2 (xmma names: tensor16x8x16)",
    ),
    KernelRule(
        r"warpgroupsize",
        True,
        "Hopper warpgroup MMA (warpgroupsize)",
        f"{REF} §1.2 (sm90_xmma_gemm_*_warpgroupsize*, torch-mojo-backend#410)",
    ),
    KernelRule(
        r"xmma\w*?(?:bf16|f16|tf32|e4m3|e5m2|i8i8|s8s8|int8)",
        True,
        "xmma kernel with a TC dtype tag",
        f"{REF} §1.2 (TC marks: f16, bf16, tf32, i8, e4m3, e5m2)",
    ),
    KernelRule(
        r"(?i:tensorop)",
        True,
        "CUTLASS TensorOp (cutlass_*_tensorop_*, cutlass3x_sm*_tensorop, MmaTensorOp)",
        f"{REF} §1.2 (NVIDIA/cutlass#981, #2766)",
    ),
    KernelRule(
        r"(?<![A-Za-z])wmma",
        True,
        "WMMA (warp matrix multiply-accumulate)",
        f"{REF} §1.2 (cutlass_80_wmma_tensorop_*, HF blog)",
    ),
    KernelRule(
        _START + r"[hsidcz](?:" + _MMA_SHAPES + r")(?![0-9])",
        True,
        "MMA shape token (884 Volta, 1688/8816 Turing, 16816/16832 Ampere, 161616 WMMA)",
        f"{REF} §1.2 (NVIDIA/cutlass#1341), §1.3 (xprof list)",
    ),
    KernelRule(
        r"(?<![A-Za-z])(?:hmma|imma|dmma|qmma|wgmma|gmma|mma_sync|tcgen05)(?![a-z])"
        r"|Gmma|Umma|Hmma|Imma|::UMMA::|::GMMA::",
        True,
        "MMA instruction name (hmma/imma/wgmma/gmma)",
        f"{REF} §7 step 3",
    ),
    KernelRule(
        _START + r"SM\d{2,3}_\d+x\d+x\d+_",
        True,
        "CuTe MMA atom (SMxx_MxNxK_...)",
        f"{REF} §1.2 [own]: CuTe names its tensor-core MMA atoms this way",
    ),
    KernelRule(
        r"conv1x1|conv2d_c1_k1|dgrad_1x1_stride_2x2|direct_group|first_layer_wgrad_kernel",
        True,
        "legacy cuDNN 7 TC kernel from the xprof list (low confidence)",
        f"{REF} §1.1, §1.5 (xprof kTensorCoreKernelNamePatterns)",
    ),
    # ---- 4. unknown from the name -------------------------------------------------------------
    KernelRule(
        _START + r"triton_",
        None,
        "Triton kernel (template or user): name cannot tell; resolve from the op's dtypes",
        f"{REF} §1.3 Triton, §7 step 4",
    ),
    KernelRule(
        _START + r"nvfuser_",
        None,
        "nvFuser-generated kernel: name cannot tell",
        f"{REF} §7 step 4 [own: code-generated like Triton]",
    ),
    KernelRule(
        r"__myl_",
        None,
        "TensorRT Myelin kernel: name cannot tell",
        f"{REF} §1.4",
    ),
    KernelRule(
        r"(?<![A-Za-z])fmha",
        None,
        "fused MHA kernel without a 16-bit tag or an arch: f32 uses TC only on sm80+",
        f"{REF} §1.3 (gemm_kernel_utils.h DefaultGemmType)",
    ),
    KernelRule(
        r"xmma",
        None,
        "xmma kernel without a dtype or MMA marker",
        f"{REF} §1.2 [own]",
    ),
    KernelRule(
        r"cutlass::device_kernel|" + _START + r"device_kernel(?![A-Za-z0-9_])",
        None,
        "CUTLASS device_kernel whose template arguments show no MMA marker",
        f"{REF} §1.2 (raw CUTLASS 3 kernels), §1.4 (short names)",
    ),
    KernelRule(
        r"(?i)(?<![a-z])(?:matmul|gemm|bmm|attn|attention|conv[123]?d?|convolution)(?![a-z])",
        None,
        "looks like a matrix/attention kernel from an unrecognised source: name cannot tell",
        f"{REF} §1.3 (user @triton.jit kernels keep the Python function name)",
    ),
)


def classify_kernels(
    names: pd.Series, rules: tuple[KernelRule, ...] = KERNEL_RULES
) -> pd.DataFrame:
    """Whether each kernel used Tensor Cores, from its full demangled name.

    Returns a DataFrame aligned with ``names.index``: ``uses_tc`` (pandas
    ``boolean``; ``<NA>`` when the name cannot tell) and ``tc_reason`` (the
    matching rule's reason, or :data:`NOT_MATRIX_REASON`). First rule wins.
    """
    names = pd.Series(names, copy=False)
    codes, uniques = factorize(names, use_na_sentinel=True)
    unique_names = pd.Series([str(u) for u in uniques], dtype=object)
    n = len(unique_names)
    rule_of = np.full(n, len(rules), dtype=np.int64)  # len(rules) = default
    open_ = np.ones(n, dtype=bool)
    for i, rule in enumerate(rules):
        if not open_.any():
            break
        candidates = np.flatnonzero(open_)
        hit = unique_names.iloc[candidates].str.contains(rule.pattern, regex=True).to_numpy(bool)
        rule_of[candidates[hit]] = i
        open_[candidates[hit]] = False

    # per rule (and default, and "no name"): value, mask, reason
    values = np.array([bool(r.uses_tc) for r in rules] + [False, False], dtype=bool)
    masks = np.array([r.uses_tc is None for r in rules] + [False, True], dtype=bool)
    reasons = np.array([r.reason for r in rules] + [NOT_MATRIX_REASON, "no kernel name"], object)
    idx = np.where(codes >= 0, rule_of[np.maximum(codes, 0)], len(rules) + 1)
    uses_tc = pd.arrays.BooleanArray(values[idx], masks[idx])
    return pd.DataFrame(
        {"uses_tc": uses_tc, "tc_reason": reasons[idx]}, index=names.index, copy=False
    )


# ---- resolving unknown kernels from the op's dtypes ------------------------------------------

# dtype spellings seen in Kineto "Input type" (c10 names), in torch (``torch.float16``) and
# short forms. Scalars, lists, bool and integer index types are ignored.
_DTYPE_CLASS: dict[str, str] = {
    **dict.fromkeys(["c10::Half", "half", "float16", "torch.float16", "fp16", "f16"], "fp16"),
    **dict.fromkeys(["c10::BFloat16", "bfloat16", "torch.bfloat16", "bf16"], "bf16"),
    **dict.fromkeys(["float", "float32", "torch.float32", "fp32", "f32"], "fp32"),
    **dict.fromkeys(["double", "float64", "torch.float64", "fp64", "f64"], "fp64"),
    **dict.fromkeys(["signed char", "int8", "torch.int8", "c10::qint8"], "int8"),
}
# minimum compute capability for TC in each dtype (reference §5.1)
_MIN_CC = {"fp16": 7.0, "bf16": 8.0, "int8": 7.5, "fp8": 8.9, "fp32": 8.0}
# FP64 Tensor Cores: GA100/GH100/GB100 class only (reference §5.1)
_FP64_TC_CC = (8.0, 9.0, 10.0)


def _dtype_class(text: object) -> str | None:
    """The TC-relevant dtype class of an op's inputs (JSON text or list), or None."""
    if text is None or (isinstance(text, float) and np.isnan(text)):
        return None
    items = text
    if isinstance(text, str):
        try:
            items = json.loads(text)
        except ValueError:
            try:
                items = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                items = [text]
    if items is None:
        return None
    if isinstance(items, str) or not hasattr(items, "__iter__"):
        items = [items]
    found = set()
    for item in items:
        s = str(item).strip()
        if "float8" in s.lower() or "e4m3" in s or "e5m2" in s:
            found.add("fp8")
        elif s in _DTYPE_CLASS:
            found.add(_DTYPE_CLASS[s])
    # the narrowest floating type decides (fp32 scales beside fp8 data, fp32 bias
    # beside 16-bit data); int8 counts only without floating inputs (uint8 masks are
    # ignored altogether)
    for cls in ("fp8", "bf16", "fp16", "fp32", "fp64", "int8"):
        if cls in found:
            return cls
    return None


def resolve_unknown(
    uses_tc: pd.Series,
    op_dtypes: pd.Series,
    compute_capability: float | str | pd.Series | None = None,
    *,
    allow_tf32: bool | None = None,
    eligible: pd.Series | None = None,
) -> pd.Series:
    """Settle ``<NA>`` kernels from their op's input dtypes (reference §1.3, §5.1, §5.13).

    Only ``<NA>`` rows change; known answers are kept. ``op_dtypes`` holds the
    op's input dtypes (JSON text like ``["c10::BFloat16","float"]`` or a list).
    ``compute_capability`` (scalar or aligned Series, e.g. ``"8.0"``) applies
    the per-arch minimums: fp16 7.0, int8 7.5, bf16 8.0, fp8 8.9, TF32 8.0
    (below them: ``False``). Without it, 16-bit/fp8/int8 inputs resolve to
    ``True``. fp32 resolves only when it is certain: ``False`` below 8.0 or
    with ``allow_tf32=False``, ``True`` on 8.0+ with ``allow_tf32=True``,
    otherwise it stays ``<NA>`` (never guessed). fp64 and fp8 below 8.9 stay
    ``<NA>`` (DMMA/upcasting cannot be told); no dtype stays ``<NA>``. With
    ``eligible``, only rows of eligible ops are resolved.
    """
    out = pd.Series(uses_tc, copy=True).astype("boolean")
    todo = out.isna().to_numpy().copy()
    if eligible is not None:
        todo &= pd.Series(eligible).fillna(False).astype(bool).to_numpy()
    if not todo.any():
        return out

    dt = pd.Series(op_dtypes, index=out.index)
    if pd.api.types.infer_dtype(dt, skipna=True) not in ("string", "empty"):
        dt = dt.where(dt.isna(), dt.astype(str))  # lists/tuples: parse their text form
    codes, uniques = pd.factorize(dt, use_na_sentinel=True)
    classes = np.array([_dtype_class(u) for u in uniques] + [None], dtype=object)
    cls = classes[np.where(codes >= 0, codes, len(uniques))]

    if isinstance(compute_capability, pd.Series):
        cc = pd.to_numeric(compute_capability.reindex(out.index), errors="coerce").to_numpy(float)
    else:
        value = pd.to_numeric(pd.Series([compute_capability]), errors="coerce").iloc[0]
        cc = np.full(len(out), np.nan if pd.isna(value) else float(value))
    cc_known = ~np.isnan(cc)

    result = np.zeros(len(out), dtype=bool)
    decided = np.zeros(len(out), dtype=bool)

    def set_(where: np.ndarray, value: bool) -> None:
        where = where & todo & ~decided
        result[where] = value
        decided[where] = True

    for name in ("fp16", "bf16", "int8"):
        is_cls = cls == name
        set_(is_cls & cc_known & (cc < _MIN_CC[name]), False)
        set_(is_cls, True)
    fp8 = cls == "fp8"
    set_(fp8 & (~cc_known | (cc >= _MIN_CC["fp8"])), True)
    fp32 = cls == "fp32"
    set_(fp32 & cc_known & (cc < _MIN_CC["fp32"]), False)
    if allow_tf32 is False:
        set_(fp32, False)
    elif allow_tf32 is True:
        set_(fp32 & cc_known & (cc >= _MIN_CC["fp32"]), True)
    fp64 = cls == "fp64"
    set_(fp64 & cc_known & ~np.isin(cc, _FP64_TC_CC), False)

    values = out.array.copy()
    values[decided] = result[decided]
    return pd.Series(values, index=out.index, name=out.name)


# ---- op eligibility --------------------------------------------------------------------------


@dataclass(frozen=True)
class OpRule:
    """One op-eligibility rule: a regex that must match the whole op leaf name.

    Matching is case-insensitive (``Conv2D`` and ``conv2d``, ``MatMul`` and
    ``matmul`` are the same op type to this rule).
    """

    pattern: str
    eligible: bool
    source: str


_BACKWARD_NODES = (
    "Mm|Addmm|Bmm|Baddbmm|Addbmm|Addmv|Mv|Addr|Dot|Vdot|Matmul|Linear|Einsum|ScaledMm|IntMm"
    "|Convolution|CudnnConvolution|CudnnConvolutionTranspose|SlowConv2D|ThnnConv2D|CudnnRnn"
    r"|ScaledDotProduct\w*Attention|FlashAttention|EfficientAttention|FlashAttn\w*Func"
)

#: Op-type eligibility, first full match wins; no match means not eligible.
OP_RULES: tuple[OpRule, ...] = (
    OpRule(
        r"_?prelu(?:_kernel)?(?:_backward)?|Prelu(?:Kernel)?Backward\d*",
        False,
        f"{REF} §2: prelu is on the autocast list for dtype policy, it is not a GEMM",
    ),
    OpRule(
        r"_?addmm_?|_addmm_activation|mm|bmm|baddbmm_?|addbmm_?|matmul|linear|chain_matmul"
        r"|linalg_multi_dot|einsum|tensordot|linalg_vecdot|_scaled_mm|_scaled_grouped_mm"
        r"|_grouped_mm|_int_mm|mv|addmv_?|addr_?|dot|vdot",
        True,
        f"{REF} §2 PyTorch (tb_plugin TC_OP_Allowlist, autocast AT_FORALL_LOWER_PRECISION_FP, "
        "_scaled_mm/_int_mm/tensordot additions; mv/addmv/addr/dot usually GEMV)",
    ),
    OpRule(
        r"_?convolution|convolution_overrideable|conv[123]d|conv_tbc|conv_transpose[123]d"
        r"|cudnn_convolution(?:_transpose|_relu|_add_relu)?|_slow_conv2d_forward",
        True,
        f"{REF} §2 PyTorch conv (tb_plugin list; flop_counter registry)",
    ),
    OpRule(
        r"_thnn_fused_lstm_cell|_thnn_fused_gru_cell|lstm_cell|gru_cell|rnn_tanh_cell"
        r"|rnn_relu_cell|_cudnn_rnn|lstm|gru|rnn|rnn_tanh|rnn_relu",
        True,
        f"{REF} §2 PyTorch RNN cells, _cudnn_rnn/lstm/gru",
    ),
    OpRule(
        r"scaled_dot_product_attention"
        r"|_scaled_dot_product_(?:flash|efficient|cudnn|fused)_attention(?:_overrideable)?"
        r"(?:_backward)?"
        r"|_flash_attention_(?:forward|backward)|_efficient_attention_(?:forward|backward)"
        r"|_cudnn_attention(?:_forward|_backward)?|_native_multi_head_attention"
        r"|_?flash_attn_(?:varlen_)?(?:forward|backward)|FlashAttn\w*Func",
        True,
        f"{REF} §2 PyTorch SDPA (autocast list; recommended additions); flash_attn package",
    ),
    OpRule(
        r"convolution_backward(?:_overrideable)?|_convolution_double_backward"
        r"|cudnn_convolution(?:_transpose)?_backward(?:_input|_weight)?|_cudnn_rnn_backward",
        True,
        f"{REF} §2 PyTorch backward ops (tb_plugin list; convolution_backward addition)",
    ),
    OpRule(
        rf"(?:{_BACKWARD_NODES})(?:Backward)+\d*",
        True,
        f"{REF} §2 autograd nodes (MmBackward0, AddmmBackward0, ConvolutionBackward0, "
        "ScaledDotProductFlashAttentionBackward0, legacy CudnnConvolutionBackward)",
    ),
    OpRule(
        r".*Conv2D|.*Conv2DBackpropFilter|.*Conv2DBackpropInput|.*Conv3D"
        r"|.*DepthwiseConv2dNative(?:BackpropFilter|BackpropInput)?|.*BatchMatMul.*|MatMul"
        r"|.*FusedMatMul|CudnnRNN|.*CudnnRNNV.*|.*CudnnRNNForward.*|.*CudnnRNNBackprop.*"
        r"|.*XlaDot|.*XlaDotV2|Einsum",
        True,
        f"{REF} §2 TensorFlow (xprof IsOpTensorCoreEligible; Einsum without its equation)",
    ),
    OpRule(
        r"Conv3DBackprop(?:Input|Filter)(?:V2)?|Conv2DBackprop(?:Input|Filter)V2",
        True,
        f"{REF} §2 TensorFlow gaps of the xprof list [own]",
    ),
    OpRule(
        r"dot|dot_general|__cublas\$.+|__cudnn\$(?:conv|fmha|fMHA).*",
        True,
        f"{REF} §2 XLA/JAX HLO dot/convolution and their cuBLAS/cuDNN custom calls",
    ),
    OpRule(
        r"gemm|conv|convtranspose[123]?d?|deconv|matmulinteger|qlinearmatmul|qlinearconv"
        r"|convinteger|attention|multiheadattention|multi_head_attention|sdpa",
        True,
        "NVTX/ONNX/nn.Module op names that name a GEMM, convolution or attention [own]",
    ),
)


def op_leaf(names: pd.Series) -> pd.Series:
    """The op-type part of op names: the last ``/`` component, without a
    ``namespace::`` prefix or a trailing instance number (TF/ONNX ``_3``, HLO
    ``.12``, perfguard's own repeat count ``(2)`` as in ``/Net/fc1/aten::addmm(2)``), and
    the op of PyProf's ``torch.nn.functional.conv2d`` / ``Tensor.__matmul__``."""
    s = pd.Series(names, copy=False).astype(object)
    leaf = s.str.rsplit("/", n=1).str[-1].str.rsplit("::", n=1).str[-1].str.strip()
    leaf = leaf.str.replace(r"(?:[._]\d+|\(\d+\))$", "", regex=True)
    py = leaf.str.fullmatch(PYTHON_OP).fillna(False).astype(bool)
    if py.any():  # PyProf: torch.nn.functional.conv2d, Tensor.__matmul__
        leaf = leaf.where(~py, python_op(leaf[py]))
    return leaf


def op_tc_eligible(op_name_or_type: pd.Series, rules: tuple[OpRule, ...] = OP_RULES) -> pd.Series:
    """Whether each op can use Tensor Cores, by op type (reference §2).

    Accepts full names (``aten::addmm``, ``/model/fc1/linear``,
    ``/Net/fc1/aten::addmm(2)``, ``model/dense/MatMul_1``) or op types
    (``addmm``, ``MmBackward0``); see :func:`op_leaf`. The autograd engine's
    ``evaluate_function: XBackward0`` wrapper is not itself an op (the node
    inside it is). Returns a bool Series aligned with the input; missing
    names are ``False``.
    """
    s = pd.Series(op_name_or_type, copy=False)
    codes, uniques = factorize(s, use_na_sentinel=True)
    leaves = op_leaf(pd.Series([str(u) for u in uniques], dtype=object))
    answer = np.zeros(len(leaves), dtype=bool)
    open_ = np.ones(len(leaves), dtype=bool)
    for rule in rules:
        if not open_.any():
            break
        candidates = np.flatnonzero(open_)
        hit = leaves.iloc[candidates].str.fullmatch(rule.pattern, case=False).to_numpy(bool)
        answer[candidates[hit]] = rule.eligible
        open_[candidates[hit]] = False
    out = np.where(codes >= 0, answer[np.maximum(codes, 0)], False)
    return pd.Series(out, index=s.index, name="tc_eligible", dtype=bool)


def eligible_by_kernels(op_eligible: pd.Series, any_kernel_uses_tc: pd.Series) -> pd.Series:
    """xprof's fallback: an op whose kernel used TC is eligible (reference §1.6).

    Both Series are aligned by index; ``<NA>`` (unknown kernel) does not make an
    op eligible.
    """
    by_kernel = pd.Series(any_kernel_uses_tc).astype("boolean").fillna(False).astype(bool)
    eligible = pd.Series(op_eligible).astype("boolean").fillna(False).astype(bool)
    return (eligible | by_kernel.reindex(eligible.index, fill_value=False)).rename("tc_eligible")


def tc_utilization(acts: pd.DataFrame, by: str = "op_key") -> tuple[pd.DataFrame, float]:
    """TC utilization per group and for the run (DESIGN.md "Metrics", DLProf).

    ``acts`` has one row per kernel with ``by`` (any hashable grouping),
    ``dur``, ``uses_tc`` (boolean, ``<NA>`` unknown) and ``eligible`` (bool:
    the kernel's op is TC eligible; apply :func:`eligible_by_kernels` first
    for xprof's rule). Per group: ``kernel_time`` (all kernels),
    ``eligible_time`` (kernels in eligible ops), ``tc_time`` (TC kernels in
    eligible ops), ``unknown_time`` (``<NA>`` kernels in eligible ops) and
    ``tc_utilization = 100 * tc_time / eligible_time`` (NaN without eligible
    kernel time). Unknown kernels count in the denominator only, so the
    figure is a lower bound. Returns ``(per_group, run_level_percent)``.
    """
    col = acts["dur"]
    dur = col.to_numpy() if isinstance(col.dtype, np.dtype) else col.astype(float).to_numpy()
    eligible = acts["eligible"].astype("boolean").fillna(False).to_numpy(bool)
    flag = acts["uses_tc"].astype("boolean")
    tc = flag.fillna(False).to_numpy(bool) & eligible
    unknown = flag.isna().to_numpy() & eligible
    zero = dur.dtype.type(0)
    frame = pd.DataFrame(
        {
            by: acts[by].to_numpy(),
            "kernel_time": dur,
            "eligible_time": np.where(eligible, dur, zero),
            "tc_time": np.where(tc, dur, zero),
            "unknown_time": np.where(unknown, dur, zero),
        },
        copy=False,
    )
    per_group = frame.groupby(by, sort=False, dropna=False).sum()
    per_group["tc_utilization"] = metrics.tc_utilization(
        per_group["tc_time"], per_group["eligible_time"]
    )
    run = metrics.tc_utilization(float(frame["tc_time"].sum()), float(frame["eligible_time"].sum()))
    return per_group, float(run)
