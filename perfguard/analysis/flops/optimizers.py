"""Optimizer steps on tensor lists: reference §3.7. Adam ~12-16 FLOPs per element [own]
(m: 3, v: 4, bias correction: 2, sqrt+eps: 2, div: 1, lr*update and subtract: 2 = 14; weight
decay +2); SGD with momentum ~4 [own]. Bytes NA: Kineto records no element type for a
``TensorList`` argument; the FLOPs are still known.
"""

from __future__ import annotations

import math

from perfguard.analysis.flops.core import OPTIMIZER, Args, Formula, OpCost, aten, formula, unknown


def _list_numel(a: Args, i: int) -> int | None:
    shapes = a.tensor_list(i)
    return sum(math.prod(s) for s in shapes) if shapes is not None else None


def _fused_adam(decoupled: bool) -> Formula:
    """_fused_adam(w)_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
    beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)."""

    def cost(a: Args) -> OpCost:
        n = _list_numel(a, 0)
        wd, ams = a.number(9), a.flag(11)
        if n is None or wd is None or ams is None:
            return unknown(OPTIMIZER, "parameter list or weight_decay/amsgrad not recorded")
        per = 14 + (2 if wd != 0 else 0) + (1 if ams else 0)
        kind = "AdamW" if decoupled else "Adam"
        return OpCost(
            float(per * n), None, None, f"{per}*n ({kind}) [own]; bytes: no dtype", OPTIMIZER
        )

    return cost


@formula("aten::_fused_sgd_")
def _fused_sgd(a: Args) -> OpCost:
    """_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, dampening,
    nesterov, ...): 2 (lr*g, subtract) + 2 momentum + 2 weight decay + 2 nesterov [own]."""
    n = _list_numel(a, 0)
    wd, mom, nest = a.number(3), a.number(4), a.flag(7)
    if n is None or wd is None or mom is None or nest is None:
        return unknown(OPTIMIZER, "parameter list or hyper-parameters not recorded")
    per = 2 + (2 if mom != 0 else 0) + (2 if wd != 0 else 0) + (2 if nest else 0)
    return OpCost(float(per * n), None, None, f"{per}*n (SGD) [own]; bytes: no dtype", OPTIMIZER)


def _foreach(per_element: float, per_tensor: float = 0) -> Formula:
    """_foreach_<op>(self: TensorList, ...): per_element FLOPs for every element of ``self``."""

    def cost(a: Args) -> OpCost:
        shapes = a.tensor_list(0)
        if shapes is None:
            return unknown(OPTIMIZER, "tensor list shapes not recorded")
        n = sum(math.prod(s) for s in shapes)
        flops = per_element * n + per_tensor * len(shapes)
        return OpCost(float(flops), None, None, f"{per_element:g}*n; bytes: no dtype", OPTIMIZER)

    return cost


# --------------------------------------------------------------------------- the ops

_FOREACH_1 = """_foreach_add_ _foreach_add _foreach_sub_ _foreach_sub _foreach_mul_
_foreach_mul _foreach_div_ _foreach_div _foreach_sqrt_ _foreach_sqrt _foreach_neg_ _foreach_neg
_foreach_maximum_ _foreach_clamp_min_ _foreach_reciprocal_ _foreach_pow_ _foreach_pow"""
_FOREACH_3 = """_foreach_addcmul_ _foreach_addcmul _foreach_addcdiv_ _foreach_addcdiv
_foreach_lerp_ _foreach_lerp"""

formula("aten::_fused_adam_")(_fused_adam(decoupled=False))
formula("aten::_fused_adamw_")(_fused_adam(decoupled=True))
formula(*aten(_FOREACH_1))(_foreach(1))
formula(*aten(_FOREACH_3))(_foreach(3))
formula("aten::_foreach_norm")(_foreach(2, per_tensor=1))  # L2 per tensor: 2*n + 1
formula(*aten("_foreach_zero_ _foreach_copy_"))(_foreach(0))
