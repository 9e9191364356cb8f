"""NVTX markers of NVIDIA PyProf (``pyprof.init()``) and DLProf (``nvidia_dlprof_pytorch_nvtx``).

Both monkey-patch ``torch.*``, ``torch.Tensor.*`` and ``torch.nn.functional.*``
and push three NVTX ranges around every call, each a Python ``str(dict)``
(facts from NVIDIA/PyProf ``pyprof/nvtx/nvmarker.py`` and ``pyprof/parse/``,
read at 218dcc1 and, for DLProf's additions, at the parent of cf12d44
"Remove dlprof specific code")::

    {'traceMarker': ['train.py:34', ...]}                     # outermost: the call stack
      {'mod': 'LSTM', 'strRepr': 'in_features=...'}           # only for torch.nn RNN forwards
        {'mod': 'torch.nn.functional', 'op': 'conv2d',
         'args': [{'name': '', 'type': 'tensor', 'shape': (32, 3, 32, 32), 'dtype': 'float32'},
                  {'name': 'stride', 'type': 'int', 'value': 2}, ...]}
          aten::conv2d, seq = 12        # autograd's ranges (emit_nvtx, autograd-nvtx)

The stack is outermost first (``traceback.extract_stack``); DLProf adds
``'funcStack': '/Net::forward/Conv2d::forward/conv2d'`` (its hierarchical op
name) to the trace marker and ``'callid'``/``'input_callids'`` to the
argument marker. A tensor is ``type 'tensor'`` (or ``'ndarray'``) with a
``shape`` tuple and a dtype without its ``torch.`` prefix; scalars keep
their Python type name and ``value``; lists and tuples of scalars are one
argument of ``type 'list'``/``'tuple'``; kwargs follow the positional
arguments with their ``name``.

What perfguard makes of them:

* the argument marker becomes the op: ``name`` ``<mod>.<op>`` (or DLProf's
  ``funcStack``, ``/Net.forward/Conv2d.forward/conv2d``: its ``::`` written
  ``.``, since perfguard reads ``::`` as a namespace), ``op_type`` the op,
  ``input_shapes``/``dtypes``/``concrete_inputs`` in the Kineto reader's
  spelling (compact JSON, c10 type names), so FLOPs, bytes, TC eligibility
  and efficiency work unchanged;
* the trace marker gives ``call_site``: the innermost frame outside torch,
  PyProf, DLProf and apex (PyProf's ``filterTrace`` dropped the same kind
  of frames); the trace and module markers are wrappers that exactly enclose
  the op, so they are dropped once their content is on the op, and so are the
  forward ranges of autograd inside the op (``aten::conv2d`` ...
  ``aten::cudnn_convolution``, which carry no shapes): as in PyProf, the
  kernels belong to the op the markers name, which has the shapes, so its
  GPU time, FLOPs and FLOP efficiency are one row;
* PyProf's forward/backward correlation: a backward range ``XBackward0, seq
  = N`` belongs to the forward op whose autograd range had ``seq = N`` (the
  last one before it, in the same process: ``findFpropKernel`` in
  ``pyprof/prof/prof.py``). The op gets that ``seq`` and the backward node
  gets the op's call site, dtypes and input shapes, as PyProf gave a bprop
  kernel its fprop marker. The node keeps its own name and ``op_type``, so
  no forward FLOP formula is applied to backward work.

Parsing is per *distinct* name (:func:`parse_markers`); the tree step
(:func:`apply_markers`) is vectorised over the ranges table.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import numpy as np
import pandas as pd

from perfguard.arrays import factorize, levels
from perfguard.trace.model import NO_PARENT
from perfguard.trace.ranges import finalize_ranges

__all__ = [
    "MODULE_MARKER",
    "PYTHON_OP",
    "TRACE_MARKER",
    "apply_markers",
    "parse_markers",
    "python_op",
]

#: name given to a trace-marker range; DLProf's funcStack follows it
TRACE_MARKER = "pyprof.traceMarker"
#: name prefix given to a module-marker range (``pyprof.modMarker:LSTM``)
MODULE_MARKER = "pyprof.modMarker:"

# a cheap test before any parsing: PyProf/DLProf write Python dict reprs with these first keys
_LOOKS_LIKE = re.compile(r"^\{'(?:traceMarker|mod|callid)'\s*:")

#: PyProf dtype text (``str(torch.float32).split('.')[-1]`` / numpy names) -> Kineto's names
_DTYPE = {
    "float32": "float",
    "float": "float",
    "float64": "double",
    "double": "double",
    "float16": "c10::Half",
    "half": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "int64": "long int",
    "long": "long int",
    "int32": "int",
    "int": "int",
    "int16": "short int",
    "short": "short int",
    "int8": "signed char",
    "uint8": "unsigned char",
    "bool": "bool",
    "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>",
    "float8_e4m3fn": "c10::Float8_e4m3fn",
    "float8_e5m2": "c10::Float8_e5m2",
}

# Argument order of the aten schema, with defaults, for the ops whose FLOPs read scalar
# arguments: PyProf records kwargs after the positional arguments, by name
_CONV = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_T = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
_SIGNATURES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    **{
        f"conv{d}d": (_CONV, {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1})
        for d in (1, 2, 3)
    },
    **{
        f"conv_transpose{d}d": (
            _CONV_T,
            {
                "bias": None,
                "stride": 1,
                "padding": 0,
                "output_padding": 0,
                "groups": 1,
                "dilation": 1,
            },
        )
        for d in (1, 2, 3)
    },
    "linear": (("input", "weight", "bias"), {"bias": None}),
}

# Python operator methods of torch.Tensor -> the aten op they run
_DUNDER = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__add__": "add",
    "__radd__": "add",
    "__iadd__": "add_",
    "__sub__": "sub",
    "__rsub__": "rsub",
    "__isub__": "sub_",
    "__mul__": "mul",
    "__rmul__": "mul",
    "__imul__": "mul_",
    "__truediv__": "div",
    "__rtruediv__": "div",
    "__itruediv__": "div_",
    "__pow__": "pow",
    "__neg__": "neg",
}

#: op names PyProf gives: ``<mod>.<op>`` for torch, torch.Tensor and torch.nn.functional
PYTHON_OP = r"(?:torch(?:\.\w+)*|Tensor)\.\w+"


def python_op(names: pd.Series) -> pd.Series:
    """The aten op of ``torch.nn.functional.conv2d`` / ``Tensor.__matmul__`` names."""
    leaf = pd.Series(names, dtype=object).str.rsplit(".", n=1).str[-1]
    return leaf.map(lambda v: _DUNDER.get(v, v))


# frames that are the framework, not the user's code (PyProf's filterTrace drops the same kind)
_INTERNAL = re.compile(
    r"[/\\](?:torch|pyprof|nvidia_dlprof_pytorch_nvtx|apex)[/\\]|^<frozen |^<string>"
)


def parse_markers(names: pd.Series) -> pd.DataFrame:
    """Parse distinct range names that are PyProf/DLProf markers.

    Input: distinct names. Output (same index): ``marker`` (``args``,
    ``trace``, ``module`` or None for other names), ``name``, ``op_type``,
    ``input_shapes``, ``dtypes``, ``concrete_inputs`` (JSON text) and
    ``call_site``; None where a name is not a marker or lacks the field.
    A marker that does not parse is left as it is (``marker`` None).
    """
    u = pd.Series(names, dtype=object, copy=False)
    cols = ("marker", "name", "op_type", "input_shapes", "dtypes", "concrete_inputs", "call_site")
    out = {c: np.full(len(u), None, dtype=object) for c in cols}
    candidates = np.flatnonzero(u.fillna("").str.contains(_LOOKS_LIKE).to_numpy(bool))
    for i in candidates:  # one parse per distinct marker text, never per range
        parsed = _parse_one(str(u.iat[int(i)]))
        if parsed is not None:
            for c, v in zip(cols, parsed, strict=True):
                out[c][i] = v
    return pd.DataFrame(out, index=u.index, copy=False)


def _parse_one(text: str) -> tuple[Any, ...] | None:
    try:
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    if isinstance(d.get("traceMarker"), list):
        stack = d.get("funcStack")
        # ``Class::method`` levels are written ``Class.method``: perfguard reads ``::`` as a
        # namespace (``aten::addmm``), and the hierarchical name is not one
        path = stack.replace("::", ".") if isinstance(stack, str) and stack.startswith("/") else ""
        name = TRACE_MARKER + path
        return ("trace", name, None, None, None, None, _call_site(d["traceMarker"]))
    mod = d.get("mod")
    if not isinstance(mod, str):
        return None
    if "strRepr" in d and "op" not in d:
        return ("module", MODULE_MARKER + mod, None, None, None, None, None)
    op, args = d.get("op"), d.get("args")
    if not isinstance(op, str) or not isinstance(args, list):
        return None
    op_type = _DUNDER.get(op, op)
    shapes, dtypes, concrete = _arguments(op_type, [a for a in args if isinstance(a, dict)])
    return ("args", f"{mod}.{op}", op_type, shapes, dtypes, concrete, None)


def _call_site(frames: list[Any]) -> str | None:
    """The innermost ``file:line`` of the user's code (the stack is outermost first)."""
    for frame in reversed(frames):
        if isinstance(frame, str) and not _INTERNAL.search(frame):
            return frame
    return None


def _arguments(op: str, args: list[dict[str, Any]]) -> tuple[str, str, str]:
    """Kineto-style ``Input Dims``, ``Input type``, ``Concrete Inputs`` as compact JSON."""
    sig = _SIGNATURES.get(op)
    if sig is not None:
        args = _in_schema_order(args, *sig)
    shapes, dtypes, concrete = [], [], []
    for a in args:
        kind = a.get("type")
        if kind in ("tensor", "ndarray"):
            shape = a.get("shape")
            shapes.append(list(shape) if isinstance(shape, (tuple, list)) else [])
            dtypes.append(_DTYPE.get(str(a.get("dtype")), str(a.get("dtype"))))
            concrete.append("")
            continue
        shapes.append([])
        value = a.get("value")
        if kind in ("list", "tuple"):
            dtypes.append("ScalarList")
            concrete.append(str(list(value)) if isinstance(value, (list, tuple)) else "")
        elif value is None:
            dtypes.append("")
            concrete.append("")
        else:
            dtypes.append("Scalar")
            concrete.append(str(value))
    return (_json(shapes), _json(dtypes), _json(concrete))


def _in_schema_order(
    args: list[dict[str, Any]], order: tuple[str, ...], defaults: dict[str, Any]
) -> list[dict[str, Any]]:
    """Positional arguments first, then kwargs by name, then defaults, in schema order."""
    positional = [a for a in args if not a.get("name")]
    named = {a.get("name"): a for a in args if a.get("name")}
    out = []
    for i, name in enumerate(order):
        if i < len(positional):
            out.append(positional[i])
        elif name in named:
            out.append(named[name])
        elif name in defaults:
            value = defaults[name]
            out.append({"name": name, "type": type(value).__name__, "value": value})
        else:
            break
    return out


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# ---- the tree step: call sites onto ops, wrappers out, fprop/bprop by seq -------------------


def apply_markers(ranges: pd.DataFrame) -> pd.DataFrame:
    """Fold PyProf/DLProf wrapper ranges into the ops they wrap and link bprop to fprop.

    ``ranges`` is a finalized ranges table (``range_id`` = row number,
    ``parent_id``, ``direction``). Returns it unchanged when it holds no
    PyProf/DLProf markers; otherwise a new table without the wrappers,
    renumbered (the tree is recomputed by ``finalize``'s rules).
    """
    if "name" not in ranges or not len(ranges):
        return ranges
    name = ranges["name"]
    codes, uniques = factorize(name, use_na_sentinel=False)
    u = pd.Series(uniques, dtype=object).fillna("")
    u_trace = u.str.startswith(TRACE_MARKER).to_numpy(bool)
    u_module = u.str.startswith(MODULE_MARKER).to_numpy(bool)
    if not (u_trace.any() or u_module.any()):
        return ranges
    trace, module = u_trace[codes], u_module[codes]
    wrapper = trace | module
    parent = ranges["parent_id"].to_numpy(np.int64)
    has_parent = parent != NO_PARENT
    p = np.where(has_parent, parent, 0)
    # the op of each trace marker: its child, or its grandchild under a module marker
    under_wrapper = ~wrapper & has_parent & wrapper[p]
    up = np.where(under_wrapper, p, -1)
    gp = np.where(up >= 0, parent[np.maximum(up, 0)], NO_PARENT)
    via_module = (up >= 0) & module[np.maximum(up, 0)] & (gp != NO_PARENT)
    trace_of = np.where(via_module, gp, up)
    ok = trace_of >= 0
    ok[ok] &= trace[trace_of[ok]]
    ops = np.flatnonzero(ok)
    src = trace_of[ops]

    out = ranges.copy()
    site = out["call_site"].to_numpy(dtype=object).copy()
    fill = pd.isna(site[ops])
    site[ops[fill]] = out["call_site"].to_numpy(dtype=object)[src[fill]]
    out["call_site"] = site
    # DLProf: the trace marker's funcStack is the op's hierarchical name
    stack = u.str.slice(len(TRACE_MARKER)).to_numpy(dtype=object)[codes[src]]
    named = stack != ""
    if named.any():
        names = out["name"].to_numpy(dtype=object).copy()
        names[ops[named]] = stack[named]
        out["name"] = names
    owner = _owners(out, ops)
    # autograd backward nodes (XBackward0, not an aten:: op), judged once per distinct name
    node = u.str.contains(r"^[^:]*Backward\d*$", regex=True).to_numpy(bool)[codes]
    _link_backward(out, ops, owner, node)

    # the framework's own ranges inside an op (autograd's aten::...) go: the kernels belong
    # to the op that PyProf/DLProf name, which carries the shapes (PyProf did the same)
    inner = (owner >= 0) & (owner != np.arange(len(out)))
    inner &= (out["direction"] == "fprop").to_numpy(bool)
    keep = ~wrapper & ~inner
    out = out.loc[keep].drop(columns=["range_id", "depth", "parent_id"])
    out["bprop"] = (out["direction"] == "bprop").to_numpy(bool)
    return finalize_ranges(out.drop(columns=["direction"]))


def _owners(r: pd.DataFrame, ops: np.ndarray) -> np.ndarray:
    """The nearest op at or above each range (-1: none), parents first, one step per level."""
    n = len(r)
    owner = np.full(n, -1, dtype=np.int64)
    owner[ops] = ops
    parent = r["parent_id"].to_numpy(np.int64)
    for at in levels(r["depth"].to_numpy(np.int64))[1:]:
        inherit = owner[at] < 0
        owner[at[inherit]] = owner[parent[at[inherit]]]
    return owner


def _link_backward(r: pd.DataFrame, ops: np.ndarray, owner: np.ndarray, node: np.ndarray) -> None:
    """PyProf's fprop/bprop correlation by ``seq`` (in place, before renumbering).

    Each op gets the ``seq`` of the first autograd range inside it; each
    backward node (``XBackward0``, not an ``aten::`` op) with a ``seq`` gets
    the call site, dtypes and input shapes of the last op before it with
    that ``seq`` in the same process.
    """
    n = len(r)
    is_op = np.zeros(n, dtype=bool)
    is_op[ops] = True
    depth = r["depth"].to_numpy(np.int64)
    seq = r["seq"].astype("Int64")
    fwd = (r["direction"] == "fprop").to_numpy(bool) & seq.notna().to_numpy() & (owner >= 0)
    fwd &= ~is_op
    if not fwd.any():
        return
    # each op's seq: that of the first (earliest, outermost) autograd range inside it
    first = (
        pd.DataFrame(
            {
                "op": owner[fwd],
                "start": r["start"].to_numpy()[fwd],
                "depth": depth[fwd],
                "seq": seq.to_numpy()[fwd],
            }
        )
        .sort_values(["op", "start", "depth"], kind="stable")
        .drop_duplicates("op")
    )
    op_seq = seq.array.copy()
    op_seq[first["op"].to_numpy()] = first["seq"].to_numpy()
    r["seq"] = op_seq

    bwd = (r["direction"] == "bprop").to_numpy(bool) & seq.notna().to_numpy()
    bwd &= node
    if not bwd.any():
        return
    left = pd.DataFrame(
        {
            "row": np.flatnonzero(bwd),
            "pid": r["pid"].to_numpy()[bwd],
            "seq": seq.to_numpy()[bwd].astype(np.int64),
            "start": r["start"].to_numpy()[bwd],
        }
    ).sort_values("start", kind="stable")
    right = pd.DataFrame(
        {
            "op": first["op"].to_numpy(),
            "pid": r["pid"].to_numpy()[first["op"].to_numpy()],
            "seq": first["seq"].to_numpy().astype(np.int64),
            "start": r["start"].to_numpy()[first["op"].to_numpy()],
        }
    ).sort_values("start", kind="stable")
    match = pd.merge_asof(left, right, on="start", by=["pid", "seq"], direction="backward")
    match = match.dropna(subset=["op"])
    rows, src = match["row"].to_numpy(np.int64), match["op"].to_numpy(np.int64)
    for col in ("call_site", "dtypes", "input_shapes", "concrete_inputs"):
        values = r[col].to_numpy(dtype=object).copy()
        empty = pd.isna(values[rows])
        values[rows[empty]] = values[src[empty]]
        r[col] = values
