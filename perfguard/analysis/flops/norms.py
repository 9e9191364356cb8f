"""Norms: reference §3.4. LayerNorm / GroupNorm / InstanceNorm 5*numel with affine, 4*numel
without (DeepSpeed); BatchNorm training 5/4*numel, eval 2/1*numel (DeepSpeed); RMSNorm ~4*numel
[own]. Backward [own]: 2x the forward (training) estimate; the reference gives no backward
figure.

Bytes: input + parameters + output + saved statistics (``rows * 4 B`` each for mean and rstd;
batch norm training also rewrites the running statistics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfguard.analysis.flops.core import (
    NORM,
    STAT_BYTES,
    Args,
    Formula,
    OpCost,
    Shape,
    aten,
    formula,
    one_input,
    sum_or_none,
    unknown,
)


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

    @one_input(0, NORM)
    def cost(a: Args, X: Shape, cd: str | None) -> OpCost:
        n = math.prod(X)
        affine = a.is_tensor(2)
        per = 4 if rms else (5 if affine else 4)
        rows = _rows(n, a.value(1), a.shape(2))
        stats = None if rows is None else rows * STAT_BYTES * (1 if rms else 2)
        bias = 0 if rms else a.opt_bytes(3)
        x_bytes = a.nbytes(0)
        by = sum_or_none(2 * x_bytes if x_bytes is not None else None, a.opt_bytes(2), bias, stats)
        text = f"{per}*numel" + ("" if rms else (" (affine)" if affine else " (no affine)"))
        return OpCost(float(per * n), by, cd, text, NORM)

    return cost


def _mask3(a: Args, i: int, length: int = 3) -> list[bool] | None:
    v = a.value(i)
    if isinstance(v, list) and len(v) == length and all(isinstance(x, bool) for x in v):
        return v + [False] * (3 - length)
    return None


def _layer_norm_backward(rms: bool) -> Formula:
    """native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
    output_mask); _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight,
    output_mask[2])."""

    @one_input(1, NORM)
    def cost(a: Args, X: Shape, cd: str | None) -> OpCost:
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
            by = sum_or_none(*reads, *writes)
        return OpCost(float(per * n), by, cd, f"{per}*numel (2x forward)", NORM)

    return cost


@dataclass(frozen=True)
class _BatchNormSpec:
    training: int | bool  # index of `training`, or a constant
    running: bool = True  # running_mean/var at 3, 4


def _batch_norm(spec: _BatchNormSpec) -> Formula:
    """(input, weight, bias, running_mean, running_var, training, ...)"""

    @one_input(0, NORM, rank=2)
    def cost(a: Args, X: Shape, cd: str | None) -> OpCost:
        training = spec.training if isinstance(spec.training, bool) else a.flag(spec.training)
        if training is None:
            return unknown(NORM, "'training' not recorded", cd)
        n, c = math.prod(X), X[1]
        affine = a.is_tensor(1)
        per = (5 if affine else 4) if training else (2 if affine else 1)
        running = (a.opt_bytes(3) + a.opt_bytes(4)) if spec.running else 0
        extra = (2 * c * STAT_BYTES + running) if training else 0  # saved stats + running update
        x = a.nbytes(0)
        by = sum_or_none(
            2 * x if x is not None else None, a.opt_bytes(1), a.opt_bytes(2), running, extra
        )
        mode = "training" if training else "eval"
        return OpCost(float(per * n), by, cd, f"{per}*numel ({mode})", NORM)

    return cost


@formula("aten::_native_batch_norm_legit")
def _native_batch_norm_legit(a: Args) -> OpCost:
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
    @one_input(spec.x, NORM, rank=2)
    def cost(a: Args, X: Shape, cd: str | None) -> OpCost:
        n = math.prod(X)
        affine = a.is_tensor(spec.w)
        per = 2 * (5 if affine else 4)
        mask = [True, True, True] if spec.mask is None else _mask3(a, spec.mask)
        if mask is None:
            return OpCost(float(per * n), None, cd, f"{per}*numel (2x training forward)", NORM)
        reads = [a.nbytes(i) for i in range(a.n) if a.is_tensor(i)]
        c_bytes = X[1] * (a.esize(spec.w) or a.esize(spec.x) or 0) if affine else 0
        writes = [a.nbytes(spec.x) if mask[0] else 0, c_bytes * mask[1], c_bytes * mask[2]]
        by = sum_or_none(*reads, *writes)
        return OpCost(float(per * n), by, cd, f"{per}*numel (2x training forward)", NORM)

    return cost


def _group_norm(native: bool) -> Formula:
    """group_norm(input, num_groups, weight, bias, eps, cudnn_enabled) /
    native_group_norm(input, weight, bias, N, C, HxW, group, eps)."""

    @one_input(0, NORM)
    def cost(a: Args, X: Shape, cd: str | None) -> OpCost:
        n = math.prod(X)
        w, b = (1, 2) if native else (2, 3)
        affine = a.is_tensor(w)
        per = 5 if affine else 4
        g = a.number(6 if native else 1)
        stats = 2 * X[0] * int(g) * STAT_BYTES if g is not None and X else None
        x = a.nbytes(0)
        by = sum_or_none(2 * x if x is not None else None, a.opt_bytes(w), a.opt_bytes(b), stats)
        return OpCost(float(per * n), by, cd, f"{per}*numel", NORM)

    return cost


@formula("aten::native_group_norm_backward")
@one_input(1, NORM, rank=2)
def _group_norm_backward(a: Args, X: Shape, cd: str | None) -> OpCost:
    """native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, mask)."""
    n = math.prod(X)
    affine = a.is_tensor(4)
    per = 2 * (5 if affine else 4)
    mask = _mask3(a, 9)
    by = None
    if mask is not None:
        reads = [a.nbytes(i) for i in range(a.n) if a.is_tensor(i)]
        c_bytes = X[1] * (a.esize(4) or 0) if affine else 0
        by = sum_or_none(
            *reads, a.nbytes(1) if mask[0] else 0, c_bytes * mask[1], c_bytes * mask[2]
        )
    return OpCost(float(per * n), by, cd, f"{per}*numel (2x forward)", NORM)


# --------------------------------------------------------------------------- the ops

formula(*aten("layer_norm native_layer_norm"))(_layer_norm(rms=False))
formula("aten::native_layer_norm_backward")(_layer_norm_backward(rms=False))
formula(*aten("rms_norm _fused_rms_norm"))(_layer_norm(rms=True))
formula("aten::_fused_rms_norm_backward")(_layer_norm_backward(rms=True))
formula("aten::group_norm")(_group_norm(native=False))
formula("aten::native_group_norm")(_group_norm(native=True))
formula(
    *aten("batch_norm _batch_norm_impl_index native_batch_norm cudnn_batch_norm miopen_batch_norm")
)(_batch_norm(_BatchNormSpec(training=5)))
formula(*aten("_native_batch_norm_legit_no_training _batch_norm_no_update"))(
    _batch_norm(_BatchNormSpec(training=False))
)
formula("aten::_batch_norm_with_update")(_batch_norm(_BatchNormSpec(training=True)))
formula(*aten("native_batch_norm_backward batch_norm_backward"))(
    _batch_norm_backward(_BatchNormBwdSpec(1, 0, 2, mask=9))
)
formula(*aten("cudnn_batch_norm_backward miopen_batch_norm_backward"))(
    _batch_norm_backward(_BatchNormBwdSpec(0, 1, 2, mask=None))
)
