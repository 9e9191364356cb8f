"""TensorFlow graph ops: FLOPs and bytes from the graph's shapes and dtypes
(:mod:`perfguard.trace.tf_graph`: a TF op range's ``tf_facts``).

The conventions are the package's (reference §0, §3): 1 FMA = 2 FLOPs, algorithmic counts;
elementwise ops 1 FLOP per output element, reductions 1 per input element; bytes are each
input read once and each output written once. An unknown dimension makes the figure NA, never
0. One exception, so that Grappler's rewrites do not move the step's FLOPs: a fused op counts
the elementwise ops fused after its contraction (the ``BiasAdd`` and ``Relu`` of
``_FusedMatMul``) as they count unfused, where the aten formulas leave a GEMM's bias out.

An op is costed by its *runtime* type with oneDNN's and Grappler's decorations taken off
(``_MklNativeFusedMatMul`` -> ``MatMul``, ``_MklNativeConv2DBackpropFilterWithBias`` ->
``Conv2DBackpropFilter``), so the same work reads the same FLOPs whether or not a rewrite
fused it. A fused op's contraction is its ``core`` (the ``MatMul`` the fusion starts from),
the ops between them its ``chain``; its bytes are the contraction's inputs, the chain's other
inputs (the bias) and its output.

* ``MatMul``, ``BatchMatMul*``: ``2 x output elements x K`` (K the contracted size, after
  ``transpose_a``/``adj_x``);
* ``Conv2D``/``Conv3D``: ``2 x output elements x kernel window x input channels per group``
  (filter ``[kh, kw, cin/groups, cout]``); ``DepthwiseConv2dNative``: ``2 x output x window``;
  ``Conv2DBackpropInput``/``Filter``: ``2 x out_backprop elements x window x filter cin``, the
  forward convolution's count (the filter shape is the backprop-filter op's output);
* ``ResourceApplyAdam``: 14 per element [own, as ``optimizers``]; ``ResourceApplyGradientDescent``
  2; ``AssignAdd/SubVariableOp`` 1 (a read, a read and a write of the value's size);
* the elementwise and reduction ops listed below. Any other op (``ReadVariableOp``, ``Reshape``,
  ``Identity``) has no formula: its figures stay None, as an aten op's without one do.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from perfguard.analysis.flops.core import (
    CONV,
    ELEMENTWISE,
    GEMM,
    OPTIMIZER,
    REDUCTION,
    OpCost,
    unknown,
)

#: TF dtype name -> (compute dtype as the other formulas write it, element size in bytes)
DTYPES = {
    "float32": ("fp32", 4),
    "float16": ("fp16", 2),
    "bfloat16": ("bf16", 2),
    "float64": ("fp64", 8),
    "int8": ("int8", 1),
    "uint8": ("uint8", 1),
    "int16": ("int16", 2),
    "int32": ("int32", 4),
    "int64": ("int64", 8),
    "bool": ("bool", 1),
    "complex64": ("complex64", 8),
    "complex128": ("complex128", 16),
}
#: decorations oneDNN and Grappler put on a type: ``_MklNative``, ``_Mkl``, ``_Fused``, ``WithBias``
_DECORATION = re.compile(r"^_(?:MklNative|Mkl)?(?:Fused)?|WithBias$")

ELEMENTWISE_OPS = frozenset(
    "Add AddV2 AddN Sub Mul RealDiv Div DivNoNan FloorDiv Maximum Minimum Neg Abs Square Sqrt "
    "Rsqrt Exp Log Log1p Pow Tanh Sigmoid Relu Relu6 Elu Selu Gelu Softplus LeakyRelu ReluGrad "
    "Relu6Grad EluGrad SigmoidGrad TanhGrad SqrtGrad RsqrtGrad SquaredDifference Reciprocal "
    "BiasAdd Cast Select SelectV2 Erf Sign Floor Ceil Round Equal NotEqual Greater GreaterEqual "
    "Less LessEqual LogicalAnd LogicalOr LogicalNot ClipByValue".split()
)
REDUCTION_OPS = frozenset("Sum Mean Max Min Prod All Any BiasAddGrad ArgMax ArgMin".split())

Facts = dict[str, Any]
Shape = list[int]
TfFormula = Callable[[Facts], OpCost]

#: runtime TF op type (decorations off) -> its formula; filled by :func:`tf_formula`
TF_FORMULAS: dict[str, TfFormula] = {}


def tf_formula(*types: str) -> Callable[[TfFormula], TfFormula]:
    """Register the decorated formula for each TF op type; a type registered twice is an
    error at import, so every op's figure has one home."""
    for t in types:
        if t in TF_FORMULAS or types.count(t) > 1:
            raise ValueError(f"two formulas for TensorFlow op {t}")

    def register(fn: TfFormula) -> TfFormula:
        TF_FORMULAS.update(dict.fromkeys(types, fn))
        return fn

    return register


def base_type(op_type: str) -> str:
    """``_MklNativeFusedMatMul`` -> ``MatMul``: the type a formula is registered under."""
    return _DECORATION.sub("", op_type)


def tf_op_cost(op_type: str, facts: Any) -> OpCost | None:
    """The cost of one TF op run as ``op_type`` with ``facts`` (a node's facts, JSON text or
    parsed); None when the type has no formula or there are no facts."""
    fn = TF_FORMULAS.get(base_type(op_type))
    if fn is None or facts is None:
        return None
    node = json.loads(facts) if isinstance(facts, str) else facts
    try:
        return fn(node)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
        return unknown("", f"unexpected graph facts ({type(e).__name__})")


# --------------------------------------------------------------------------- shapes


def _known(shape: Any) -> Shape | None:
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return None
    return shape


def _in(node: Facts, i: int) -> Shape | None:
    shapes = node.get("in") or []
    return _known(shapes[i]) if i < len(shapes) else None


def _out(node: Facts, i: int = 0) -> Shape | None:
    shapes = node.get("out") or []
    return _known(shapes[i]) if i < len(shapes) else None


def _dtype(node: Facts, key: str, i: int) -> tuple[str, int] | None:
    names = node.get(key) or []
    return DTYPES.get(names[i]) if i < len(names) else None


def _tensor_bytes(node: Facts, key: str) -> int | None:
    """Bytes of every input (``in``/``dt``) or output (``out``/``odt``); None if one is unknown."""
    total = 0
    shapes = node.get(key) or []
    for i in range(len(shapes)):
        shape, dt = _known(shapes[i]), _dtype(node, "dt" if key == "in" else "odt", i)
        if shape is None or dt is None:
            return None
        total += math.prod(shape) * dt[1]
    return total


def _bytes(node: Facts, extra_inputs: Facts | None = None) -> int | None:
    """Inputs read once and outputs written once; ``extra_inputs``' inputs added (a fusion's
    contraction, whose operands the fused op reads)."""
    parts = [_tensor_bytes(node, "in"), _tensor_bytes(node, "out")]
    if extra_inputs is not None:
        parts.append(_tensor_bytes(extra_inputs, "in"))
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _compute(node: Facts) -> str | None:
    dt = _dtype(node, "dt", 0) or _dtype(node, "odt", 0)
    return dt[0] if dt else None


# --------------------------------------------------------------------------- contractions


def _fused(node: Facts) -> tuple[Facts, int | None, int | None]:
    """The contraction of ``node`` (its fusion's ``core``, else itself), the op's bytes and
    the FLOPs of the elementwise ops fused after the contraction (0 unfused)."""
    core = node.get("core")
    if core is None:
        return node, _bytes(node), 0
    # the fused op reads the contraction's operands and the chain's other inputs (the bias),
    # and writes its own output; the contraction's and the chain's outputs stay on chip
    steps = [node, *(node.get("chain") or [])]
    inner = {str(core.get("name"))} | {str(n.get("name")) for n in steps[1:]}
    extra: int | None = 0
    flops: int | None = 0
    for n in steps:
        out = _out(n)
        flops = None if out is None or flops is None else flops + math.prod(out)
        for i, src in enumerate(n.get("src") or []):
            shape, dt = _in(n, i), _dtype(n, "dt", i)
            if str(src) in inner or extra is None:
                continue
            extra = None if shape is None or dt is None else extra + math.prod(shape) * dt[1]
    inputs, written = _tensor_bytes(core, "in"), _tensor_bytes(node, "out")
    nbytes = (
        None if inputs is None or written is None or extra is None else inputs + extra + written
    )
    return core, nbytes, flops


@tf_formula("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _matmul(node: Facts) -> OpCost:
    core, nbytes, fused = _fused(node)
    a, out = _in(core, 0), _out(core)
    if a is None or out is None or len(a) < 2 or fused is None:
        return unknown(GEMM, "input shape not known in the graph", _compute(core))
    attr = core.get("attr") or {}
    flipped = attr.get("transpose_a") or attr.get("adj_x")
    k = a[-2] if flipped else a[-1]
    flops = 2 * math.prod(out) * k + fused
    text = "2*out*K" + (" + fused elementwise" if fused else "") + " (TF graph shapes)"
    return OpCost(float(flops), nbytes, _compute(core), text, GEMM)


def _window(filter_shape: Shape) -> int:
    """Kernel window x input channels of a ``[*spatial, cin, cout]`` filter."""
    return math.prod(filter_shape[:-1])


@tf_formula("Conv2D", "Conv3D")
def _conv(node: Facts) -> OpCost:
    core, nbytes, fused = _fused(node)
    w, out = _in(core, 1), _out(core)
    if w is None or out is None or fused is None:
        return unknown(CONV, "filter or output shape not known in the graph", _compute(core))
    flops = 2 * math.prod(out) * _window(w) + fused
    text = "2*out*kh*kw*cin" + (" + fused elementwise" if fused else "") + " (TF graph shapes)"
    return OpCost(float(flops), nbytes, _compute(core), text, CONV)


@tf_formula("DepthwiseConv2dNative")
def _depthwise(node: Facts) -> OpCost:
    core, nbytes, fused = _fused(node)
    w, out = _in(core, 1), _out(core)
    if w is None or out is None or fused is None:
        return unknown(CONV, "filter or output shape not known in the graph", _compute(core))
    flops = 2 * math.prod(out) * math.prod(w[:-2]) + fused
    return OpCost(float(flops), nbytes, _compute(core), "2*out*kh*kw (TF graph shapes)", CONV)


@tf_formula("Conv2DBackpropInput", "Conv3DBackpropInputV2")
def _conv_grad_input(node: Facts) -> OpCost:
    w, dy = _in(node, 1), _in(node, 2)
    if w is None or dy is None:
        return unknown(CONV, "filter or gradient shape not known in the graph", _compute(node))
    flops = 2 * math.prod(dy) * _window(w)
    return OpCost(float(flops), _bytes(node), _compute(node), "2*dy*kh*kw*cin (TF graph)", CONV)


@tf_formula("Conv2DBackpropFilter", "Conv3DBackpropFilterV2")
def _conv_grad_filter(node: Facts) -> OpCost:
    w, dy = _out(node), _in(node, 2)
    if w is None or dy is None:
        return unknown(CONV, "filter or gradient shape not known in the graph", _compute(node))
    flops = 2 * math.prod(dy) * _window(w)
    return OpCost(float(flops), _bytes(node), _compute(node), "2*dy*kh*kw*cin (TF graph)", CONV)


# --------------------------------------------------------------------------- the rest


@tf_formula(*sorted(ELEMENTWISE_OPS))
def _elementwise(node: Facts) -> OpCost:
    out = _out(node)
    if out is None:
        return unknown(ELEMENTWISE, "output shape not known in the graph", _compute(node))
    n = math.prod(out) * (max(len(node.get("in") or []) - 1, 1) if node["type"] == "AddN" else 1)
    return OpCost(float(n), _bytes(node), _compute(node), "out (TF graph shapes)", ELEMENTWISE)


@tf_formula(*sorted(REDUCTION_OPS))
def _reduction(node: Facts) -> OpCost:
    x = _in(node, 0)
    if x is None:
        return unknown(REDUCTION, "input shape not known in the graph", _compute(node))
    return OpCost(float(math.prod(x)), _bytes(node), _compute(node), "in (TF graph)", REDUCTION)


def _update(per_element: int, value: int, moved: int) -> TfFormula:
    """A variable update: ``per_element`` FLOPs per element of input ``value`` (the gradient
    or delta); bytes: ``moved`` tensors of its size read or written."""

    def cost(node: Facts) -> OpCost:
        x, dt = _in(node, value), _dtype(node, "dt", value)
        if x is None or dt is None:
            return unknown(OPTIMIZER, "update shape not known in the graph")
        n = math.prod(x)
        return OpCost(
            float(per_element * n),
            moved * n * dt[1],
            dt[0],
            f"{per_element}*n (TF graph) [own]",
            OPTIMIZER,
        )

    return cost


# var, m, v, grad read; var, m, v written
tf_formula("ResourceApplyAdam")(_update(14, 9, 7))
# var, delta read; var written (the same for a variable's add or subtract of a value)
tf_formula("ResourceApplyGradientDescent")(_update(2, 2, 3))
tf_formula("AssignAddVariableOp", "AssignSubVariableOp")(_update(1, 1, 3))
