"""Attention: reference §3.6. Forward 2*b*h_q*s_q*s_k*(d_qk + d_v) (flop_counter
sdpa_flop_count), backward 2*b*h_q*s_q*s_k*(3*d_qk + 2*d_v) (sdpa_backward_flop_count);
causal counts half (the FlashAttention benchmark convention; flop_counter does not halve: the
formula text says ``causal x1/2``); GQA: the query heads count.

Bytes (flash / efficient / cuDNN): read Q, K, V (+ mask), write O and the fp32 LSE; backward
reads every recorded tensor (dO, Q, K, V, O, LSE, ...) and writes dQ, dK, dV.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfguard.analysis.flops.core import (
    ATTENTION,
    STAT_BYTES,
    Args,
    Formula,
    OpCost,
    dtype_of,
    formula_per_spec,
    sum_or_none,
    unknown,
)


@dataclass(frozen=True)
class AttnSpec:
    q: int = 0
    k: int = 1
    v: int = 2
    bshd: bool = False  # [b, s, h, d] layout (flash/efficient internals) instead of [b, h, s, d]
    causal: int | None = None  # index of is_causal
    mask_type: int | None = None  # index of custom_mask_type (efficient internals)
    cum_seq: int | None = None  # index of cum_seq_q: a tensor there means packed varlen input
    backward: bool = False
    lse: bool | int = True  # forward writes the LSE (or index of compute_log_sumexp)


def _attention(spec: AttnSpec) -> Formula:
    def cost(a: Args) -> OpCost:
        Q, K, V = a.shape(spec.q), a.shape(spec.k), a.shape(spec.v)
        cd = dtype_of(a, spec.q, spec.k)
        if Q is not None and len(Q) == 3 and spec.cum_seq is not None:
            return unknown(ATTENTION, "packed variable-length attention (offsets not recorded)", cd)
        if Q is None or K is None or V is None or not len(Q) == len(K) == len(V) == 4:
            return unknown(ATTENTION, "query/key/value shapes not recorded as 4-D", cd)
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
            return unknown(ATTENTION, "is_causal not recorded", cd)
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
            writes = [b * hq * sq * dv * es if es else None, b * hq * sq * STAT_BYTES * lse]
        return OpCost(flops, sum_or_none(*tensors, *writes), cd, text, ATTENTION)

    return cost


# --------------------------------------------------------------------------- the ops

formula_per_spec(
    _attention,
    {
        "aten::scaled_dot_product_attention": AttnSpec(causal=5),
        "aten::_scaled_dot_product_attention_math": AttnSpec(causal=5, lse=False),
        "aten::_scaled_dot_product_flash_attention": AttnSpec(causal=4),
        "aten::_scaled_dot_product_flash_attention_for_cpu": AttnSpec(causal=4),
        "aten::_scaled_dot_product_efficient_attention": AttnSpec(causal=6, lse=4),
        "aten::_scaled_dot_product_cudnn_attention": AttnSpec(causal=6, lse=4),
        "aten::_scaled_dot_product_fused_attention_overrideable": AttnSpec(causal=5),
        "aten::_flash_attention_forward": AttnSpec(bshd=True, causal=8, cum_seq=3),
        "aten::_efficient_attention_forward": AttnSpec(bshd=True, mask_type=9, cum_seq=4, lse=10),
        "aten::_scaled_dot_product_flash_attention_backward": AttnSpec(
            1, 2, 3, causal=11, cum_seq=6, backward=True
        ),
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward": AttnSpec(
            1, 2, 3, causal=7, backward=True
        ),
        "aten::_scaled_dot_product_efficient_attention_backward": AttnSpec(
            1, 2, 3, causal=11, backward=True
        ),
        "aten::_scaled_dot_product_cudnn_attention_backward": AttnSpec(
            1, 2, 3, causal=14, cum_seq=9, backward=True
        ),
        "aten::_scaled_dot_product_fused_attention_overrideable_backward": AttnSpec(
            1, 2, 3, causal=13, cum_seq=8, backward=True
        ),
        "aten::_flash_attention_backward": AttnSpec(
            1, 2, 3, bshd=True, causal=11, cum_seq=6, backward=True
        ),
        "aten::_efficient_attention_backward": AttnSpec(
            1, 2, 3, bshd=True, mask_type=14, cum_seq=6, backward=True
        ),
    },
)
