"""Elementwise ops: reference §3.3. Unary FLOPs = numel (PyProf; DeepSpeed relu/gelu/silu/elu;
exp/tanh/... also counted as 1, not PyProf's 20 "estimate"); binary = numel(broadcast output);
addcmul/addcdiv 3*numel (PyProf); dropout 5*numel (PyProf, the RNG).

Bytes: the operands + the output (a comparison writes bool, 1 B); activation backward
(grad_output, saved) therefore costs ``3 * numel * s``.
"""

from __future__ import annotations

import math

from perfguard.analysis.flops.core import (
    ELEMENTWISE,
    Args,
    Formula,
    OpCost,
    Shape,
    aten,
    broadcast,
    formula,
    one_input,
    promote,
    sum_or_none,
    unknown,
)
from perfguard.analysis.flops.dtypes import COMPUTE_DTYPE, ELEMENT_SIZE


def pointwise(operands: int, per_element: float, out: str = "promote") -> Formula:
    """Tensors at positions < ``operands`` are operands; a tensor after them is ``out=``."""

    def cost(a: Args) -> OpCost:
        ops_ = [i for i in range(min(operands, a.n)) if a.is_tensor(i)]
        outs = [i for i in range(operands, a.n) if a.is_tensor(i)]
        if not ops_:
            return unknown(ELEMENTWISE, "operand shapes not recorded")
        shapes = [s for s in (a.shape(i) for i in ops_) if s is not None]  # ops_ are tensors
        names = [a.dtype(i) or "" for i in ops_]
        shape = broadcast(shapes)
        if shape is None:
            return unknown(ELEMENTWISE, "operand shapes do not broadcast")
        n = math.prod(shape)
        res = promote(names, [len(s) for s in shapes])
        cd = COMPUTE_DTYPE.get(res or "")
        if outs:
            out_bytes = a.nbytes(outs[-1])
        else:
            out_name = "bool" if out == "bool" else res
            es = ELEMENT_SIZE.get(out_name or "")
            out_bytes = n * es if es else None
        by = sum_or_none(*(a.nbytes(i) for i in ops_), out_bytes)
        text = f"{per_element:g}*numel" if per_element else "0 (no arithmetic)"
        return OpCost(per_element * n, by, cd, text, ELEMENTWISE)

    return cost


def _dropout(native: bool) -> Formula:
    """native_dropout / dropout(input, p, train): PyProf 5*numel (RNG); eval is a no-op.
    Bytes: input + output (+ the bool mask that native_dropout writes)."""

    @one_input(0, ELEMENTWISE)
    def cost(a: Args, X: Shape, cd: str | None) -> OpCost:
        train = a.flag(2)
        if train is None and not (native and a.value(2) is None):
            return unknown(ELEMENTWISE, "'train' not recorded", cd)
        if train is False:
            return OpCost(0.0, 0, cd, "0 (eval: identity)", ELEMENTWISE)
        n = math.prod(X)
        x = a.nbytes(0) or 0
        return OpCost(5.0 * n, 2 * x + n, cd, "5*numel (PyProf)", ELEMENTWISE)

    return cost


# --------------------------------------------------------------------------- the ops

_UNARY = """relu relu_ silu silu_ sigmoid sigmoid_ tanh tanh_ exp exp_ exp2 expm1 log log_
log1p log2 sqrt sqrt_ rsqrt rsqrt_ neg neg_ abs abs_ reciprocal reciprocal_ sin sin_ cos cos_ erf
erf_ sign floor ceil round trunc hardswish hardswish_ hardsigmoid hardsigmoid_ mish mish_"""
_UNARY_PARAM = """gelu gelu_ leaky_relu leaky_relu_ elu elu_ hardtanh hardtanh_ softplus
threshold threshold_"""  # non-tensor parameters (approximate, alpha, ...)
_BINARY = """add add_ sub sub_ rsub mul mul_ div div_ remainder fmod maximum minimum fmax fmin
pow pow_ atan2 hypot xlogy"""
_ACT_BACKWARD = """threshold_backward gelu_backward silu_backward sigmoid_backward
tanh_backward hardtanh_backward leaky_relu_backward hardswish_backward hardsigmoid_backward
softplus_backward mish_backward native_dropout_backward"""  # (grad_output, saved)

formula(*aten(_UNARY), *aten(_UNARY_PARAM))(pointwise(1, 1))
formula(*aten("clamp_min clamp_min_ clamp_max clamp_max_"))(pointwise(2, 1))
formula(*aten("clamp clamp_"))(pointwise(3, 1))  # clamp.Tensor takes tensor bounds
formula(*aten(_BINARY), *aten(_ACT_BACKWARD))(pointwise(2, 1))  # numel(broadcast output)
formula(*aten("eq ne lt le gt ge logical_and logical_or logical_xor"))(pointwise(2, 1, out="bool"))
formula("aten::logical_not")(pointwise(1, 1, out="bool"))
# addcmul / addcdiv: 3*numel (PyProf); lerp: self + w*(end - self), 3*numel [own]
formula(*aten("addcmul addcmul_ addcdiv addcdiv_ lerp lerp_"))(pointwise(3, 3))
formula("aten::native_dropout")(_dropout(native=True))
formula("aten::dropout")(_dropout(native=False))
