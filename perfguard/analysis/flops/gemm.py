"""GEMM family: reference §3.1. ``mm`` = 2*M*N*K (flop_counter, Kineto util.cpp, PyProf,
DeepSpeed); bias, alpha and beta are not counted; bytes = A + B + C (+ the added operand when
``beta != 0``).

Every formula but einsum's has one preamble, :func:`_gemm`, as its decorator: the two
operands' shapes and compute dtype read as ``(B, M, K, N)`` by the op's layout rule, or NA
saying which layout was expected; the formula only says what it reads and writes, and
:meth:`_Gemm.cost` counts ``2*B*M*N*K``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from perfguard.analysis.flops.core import (
    GEMM,
    Args,
    Formula,
    OpCost,
    Shape,
    aten,
    broadcast,
    dtype_of,
    formula,
    sum_or_none,
    unknown,
)
from perfguard.analysis.flops.dtypes import ELEMENT_SIZE

Dims = tuple[int, int, int, int]  # (B, M, K, N)


@dataclass(frozen=True)
class _Gemm:
    """One GEMM read from its operands (at ``first``, ``first + 1``): ``B`` products of
    ``[M,K] x [K,N]``, and the operands' compute dtype."""

    b: int
    m: int
    k: int
    n: int
    cd: str | None
    first: int

    def out_bytes(
        self, a: Args, operand: int, out_dtype: int | None = None, elems: int | None = None
    ) -> int | None:
        """The output (``B*M*N`` elements unless ``elems``) in the ``ScalarType`` argument
        ``out_dtype``, else in ``operand``'s type."""
        name = a.scalar_type(out_dtype) or a.dtype(operand)
        es = ELEMENT_SIZE.get(name or "")
        numel = self.b * self.m * self.n if elems is None else elems
        return numel * es if es is not None else None

    def cost(self, text: str, *parts: int | None) -> OpCost:
        """``2*B*M*N*K`` FLOPs; bytes the sum of ``parts`` (NA if one is)."""
        flops = 2.0 * self.b * self.m * self.n * self.k
        return OpCost(flops, sum_or_none(*parts), self.cd, text, GEMM)

    @property
    def mnk(self) -> str:
        return f"M={self.m} N={self.n} K={self.k}"


Rule = Callable[[Shape, Shape], Dims | None]


def _gemm(
    first: int | Callable[[Args], int], rule: Rule, why: str
) -> Callable[[Callable[[Args, _Gemm], OpCost]], Formula]:
    """The GEMM preamble, once for every formula: the operands at ``first`` and ``first + 1``
    read by their layout ``rule`` as a :class:`_Gemm`, handed to the formula, or the op's NA
    cost saying ``why`` when they are not recorded in that layout."""

    def wrap(fn: Callable[[Args, _Gemm], OpCost]) -> Formula:
        def cost(a: Args) -> OpCost:
            at = first(a) if callable(first) else first
            x, y = a.shape(at), a.shape(at + 1)
            cd = dtype_of(a, at, at + 1)
            dims = rule(x, y) if x is not None and y is not None else None
            return unknown(GEMM, why, cd) if dims is None else fn(a, _Gemm(*dims, cd, at))

        return cost

    return wrap


def _mk_kn(x: Shape, y: Shape) -> Dims | None:
    ok = len(x) == 2 and len(y) == 2 and x[1] == y[0]
    return (1, x[0], x[1], y[1]) if ok else None


def _bmk_bkn(x: Shape, y: Shape) -> Dims | None:
    ok = len(x) == 3 and len(y) == 3 and x[0] == y[0] and x[2] == y[1]
    return (x[0], x[1], x[2], y[2]) if ok else None


def _broadcast_batch(x: Shape, y: Shape) -> Dims | None:
    """torch.matmul: a 1-D operand becomes a matrix, then the batch dims broadcast."""
    if not x or not y:
        return None
    a2 = (1, x[0]) if len(x) == 1 else x
    b2 = (y[0], 1) if len(y) == 1 else y
    if a2[-1] != b2[-2]:
        return None
    batch = broadcast([a2[:-2], b2[:-2]])
    return None if batch is None else (math.prod(batch), a2[-2], a2[-1], b2[-1])


def _input_weight(x: Shape, w: Shape) -> Dims | None:
    """linear: ``x[..., K]`` rows times ``weight[N, K]`` (or ``[K]``)."""
    if not x or len(w) not in (1, 2) or x[-1] != w[-1]:
        return None
    return (1, math.prod(x[:-1]), x[-1], w[0] if len(w) == 2 else 1)


def _mk_k(x: Shape, v: Shape) -> Dims | None:
    ok = len(x) == 2 and len(v) == 1 and x[1] == v[0]
    return (1, x[0], x[1], 1) if ok else None


def _k_k(x: Shape, y: Shape) -> Dims | None:
    return (1, 1, x[0], 1) if len(x) == 1 and x == y else None


_MK_KN = "operands not recorded as [M,K]x[K,N]"
_BMK_BKN = "operands not recorded as [B,M,K]x[B,K,N]"


def _beta_is_zero(a: Args, i: int) -> bool:
    return a.number(i) == 0.0


def _out_dtype_arg(a: Args, i: int) -> int | None:
    """``mm.dtype(self, mat2, out_dtype)``: a non-tensor at ``i`` is the output dtype."""
    return i if a.n > i and not a.is_tensor(i) else None


@formula("aten::mm")
@_gemm(0, _mk_kn, f"mm {_MK_KN}")
def _mm(a: Args, g: _Gemm) -> OpCost:
    out = g.out_bytes(a, 0, _out_dtype_arg(a, 2))
    return g.cost(f"2*M*N*K ({g.mnk})", a.nbytes(0), a.nbytes(1), out)


@formula(*aten("addmm addmm_ _addmm_activation"))  # _addmm_activation: cuBLASLt epilogue
@_gemm(1, _mk_kn, f"addmm {_MK_KN}")
def _addmm(a: Args, g: _Gemm) -> OpCost:
    """addmm / addmm_ / _addmm_activation(self, mat1, mat2, beta, alpha)."""
    # addmm.dtype(self, mat1, mat2, out_dtype, beta, alpha) has 6 args and no out tensor
    has_out_dtype = a.n >= 6 and not a.is_tensor(5) and a.dtype(3) == "Scalar"
    bias = 0 if _beta_is_zero(a, 4 if has_out_dtype else 3) else a.nbytes(0)
    out = g.out_bytes(a, 1, 3 if has_out_dtype else None)
    return g.cost(f"2*M*N*K ({g.mnk}; bias not counted)", bias, a.nbytes(1), a.nbytes(2), out)


def _batched_text(g: _Gemm) -> str:
    return f"2*B*M*N*K (B={g.b} {g.mnk})"


@formula("aten::bmm")
@_gemm(0, _bmk_bkn, f"bmm {_BMK_BKN}")
def _bmm(a: Args, g: _Gemm) -> OpCost:
    out = g.out_bytes(a, 0, _out_dtype_arg(a, 2))
    return g.cost(_batched_text(g), a.nbytes(0), a.nbytes(1), out)


def _bias_batched(op: str, summed: bool) -> Formula:
    """baddbmm / addbmm(self, batch1, batch2, beta, alpha); ``summed``: addbmm adds the batch
    into one ``[M, N]`` output."""

    @_gemm(1, _bmk_bkn, f"{op} {_BMK_BKN}")
    def cost(a: Args, g: _Gemm) -> OpCost:
        bias = 0 if _beta_is_zero(a, 3) else a.nbytes(0)
        out = g.out_bytes(a, 1, elems=g.m * g.n if summed else None)
        return g.cost(_batched_text(g), bias, a.nbytes(1), a.nbytes(2), out)

    return cost


formula(*aten("baddbmm baddbmm_"))(_bias_batched("baddbmm", summed=False))
formula(*aten("addbmm addbmm_"))(_bias_batched("addbmm", summed=True))


@formula("aten::matmul")  # broadcast batch dims, then bmm (reference §3.1)
@_gemm(0, _broadcast_batch, "matmul operand shapes not recorded or not broadcastable")
def _matmul(a: Args, g: _Gemm) -> OpCost:
    text = f"2*B*M*N*K, B=broadcast batch (B={g.b} {g.mnk})"
    return g.cost(text, a.nbytes(0), a.nbytes(1), g.out_bytes(a, 0))


@formula("aten::linear")
@_gemm(0, _input_weight, "linear input/weight shapes not recorded")
def _linear(a: Args, g: _Gemm) -> OpCost:
    """linear(input[...,K], weight[N,K], bias): 2*numel(x)*N (DeepSpeed macs = numel(x)*N)."""
    text = f"2*numel(x)*N (N={g.n} K={g.k})"
    return g.cost(text, a.nbytes(0), a.nbytes(1), a.opt_bytes(2), g.out_bytes(a, 0))


def _mv_first(a: Args) -> int:
    """addmv(self[M], mat, vec, beta, alpha) has the added vector first."""
    return 1 if len(a.shape(0) or ()) == 1 else 0


@formula(*aten("mv addmv addmv_"))
@_gemm(_mv_first, _mk_k, "mv operands not recorded as [M,K]x[K]")
def _mv(a: Args, g: _Gemm) -> OpCost:
    """mv(self[M,K], vec[K]) and addmv(self[M], mat, vec, beta, alpha): 2*M*K."""
    off = g.first
    bias = (0 if _beta_is_zero(a, 3) else a.nbytes(0)) if off else 0
    out = g.out_bytes(a, off)
    return g.cost(f"2*M*K (M={g.m} K={g.k})", bias, a.nbytes(off), a.nbytes(off + 1), out)


@formula(*aten("dot vdot"))
@_gemm(0, _k_k, "dot operands not recorded as [K]x[K]")
def _dot(a: Args, g: _Gemm) -> OpCost:
    return g.cost(f"2*K (K={g.k})", a.nbytes(0), a.nbytes(1), a.esize(0))


@formula("aten::_scaled_mm")  # FP8 GEMM (flop_counter _scaled_mm_flop)
@_gemm(0, _mk_kn, f"_scaled_mm {_MK_KN}")
def _scaled_mm(a: Args, g: _Gemm) -> OpCost:
    """_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum):
    2*M*N*K; out dtype = ``out_dtype`` or self's."""
    reads = [a.nbytes(0), a.nbytes(1)] + [a.opt_bytes(i) for i in (2, 3, 4, 5)]
    return g.cost(f"2*M*N*K ({g.mnk})", *reads, g.out_bytes(a, 0, 6))


@formula("aten::_int_mm")  # int8 GEMM, int32 output
@_gemm(0, _mk_kn, f"_int_mm {_MK_KN}")
def _int_mm(a: Args, g: _Gemm) -> OpCost:
    return g.cost(f"2*M*N*K ({g.mnk})", a.nbytes(0), a.nbytes(1), g.m * g.n * 4)


@formula("aten::einsum")
def _einsum(a: Args) -> OpCost:
    """Two-operand einsum from its equation (reference §3.1): with a contracted index
    2*prod(extent of every distinct index), else prod(output extents). Kineto does not record
    the equation string (torch 2.13 writes ''), so this is normally NA; the bmm/mul it
    decomposes into carry the FLOPs."""
    eq = a.value(0)
    shapes = a.tensor_list(1)
    if not isinstance(eq, str) or shapes is None or len(shapes) != 2 or "." in eq:
        return unknown(GEMM, "einsum equation not recorded (or not a two-operand equation)")
    lhs, _, rhs = eq.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != 2 or not all(len(t) == len(s) for t, s in zip(terms, shapes, strict=True)):
        return unknown(GEMM, "einsum equation does not match the operand shapes")
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
