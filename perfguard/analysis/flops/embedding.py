"""Embedding lookups and gathers: reference §3.5. FLOPs 0 (PyProf, DeepSpeed); bytes forward
= index bytes + ``2 * n_idx * D * s_w`` (gather + write, PyProf); dense backward
``index + 3 * n_idx * D * s`` (PyProf) + ``V * D * s`` for the zero-filled weight gradient
[own]; a bag's pooling is one op per gathered element [own].
"""

from __future__ import annotations

import math

from perfguard.analysis.flops.core import (
    EMBEDDING,
    Args,
    OpCost,
    aten,
    dtype_of,
    formula,
    sum_or_none,
    unknown,
)


@formula("aten::embedding")
def _embedding(a: Args) -> OpCost:
    """embedding(weight[V, D], indices, padding_idx, scale_grad_by_freq, sparse)."""
    W, n_idx = a.shape(0), a.numel(1)
    cd = dtype_of(a, 0)
    if W is None or len(W) != 2 or n_idx is None:
        return unknown(EMBEDDING, "weight/indices shapes not recorded", cd)
    es = a.esize(0) or 0
    by = sum_or_none(a.nbytes(1), 2 * n_idx * W[1] * es)
    return OpCost(0.0, by, cd, "0 (gather)", EMBEDDING)


@formula("aten::index_select")
def _index_select(a: Args) -> OpCost:
    """index_select(self, dim, index): gathers numel(index) slices of self along dim."""
    X, n_idx = a.shape(0), a.numel(2)
    cd = dtype_of(a, 0)
    dim = a.number(1)
    if X is None or n_idx is None:
        return unknown(EMBEDDING, "self/index shapes not recorded", cd)
    if dim is None or not X:
        return OpCost(0.0, None, cd, "0 (gather); dim not recorded", EMBEDDING)
    d = int(dim) % len(X)
    row = math.prod(X) // X[d] if X[d] else 0
    by = sum_or_none(a.nbytes(2), 2 * n_idx * row * (a.esize(0) or 0))
    return OpCost(0.0, by, cd, "0 (gather)", EMBEDDING)


@formula("aten::embedding_dense_backward")
def _embedding_dense_backward(a: Args) -> OpCost:
    """embedding_dense_backward(grad_output, indices, num_weights, padding_idx, ...)."""
    G, n_idx = a.shape(0), a.numel(1)
    cd = dtype_of(a, 0)
    if G is None or not G or n_idx is None:
        return unknown(EMBEDDING, "grad_output/indices shapes not recorded", cd)
    d, es = G[-1], a.esize(0) or 0
    v = a.number(2)
    dense = int(v) * d * es if v is not None else None
    by = sum_or_none(a.nbytes(1), 3 * n_idx * d * es, dense)
    return OpCost(float(n_idx * d), by, cd, "n_idx*D accumulations [own]", EMBEDDING)


@formula(*aten("_embedding_bag embedding_bag"))
def _embedding_bag(a: Args) -> OpCost:
    """_embedding_bag / embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
    per_sample_weights, include_last_offset, ...): pooling = one op per gathered element [own]."""
    W, n_idx, n_off = a.shape(0), a.numel(1), a.numel(2)
    cd = dtype_of(a, 0)
    if W is None or len(W) != 2 or n_idx is None or n_off is None:
        return unknown(EMBEDDING, "weight/indices/offsets shapes not recorded", cd)
    es = a.esize(0) or 0
    last = a.flag(7)
    bags = None if last is None else n_off - int(last)
    out = bags * W[1] * es if bags is not None else None
    by = sum_or_none(a.nbytes(1), a.nbytes(2), a.opt_bytes(6), n_idx * W[1] * es, out)
    return OpCost(float(n_idx * W[1]), by, cd, "n_idx*D (pooling) [own]", EMBEDDING)
