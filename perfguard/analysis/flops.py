"""FLOPs and DRAM bytes per framework op, from its recorded shapes, dtypes and scalar arguments.

Facts and formulas come from ``shared/reference/tensor_cores_flops.md`` ("the reference"), §0
and §3; each registry entry names its source. Conventions (reference §0):

* **1 FMA = 2 FLOPs**; algorithmic FLOPs, not executed ones (Winograd, padding tiles, split-K
  and recompute do not change the count). Bias, scale and softmax work inside a GEMM,
  convolution or attention is not counted there (flop_counter convention).
* **Unknown is NA, never 0 and never a guess.** A shape, dtype or scalar argument that the
  capture did not record (legacy Kineto has no ``Concrete Inputs``, so a forward convolution's
  stride is unknown) makes the figure NA, with the reason in ``flop_formula``.
* **Causal attention counts half** the score/value work (the FlashAttention benchmark convention,
  reference §3.6). ``FlopCounterMode`` does not halve; the formula text says ``causal x1/2``.
* **FP32 is reported as ``fp32``**: whether a GEMM ran as TF32 is a kernel property (Tensor-Core
  kernel with fp32 operands), decided by the caller when it picks the peak
  (:func:`perfguard.analysis.peaks.peak_flops` with ``tensor_core=True`` gives the TF32 peak).

Byte model (reference §3: compulsory DRAM traffic, each input read once, each output written
once; real kernels can move more or less):

* GEMM: ``A + B + C`` (+ the bias/``self`` operand of ``addmm``-like ops unless ``beta == 0``).
* Convolution forward: input + weight + bias + output (PyProf ``conv_bytes_flops``). Backward:
  ``dY`` + (``W`` read, ``dX`` written when ``output_mask[0]``) + (``X`` read, ``dW`` written when
  ``output_mask[1]``) + ``db`` when ``output_mask[2]``.
* Elementwise: sum of operand bytes + output bytes (a comparison writes bool, 1 B); activation
  backward therefore costs ``3 * numel * s``.
* Reductions: input + output(s) (``max.dim`` also writes int64 indices).
* Softmax / log_softmax: fused single pass, input + output (backward: ``dY + Y + dX``); PyProf's
  3x/5x multi-pass figures are the alternative the reference mentions.
* Norms: input + parameters + output + saved statistics (``rows * 4 B`` each for mean and rstd;
  batch norm training also rewrites the running statistics).
* Embedding: ``index bytes + 2 * n_idx * D * s_w`` (gather + write, PyProf); dense backward
  ``index + 3 * n_idx * D * s + V * D * s`` (zero-filled weight gradient).
* Attention (flash / efficient / cuDNN): read Q, K, V (+ mask), write O and the fp32 LSE;
  backward reads every recorded tensor (dO, Q, K, V, O, LSE, ...) and writes dQ, dK, dV.
* Copies / casts: ``numel * (s_src + s_dst)``; fills write only.
* Optimizer ``TensorList`` ops (``_fused_adam_``, ``_foreach_*``): NA, because Kineto records no
  element type for tensor lists; FLOPs are still known.

Vectorised entry point: :func:`op_flops` over a DataFrame of ops (works on
``Trace.ranges``); it parses each unique ``(name, input_shapes, dtypes, concrete_inputs)``
combination once. :func:`count_once` applies the leaf policy (:data:`LEAF_POLICY`) over the
range tree so nested ops (``aten::linear`` -> ``aten::addmm``) are never counted twice.

Adding an op is one entry in :data:`FORMULAS` (key: the aten op name without ``aten::``).
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from perfguard.arrays import unique_first

__all__ = [
    "COMPUTE_DTYPE",
    "CONTRACTION_FAMILIES",
    "ELEMENT_SIZE",
    "FORMULAS",
    "LEAF_POLICY",
    "OpCost",
    "count_once",
    "op_cost",
    "op_flops",
]

LEAF_POLICY = """\
FLOPs (and bytes) are counted once, at the leaf level of the op tree.

A range keeps its own figure only if no range below it (at any depth) has a known, positive
figure; a range that is covered this way gets 0 ("counted below"), whatever its own estimate.
So aten::linear -> aten::addmm counts only addmm, and aten::conv2d -> aten::convolution ->
aten::_convolution -> aten::cudnn_convolution counts only the deepest of them that has FLOPs.
Descendants whose figure is NA (unknown) or 0 (shape-only ops such as copy_ or empty) do not
cover their ancestors: on CPU aten::_convolution of a transposed convolution runs the work
itself under a child aten::copy_.

With ``family`` (from :func:`op_flops`) given, which descendants cover depends on the family:

* a contraction op (GEMM, convolution, attention) is covered only by a contraction descendant:
  aten::convolution_backward on CUDA computes the bias gradient in a child aten::sum, and both
  are real work; aten::_scaled_dot_product_attention_math is covered by its aten::bmm children;
* a copy/fill op, or an op with no formula, is covered by any positive descendant
  (aten::clone -> aten::copy_);
* any other op (elementwise, reduction, softmax, norm, embedding, optimizer) is covered by any
  positive descendant that is not a copy/fill: helper copies such as the aten::fill_ that
  initialises a CPU aten::sum, or the scalar aten::_to_copy under aten::mul, do not hide the
  op's own traffic, while a CPU-decomposed aten::_fused_rms_norm counts its pow/mean/... only.

Without ``family`` every range with a positive descendant is covered. The same function applies
to bytes (pass the ``bytes`` column), with the same meaning.
"""

#: Element size in bytes for the tensor type names Kineto writes in ``Input type``: c10
#: ``TypeMeta`` names, i.e. the compiler's demangled C++ type (GCC ``long int``, checked against
#: torch 2.13 on CPU; clang ``long``, as in the 2022 torchrec fixture).
ELEMENT_SIZE: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "short unsigned int": 2,
    "unsigned int": 4,
    "long unsigned int": 8,
    "long": 8,  # clang spellings of the integer types
    "long long": 8,
    "short": 2,
    "unsigned short": 2,
    "unsigned long": 8,
    "unsigned long long": 8,
    "c10::complex<c10::Half>": 4,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1,
    "c10::Float4_e2m1fn_x2": 1,
    "c10::qint8": 1,
    "c10::quint8": 1,
    "c10::qint32": 4,
}

#: Kineto type name -> compute dtype used to pick a peak (peaks.py: fp64, fp32, fp16, bf16,
#: fp8, int8; other names have no peak).
COMPUTE_DTYPE: dict[str, str] = {
    "float": "fp32",
    "double": "fp64",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float8_e8m0fnu": "fp8",
    "c10::Float4_e2m1fn_x2": "fp4",
    "signed char": "int8",
    "c10::qint8": "int8",
    "unsigned char": "uint8",
    "c10::quint8": "uint8",
    "short int": "int16",
    "int": "int32",
    "c10::qint32": "int32",
    "long int": "int64",
    "short unsigned int": "uint16",
    "unsigned int": "uint32",
    "long unsigned int": "uint64",
    "long": "int64",
    "long long": "int64",
    "short": "int16",
    "unsigned short": "uint16",
    "unsigned long": "uint64",
    "unsigned long long": "uint64",
    "bool": "bool",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}

#: c10::ScalarType codes as Kineto records a ``ScalarType`` argument (``aten::_to_copy`` dtype
#: ``'5'`` = Half, ``'6'`` = Float, ``'15'`` = BFloat16: c10/core/ScalarType.h enum order).
_SCALAR_TYPE_CODES: dict[int, str] = {
    0: "unsigned char",
    1: "signed char",
    2: "short int",
    3: "int",
    4: "long int",
    5: "c10::Half",
    6: "float",
    7: "double",
    8: "c10::complex<c10::Half>",
    9: "c10::complex<float>",
    10: "c10::complex<double>",
    11: "bool",
    15: "c10::BFloat16",
    23: "c10::Float8_e5m2",
    24: "c10::Float8_e4m3fn",
    25: "c10::Float8_e5m2fnuz",
    26: "c10::Float8_e4m3fnuz",
}

GEMM, CONV, ATTENTION = "gemm", "conv", "attention"
ELEMENTWISE, REDUCTION, SOFTMAX, NORM = "elementwise", "reduction", "softmax", "norm"
EMBEDDING, OPTIMIZER, COPY = "embedding", "optimizer", "copy"
#: Families whose ops are Tensor-Core contractions (reference §2); see :data:`LEAF_POLICY`.
CONTRACTION_FAMILIES = frozenset({GEMM, CONV, ATTENTION})

#: Bytes of one saved mean / rstd element (reference §3.4: ``rows * 4 B``).
_STAT_BYTES = 4
_CATEGORY = {"bool": 0, "int": 1, "float": 2, "complex": 3}


def _category(type_name: str | None) -> int:
    cd = COMPUTE_DTYPE.get(type_name, "") if type_name is not None else ""
    if cd == "bool":
        return _CATEGORY["bool"]
    if cd.startswith(("int", "uint")):
        return _CATEGORY["int"]
    if cd.startswith("complex"):
        return _CATEGORY["complex"]
    return _CATEGORY["float"]


# --------------------------------------------------------------------------- result + args


@dataclass(frozen=True)
class OpCost:
    """FLOPs (NA = None), bytes (None), compute dtype, formula text and family of one op."""

    flops: float | None
    bytes: int | None
    compute_dtype: str | None
    formula: str
    family: str | None


_NOT_RECORDED = object()  # the capture has no value for this argument
_NO_COST = OpCost(None, None, None, "", None)


class _Args:
    """One op's recorded arguments: shapes, Kineto type names, concrete scalar values."""

    __slots__ = ("concrete", "dtypes", "n", "shapes")

    def __init__(self, shapes: list, dtypes: list, concrete: list | None) -> None:
        self.shapes = shapes
        self.dtypes = dtypes
        self.concrete = concrete
        self.n = max(len(shapes), len(dtypes))

    def dtype(self, i: int | None) -> str | None:
        if i is None or i >= len(self.dtypes):
            return None
        d = self.dtypes[i]
        return d if isinstance(d, str) else None

    def is_tensor(self, i: int | None) -> bool:
        d = self.dtype(i)
        if d not in ELEMENT_SIZE or i is None or i >= len(self.shapes):
            return False
        s = self.shapes[i]
        return isinstance(s, list) and all(isinstance(x, int) and x >= 0 for x in s)

    def shape(self, i: int | None) -> tuple[int, ...] | None:
        return tuple(self.shapes[i]) if i is not None and self.is_tensor(i) else None

    def esize(self, i: int | None) -> int | None:
        return ELEMENT_SIZE.get(self.dtype(i) or "") if self.is_tensor(i) else None

    def numel(self, i: int | None) -> int | None:
        s = self.shape(i)
        return math.prod(s) if s is not None else None

    def nbytes(self, i: int | None) -> int | None:
        """Bytes of tensor argument ``i``; None when it is not a recorded tensor."""
        s, e = self.shape(i), self.esize(i)
        return math.prod(s) * e if s is not None and e is not None else None

    def opt_bytes(self, i: int | None) -> int:
        """Bytes of an optional tensor argument: 0 when absent (None)."""
        b = self.nbytes(i)
        return b if b is not None else 0

    def tensor_list(self, i: int) -> list[tuple[int, ...]] | None:
        if self.dtype(i) != "TensorList" or i >= len(self.shapes):
            return None
        s = self.shapes[i]
        if not isinstance(s, list) or not all(
            isinstance(t, list) and all(isinstance(x, int) for x in t) for t in s
        ):
            return None
        return [tuple(t) for t in s]

    def value(self, i: int | None) -> Any:
        """Parsed concrete value; None for an empty entry (None / str argument), or
        ``_NOT_RECORDED`` when the capture has no concrete inputs."""
        if i is None or self.concrete is None or i >= len(self.concrete):
            return _NOT_RECORDED
        return _parse_scalar(self.concrete[i])

    def flag(self, i: int | None) -> bool | None:
        v = self.value(i)
        return v if isinstance(v, bool) else None

    def number(self, i: int | None) -> float | None:
        v = self.value(i)
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        return float(v)

    def ints(self, i: int | None, n: int) -> list[int] | None:
        """An int-list argument expanded to ``n`` entries (``[2]`` -> ``[2, 2]``), or None."""
        v = self.value(i)
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            return [v] * n
        if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            if len(v) == n:
                return list(v)
            if len(v) == 1:
                return v * n
        return None

    def scalar_type(self, i: int | None) -> str | None:
        """A ``ScalarType`` argument as a Kineto type name (None when absent or unknown)."""
        v = self.value(i)
        if isinstance(v, int) and not isinstance(v, bool):
            return _SCALAR_TYPE_CODES.get(v)
        return None


def _parse_scalar(text: Any) -> Any:
    if text is None:
        return _NOT_RECORDED
    if not isinstance(text, str):
        return text
    t = text.strip()
    if t == "":
        return None
    if t in ("True", "False"):
        return t == "True"
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        pass
    if t.startswith("["):
        try:
            return ast.literal_eval(t)
        except (ValueError, SyntaxError):
            return _NOT_RECORDED
    return t


def _cd(a: _Args, *idx: int) -> str | None:
    """Compute dtype of the operands ``idx``: their shared dtype, else the widest one."""
    names = [a.dtype(i) for i in idx if a.is_tensor(i)]
    if not names:
        return None
    widest = max(names, key=lambda d: (ELEMENT_SIZE.get(d, 0) if d else 0, _category(d)))
    return COMPUTE_DTYPE.get(widest) if widest is not None else None


def _unknown(family: str, why: str, compute_dtype: str | None = None) -> OpCost:
    return OpCost(None, None, compute_dtype, f"unknown: {why}", family)


def _sum_or_none(*parts: int | None) -> int | None:
    known = [p for p in parts if p is not None]
    return None if len(known) < len(parts) else int(sum(known))


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(nd):
        dims = {s[len(s) - nd + k] for s in shapes if len(s) - nd + k >= 0}
        dims.discard(1)
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _promote(names: Sequence[str], ndims: Sequence[int]) -> str | None:
    """Result dtype of a pointwise op (simplified torch type promotion)."""
    if not names:
        return None
    dimensioned = [d for d, nd in zip(names, ndims, strict=True) if nd > 0] or list(names)
    top = max(_category(d) for d in names)
    if max(_category(d) for d in dimensioned) < top:
        return "float" if top == _CATEGORY["float"] else names[0]  # 0-dim float * int tensor
    cands = {d for d in dimensioned if _category(d) == top}
    if len(cands) == 1:
        return cands.pop()
    if cands == {"c10::Half", "c10::BFloat16"}:
        return "float"
    return max(cands, key=lambda d: ELEMENT_SIZE.get(d, 0))


Formula = Callable[[_Args], OpCost]

# --------------------------------------------------------------------------- GEMM family
# reference §3.1: mm = 2*M*N*K (flop_counter, Kineto util.cpp, PyProf, DeepSpeed); bias, alpha
# and beta are not counted; bytes = A + B + C (+ the added operand when beta != 0).


def _out_bytes_gemm(a: _Args, numel: int, operand: int, out_dtype_idx: int | None) -> int | None:
    name = a.scalar_type(out_dtype_idx) or a.dtype(operand)
    es = ELEMENT_SIZE.get(name or "")
    return numel * es if es is not None else None


def _beta_is_zero(a: _Args, i: int) -> bool:
    return a.number(i) == 0.0


def _matrix_operands(a: _Args, first: int, op: str) -> tuple[int, int, int] | OpCost:
    """``(M, K, N)`` of the ``[M,K] x [K,N]`` operands at ``first``, ``first + 1``."""
    A, B = a.shape(first), a.shape(first + 1)
    if A is None or B is None or len(A) != 2 or len(B) != 2 or A[1] != B[0]:
        return _unknown(
            GEMM, f"{op} operands not recorded as [M,K]x[K,N]", _cd(a, first, first + 1)
        )
    return A[0], A[1], B[1]


def _mm(a: _Args) -> OpCost:
    cd = _cd(a, 0, 1)
    dims = _matrix_operands(a, 0, "mm")
    if isinstance(dims, OpCost):
        return dims
    m, k, n = dims
    out_dt = 2 if a.n > 2 and not a.is_tensor(2) else None  # mm.dtype(self, mat2, out_dtype)
    by = _sum_or_none(a.nbytes(0), a.nbytes(1), _out_bytes_gemm(a, m * n, 0, out_dt))
    return OpCost(2.0 * m * n * k, by, cd, f"2*M*N*K (M={m} N={n} K={k})", GEMM)


def _addmm(a: _Args) -> OpCost:
    """addmm / addmm_ / _addmm_activation(self, mat1, mat2, beta, alpha)."""
    cd = _cd(a, 1, 2)
    dims = _matrix_operands(a, 1, "addmm")
    if isinstance(dims, OpCost):
        return dims
    m, k, n = dims
    # addmm.dtype(self, mat1, mat2, out_dtype, beta, alpha) has 6 args and no out tensor
    has_out_dtype = a.n >= 6 and not a.is_tensor(5) and a.dtype(3) == "Scalar"
    beta_idx = 4 if has_out_dtype else 3
    bias = 0 if _beta_is_zero(a, beta_idx) else a.nbytes(0)
    out = _out_bytes_gemm(a, m * n, 1, 3 if has_out_dtype else None)
    by = _sum_or_none(bias, a.nbytes(1), a.nbytes(2), out)
    return OpCost(2.0 * m * n * k, by, cd, f"2*M*N*K (M={m} N={n} K={k}; bias not counted)", GEMM)


def _batched_operands(a: _Args, first: int, op: str) -> tuple[int, int, int, int] | OpCost:
    """``(B, M, K, N)`` of the ``[B,M,K] x [B,K,N]`` operands at ``first``, ``first + 1``."""
    A, B = a.shape(first), a.shape(first + 1)
    if A is None or B is None or len(A) != 3 or len(B) != 3 or A[0] != B[0] or A[2] != B[1]:
        return _unknown(
            GEMM, f"{op} operands not recorded as [B,M,K]x[B,K,N]", _cd(a, first, first + 1)
        )
    return A[0], A[1], A[2], B[2]


def _bmm(a: _Args) -> OpCost:
    dims = _batched_operands(a, 0, "bmm")
    if isinstance(dims, OpCost):
        return dims
    b, m, k, n = dims
    out_dt = 2 if a.n > 2 and not a.is_tensor(2) else None
    by = _sum_or_none(a.nbytes(0), a.nbytes(1), _out_bytes_gemm(a, b * m * n, 0, out_dt))
    return OpCost(
        2.0 * b * m * n * k, by, _cd(a, 0, 1), f"2*B*M*N*K (B={b} M={m} N={n} K={k})", GEMM
    )


def _bias_batched(a: _Args, op: str, out_elems: Callable[[int, int, int], int]) -> OpCost:
    """baddbmm / addbmm (self, batch1, batch2, beta, alpha); ``out_elems(B, M, N)``: output size."""
    dims = _batched_operands(a, 1, op)
    if isinstance(dims, OpCost):
        return dims
    b, m, k, n = dims
    bias = 0 if _beta_is_zero(a, 3) else a.nbytes(0)
    out = _out_bytes_gemm(a, out_elems(b, m, n), 1, None)
    by = _sum_or_none(bias, a.nbytes(1), a.nbytes(2), out)
    return OpCost(
        2.0 * b * m * n * k, by, _cd(a, 1, 2), f"2*B*M*N*K (B={b} M={m} N={n} K={k})", GEMM
    )


def _baddbmm(a: _Args) -> OpCost:
    return _bias_batched(a, "baddbmm", lambda b, m, n: b * m * n)


def _addbmm(a: _Args) -> OpCost:
    """addbmm(self[M,N], batch1[B,M,K], batch2[B,K,N]): the batch is summed into one [M,N]."""
    return _bias_batched(a, "addbmm", lambda b, m, n: m * n)


def _matmul_dims(A: tuple[int, ...], B: tuple[int, ...]) -> tuple[int, int, int, int, int] | None:
    """(batch, M, N, K, out_numel) of torch.matmul with broadcast batch dims."""
    if not A or not B:
        return None
    a2 = (1, A[0]) if len(A) == 1 else A
    b2 = (B[0], 1) if len(B) == 1 else B
    if a2[-1] != b2[-2]:
        return None
    batch = _broadcast([a2[:-2], b2[:-2]])
    if batch is None:
        return None
    m, k, n = a2[-2], a2[-1], b2[-1]
    nb = math.prod(batch)
    return nb, m, n, k, nb * m * n


def _matmul(a: _Args) -> OpCost:
    A, B = a.shape(0), a.shape(1)
    cd = _cd(a, 0, 1)
    dims = _matmul_dims(A, B) if A is not None and B is not None else None
    if dims is None:
        return _unknown(GEMM, "matmul operand shapes not recorded or not broadcastable", cd)
    nb, m, n, k, out = dims
    by = _sum_or_none(a.nbytes(0), a.nbytes(1), _out_bytes_gemm(a, out, 0, None))
    return OpCost(
        2.0 * nb * m * n * k,
        by,
        cd,
        f"2*B*M*N*K, B=broadcast batch (B={nb} M={m} N={n} K={k})",
        GEMM,
    )


def _linear(a: _Args) -> OpCost:
    """linear(input[...,K], weight[N,K], bias): 2*numel(x)*N (DeepSpeed macs = numel(x)*N)."""
    X, W = a.shape(0), a.shape(1)
    cd = _cd(a, 0, 1)
    if X is None or W is None or not X or len(W) not in (1, 2) or X[-1] != W[-1]:
        return _unknown(GEMM, "linear input/weight shapes not recorded", cd)
    n = W[0] if len(W) == 2 else 1
    rows = math.prod(X[:-1])
    by = _sum_or_none(
        a.nbytes(0), a.nbytes(1), a.opt_bytes(2), _out_bytes_gemm(a, rows * n, 0, None)
    )
    return OpCost(2.0 * rows * X[-1] * n, by, cd, f"2*numel(x)*N (N={n} K={X[-1]})", GEMM)


def _mv(a: _Args) -> OpCost:
    """mv(self[M,K], vec[K]) and addmv(self[M], mat, vec, beta, alpha): 2*M*K."""
    off = 1 if len(a.shape(0) or ()) == 1 else 0  # addmv(self[M], mat, vec): self first
    A, v = a.shape(off), a.shape(off + 1)
    cd = _cd(a, off, off + 1)
    if A is None or v is None or len(A) != 2 or len(v) != 1 or A[1] != v[0]:
        return _unknown(GEMM, "mv operands not recorded as [M,K]x[K]", cd)
    m, k = A
    bias = (0 if _beta_is_zero(a, 3) else a.nbytes(0)) if off else 0
    by = _sum_or_none(bias, a.nbytes(off), a.nbytes(off + 1), _out_bytes_gemm(a, m, off, None))
    return OpCost(2.0 * m * k, by, cd, f"2*M*K (M={m} K={k})", GEMM)


def _dot(a: _Args) -> OpCost:
    A, B = a.shape(0), a.shape(1)
    cd = _cd(a, 0, 1)
    if A is None or B is None or len(A) != 1 or A != B:
        return _unknown(GEMM, "dot operands not recorded as [K]x[K]", cd)
    by = _sum_or_none(a.nbytes(0), a.nbytes(1), a.esize(0))
    return OpCost(2.0 * A[0], by, cd, f"2*K (K={A[0]})", GEMM)


def _scaled_mm(a: _Args) -> OpCost:
    """_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum):
    2*M*N*K (flop_counter ``_scaled_mm_flop``); out dtype = ``out_dtype`` or self's."""
    cd = _cd(a, 0, 1)
    dims = _matrix_operands(a, 0, "_scaled_mm")
    if isinstance(dims, OpCost):
        return dims
    m, k, n = dims
    reads = [a.nbytes(0), a.nbytes(1)] + [a.opt_bytes(i) for i in (2, 3, 4, 5)]
    by = _sum_or_none(*reads, _out_bytes_gemm(a, m * n, 0, 6))
    return OpCost(2.0 * m * n * k, by, cd, f"2*M*N*K (M={m} N={n} K={k})", GEMM)


def _int_mm(a: _Args) -> OpCost:
    cd = _cd(a, 0, 1)
    dims = _matrix_operands(a, 0, "_int_mm")
    if isinstance(dims, OpCost):
        return dims
    m, k, n = dims
    by = _sum_or_none(a.nbytes(0), a.nbytes(1), m * n * 4)  # int32 result
    return OpCost(2.0 * m * n * k, by, cd, f"2*M*N*K (M={m} N={n} K={k})", GEMM)


def _einsum(a: _Args) -> OpCost:
    """Two-operand einsum from its equation (reference §3.1): with a contracted index
    2*prod(extent of every distinct index), else prod(output extents). Kineto does not record
    the equation string (torch 2.13 writes ''), so this is normally NA; the bmm/mul it
    decomposes into carry the FLOPs."""
    eq = a.value(0)
    shapes = a.tensor_list(1)
    if not isinstance(eq, str) or shapes is None or len(shapes) != 2 or "." in eq:
        return _unknown(GEMM, "einsum equation not recorded (or not a two-operand equation)")
    lhs, _, rhs = eq.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != 2 or not all(len(t) == len(s) for t, s in zip(terms, shapes, strict=True)):
        return _unknown(GEMM, "einsum equation does not match the operand shapes")
    extent: dict[str, int] = {}
    for t, s in zip(terms, shapes, strict=True):
        for c, d in zip(t, s, strict=True):
            extent[c] = max(extent.get(c, 1), d)
    out_idx = rhs if "->" in eq else "".join(sorted(c for c in extent if lhs.count(c) == 1))
    contracted = [c for c in extent if c not in out_idx]
    if contracted:
        flops, text = 2.0 * math.prod(extent.values()), "2*prod(all index extents)"
    else:
        flops, text = float(math.prod(extent[c] for c in out_idx)), "prod(output extents)"
    return OpCost(flops, None, None, f"einsum {eq}: {text}", GEMM)


# --------------------------------------------------------------------------- convolution
# reference §3.2: forward 2*N*C_out*prod(D_out)*(C_in/g)*prod(k) = 2*N*prod(D_out)*numel(W)
# (W = [C_out, C_in/g, k...]); transposed 2*N*prod(D_in)*numel(W) (W = [C_in, C_out/g, k...],
# flop_counter and DeepSpeed use the input spatial size); dgrad = wgrad = forward count.


@dataclass(frozen=True)
class _ConvSpec:
    """Argument positions of one convolution op (None: not an argument, use the default)."""

    x: int = 0
    w: int = 1
    bias: int | None = 2
    stride: int | None = None
    padding: int | None = None
    dilation: int | None = None
    transposed: int | bool = False
    output_padding: int | None = None
    groups: int | None = None
    extra: tuple[int, ...] = ()  # other tensors read (z of cudnn_convolution_add_relu)


def _conv_out(
    din: Sequence[int],
    k: Sequence[int],
    s: Sequence[int],
    p: Sequence[int],
    d: Sequence[int],
    transposed: bool,
    op: Sequence[int],
) -> list[int]:
    if transposed:
        return [
            (i - 1) * st - 2 * pp + dd * (kk - 1) + oo + 1
            for i, kk, st, pp, dd, oo in zip(din, k, s, p, d, op, strict=True)
        ]
    return [
        (i + 2 * pp - dd * (kk - 1) - 1) // st + 1
        for i, kk, st, pp, dd in zip(din, k, s, p, d, strict=True)
    ]


def _arg_ints(a: _Args, idx: int | None, n: int, default: int) -> list[int] | None:
    return [default] * n if idx is None else a.ints(idx, n)


def _conv_forward(spec: _ConvSpec) -> Formula:
    def cost(a: _Args) -> OpCost:
        X, W = a.shape(spec.x), a.shape(spec.w)
        cd = _cd(a, spec.x, spec.w)
        if X is None or W is None or len(W) < 3:
            return _unknown(CONV, "convolution input/weight shapes not recorded", cd)
        nsp = len(W) - 2
        if len(X) == nsp + 2:
            n, din = X[0], X[2:]
        elif len(X) == nsp + 1:  # unbatched input
            n, din = 1, X[1:]
        else:
            return _unknown(CONV, "convolution input rank does not match the weight", cd)
        tr = spec.transposed if isinstance(spec.transposed, bool) else a.flag(spec.transposed)
        if tr is None:
            return _unknown(CONV, "'transposed' not recorded", cd)
        s = _arg_ints(a, spec.stride, nsp, 1)
        p = _arg_ints(a, spec.padding, nsp, 0)
        d = _arg_ints(a, spec.dilation, nsp, 1)
        op = _arg_ints(a, spec.output_padding, nsp, 0)
        g = _arg_ints(a, spec.groups, 1, 1)
        dout = (
            _conv_out(din, W[2:], s, p, d, tr, op)
            if s is not None
            and p is not None
            and d is not None
            and op is not None
            and g is not None
            else None
        )
        if tr:
            flops = 2.0 * n * math.prod(din) * math.prod(W)
            text = "transposed: 2*N*prod(D_in)*C_in*(C_out/g)*prod(k)"
            cout = W[1] * g[0] if g is not None else None
        else:
            if dout is None:
                return _unknown(CONV, "stride/padding/dilation not recorded", cd)
            flops = 2.0 * n * math.prod(dout) * math.prod(W)
            text = "2*N*C_out*prod(D_out)*(C_in/g)*prod(k)"
            cout = W[0]
        es = a.esize(spec.x)
        out = n * cout * math.prod(dout) * es if dout is not None and cout and es else None
        reads = [a.nbytes(spec.x), a.nbytes(spec.w), a.opt_bytes(spec.bias)]
        by = _sum_or_none(*reads, *(a.opt_bytes(i) for i in spec.extra), out)
        return OpCost(flops, by, cd, text, CONV)

    return cost


@dataclass(frozen=True)
class _ConvBwdSpec:
    grad_out: int
    x: int
    w: int
    transposed: int | bool
    mask: int
    mask_len: int = 3


def _conv_backward(spec: _ConvBwdSpec) -> Formula:
    """dgrad (output_mask[0]) and wgrad (output_mask[1]) each = the forward count; the bias
    gradient (mask[2]) is a reduction (on CUDA a separate aten::sum child) and is not counted."""

    def cost(a: _Args) -> OpCost:
        G, X, W = a.shape(spec.grad_out), a.shape(spec.x), a.shape(spec.w)
        cd = _cd(a, spec.x, spec.w)
        if G is None or X is None or W is None or len(W) < 3 or len(G) != len(W):
            return _unknown(CONV, "convolution_backward shapes not recorded", cd)
        tr = spec.transposed if isinstance(spec.transposed, bool) else a.flag(spec.transposed)
        mask = a.value(spec.mask)
        if tr is None:
            return _unknown(CONV, "'transposed' not recorded", cd)
        if not (isinstance(mask, list) and len(mask) == spec.mask_len):
            return _unknown(CONV, "output_mask not recorded", cd)
        mask = [bool(m) for m in mask] + [False] * (3 - spec.mask_len)
        conv = 2.0 * G[0] * math.prod((X if tr else G)[2:]) * math.prod(W)
        flops = conv * (int(mask[0]) + int(mask[1]))
        parts = [a.nbytes(spec.grad_out)]
        if mask[0]:
            parts += [a.nbytes(spec.w), a.nbytes(spec.x)]  # read W, write dX
        if mask[1]:
            parts += [a.nbytes(spec.x), a.nbytes(spec.w)]  # read X, write dW
        if mask[2]:
            es = a.esize(spec.grad_out)
            parts.append(G[1] * es if es else None)
        text = f"(dgrad {int(mask[0])} + wgrad {int(mask[1])}) x forward count"
        return OpCost(flops, _sum_or_none(*parts), cd, text, CONV)

    return cost


def _cudnn_conv_backward_input(a: _Args) -> OpCost:
    """Legacy cudnn_convolution_backward_input(self_size, grad_output, weight, ...): dgrad."""
    G, W = a.shape(1), a.shape(2)
    cd = _cd(a, 1, 2)
    if G is None or W is None or len(W) < 3 or len(G) != len(W):
        return _unknown(CONV, "grad_output/weight shapes not recorded", cd)
    flops = 2.0 * G[0] * math.prod(G[2:]) * math.prod(W)
    size = a.value(0)
    es = a.esize(1)
    dx = math.prod(size) * es if isinstance(size, list) and es else None
    return OpCost(flops, _sum_or_none(a.nbytes(1), a.nbytes(2), dx), cd, "dgrad = forward", CONV)


def _cudnn_conv_backward_weight(a: _Args) -> OpCost:
    """Legacy cudnn_convolution_backward_weight(weight_size, grad_output, self, ...): wgrad;
    needs ``weight_size`` (not recorded by legacy Kineto)."""
    G, X = a.shape(1), a.shape(2)
    cd = _cd(a, 1, 2)
    size = a.value(0)
    if G is None or X is None or not isinstance(size, list) or len(size) != len(G):
        return _unknown(CONV, "weight_size not recorded", cd)
    flops = 2.0 * G[0] * math.prod(G[2:]) * math.prod(size)
    es = a.esize(1)
    dw = math.prod(size) * es if es else None
    return OpCost(flops, _sum_or_none(a.nbytes(1), a.nbytes(2), dw), cd, "wgrad = forward", CONV)


# --------------------------------------------------------------------------- attention
# reference §3.6: forward 2*b*h_q*s_q*s_k*(d_qk + d_v) (flop_counter sdpa_flop_count),
# backward 2*b*h_q*s_q*s_k*(3*d_qk + 2*d_v) (sdpa_backward_flop_count); causal x1/2 (FlashAttention
# benchmark convention; flop_counter does not halve); GQA: query heads for FLOPs.


@dataclass(frozen=True)
class _AttnSpec:
    q: int = 0
    k: int = 1
    v: int = 2
    bshd: bool = False  # [b, s, h, d] layout (flash/efficient internals) instead of [b, h, s, d]
    causal: int | None = None  # index of is_causal
    mask_type: int | None = None  # index of custom_mask_type (efficient internals)
    cum_seq: int | None = None  # index of cum_seq_q: a tensor there means packed varlen input
    backward: bool = False
    lse: bool | int = True  # forward writes the LSE (or index of compute_log_sumexp)


def _attention(spec: _AttnSpec) -> Formula:
    def cost(a: _Args) -> OpCost:
        Q, K, V = a.shape(spec.q), a.shape(spec.k), a.shape(spec.v)
        cd = _cd(a, spec.q, spec.k)
        if Q is not None and len(Q) == 3 and spec.cum_seq is not None:
            return _unknown(
                ATTENTION, "packed variable-length attention (offsets not recorded)", cd
            )
        if Q is None or K is None or V is None or not len(Q) == len(K) == len(V) == 4:
            return _unknown(ATTENTION, "query/key/value shapes not recorded as 4-D", cd)
        if spec.bshd:
            (b, sq, hq, dqk), (_, sk, _, _), (_, _, _, dv) = Q, K, V
        else:
            (b, hq, sq, dqk), (_, _, sk, _), (_, _, _, dv) = Q, K, V
        if spec.mask_type is not None:
            mt = a.number(spec.mask_type)
            causal = None if mt is None else mt != 0
        elif spec.causal is not None:
            causal = a.flag(spec.causal)
        else:
            causal = False
        if causal is None:
            return _unknown(ATTENTION, "is_causal not recorded", cd)
        per = (3 * dqk + 2 * dv) if spec.backward else (dqk + dv)
        flops = 2.0 * b * hq * sq * sk * per * (0.5 if causal else 1.0)
        text = (
            "bwd 2*b*h*s_q*s_k*(3*d_qk+2*d_v)" if spec.backward else "fwd 2*b*h*s_q*s_k*(d_qk+d_v)"
        ) + (" causal x1/2" if causal else "")
        es = a.esize(spec.q)
        tensors = [a.nbytes(i) for i in range(a.n) if a.is_tensor(i)]
        if spec.backward:
            writes = [a.nbytes(spec.q), a.nbytes(spec.k), a.nbytes(spec.v)]
        else:
            lse = spec.lse if isinstance(spec.lse, bool) else bool(a.flag(spec.lse))
            writes = [b * hq * sq * dv * es if es else None, b * hq * sq * _STAT_BYTES * lse]
        return OpCost(flops, _sum_or_none(*tensors, *writes), cd, text, ATTENTION)

    return cost


# --------------------------------------------------------------------------- elementwise
# reference §3.3: unary FLOPs = numel (PyProf; DeepSpeed relu/gelu/silu/elu; exp/tanh/... also
# counted as 1, not PyProf's 20 "estimate"); binary = numel(broadcast output); addcmul/addcdiv
# 3*numel (PyProf); bytes = operands + output, comparisons write bool.


def _pointwise(operands: int, per_element: float, out: str = "promote") -> Formula:
    """Tensors at positions < ``operands`` are operands; a tensor after them is ``out=``."""

    def cost(a: _Args) -> OpCost:
        ops_ = [i for i in range(min(operands, a.n)) if a.is_tensor(i)]
        outs = [i for i in range(operands, a.n) if a.is_tensor(i)]
        if not ops_:
            return _unknown(ELEMENTWISE, "operand shapes not recorded")
        shapes = [s for s in (a.shape(i) for i in ops_) if s is not None]  # ops_ are tensors
        names = [a.dtype(i) or "" for i in ops_]
        shape = _broadcast(shapes)
        if shape is None:
            return _unknown(ELEMENTWISE, "operand shapes do not broadcast")
        n = math.prod(shape)
        res = _promote(names, [len(s) for s in shapes])
        cd = COMPUTE_DTYPE.get(res or "")
        if outs:
            out_bytes = a.nbytes(outs[-1])
        else:
            out_name = "bool" if out == "bool" else res
            es = ELEMENT_SIZE.get(out_name or "")
            out_bytes = n * es if es else None
        by = _sum_or_none(*(a.nbytes(i) for i in ops_), out_bytes)
        text = f"{per_element:g}*numel" if per_element else "0 (no arithmetic)"
        return OpCost(per_element * n, by, cd, text, ELEMENTWISE)

    return cost


def _max_min(a: _Args) -> OpCost:
    """max / min: binary (other tensor), full reduction (1 arg) or dim reduction + indices."""
    if a.is_tensor(1):
        return _pointwise(2, 1)(a)
    if a.n <= 1 or a.dtype(1) is None:
        return _reduce_cost(a, None, False, None, 1, False, False, "numel")
    return _reduce_cost(a, a.value(1), a.flag(2), None, 1, False, True, "numel")


# --------------------------------------------------------------------------- reductions
# reference §3.4: sum numel, mean numel + 1 (one division per output), L2 norm 2*numel + 1;
# max/min/amax/amin/prod/argmax/argmin/all/any: numel (one op per input element) [own, as sum].


def _reduced_numel(shape: tuple[int, ...], dims: Any) -> int | None:
    """Output numel of a reduction over ``dims`` (None or [] = all); keepdim does not change it."""
    if dims is _NOT_RECORDED:
        return None
    if dims is None or dims == []:
        return 1
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = [dims]
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return None
    nd = max(len(shape), 1)
    red = {d % nd for d in dims}
    return math.prod(s for i, s in enumerate(shape) if i not in red)


def _reduce_cost(
    a: _Args,
    dims: Any,
    keepdim: bool | None,
    out_type: str | None,
    per_element: float,
    plus_out: bool,
    indices: bool,
    text: str,
    out_idx: int | None = None,
) -> OpCost:
    X = a.shape(0)
    cd = _cd(a, 0)
    if X is None:
        return _unknown(REDUCTION, "input shape not recorded", cd)
    n = math.prod(X)
    out_n = _reduced_numel(X, dims)
    if plus_out and out_n is None:
        return _unknown(REDUCTION, "reduced dims not recorded", cd)
    flops = per_element * n + (out_n if plus_out and out_n is not None else 0)
    es = ELEMENT_SIZE.get(out_type or a.dtype(0) or "")
    if out_idx is not None and a.is_tensor(out_idx):
        out = a.nbytes(out_idx)
    else:
        out = out_n * es if out_n is not None and es else None
    idx = (out_n * 8 if out_n is not None else None) if indices else 0
    return OpCost(flops, _sum_or_none(a.nbytes(0), out, idx), cd, text, REDUCTION)


def _reduction(per_element: float, plus_out: bool = False, text: str = "numel") -> Formula:
    """sum / nansum / mean / prod / amax / amin(self[, dim, keepdim[, dtype]][, out])."""

    def cost(a: _Args) -> OpCost:
        if a.n <= 2:  # sum(self, dtype) / prod(self, dtype): full reduction
            return _reduce_cost(
                a, None, False, a.scalar_type(1), per_element, plus_out, False, text
            )
        dtype = a.scalar_type(3) if a.n > 3 and not a.is_tensor(3) else None
        return _reduce_cost(
            a, a.value(1), a.flag(2), dtype, per_element, plus_out, False, text, out_idx=a.n - 1
        )

    return cost


def _arg_reduction(a: _Args) -> OpCost:
    """argmax / argmin(self, dim?, keepdim): int64 output."""
    return _reduce_cost(
        a,
        a.value(1) if a.n > 1 else None,
        a.flag(2) if a.n > 2 else False,
        "long int",
        1,
        False,
        False,
        "numel",
        out_idx=3,
    )


def _bool_reduction(a: _Args) -> OpCost:
    """all / any(self[, dim, keepdim])."""
    dims = a.value(1) if a.n > 1 else None
    return _reduce_cost(a, dims, a.flag(2) if a.n > 2 else False, "bool", 1, False, False, "numel")


def _vector_norm(a: _Args) -> OpCost:
    """linalg_vector_norm(self, ord, dim, keepdim, dtype): L2 = 2*numel + one sqrt per output."""
    ord_ = a.number(1)
    if ord_ != 2.0:
        return _unknown(REDUCTION, "only the L2 norm has a formula", _cd(a, 0))
    return _reduce_cost(
        a,
        a.value(2),
        a.flag(3),
        a.scalar_type(4),
        2,
        True,
        False,
        "2*numel + numel(out)",
        out_idx=5,
    )


def _norm(a: _Args) -> OpCost:
    """norm.Scalar(self, p) / norm.ScalarOpt_dim(self, p, dim, keepdim[, dtype])."""
    if a.number(1) != 2.0:
        return _unknown(REDUCTION, "only the L2 norm has a formula", _cd(a, 0))
    if a.n <= 2:
        return _reduce_cost(a, None, False, None, 2, True, False, "2*numel + 1")
    return _reduce_cost(a, a.value(2), a.flag(3), None, 2, True, False, "2*numel + numel(out)")


# --------------------------------------------------------------------------- softmax
# reference §3.4: estimates disagree (PyProf ~40*numel, DeepSpeed numel); the reference's middle
# estimate 5*numel (max, sub, exp, sum, div) is used. Backward [own]: softmax dx = y*(dy -
# sum(dy*y)) and log_softmax dx = dy - exp(y)*sum(dy): 4*numel each.


def _softmax(half_to_float: bool) -> Formula:
    def cost(a: _Args) -> OpCost:
        X = a.shape(0)
        cd = _cd(a, 0)
        if X is None:
            return _unknown(SOFTMAX, "input shape not recorded", cd)
        n = math.prod(X)
        if half_to_float:  # _softmax(self, dim, half_to_float)
            out_t = "float" if a.flag(2) else a.dtype(0)
        else:  # softmax(self, dim, dtype)
            out_t = a.scalar_type(2) or a.dtype(0)
        es = ELEMENT_SIZE.get(out_t or "")
        by = _sum_or_none(a.nbytes(0), n * es if es else None)
        return OpCost(5.0 * n, by, cd, "5*numel (max, sub, exp, sum, div)", SOFTMAX)

    return cost


def _softmax_backward(a: _Args) -> OpCost:
    """_softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim, dtype)."""
    G = a.shape(0)
    cd = _cd(a, 1)
    if G is None:
        return _unknown(SOFTMAX, "grad_output shape not recorded", cd)
    n = math.prod(G)
    es = ELEMENT_SIZE.get(a.scalar_type(3) or a.dtype(0) or "")
    by = _sum_or_none(a.nbytes(0), a.nbytes(1), n * es if es else None)
    return OpCost(4.0 * n, by, cd, "4*numel", SOFTMAX)


# --------------------------------------------------------------------------- norms
# reference §3.4: LayerNorm / GroupNorm / InstanceNorm 5*numel with affine, 4*numel without
# (DeepSpeed); BatchNorm training 5/4*numel, eval 2/1*numel (DeepSpeed); RMSNorm ~4*numel [own].
# Backward [own]: 2x the forward (training) estimate; the reference gives no backward figure.


def _rows(numel: int, normalized: Any, weight: tuple[int, ...] | None) -> int | None:
    if isinstance(normalized, list) and normalized and all(isinstance(x, int) for x in normalized):
        inner = math.prod(normalized)
    elif weight is not None and weight:
        inner = math.prod(weight)
    else:
        return None
    return numel // inner if inner else None


def _layer_norm(rms: bool) -> Formula:
    """layer_norm / native_layer_norm(input, normalized_shape, weight, bias, eps);
    rms_norm / _fused_rms_norm(input, normalized_shape, weight, eps)."""

    def cost(a: _Args) -> OpCost:
        X = a.shape(0)
        cd = _cd(a, 0)
        if X is None:
            return _unknown(NORM, "input shape not recorded", cd)
        n = math.prod(X)
        affine = a.is_tensor(2)
        per = 4 if rms else (5 if affine else 4)
        rows = _rows(n, a.value(1), a.shape(2))
        stats = None if rows is None else rows * _STAT_BYTES * (1 if rms else 2)
        bias = 0 if rms else a.opt_bytes(3)
        x_bytes = a.nbytes(0)
        by = _sum_or_none(2 * x_bytes if x_bytes is not None else None, a.opt_bytes(2), bias, stats)
        text = f"{per}*numel" + ("" if rms else (" (affine)" if affine else " (no affine)"))
        return OpCost(float(per * n), by, cd, text, NORM)

    return cost


def _mask3(a: _Args, i: int, length: int = 3) -> list[bool] | None:
    v = a.value(i)
    if isinstance(v, list) and len(v) == length and all(isinstance(x, bool) for x in v):
        return v + [False] * (3 - length)
    return None


def _layer_norm_backward(rms: bool) -> Formula:
    """native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
    output_mask); _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight,
    output_mask[2])."""

    def cost(a: _Args) -> OpCost:
        X = a.shape(1)
        cd = _cd(a, 1)
        if X is None:
            return _unknown(NORM, "input shape not recorded", cd)
        n = math.prod(X)
        w = 4 if rms else 5
        affine = a.is_tensor(w)
        per = 2 * (4 if rms else (5 if affine else 4))
        mask = _mask3(a, 5 if rms else 7, 2 if rms else 3)
        reads = [a.nbytes(i) for i in range(a.n) if a.is_tensor(i) and i != (6 if not rms else -1)]
        if mask is None:
            by = None
        else:
            writes = [
                a.nbytes(1) if mask[0] else 0,
                a.opt_bytes(w) if mask[1] else 0,
                a.opt_bytes(6) if mask[2] and not rms else 0,
            ]
            by = _sum_or_none(*reads, *writes)
        return OpCost(float(per * n), by, cd, f"{per}*numel (2x forward)", NORM)

    return cost


@dataclass(frozen=True)
class _BatchNormSpec:
    training: int | bool  # index of `training`, or a constant
    running: bool = True  # running_mean/var at 3, 4


def _batch_norm(spec: _BatchNormSpec) -> Formula:
    """(input, weight, bias, running_mean, running_var, training, ...)"""

    def cost(a: _Args) -> OpCost:
        X = a.shape(0)
        cd = _cd(a, 0)
        if X is None or len(X) < 2:
            return _unknown(NORM, "input shape not recorded", cd)
        training = spec.training if isinstance(spec.training, bool) else a.flag(spec.training)
        if training is None:
            return _unknown(NORM, "'training' not recorded", cd)
        n, c = math.prod(X), X[1]
        affine = a.is_tensor(1)
        per = (5 if affine else 4) if training else (2 if affine else 1)
        running = (a.opt_bytes(3) + a.opt_bytes(4)) if spec.running else 0
        extra = (2 * c * _STAT_BYTES + running) if training else 0  # saved stats + running update
        x = a.nbytes(0)
        by = _sum_or_none(
            2 * x if x is not None else None, a.opt_bytes(1), a.opt_bytes(2), running, extra
        )
        mode = "training" if training else "eval"
        return OpCost(float(per * n), by, cd, f"{per}*numel ({mode})", NORM)

    return cost


def _native_batch_norm_legit(a: _Args) -> OpCost:
    if a.n == 6 and not a.is_tensor(3):  # .no_stats(input, weight, bias, training, momentum, eps)
        return _batch_norm(_BatchNormSpec(training=3, running=False))(a)
    return _batch_norm(_BatchNormSpec(training=5))(a)


@dataclass(frozen=True)
class _BatchNormBwdSpec:
    x: int
    grad_out: int
    w: int
    mask: int | None  # index of output_mask; None: all three gradients


def _batch_norm_backward(spec: _BatchNormBwdSpec) -> Formula:
    def cost(a: _Args) -> OpCost:
        X = a.shape(spec.x)
        cd = _cd(a, spec.x)
        if X is None or len(X) < 2:
            return _unknown(NORM, "input shape not recorded", cd)
        n = math.prod(X)
        affine = a.is_tensor(spec.w)
        per = 2 * (5 if affine else 4)
        mask = [True, True, True] if spec.mask is None else _mask3(a, spec.mask)
        if mask is None:
            return OpCost(float(per * n), None, cd, f"{per}*numel (2x training forward)", NORM)
        reads = [a.nbytes(i) for i in range(a.n) if a.is_tensor(i)]
        c_bytes = X[1] * (a.esize(spec.w) or a.esize(spec.x) or 0) if affine else 0
        writes = [a.nbytes(spec.x) if mask[0] else 0, c_bytes * mask[1], c_bytes * mask[2]]
        by = _sum_or_none(*reads, *writes)
        return OpCost(float(per * n), by, cd, f"{per}*numel (2x training forward)", NORM)

    return cost


def _group_norm(native: bool) -> Formula:
    """group_norm(input, num_groups, weight, bias, eps, cudnn_enabled) /
    native_group_norm(input, weight, bias, N, C, HxW, group, eps)."""

    def cost(a: _Args) -> OpCost:
        X = a.shape(0)
        cd = _cd(a, 0)
        if X is None:
            return _unknown(NORM, "input shape not recorded", cd)
        n = math.prod(X)
        w, b = (1, 2) if native else (2, 3)
        affine = a.is_tensor(w)
        per = 5 if affine else 4
        g = a.number(6 if native else 1)
        stats = 2 * X[0] * int(g) * _STAT_BYTES if g is not None and X else None
        x = a.nbytes(0)
        by = _sum_or_none(2 * x if x is not None else None, a.opt_bytes(w), a.opt_bytes(b), stats)
        return OpCost(float(per * n), by, cd, f"{per}*numel", NORM)

    return cost


def _group_norm_backward(a: _Args) -> OpCost:
    """native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, mask)."""
    X = a.shape(1)
    cd = _cd(a, 1)
    if X is None or len(X) < 2:
        return _unknown(NORM, "input shape not recorded", cd)
    n = math.prod(X)
    affine = a.is_tensor(4)
    per = 2 * (5 if affine else 4)
    mask = _mask3(a, 9)
    by = None
    if mask is not None:
        reads = [a.nbytes(i) for i in range(a.n) if a.is_tensor(i)]
        c_bytes = X[1] * (a.esize(4) or 0) if affine else 0
        by = _sum_or_none(
            *reads, a.nbytes(1) if mask[0] else 0, c_bytes * mask[1], c_bytes * mask[2]
        )
    return OpCost(float(per * n), by, cd, f"{per}*numel (2x forward)", NORM)


# --------------------------------------------------------------------------- embedding
# reference §3.5: FLOPs 0 (PyProf, DeepSpeed); bytes fwd = index bytes + 2*n_idx*D*s_w (gather +
# write); bwd ~ 3*n_idx*D*s (PyProf) + V*D*s for the zero-filled dense gradient [own].


def _embedding(a: _Args) -> OpCost:
    """embedding(weight[V, D], indices, padding_idx, scale_grad_by_freq, sparse)."""
    W, n_idx = a.shape(0), a.numel(1)
    cd = _cd(a, 0)
    if W is None or len(W) != 2 or n_idx is None:
        return _unknown(EMBEDDING, "weight/indices shapes not recorded", cd)
    es = a.esize(0) or 0
    by = _sum_or_none(a.nbytes(1), 2 * n_idx * W[1] * es)
    return OpCost(0.0, by, cd, "0 (gather)", EMBEDDING)


def _index_select(a: _Args) -> OpCost:
    """index_select(self, dim, index): gathers numel(index) slices of self along dim."""
    X, n_idx = a.shape(0), a.numel(2)
    cd = _cd(a, 0)
    dim = a.number(1)
    if X is None or n_idx is None:
        return _unknown(EMBEDDING, "self/index shapes not recorded", cd)
    if dim is None or not X:
        return OpCost(0.0, None, cd, "0 (gather); dim not recorded", EMBEDDING)
    d = int(dim) % len(X)
    row = math.prod(X) // X[d] if X[d] else 0
    by = _sum_or_none(a.nbytes(2), 2 * n_idx * row * (a.esize(0) or 0))
    return OpCost(0.0, by, cd, "0 (gather)", EMBEDDING)


def _embedding_dense_backward(a: _Args) -> OpCost:
    """embedding_dense_backward(grad_output, indices, num_weights, padding_idx, ...)."""
    G, n_idx = a.shape(0), a.numel(1)
    cd = _cd(a, 0)
    if G is None or not G or n_idx is None:
        return _unknown(EMBEDDING, "grad_output/indices shapes not recorded", cd)
    d, es = G[-1], a.esize(0) or 0
    v = a.number(2)
    dense = int(v) * d * es if v is not None else None
    by = _sum_or_none(a.nbytes(1), 3 * n_idx * d * es, dense)
    return OpCost(float(n_idx * d), by, cd, "n_idx*D accumulations [own]", EMBEDDING)


def _embedding_bag(a: _Args) -> OpCost:
    """_embedding_bag / embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
    per_sample_weights, include_last_offset, ...): pooling = one op per gathered element [own]."""
    W, n_idx, n_off = a.shape(0), a.numel(1), a.numel(2)
    cd = _cd(a, 0)
    if W is None or len(W) != 2 or n_idx is None or n_off is None:
        return _unknown(EMBEDDING, "weight/indices/offsets shapes not recorded", cd)
    es = a.esize(0) or 0
    last = a.flag(7)
    bags = None if last is None else n_off - int(last)
    out = bags * W[1] * es if bags is not None else None
    by = _sum_or_none(a.nbytes(1), a.nbytes(2), a.opt_bytes(6), n_idx * W[1] * es, out)
    return OpCost(float(n_idx * W[1]), by, cd, "n_idx*D (pooling) [own]", EMBEDDING)


# --------------------------------------------------------------------------- optimizers
# reference §3.7: Adam ~12-16 FLOPs per element [own] (m: 3, v: 4, bias correction: 2,
# sqrt+eps: 2, div: 1, lr*update and subtract: 2 = 14; weight decay +2); SGD with momentum ~4
# [own]. Bytes NA: Kineto records no element type for TensorList arguments.


def _list_numel(a: _Args, i: int) -> int | None:
    shapes = a.tensor_list(i)
    return sum(math.prod(s) for s in shapes) if shapes is not None else None


def _fused_adam(decoupled: bool) -> Formula:
    """_fused_adam(w)_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
    beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)."""

    def cost(a: _Args) -> OpCost:
        n = _list_numel(a, 0)
        wd, ams = a.number(9), a.flag(11)
        if n is None or wd is None or ams is None:
            return _unknown(OPTIMIZER, "parameter list or weight_decay/amsgrad not recorded")
        per = 14 + (2 if wd != 0 else 0) + (1 if ams else 0)
        kind = "AdamW" if decoupled else "Adam"
        return OpCost(
            float(per * n), None, None, f"{per}*n ({kind}) [own]; bytes: no dtype", OPTIMIZER
        )

    return cost


def _fused_sgd(a: _Args) -> OpCost:
    """_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, dampening,
    nesterov, ...): 2 (lr*g, subtract) + 2 momentum + 2 weight decay + 2 nesterov [own]."""
    n = _list_numel(a, 0)
    wd, mom, nest = a.number(3), a.number(4), a.flag(7)
    if n is None or wd is None or mom is None or nest is None:
        return _unknown(OPTIMIZER, "parameter list or hyper-parameters not recorded")
    per = 2 + (2 if mom != 0 else 0) + (2 if wd != 0 else 0) + (2 if nest else 0)
    return OpCost(float(per * n), None, None, f"{per}*n (SGD) [own]; bytes: no dtype", OPTIMIZER)


def _foreach(per_element: float, per_tensor: float = 0) -> Formula:
    """_foreach_<op>(self: TensorList, ...): per_element FLOPs for every element of ``self``."""

    def cost(a: _Args) -> OpCost:
        shapes = a.tensor_list(0)
        if shapes is None:
            return _unknown(OPTIMIZER, "tensor list shapes not recorded")
        n = sum(math.prod(s) for s in shapes)
        flops = per_element * n + per_tensor * len(shapes)
        return OpCost(float(flops), None, None, f"{per_element:g}*n; bytes: no dtype", OPTIMIZER)

    return cost


# --------------------------------------------------------------------------- copies, dropout


def _copy_(a: _Args) -> OpCost:
    """copy_(self, src, non_blocking): read src, write self (reference §3.3 Copy)."""
    by = _sum_or_none(a.nbytes(0), a.nbytes(1))
    return OpCost(0.0, by, _cd(a, 1), "0 (copy)", COPY)


def _to_copy(a: _Args) -> OpCost:
    """_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)."""
    n, es = a.numel(0), a.esize(0)
    dst = a.scalar_type(1)
    if dst is None and a.value(1) is not None:  # dtype not recorded (None means "keep")
        return OpCost(0.0, None, _cd(a, 0), "0 (copy); target dtype not recorded", COPY)
    es_dst = ELEMENT_SIZE.get(dst) if dst is not None else es
    by = n * (es + es_dst) if n is not None and es and es_dst else None
    return OpCost(0.0, by, _cd(a, 0), "0 (copy): numel*(s_src + s_dst)", COPY)


def _clone(a: _Args) -> OpCost:
    b = a.nbytes(0)
    return OpCost(0.0, 2 * b if b is not None else None, _cd(a, 0), "0 (copy)", COPY)


def _fill(a: _Args) -> OpCost:
    """fill_ / zero_: write self only."""
    return OpCost(0.0, a.nbytes(0), _cd(a, 0), "0 (fill)", COPY)


def _dropout(native: bool) -> Formula:
    """native_dropout / dropout(input, p, train): PyProf 5*numel (RNG); eval is a no-op.
    Bytes: input + output (+ the bool mask that native_dropout writes)."""

    def cost(a: _Args) -> OpCost:
        X = a.shape(0)
        cd = _cd(a, 0)
        if X is None:
            return _unknown(ELEMENTWISE, "input shape not recorded", cd)
        train = a.flag(2)
        if train is None and not (native and a.value(2) is None):
            return _unknown(ELEMENTWISE, "'train' not recorded", cd)
        if train is False:
            return OpCost(0.0, 0, cd, "0 (eval: identity)", ELEMENTWISE)
        n = math.prod(X)
        x = a.nbytes(0) or 0
        return OpCost(5.0 * n, 2 * x + n, cd, "5*numel (PyProf)", ELEMENTWISE)

    return cost


# --------------------------------------------------------------------------- the registry

_U = _pointwise(1, 1)  # unary, 1 FLOP per element
_UP = _pointwise(1, 1)  # unary with non-tensor parameters (approximate, alpha, ...)
_B = _pointwise(2, 1)  # binary, numel(broadcast output)
_CMP = _pointwise(2, 1, out="bool")  # comparison: bool output
_T3 = _pointwise(3, 3)  # addcmul / addcdiv: 3*numel (PyProf)
_BWD = _pointwise(2, 1)  # activation backward (grad_output, saved): 3*numel*s bytes

_CONVOLUTION = _ConvSpec(stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8)
_CONV_ND = _ConvSpec(stride=3, padding=4, dilation=5, groups=6)
_CONV_T_ND = _ConvSpec(stride=3, padding=4, output_padding=5, groups=6, dilation=7, transposed=True)
_SLOW_CONV = _ConvSpec(bias=3, stride=4, padding=5)
_SLOW_CONV_DIL = _ConvSpec(bias=3, stride=4, padding=5, dilation=6)
_SLOW_CONV_T = _ConvSpec(bias=3, stride=4, padding=5, output_padding=6, dilation=7, transposed=True)
_BACKEND_CONV = _ConvSpec(padding=3, stride=4, dilation=5, groups=6)  # mkldnn / miopen

# op-name groups for the registry (one FLOP formula each)
_UNARY_OPS = """relu relu_ silu silu_ sigmoid sigmoid_ tanh tanh_ exp exp_ exp2 expm1 log log_
log1p log2 sqrt sqrt_ rsqrt rsqrt_ neg neg_ abs abs_ reciprocal reciprocal_ sin sin_ cos cos_ erf
erf_ sign floor ceil round trunc hardswish hardswish_ hardsigmoid hardsigmoid_ mish mish_""".split()
_UNARY_PARAM_OPS = """gelu gelu_ leaky_relu leaky_relu_ elu elu_ hardtanh hardtanh_ softplus
threshold threshold_""".split()
_CLAMP_OPS = "clamp_min clamp_min_ clamp_max clamp_max_".split()
_BINARY_OPS = """add add_ sub sub_ rsub mul mul_ div div_ remainder fmod maximum minimum fmax fmin
pow pow_ atan2 hypot xlogy""".split()
_COMPARE_OPS = "eq ne lt le gt ge logical_and logical_or logical_xor".split()
_ACT_BACKWARD_OPS = """threshold_backward gelu_backward silu_backward sigmoid_backward
tanh_backward hardtanh_backward leaky_relu_backward hardswish_backward hardsigmoid_backward
softplus_backward mish_backward native_dropout_backward""".split()
_FOREACH_1_OPS = """_foreach_add_ _foreach_add _foreach_sub_ _foreach_sub _foreach_mul_
_foreach_mul _foreach_div_ _foreach_div _foreach_sqrt_ _foreach_sqrt _foreach_neg_ _foreach_neg
_foreach_maximum_ _foreach_clamp_min_ _foreach_reciprocal_ _foreach_pow_ _foreach_pow""".split()
_FOREACH_3_OPS = """_foreach_addcmul_ _foreach_addcmul _foreach_addcdiv_ _foreach_addcdiv
_foreach_lerp_ _foreach_lerp""".split()

FORMULAS: dict[str, Formula] = {
    # --- GEMM family: reference §3.1 (flop_counter mm/addmm/bmm/baddbmm, Kineto util.cpp)
    "mm": _mm,
    "addmm": _addmm,
    "addmm_": _addmm,
    "_addmm_activation": _addmm,  # fused addmm + GELU/ReLU epilogue (cuBLASLt)
    "bmm": _bmm,
    "baddbmm": _baddbmm,
    "baddbmm_": _baddbmm,
    "addbmm": _addbmm,
    "addbmm_": _addbmm,
    "matmul": _matmul,  # broadcast batch dims, then bmm (reference §3.1)
    "linear": _linear,  # 2*numel(x)*N (DeepSpeed)
    "mv": _mv,
    "addmv": _mv,
    "addmv_": _mv,
    "dot": _dot,
    "vdot": _dot,
    "einsum": _einsum,  # two-operand rule (reference §3.1); equation usually not recorded
    "_scaled_mm": _scaled_mm,  # FP8 GEMM, 2*M*N*K (flop_counter _scaled_mm_flop)
    "_int_mm": _int_mm,  # int8 GEMM, int32 output
    # --- convolution forward: reference §3.2 (flop_counter conv_flop_count, PyProf, DeepSpeed)
    "conv1d": _conv_forward(_CONV_ND),
    "conv2d": _conv_forward(_CONV_ND),
    "conv3d": _conv_forward(_CONV_ND),
    "_convolution_mode": _conv_forward(_CONV_ND),  # padding='same'/'valid' (string: not recorded)
    "convolution": _conv_forward(_CONVOLUTION),
    "_convolution": _conv_forward(_CONVOLUTION),
    "convolution_overrideable": _conv_forward(_CONVOLUTION),
    "conv_transpose1d": _conv_forward(_CONV_T_ND),
    "conv_transpose2d": _conv_forward(_CONV_T_ND),
    "conv_transpose3d": _conv_forward(_CONV_T_ND),
    "cudnn_convolution": _conv_forward(
        _ConvSpec(bias=None, padding=2, stride=3, dilation=4, groups=5)
    ),
    "cudnn_convolution_transpose": _conv_forward(
        _ConvSpec(
            bias=None, padding=2, output_padding=3, stride=4, dilation=5, groups=6, transposed=True
        )
    ),
    "cudnn_convolution_relu": _conv_forward(_CONV_ND),
    "cudnn_convolution_add_relu": _conv_forward(
        _ConvSpec(bias=4, stride=5, padding=6, dilation=7, groups=8, extra=(2,))
    ),
    "mkldnn_convolution": _conv_forward(_BACKEND_CONV),
    "miopen_convolution": _conv_forward(_BACKEND_CONV),
    "_nnpack_spatial_convolution": _conv_forward(_ConvSpec(padding=3, stride=4)),
    "_slow_conv2d_forward": _conv_forward(_SLOW_CONV),
    "thnn_conv2d": _conv_forward(_SLOW_CONV),
    "slow_conv3d": _conv_forward(_SLOW_CONV),
    "slow_conv3d_forward": _conv_forward(_SLOW_CONV),
    "slow_conv_dilated2d": _conv_forward(_SLOW_CONV_DIL),
    "slow_conv_dilated3d": _conv_forward(_SLOW_CONV_DIL),
    "slow_conv_transpose2d": _conv_forward(_SLOW_CONV_T),
    "slow_conv_transpose3d": _conv_forward(_SLOW_CONV_T),
    # --- convolution backward: reference §3.2 dgrad = wgrad = forward, per output_mask
    "convolution_backward": _conv_backward(_ConvBwdSpec(0, 1, 2, transposed=7, mask=10)),
    "convolution_backward_overrideable": _conv_backward(
        _ConvBwdSpec(0, 1, 2, transposed=6, mask=9)
    ),
    "cudnn_convolution_backward": _conv_backward(  # torch <= 1.10
        _ConvBwdSpec(1, 0, 2, transposed=False, mask=10, mask_len=2)
    ),
    "cudnn_convolution_transpose_backward": _conv_backward(  # torch <= 1.10
        _ConvBwdSpec(1, 0, 2, transposed=True, mask=11, mask_len=2)
    ),
    "cudnn_convolution_backward_input": _cudnn_conv_backward_input,  # torch <= 1.10
    "cudnn_convolution_backward_weight": _cudnn_conv_backward_weight,  # torch <= 1.10
    # --- attention: reference §3.6 (flop_counter sdpa_flop_count / sdpa_backward_flop_count)
    "scaled_dot_product_attention": _attention(_AttnSpec(causal=5)),
    "_scaled_dot_product_attention_math": _attention(_AttnSpec(causal=5, lse=False)),
    "_scaled_dot_product_flash_attention": _attention(_AttnSpec(causal=4)),
    "_scaled_dot_product_flash_attention_for_cpu": _attention(_AttnSpec(causal=4)),
    "_scaled_dot_product_efficient_attention": _attention(_AttnSpec(causal=6, lse=4)),
    "_scaled_dot_product_cudnn_attention": _attention(_AttnSpec(causal=6, lse=4)),
    "_scaled_dot_product_fused_attention_overrideable": _attention(_AttnSpec(causal=5)),
    "_flash_attention_forward": _attention(_AttnSpec(bshd=True, causal=8, cum_seq=3)),
    "_efficient_attention_forward": _attention(
        _AttnSpec(bshd=True, mask_type=9, cum_seq=4, lse=10)
    ),
    "_scaled_dot_product_flash_attention_backward": _attention(
        _AttnSpec(1, 2, 3, causal=11, cum_seq=6, backward=True)
    ),
    "_scaled_dot_product_flash_attention_for_cpu_backward": _attention(
        _AttnSpec(1, 2, 3, causal=7, backward=True)
    ),
    "_scaled_dot_product_efficient_attention_backward": _attention(
        _AttnSpec(1, 2, 3, causal=11, backward=True)
    ),
    "_scaled_dot_product_cudnn_attention_backward": _attention(
        _AttnSpec(1, 2, 3, causal=14, cum_seq=9, backward=True)
    ),
    "_scaled_dot_product_fused_attention_overrideable_backward": _attention(
        _AttnSpec(1, 2, 3, causal=13, cum_seq=8, backward=True)
    ),
    "_flash_attention_backward": _attention(
        _AttnSpec(1, 2, 3, bshd=True, causal=11, cum_seq=6, backward=True)
    ),
    "_efficient_attention_backward": _attention(
        _AttnSpec(1, 2, 3, bshd=True, mask_type=14, cum_seq=6, backward=True)
    ),
    # --- elementwise: reference §3.3 (unary/binary numel; PyProf ternary 3*numel)
    **dict.fromkeys(_UNARY_OPS, _U),
    **dict.fromkeys(_UNARY_PARAM_OPS, _UP),
    **dict.fromkeys(_CLAMP_OPS, _pointwise(2, 1)),
    "clamp": _pointwise(3, 1),  # clamp.Tensor takes tensor bounds
    "clamp_": _pointwise(3, 1),
    **dict.fromkeys(_BINARY_OPS, _B),
    **dict.fromkeys(_COMPARE_OPS, _CMP),
    "logical_not": _pointwise(1, 1, out="bool"),
    "max": _max_min,  # binary, full or dim reduction by overload
    "min": _max_min,
    "addcmul": _T3,
    "addcmul_": _T3,
    "addcdiv": _T3,
    "addcdiv_": _T3,
    "lerp": _T3,  # self + w*(end - self): 3*numel [own]
    "lerp_": _T3,
    **dict.fromkeys(_ACT_BACKWARD_OPS, _BWD),
    "native_dropout": _dropout(native=True),  # PyProf 5*numel (reference §3.3)
    "dropout": _dropout(native=False),
    # --- reductions: reference §3.4 (PyProf reduction.py)
    "sum": _reduction(1),
    "nansum": _reduction(1),
    "mean": _reduction(1, plus_out=True, text="numel + numel(out)"),
    "prod": _reduction(1),
    "amax": _reduction(1),
    "amin": _reduction(1),
    "argmax": _arg_reduction,
    "argmin": _arg_reduction,
    "all": _bool_reduction,
    "any": _bool_reduction,
    "linalg_vector_norm": _vector_norm,  # L2: 2*numel + 1 (PyProf)
    "norm": _norm,
    # --- softmax: reference §3.4 middle estimate 5*numel; backward 4*numel [own]
    "softmax": _softmax(half_to_float=False),
    "_safe_softmax": _softmax(half_to_float=False),
    "log_softmax": _softmax(half_to_float=False),
    "_softmax": _softmax(half_to_float=True),
    "_log_softmax": _softmax(half_to_float=True),
    "_softmax_backward_data": _softmax_backward,
    "_log_softmax_backward_data": _softmax_backward,
    # --- norms: reference §3.4 (DeepSpeed LN/GN/BN estimates; RMSNorm 4*numel [own])
    "layer_norm": _layer_norm(rms=False),
    "native_layer_norm": _layer_norm(rms=False),
    "native_layer_norm_backward": _layer_norm_backward(rms=False),
    "rms_norm": _layer_norm(rms=True),
    "_fused_rms_norm": _layer_norm(rms=True),
    "_fused_rms_norm_backward": _layer_norm_backward(rms=True),
    "group_norm": _group_norm(native=False),
    "native_group_norm": _group_norm(native=True),
    "native_group_norm_backward": _group_norm_backward,
    "batch_norm": _batch_norm(_BatchNormSpec(training=5)),
    "_batch_norm_impl_index": _batch_norm(_BatchNormSpec(training=5)),
    "native_batch_norm": _batch_norm(_BatchNormSpec(training=5)),
    "cudnn_batch_norm": _batch_norm(_BatchNormSpec(training=5)),
    "miopen_batch_norm": _batch_norm(_BatchNormSpec(training=5)),
    "_native_batch_norm_legit": _native_batch_norm_legit,
    "_native_batch_norm_legit_no_training": _batch_norm(_BatchNormSpec(training=False)),
    "_batch_norm_with_update": _batch_norm(_BatchNormSpec(training=True)),
    "_batch_norm_no_update": _batch_norm(_BatchNormSpec(training=False)),
    "native_batch_norm_backward": _batch_norm_backward(_BatchNormBwdSpec(1, 0, 2, mask=9)),
    "batch_norm_backward": _batch_norm_backward(_BatchNormBwdSpec(1, 0, 2, mask=9)),
    "cudnn_batch_norm_backward": _batch_norm_backward(_BatchNormBwdSpec(0, 1, 2, mask=None)),
    "miopen_batch_norm_backward": _batch_norm_backward(_BatchNormBwdSpec(0, 1, 2, mask=None)),
    # --- embedding: reference §3.5 (PyProf embedding.py)
    "embedding": _embedding,
    "index_select": _index_select,
    "embedding_dense_backward": _embedding_dense_backward,
    "_embedding_bag": _embedding_bag,
    "embedding_bag": _embedding_bag,
    # --- optimizers: reference §3.7
    "_fused_adam_": _fused_adam(decoupled=False),
    "_fused_adamw_": _fused_adam(decoupled=True),
    "_fused_sgd_": _fused_sgd,
    **dict.fromkeys(_FOREACH_1_OPS, _foreach(1)),
    **dict.fromkeys(_FOREACH_3_OPS, _foreach(3)),
    "_foreach_norm": _foreach(2, per_tensor=1),  # L2 per tensor: 2*n + 1
    "_foreach_zero_": _foreach(0),
    "_foreach_copy_": _foreach(0),
    # --- copies and fills: reference §3.3 Copy (PyProf)
    "copy_": _copy_,
    "_to_copy": _to_copy,
    "clone": _clone,
    "fill_": _fill,
    "zero_": _fill,
}


# --------------------------------------------------------------------------- public API


def op_cost(name: str, input_shapes: Any, dtypes: Any, concrete_inputs: Any = None) -> OpCost:
    """The cost of one op. ``name``: ``aten::mm`` or ``mm``; the rest as Kineto JSON text (or
    already parsed lists). No formula for the op: all None; an unusable record: NA figures
    with the reason in ``formula`` (and the op's family)."""
    key = name[6:] if name.startswith("aten::") else name
    fn = FORMULAS.get(key)
    if fn is None:
        return _NO_COST
    try:
        shapes, types = _load(input_shapes), _load(dtypes)
        concrete = _load(concrete_inputs)
    except (TypeError, ValueError):
        return _unknown(_family_of(key), "input shapes/dtypes are not valid JSON")
    if not isinstance(shapes, list) or not isinstance(types, list):
        return _unknown(_family_of(key), "input shapes/dtypes not recorded")
    args = _Args(shapes, types, concrete if isinstance(concrete, list) else None)
    try:
        return fn(args)
    except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, OverflowError) as e:
        return _unknown(_family_of(key), f"unexpected record ({type(e).__name__})")


_FAMILY_CACHE: dict[str, str] = {}


def _family_of(key: str) -> str:
    """An op's family, from its formula run on an empty record (cached)."""
    if key not in _FAMILY_CACHE:
        try:
            _FAMILY_CACHE[key] = FORMULAS[key](_Args([], [], None)).family or ""
        except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError):
            _FAMILY_CACHE[key] = ""
    return _FAMILY_CACHE[key]


def _load(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):
        return json.loads(v) if v else None
    return v


def _op_keys(ops: pd.DataFrame) -> pd.Series:
    """Registry key per row: the name without ``aten::``; other namespaces get None."""
    if "name" in ops.columns:
        src = ops["name"]
    elif "op_type" in ops.columns:
        src = ops["op_type"]
    else:
        raise KeyError("op_flops needs a 'name' or 'op_type' column")
    codes, uniques = pd.factorize(src.astype(object), use_na_sentinel=True)
    keys = []
    for u in uniques:
        k = u[6:] if isinstance(u, str) and u.startswith("aten::") else u
        keys.append(k if isinstance(k, str) and "::" not in k and k in FORMULAS else None)
    arr = np.array(keys + [None], dtype=object)
    return pd.Series(arr[codes], index=ops.index, dtype=object)


def _group_codes(cols: Sequence[pd.Series]) -> np.ndarray:
    """One int code per distinct row of ``cols`` (in order of first appearance)."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    for col in cols:
        c, u = pd.factorize(col.astype(object), use_na_sentinel=False)
        code, _ = pd.factorize(code * (len(u) + 1) + c.astype(np.int64))
    return code.astype(np.int64)


def op_flops(ops: pd.DataFrame) -> pd.DataFrame:
    """FLOPs, bytes, compute dtype and formula per op row (vectorised over unique records).

    ``ops`` needs ``name`` (or ``op_type``) and ``input_shapes``; ``dtypes`` and
    ``concrete_inputs`` are used when present (JSON text as in ``Trace.ranges``). Returns, aligned
    with ``ops.index``: ``flops`` (Float64, NA = unknown), ``bytes`` (Int64, NA = unknown),
    ``compute_dtype`` (fp32/fp16/bf16/fp8/int8/fp64/... or None), ``flop_formula`` (text; the
    reason when unknown; None for ops with no formula) and ``family`` (gemm, conv, attention,
    elementwise, reduction, softmax, norm, embedding, optimizer, copy or None).

    Counts are per op instance, not yet de-duplicated over the op tree: apply
    :func:`count_once` before summing (see :data:`LEAF_POLICY`).
    """
    n = len(ops)
    keys = _op_keys(ops)
    empty = pd.Series([None] * n, index=ops.index, dtype=object)
    shapes = ops["input_shapes"] if "input_shapes" in ops.columns else empty
    dtypes = ops["dtypes"] if "dtypes" in ops.columns else empty
    concrete = ops["concrete_inputs"] if "concrete_inputs" in ops.columns else empty

    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    cdt = np.full(n, None, dtype=object)
    formula = np.full(n, None, dtype=object)
    family = np.full(n, None, dtype=object)

    rows = np.flatnonzero(keys.notna().to_numpy())
    if len(rows):
        sub = [keys.iloc[rows], shapes.iloc[rows], dtypes.iloc[rows], concrete.iloc[rows]]
        codes = _group_codes(sub)
        _, first = unique_first(codes)
        g = len(first)
        u_fl = np.full(g, np.nan)
        u_by = np.full(g, np.nan)
        u_cd = np.full(g, None, dtype=object)
        u_fo = np.full(g, None, dtype=object)
        u_fa = np.full(g, None, dtype=object)
        k_arr, s_arr, d_arr, c_arr = (s.to_numpy(dtype=object) for s in sub)
        for j, r in enumerate(first):  # one Python call per unique record, never per event
            c = op_cost(k_arr[r], s_arr[r], d_arr[r], c_arr[r])
            u_fl[j] = np.nan if c.flops is None else c.flops
            u_by[j] = np.nan if c.bytes is None else c.bytes
            u_cd[j], u_fo[j], u_fa[j] = c.compute_dtype, c.formula, c.family or None
        flops[rows] = u_fl[codes]
        nbytes[rows] = u_by[codes]
        cdt[rows], formula[rows], family[rows] = u_cd[codes], u_fo[codes], u_fa[codes]

    by = cast(Any, pd.array(nbytes, dtype="Float64")).round().astype("Int64")
    return pd.DataFrame(
        {
            "flops": pd.array(flops, dtype="Float64"),
            "bytes": by,
            "compute_dtype": cdt,
            "flop_formula": formula,
            "family": family,
        },
        index=ops.index,
        copy=False,
    )


def count_once(
    flops: pd.Series,
    parent_id: pd.Series,
    range_id: pd.Series,
    family: pd.Series | None = None,
) -> pd.Series:
    """Apply :data:`LEAF_POLICY`: 0 for every range that has a descendant with known, positive
    figures (with ``family``: of a family that covers it), else the range's own figure.

    ``flops`` (or bytes), ``parent_id``, ``range_id`` and ``family`` are aligned Series (e.g. from
    ``Trace.ranges`` and :func:`op_flops`); ``parent_id`` of a root is any id not in
    ``range_id`` (the model uses -1). Vectorised per depth level; returns ``flops``' dtype.
    """
    values = pd.Series(flops)
    n = len(values)
    if n == 0:
        return values.copy()
    ids = pd.Index(np.asarray(range_id))
    parent = ids.get_indexer(np.asarray(parent_id))  # position of the parent, -1 for roots
    positive = (values.fillna(0) > 0).to_numpy(dtype=bool)
    fam = pd.Series(family) if family is not None else pd.Series([None] * n, dtype=object)
    contraction = np.asarray(fam.isin(CONTRACTION_FAMILIES), dtype=bool)
    copy_like = np.asarray(fam.isna() | (fam == COPY), dtype=bool)
    # depth by pointer jumping over parents: one vectorised step per tree level
    depth = np.zeros(n, dtype=np.int64)
    cur = parent.copy()
    for _ in range(n):  # at most n levels; a cycle (never in a Trace) stops here
        live = cur >= 0
        if not live.any():
            break
        depth[live] += 1
        cur[live] = parent[cur[live]]
    below_any = np.zeros(n, dtype=bool)  # some descendant has positive figures
    below_real = np.zeros(n, dtype=bool)  # ... and is not a copy/fill
    below_con = np.zeros(n, dtype=bool)  # ... and is a contraction
    for level in range(int(depth.max()), 0, -1):
        idx = np.flatnonzero(depth == level)
        par, pos = parent[idx], positive[idx]
        below_any[par[pos | below_any[idx]]] = True
        below_real[par[(pos & ~copy_like[idx]) | below_real[idx]]] = True
        below_con[par[(pos & contraction[idx]) | below_con[idx]]] = True
    if family is None:
        covered = below_any
    else:
        covered = np.where(contraction, below_con, np.where(copy_like, below_any, below_real))
    out = values.copy()
    out[covered] = 0
    return out
