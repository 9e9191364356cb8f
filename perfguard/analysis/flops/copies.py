"""Copies, casts and fills: reference §3.3 Copy (PyProf). No arithmetic; bytes
``numel * (s_src + s_dst)`` for a copy or cast, the written tensor only for a fill.
"""

from __future__ import annotations

from perfguard.analysis.flops.core import COPY, Args, OpCost, aten, dtype_of, formula, sum_or_none
from perfguard.analysis.flops.dtypes import ELEMENT_SIZE


@formula("aten::copy_")
def _copy_(a: Args) -> OpCost:
    """copy_(self, src, non_blocking): read src, write self (reference §3.3 Copy)."""
    by = sum_or_none(a.nbytes(0), a.nbytes(1))
    return OpCost(0.0, by, dtype_of(a, 1), "0 (copy)", COPY)


@formula("aten::_to_copy")
def _to_copy(a: Args) -> OpCost:
    """_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)."""
    n, es = a.numel(0), a.esize(0)
    dst = a.scalar_type(1)
    if dst is None and a.value(1) is not None:  # dtype not recorded (None means "keep")
        return OpCost(0.0, None, dtype_of(a, 0), "0 (copy); target dtype not recorded", COPY)
    es_dst = ELEMENT_SIZE.get(dst) if dst is not None else es
    by = n * (es + es_dst) if n is not None and es and es_dst else None
    return OpCost(0.0, by, dtype_of(a, 0), "0 (copy): numel*(s_src + s_dst)", COPY)


@formula("aten::clone")
def _clone(a: Args) -> OpCost:
    b = a.nbytes(0)
    return OpCost(0.0, 2 * b if b is not None else None, dtype_of(a, 0), "0 (copy)", COPY)


@formula(*aten("fill_ zero_"))
def _fill(a: Args) -> OpCost:
    """fill_ / zero_: write self only."""
    return OpCost(0.0, a.nbytes(0), dtype_of(a, 0), "0 (fill)", COPY)
