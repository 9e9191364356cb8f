"""Convolutions: reference §3.2. Forward 2*N*C_out*prod(D_out)*(C_in/g)*prod(k) =
2*N*prod(D_out)*numel(W) (W = [C_out, C_in/g, k...]); transposed 2*N*prod(D_in)*numel(W)
(W = [C_in, C_out/g, k...]: flop_counter and DeepSpeed use the input spatial size);
dgrad = wgrad = the forward count. Sources: flop_counter conv_flop_count, PyProf, DeepSpeed.

Bytes: input + weight + bias + output (PyProf ``conv_bytes_flops``); backward ``dY`` +
(``W`` read, ``dX`` written when ``output_mask[0]``) + (``X`` read, ``dW`` written when
``output_mask[1]``) + ``db`` when ``output_mask[2]``.

The many aten convolution ops differ only in where their arguments sit: one
:class:`ConvSpec` (:class:`ConvBwdSpec`) per layout, one formula per spec.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perfguard.analysis.flops.core import (
    CONV,
    Args,
    Formula,
    OpCost,
    aten,
    dtype_of,
    formula,
    sum_or_none,
    unknown,
)


@dataclass(frozen=True)
class ConvSpec:
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


def _arg_ints(a: Args, idx: int | None, n: int, default: int) -> list[int] | None:
    return [default] * n if idx is None else a.ints(idx, n)


def _conv_forward(spec: ConvSpec) -> Formula:
    def cost(a: Args) -> OpCost:
        X, W = a.shape(spec.x), a.shape(spec.w)
        cd = dtype_of(a, spec.x, spec.w)
        if X is None or W is None or len(W) < 3:
            return unknown(CONV, "convolution input/weight shapes not recorded", cd)
        nsp = len(W) - 2
        if len(X) == nsp + 2:
            n, din = X[0], X[2:]
        elif len(X) == nsp + 1:  # unbatched input
            n, din = 1, X[1:]
        else:
            return unknown(CONV, "convolution input rank does not match the weight", cd)
        tr = spec.transposed if isinstance(spec.transposed, bool) else a.flag(spec.transposed)
        if tr is None:
            return unknown(CONV, "'transposed' not recorded", cd)
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
                return unknown(CONV, "stride/padding/dilation not recorded", cd)
            flops = 2.0 * n * math.prod(dout) * math.prod(W)
            text = "2*N*C_out*prod(D_out)*(C_in/g)*prod(k)"
            cout = W[0]
        es = a.esize(spec.x)
        out = n * cout * math.prod(dout) * es if dout is not None and cout and es else None
        reads = [a.nbytes(spec.x), a.nbytes(spec.w), a.opt_bytes(spec.bias)]
        by = sum_or_none(*reads, *(a.opt_bytes(i) for i in spec.extra), out)
        return OpCost(flops, by, cd, text, CONV)

    return cost


@dataclass(frozen=True)
class ConvBwdSpec:
    grad_out: int
    x: int
    w: int
    transposed: int | bool
    mask: int
    mask_len: int = 3


def _conv_backward(spec: ConvBwdSpec) -> Formula:
    """dgrad (output_mask[0]) and wgrad (output_mask[1]) each = the forward count; the bias
    gradient (mask[2]) is a reduction (on CUDA a separate aten::sum child) and is not counted."""

    def cost(a: Args) -> OpCost:
        G, X, W = a.shape(spec.grad_out), a.shape(spec.x), a.shape(spec.w)
        cd = dtype_of(a, spec.x, spec.w)
        if G is None or X is None or W is None or len(W) < 3 or len(G) != len(W):
            return unknown(CONV, "convolution_backward shapes not recorded", cd)
        tr = spec.transposed if isinstance(spec.transposed, bool) else a.flag(spec.transposed)
        mask = a.value(spec.mask)
        if tr is None:
            return unknown(CONV, "'transposed' not recorded", cd)
        if not (isinstance(mask, list) and len(mask) == spec.mask_len):
            return unknown(CONV, "output_mask not recorded", cd)
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
        return OpCost(flops, sum_or_none(*parts), cd, text, CONV)

    return cost


@formula("aten::cudnn_convolution_backward_input")  # torch <= 1.10
def _cudnn_conv_backward_input(a: Args) -> OpCost:
    """Legacy cudnn_convolution_backward_input(self_size, grad_output, weight, ...): dgrad."""
    G, W = a.shape(1), a.shape(2)
    cd = dtype_of(a, 1, 2)
    if G is None or W is None or len(W) < 3 or len(G) != len(W):
        return unknown(CONV, "grad_output/weight shapes not recorded", cd)
    flops = 2.0 * G[0] * math.prod(G[2:]) * math.prod(W)
    size = a.value(0)
    es = a.esize(1)
    dx = math.prod(size) * es if isinstance(size, list) and es else None
    return OpCost(flops, sum_or_none(a.nbytes(1), a.nbytes(2), dx), cd, "dgrad = forward", CONV)


@formula("aten::cudnn_convolution_backward_weight")  # torch <= 1.10
def _cudnn_conv_backward_weight(a: Args) -> OpCost:
    """Legacy cudnn_convolution_backward_weight(weight_size, grad_output, self, ...): wgrad;
    needs ``weight_size`` (not recorded by legacy Kineto)."""
    G, X = a.shape(1), a.shape(2)
    cd = dtype_of(a, 1, 2)
    size = a.value(0)
    if G is None or X is None or not isinstance(size, list) or len(size) != len(G):
        return unknown(CONV, "weight_size not recorded", cd)
    flops = 2.0 * G[0] * math.prod(G[2:]) * math.prod(size)
    es = a.esize(1)
    dw = math.prod(size) * es if es else None
    return OpCost(flops, sum_or_none(a.nbytes(1), a.nbytes(2), dw), cd, "wgrad = forward", CONV)


# --------------------------------------------------------------------------- the ops
# forward: flop_counter conv_flop_count, PyProf, DeepSpeed

_CONVOLUTION = ConvSpec(stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8)
_CONV_ND = ConvSpec(stride=3, padding=4, dilation=5, groups=6)
_CONV_T_ND = ConvSpec(stride=3, padding=4, output_padding=5, groups=6, dilation=7, transposed=True)
_SLOW_CONV = ConvSpec(bias=3, stride=4, padding=5)
_SLOW_CONV_DIL = ConvSpec(bias=3, stride=4, padding=5, dilation=6)
_SLOW_CONV_T = ConvSpec(bias=3, stride=4, padding=5, output_padding=6, dilation=7, transposed=True)
_BACKEND_CONV = ConvSpec(padding=3, stride=4, dilation=5, groups=6)  # mkldnn / miopen

# _convolution_mode: padding='same'/'valid' (a string: not recorded)
formula(*aten("conv1d conv2d conv3d _convolution_mode cudnn_convolution_relu"))(
    _conv_forward(_CONV_ND)
)
formula(*aten("convolution _convolution convolution_overrideable"))(_conv_forward(_CONVOLUTION))
formula(*aten("conv_transpose1d conv_transpose2d conv_transpose3d"))(_conv_forward(_CONV_T_ND))
formula("aten::cudnn_convolution")(
    _conv_forward(ConvSpec(bias=None, padding=2, stride=3, dilation=4, groups=5))
)
formula("aten::cudnn_convolution_transpose")(
    _conv_forward(
        ConvSpec(
            bias=None, padding=2, output_padding=3, stride=4, dilation=5, groups=6, transposed=True
        )
    )
)
formula("aten::cudnn_convolution_add_relu")(
    _conv_forward(ConvSpec(bias=4, stride=5, padding=6, dilation=7, groups=8, extra=(2,)))
)
formula(*aten("mkldnn_convolution miopen_convolution"))(_conv_forward(_BACKEND_CONV))
formula("aten::_nnpack_spatial_convolution")(_conv_forward(ConvSpec(padding=3, stride=4)))
formula(*aten("_slow_conv2d_forward thnn_conv2d slow_conv3d slow_conv3d_forward"))(
    _conv_forward(_SLOW_CONV)
)
formula(*aten("slow_conv_dilated2d slow_conv_dilated3d"))(_conv_forward(_SLOW_CONV_DIL))
formula(*aten("slow_conv_transpose2d slow_conv_transpose3d"))(_conv_forward(_SLOW_CONV_T))

# backward: dgrad = wgrad = forward, per output_mask
formula("aten::convolution_backward")(_conv_backward(ConvBwdSpec(0, 1, 2, transposed=7, mask=10)))
formula("aten::convolution_backward_overrideable")(
    _conv_backward(ConvBwdSpec(0, 1, 2, transposed=6, mask=9))
)
formula("aten::cudnn_convolution_backward")(  # torch <= 1.10
    _conv_backward(ConvBwdSpec(1, 0, 2, transposed=False, mask=10, mask_len=2))
)
formula("aten::cudnn_convolution_transpose_backward")(  # torch <= 1.10
    _conv_backward(ConvBwdSpec(1, 0, 2, transposed=True, mask=11, mask_len=2))
)
