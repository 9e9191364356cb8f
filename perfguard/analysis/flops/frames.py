"""The vectorised entry points: :func:`op_flops` costs a DataFrame of ops (``Trace.ranges``),
one :func:`~perfguard.analysis.flops.core.op_cost` call per unique ``(name, input_shapes,
dtypes, concrete_inputs)`` record; :func:`count_once` applies :data:`LEAF_POLICY` over the range
tree so nested ops (``aten::linear`` -> ``aten::addmm``) are never counted twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pandas as pd

from perfguard.analysis.flops.core import CONTRACTION_FAMILIES, COPY, FORMULAS, op_cost
from perfguard.arrays import unique_first

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
