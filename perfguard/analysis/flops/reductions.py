"""Reductions and softmax: reference §3.4. sum numel, mean numel + 1 per output (one
division), L2 norm 2*numel + 1; max/min/amax/amin/prod/argmax/argmin/all/any numel (one op per
input element) [own, as sum]. Bytes: input + output(s) (``max.dim`` also writes int64 indices).

Softmax: estimates disagree (PyProf ~40*numel, DeepSpeed numel); the reference's middle
estimate 5*numel (max, sub, exp, sum, div) is used, as a fused single pass (input + output;
PyProf's 3x/5x multi-pass bytes are the alternative the reference mentions). Backward [own]:
softmax dx = y*(dy - sum(dy*y)) and log_softmax dx = dy - exp(y)*sum(dy): 4*numel each, bytes
``dY + Y + dX``.
"""

from __future__ import annotations

import math
from typing import Any

from perfguard.analysis.flops.core import (
    NOT_RECORDED,
    REDUCTION,
    SOFTMAX,
    Args,
    Formula,
    OpCost,
    Shape,
    aten,
    dtype_of,
    formula,
    input_of,
    one_input,
    sum_or_none,
    unknown,
)
from perfguard.analysis.flops.dtypes import ELEMENT_SIZE
from perfguard.analysis.flops.pointwise import pointwise


def _reduced_numel(shape: tuple[int, ...], dims: Any) -> int | None:
    """Output numel of a reduction over ``dims`` (None or [] = all); keepdim does not change it."""
    if dims is NOT_RECORDED:
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
    a: Args,
    dims: Any,
    keepdim: bool | None,
    out_type: str | None,
    per_element: float,
    plus_out: bool,
    indices: bool,
    text: str,
    out_idx: int | None = None,
) -> OpCost:
    got = input_of(a, 0, REDUCTION)
    if isinstance(got, OpCost):
        return got
    X, cd = got
    n = math.prod(X)
    out_n = _reduced_numel(X, dims)
    if plus_out and out_n is None:
        return unknown(REDUCTION, "reduced dims not recorded", cd)
    flops = per_element * n + (out_n if plus_out and out_n is not None else 0)
    es = ELEMENT_SIZE.get(out_type or a.dtype(0) or "")
    if out_idx is not None and a.is_tensor(out_idx):
        out = a.nbytes(out_idx)
    else:
        out = out_n * es if out_n is not None and es else None
    idx = (out_n * 8 if out_n is not None else None) if indices else 0
    return OpCost(flops, sum_or_none(a.nbytes(0), out, idx), cd, text, REDUCTION)


def _reduction(per_element: float, plus_out: bool = False, text: str = "numel") -> Formula:
    """sum / nansum / mean / prod / amax / amin(self[, dim, keepdim[, dtype]][, out])."""

    def cost(a: Args) -> OpCost:
        if a.n <= 2:  # sum(self, dtype) / prod(self, dtype): full reduction
            return _reduce_cost(
                a, None, False, a.scalar_type(1), per_element, plus_out, False, text
            )
        dtype = a.scalar_type(3) if a.n > 3 and not a.is_tensor(3) else None
        return _reduce_cost(
            a, a.value(1), a.flag(2), dtype, per_element, plus_out, False, text, out_idx=a.n - 1
        )

    return cost


@formula(*aten("argmax argmin"))
def _arg_reduction(a: Args) -> OpCost:
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


@formula(*aten("all any"))
def _bool_reduction(a: Args) -> OpCost:
    """all / any(self[, dim, keepdim])."""
    dims = a.value(1) if a.n > 1 else None
    return _reduce_cost(a, dims, a.flag(2) if a.n > 2 else False, "bool", 1, False, False, "numel")


@formula("aten::linalg_vector_norm")  # L2: 2*numel + 1 (PyProf)
def _vector_norm(a: Args) -> OpCost:
    """linalg_vector_norm(self, ord, dim, keepdim, dtype): L2 = 2*numel + one sqrt per output."""
    ord_ = a.number(1)
    if ord_ != 2.0:
        return unknown(REDUCTION, "only the L2 norm has a formula", dtype_of(a, 0))
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


@formula("aten::norm")
def _norm(a: Args) -> OpCost:
    """norm.Scalar(self, p) / norm.ScalarOpt_dim(self, p, dim, keepdim[, dtype])."""
    if a.number(1) != 2.0:
        return unknown(REDUCTION, "only the L2 norm has a formula", dtype_of(a, 0))
    if a.n <= 2:
        return _reduce_cost(a, None, False, None, 2, True, False, "2*numel + 1")
    return _reduce_cost(a, a.value(2), a.flag(3), None, 2, True, False, "2*numel + numel(out)")


@formula(*aten("max min"))
def _max_min(a: Args) -> OpCost:
    """max / min: binary (other tensor), full reduction (1 arg) or dim reduction + indices."""
    if a.is_tensor(1):
        return pointwise(2, 1)(a)
    if a.n <= 1 or a.dtype(1) is None:
        return _reduce_cost(a, None, False, None, 1, False, False, "numel")
    return _reduce_cost(a, a.value(1), a.flag(2), None, 1, False, True, "numel")


def _softmax(half_to_float: bool) -> Formula:
    @one_input(0, SOFTMAX)
    def cost(a: Args, X: Shape, cd: str | None) -> OpCost:
        n = math.prod(X)
        if half_to_float:  # _softmax(self, dim, half_to_float)
            out_t = "float" if a.flag(2) else a.dtype(0)
        else:  # softmax(self, dim, dtype)
            out_t = a.scalar_type(2) or a.dtype(0)
        es = ELEMENT_SIZE.get(out_t or "")
        by = sum_or_none(a.nbytes(0), n * es if es else None)
        return OpCost(5.0 * n, by, cd, "5*numel (max, sub, exp, sum, div)", SOFTMAX)

    return cost


@formula(*aten("_softmax_backward_data _log_softmax_backward_data"))
def _softmax_backward(a: Args) -> OpCost:
    """_softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim, dtype)."""
    G = a.shape(0)
    cd = dtype_of(a, 1)
    if G is None:
        return unknown(SOFTMAX, "grad_output shape not recorded", cd)
    n = math.prod(G)
    es = ELEMENT_SIZE.get(a.scalar_type(3) or a.dtype(0) or "")
    by = sum_or_none(a.nbytes(0), a.nbytes(1), n * es if es else None)
    return OpCost(4.0 * n, by, cd, "4*numel", SOFTMAX)


# --------------------------------------------------------------------------- the ops

formula(*aten("sum nansum prod amax amin"))(_reduction(1))
formula("aten::mean")(_reduction(1, plus_out=True, text="numel + numel(out)"))
formula(*aten("softmax _safe_softmax log_softmax"))(_softmax(half_to_float=False))
formula(*aten("_softmax _log_softmax"))(_softmax(half_to_float=True))
