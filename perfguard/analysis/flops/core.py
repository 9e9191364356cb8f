"""What every FLOP formula shares: the result (:class:`OpCost`), one op's recorded arguments
parsed once (:class:`Args`), the registry (:data:`FORMULAS`, filled by :func:`formula`) and
:func:`op_cost`, the one lookup.

A formula is a function of :class:`Args` that returns an :class:`OpCost`; the family modules
(``gemm``, ``conv``, ``attention``, ``pointwise``, ``reductions``, ``norms``, ``embedding``,
``optimizers``, ``copies``) each register theirs with ``@formula("aten::mm")``. The registry
refuses a name twice, so each op has one home.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from perfguard.analysis.flops.dtypes import COMPUTE_DTYPE, ELEMENT_SIZE, SCALAR_TYPE_CODES

GEMM, CONV, ATTENTION = "gemm", "conv", "attention"
ELEMENTWISE, REDUCTION, SOFTMAX, NORM = "elementwise", "reduction", "softmax", "norm"
EMBEDDING, OPTIMIZER, COPY = "embedding", "optimizer", "copy"
#: Families whose ops are Tensor-Core contractions (reference §2); see ``LEAF_POLICY``.
CONTRACTION_FAMILIES = frozenset({GEMM, CONV, ATTENTION})

#: Bytes of one saved mean / rstd element (reference §3.4: ``rows * 4 B``).
STAT_BYTES = 4
_CATEGORY = {"bool": 0, "int": 1, "float": 2, "complex": 3}


def _category(type_name: str | None) -> int:
    cd = COMPUTE_DTYPE.get(type_name, "") if type_name is not None else ""
    if cd == "bool":
        return _CATEGORY["bool"]
    if cd.startswith(("int", "uint")):
        return _CATEGORY["int"]
    if cd.startswith("complex"):
        return _CATEGORY["complex"]
    return _CATEGORY["float"]


# --------------------------------------------------------------------------- result + args


@dataclass(frozen=True)
class OpCost:
    """FLOPs (NA = None), bytes (None), compute dtype, formula text and family of one op."""

    flops: float | None
    bytes: int | None
    compute_dtype: str | None
    formula: str
    family: str | None


NOT_RECORDED = object()  # the capture has no value for this argument
_NO_COST = OpCost(None, None, None, "", None)


class Args:
    """One op's recorded arguments: shapes, Kineto type names, concrete scalar values."""

    __slots__ = ("concrete", "dtypes", "n", "shapes")

    def __init__(self, shapes: list[Any], dtypes: list[Any], concrete: list[Any] | None) -> None:
        self.shapes = shapes
        self.dtypes = dtypes
        self.concrete = concrete
        self.n = max(len(shapes), len(dtypes))

    def dtype(self, i: int | None) -> str | None:
        if i is None or i >= len(self.dtypes):
            return None
        d = self.dtypes[i]
        return d if isinstance(d, str) else None

    def is_tensor(self, i: int | None) -> bool:
        d = self.dtype(i)
        if d not in ELEMENT_SIZE or i is None or i >= len(self.shapes):
            return False
        s = self.shapes[i]
        return isinstance(s, list) and all(isinstance(x, int) and x >= 0 for x in s)

    def shape(self, i: int | None) -> tuple[int, ...] | None:
        return tuple(self.shapes[i]) if i is not None and self.is_tensor(i) else None

    def esize(self, i: int | None) -> int | None:
        return ELEMENT_SIZE.get(self.dtype(i) or "") if self.is_tensor(i) else None

    def numel(self, i: int | None) -> int | None:
        s = self.shape(i)
        return math.prod(s) if s is not None else None

    def nbytes(self, i: int | None) -> int | None:
        """Bytes of tensor argument ``i``; None when it is not a recorded tensor."""
        s, e = self.shape(i), self.esize(i)
        return math.prod(s) * e if s is not None and e is not None else None

    def opt_bytes(self, i: int | None) -> int:
        """Bytes of an optional tensor argument: 0 when absent (None)."""
        b = self.nbytes(i)
        return b if b is not None else 0

    def tensor_list(self, i: int) -> list[tuple[int, ...]] | None:
        if self.dtype(i) != "TensorList" or i >= len(self.shapes):
            return None
        s = self.shapes[i]
        if not isinstance(s, list) or not all(
            isinstance(t, list) and all(isinstance(x, int) for x in t) for t in s
        ):
            return None
        return [tuple(t) for t in s]

    def value(self, i: int | None) -> Any:
        """Parsed concrete value; None for an empty entry (None / str argument), or
        ``NOT_RECORDED`` when the capture has no concrete inputs."""
        if i is None or self.concrete is None or i >= len(self.concrete):
            return NOT_RECORDED
        return _parse_scalar(self.concrete[i])

    def flag(self, i: int | None) -> bool | None:
        v = self.value(i)
        return v if isinstance(v, bool) else None

    def number(self, i: int | None) -> float | None:
        v = self.value(i)
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        return float(v)

    def ints(self, i: int | None, n: int) -> list[int] | None:
        """An int-list argument expanded to ``n`` entries (``[2]`` -> ``[2, 2]``), or None."""
        v = self.value(i)
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            return [v] * n
        if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            if len(v) == n:
                return list(v)
            if len(v) == 1:
                return v * n
        return None

    def scalar_type(self, i: int | None) -> str | None:
        """A ``ScalarType`` argument as a Kineto type name (None when absent or unknown)."""
        v = self.value(i)
        if isinstance(v, int) and not isinstance(v, bool):
            return SCALAR_TYPE_CODES.get(v)
        return None


def _parse_scalar(text: Any) -> Any:
    if text is None:
        return NOT_RECORDED
    if not isinstance(text, str):
        return text
    t = text.strip()
    if t == "":
        return None
    if t in ("True", "False"):
        return t == "True"
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        pass
    if t.startswith("["):
        try:
            return ast.literal_eval(t)
        except (ValueError, SyntaxError):
            return NOT_RECORDED
    return t


def dtype_of(a: Args, *idx: int) -> str | None:
    """Compute dtype of the operands ``idx``: their shared dtype, else the widest one."""
    names = [a.dtype(i) for i in idx if a.is_tensor(i)]
    if not names:
        return None
    widest = max(names, key=lambda d: (ELEMENT_SIZE.get(d, 0) if d else 0, _category(d)))
    return COMPUTE_DTYPE.get(widest) if widest is not None else None


def unknown(family: str, why: str, compute_dtype: str | None = None) -> OpCost:
    return OpCost(None, None, compute_dtype, f"unknown: {why}", family)


def sum_or_none(*parts: int | None) -> int | None:
    known = [p for p in parts if p is not None]
    return None if len(known) < len(parts) else int(sum(known))


def broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(nd):
        dims = {s[len(s) - nd + k] for s in shapes if len(s) - nd + k >= 0}
        dims.discard(1)
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def promote(names: Sequence[str], ndims: Sequence[int]) -> str | None:
    """Result dtype of a pointwise op (simplified torch type promotion)."""
    if not names:
        return None
    dimensioned = [d for d, nd in zip(names, ndims, strict=True) if nd > 0] or list(names)
    top = max(_category(d) for d in names)
    if max(_category(d) for d in dimensioned) < top:
        return "float" if top == _CATEGORY["float"] else names[0]  # 0-dim float * int tensor
    cands = {d for d in dimensioned if _category(d) == top}
    if len(cands) == 1:
        return cands.pop()
    if cands == {"c10::Half", "c10::BFloat16"}:
        return "float"
    return max(cands, key=lambda d: ELEMENT_SIZE.get(d, 0))


Shape = tuple[int, ...]
Formula = Callable[[Args], OpCost]


def input_of(a: Args, i: int, family: str, rank: int = 0) -> tuple[Shape, str | None] | OpCost:
    """The shape of tensor ``i`` (of at least ``rank`` dims) and its compute dtype, or the
    op's NA cost: the preamble of every one-input formula."""
    x, dtype = a.shape(i), dtype_of(a, i)
    if x is None or len(x) < rank:
        return unknown(family, "input shape not recorded", dtype)
    return x, dtype


def one_input(
    i: int, family: str, rank: int = 0
) -> Callable[[Callable[[Args, Shape, str | None], OpCost]], Formula]:
    """:func:`input_of` as a formula's decorator: the formula gets ``(args, shape, dtype)``
    and is not called when the input is not recorded."""

    def wrap(fn: Callable[[Args, Shape, str | None], OpCost]) -> Formula:
        def cost(a: Args) -> OpCost:
            got = input_of(a, i, family, rank)
            return got if isinstance(got, OpCost) else fn(a, *got)

        return cost

    return wrap


# --------------------------------------------------------------------------- the registry

Spec = TypeVar("Spec")

#: aten op name without ``aten::`` -> its formula; filled by :func:`formula`.
FORMULAS: dict[str, Formula] = {}


def aten(names: str) -> list[str]:
    """``"mm bmm"`` -> ``["aten::mm", "aten::bmm"]``: a group of ops that share a formula."""
    return [f"aten::{n}" for n in names.split()]


def formula(*ops: str) -> Callable[[Formula], Formula]:
    """Register the decorated formula for each op (``"aten::mm"``); a name registered twice
    is an error at import, so every op's figure has one home."""
    keys = [op[6:] for op in ops]
    for op, key in zip(ops, keys, strict=True):
        if not op.startswith("aten::") or not key or "::" in key:
            raise ValueError(f"formula for {op!r}: name an aten op, as aten::mm")
        if key in FORMULAS or keys.count(key) > 1:
            raise ValueError(f"two formulas for {op}")

    def register(fn: Formula) -> Formula:
        FORMULAS.update(dict.fromkeys(keys, fn))
        return fn

    return register


def formula_per_spec(factory: Callable[[Spec], Formula], table: dict[str, Spec]) -> None:
    """Register ``factory(spec)`` for each ``"aten::op": spec`` of ``table``: the ops of a
    family that differ only in where their arguments sit."""
    for op, spec in table.items():
        formula(op)(factory(spec))


def op_cost(name: str, input_shapes: Any, dtypes: Any, concrete_inputs: Any = None) -> OpCost:
    """The cost of one op. ``name``: ``aten::mm`` or ``mm``; the rest as Kineto JSON text (or
    already parsed lists). No formula for the op: all None; an unusable record: NA figures
    with the reason in ``formula`` (and the op's family)."""
    key = name[6:] if name.startswith("aten::") else name
    fn = FORMULAS.get(key)
    if fn is None:
        return _NO_COST
    try:
        shapes, types = _load(input_shapes), _load(dtypes)
        concrete = _load(concrete_inputs)
    except (TypeError, ValueError):
        return unknown(_family_of(key), "input shapes/dtypes are not valid JSON")
    if not isinstance(shapes, list) or not isinstance(types, list):
        return unknown(_family_of(key), "input shapes/dtypes not recorded")
    args = Args(shapes, types, concrete if isinstance(concrete, list) else None)
    try:
        return fn(args)
    except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, OverflowError) as e:
        return unknown(_family_of(key), f"unexpected record ({type(e).__name__})")


_FAMILY_CACHE: dict[str, str] = {}


def _family_of(key: str) -> str:
    """An op's family, from its formula run on an empty record (cached)."""
    if key not in _FAMILY_CACHE:
        try:
            _FAMILY_CACHE[key] = FORMULAS[key](Args([], [], None)).family or ""
        except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError):
            _FAMILY_CACHE[key] = ""
    return _FAMILY_CACHE[key]


def _load(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):
        return json.loads(v) if v else None
    return v
