"""PyTorch instrumentation: one range per ``nn.Module`` call and per aten op, DLProf-style names.

This is what DLProf's ``nvidia_dlprof_pytorch_nvtx.init()`` and PyProf did:
while :func:`instrument` is on, every module forward and every aten op is an
NVTX range (for nsys) and, while a torch profiler records, a
``record_function`` range with the same name (a ``user_annotation`` event in
the Kineto trace). Off by default; on only inside ``with instrument(...)``
or between ``enable()`` and ``disable()``.

Names (DLProf's hierarchical op names)
--------------------------------------
Every name is an absolute path starting with ``/`` (the analysis does not
prefix such names with their enclosing ranges):

* A module called with no instrumented module running is a root:
  ``/<class name>`` (``/Net``). Under ``instrument(model)`` a submodule of
  ``model`` called from outside any module gets its static path instead
  (``/Net/encoder``).
* A module called while module ``P`` runs: ``<path of P>/<name of it in P>``.
  The name is its attribute name (``/Net/layer1/conv1``); a module reached
  through a container that is never called itself (``ModuleList``) keeps the
  container's levels (``/Net/layers/0``); a module ``P`` does not own is
  named by its class.
* An aten op in forward: ``<path of the running module>/<op>`` with the
  schema name (``/Net/fc1/aten::addmm``); with no module running,
  ``/<op>`` (``/aten::add_`` of an optimizer step).
* Repeats: inside one *call* of a parent, the k-th child with the same
  name (module or op) is ``name(k)`` for k >= 2; the first has no number:
  ``y = self.block(x); y = self.block(y)`` gives ``/Net/block`` then
  ``/Net/block(2)``, and the ops inside the second are ``/Net/block(2)/...``.
  The count starts again in every call of the parent, so every training
  step yields the same names. Roots are never numbered (each is a new step).
* An aten op run by autograd in backward: ``<forward op>/<op>`` where
  ``<forward op>`` is the full name of the forward op whose autograd node is
  executing (``/Net/fc1/aten::addmm/aten::mm``), numbered per node
  execution like any parent (``.../aten::mm(2)``). Ops of a node whose
  forward op was not seen (``AccumulateGrad``, forward outside the scope,
  custom ``autograd.Function``) hang under ``/<node class>``
  (``/AccumulateGrad/aten::detach``).

Direction
---------
``bprop`` when the op runs inside the autograd engine
(``torch._C._current_graph_task_id() != -1``), else ``fprop``; modules are
always ``fprop`` (module hooks run in forward). The forward op of a node is
found through autograd sequence numbers: the autograd kernel creates an op's
node (taking the next sequence number) before the op reaches the dispatch
mode, so a grad-requiring op seen in forward owns number
``torch.autograd._get_sequence_nr() - 1``; in backward,
``torch._C._current_autograd_node()._sequence_nr()`` looks it up. Sequence
numbers are per thread: forwards on several threads at once can mix names up.
Ops recomputed in backward (activation checkpointing) count as ``bprop``.

NVTX message
------------
The nsys reader only has the range's text, so the payload rides in it, in
the style of ``emit_nvtx`` suffixes that ``perfguard.trace.names`` parses::

    message  = name [", sizes = " json] [", dtypes = " json] [", concrete = " json]
               ", dir = " ("fprop" | "bprop") [", site = " site]

* ``name`` and ``site`` have ``%`` written ``%25`` and ``,`` written ``%2C``;
* ``json`` is compact JSON (``[[4,16],[8,16],[8]]``) in which ``", "``
  inside strings is written ``",\\u0020"``;

so ``", "`` occurs only between fields and any name round-trips. ``sizes``,
``dtypes`` and ``concrete`` align with the op's schema inputs, defaults
included, exactly like the Kineto ``Input Dims``/``Input type``/``Concrete
Inputs`` args: a tensor gives its shape, its dtype in Kineto spelling
(``float``, ``c10::Half``, ``long int``) and ``""``; a tensor list
``TensorList``; a number ``Scalar`` and a number list ``ScalarList`` with
its value as text (``"[2, 2]"``); anything else ``""``. ``concrete`` is
sent for convolution and pooling ops only (stride, padding, dilation,
groups: what their FLOPs need). ``site`` is ``file:line`` of the first
frame outside torch and perfguard (for a backward op: its forward op's).
Module ranges carry ``dir`` and ``site`` only. There is no ``seq``: the
``nvtx`` package registers every distinct message once and keeps it, so a
per-call number would grow that table without bound.

Cost: payloads and call sites are built only while an NVTX tool (nsys) is
attached, profiler mirrors only while a torch profiler records; otherwise
an op pays the Python dispatch mode and the name bookkeeping. See
``benchmarks/instrument_overhead.py``. Eager mode only: a dispatch mode
makes ``torch.compile`` fall back.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# the module, not its names: tests replace ``_nvtx_domain`` in it
from perfguard.capture import ranges as _annotate  # noqa: E402

_PERFGUARD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

__all__ = ["Instrumentation", "encode_message", "instrument", "kineto_dtype"]

DIRECTIONS = ("fprop", "bprop")

#: torch dtype name -> the spelling Kineto writes in ``Input type`` (c10 TypeMeta names).
KINETO_DTYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "int64": "long int",
    "int32": "int",
    "int16": "short int",
    "int8": "signed char",
    "uint8": "unsigned char",
    "uint16": "short unsigned int",
    "uint32": "unsigned int",
    "uint64": "long unsigned int",
    "bool": "bool",
    "complex32": "c10::complex<c10::Half>",
    "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>",
    "float8_e4m3fn": "c10::Float8_e4m3fn",
    "float8_e5m2": "c10::Float8_e5m2",
    "float8_e4m3fnuz": "c10::Float8_e4m3fnuz",
    "float8_e5m2fnuz": "c10::Float8_e5m2fnuz",
    "qint8": "c10::qint8",
    "quint8": "c10::quint8",
    "qint32": "c10::qint32",
}

#: Ops whose scalar inputs travel in ``concrete`` (convolutions, pooling): FLOPs need them.
_CONCRETE_OPS = re.compile(r"conv(?!ert)|pool")
#: Forward-op names kept for backward naming; the oldest half goes past this.
_FWD_LIMIT = 1 << 18
#: NVTX attribute objects cached per distinct message.
_ATTR_LIMIT = 1 << 16


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace(",", "%2C")


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _json(value: Any) -> str:
    return _ENCODER.encode(value).replace(", ", ",\\u0020")


def encode_message(
    name: str,
    *,
    sizes: list[Any] | None = None,
    dtypes: list[str] | None = None,
    concrete: list[str] | None = None,
    direction: str = "fprop",
    site: str | None = None,
) -> str:
    """The NVTX message of a range (grammar in the module docstring).

    ``perfguard.trace.names.parse_range_names`` gives back ``name``,
    ``input_shapes`` (``sizes`` as compact JSON), ``dtypes``,
    ``concrete_inputs``, ``call_site`` and ``bprop``.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'fprop' or 'bprop', not {direction!r}")
    return _message(
        name,
        None if sizes is None else _json(sizes),
        None if dtypes is None else _json(dtypes),
        None if concrete is None else _json(concrete),
        direction,
        site,
    )


def _message(
    name: str,
    sizes: str | None,
    dtypes: str | None,
    concrete: str | None,
    direction: str,
    site: str | None,
) -> str:
    """:func:`encode_message` on fields already written as (escaped) JSON text."""
    text = _escape(name)
    if sizes is not None:
        text += ", sizes = " + sizes
    if dtypes is not None:
        text += ", dtypes = " + dtypes
    if concrete is not None:
        text += ", concrete = " + concrete
    text += ", dir = " + direction
    if site is not None:
        text += ", site = " + _escape(site)
    return text


def kineto_dtype(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``c10::Half``: the dtype as the torch profiler spells it."""
    short = str(dtype).removeprefix("torch.")
    return KINETO_DTYPES.get(short, short)


def instrument(
    model: torch.nn.Module | None = None,
    *,
    ops: bool = False,
    call_site: bool = True,
    domain: str | None = None,
    color: str | int | None = None,
) -> Instrumentation:
    """Ranges for modules and aten ops, with DLProf's hierarchical names (module docstring).

    Use ``with perfguard.instrument(model): train_step()`` or keep the handle and
    ``enable()``/``disable()`` it. ``model`` limits module ranges to its subtree
    (ops are ranged everywhere in scope: loss, backward, optimizer). ``ops=True``
    adds a range per aten op, as DLProf's PyTorch plugin did; it is off by default
    because it costs +20-30% of a CPU training step (benchmarks/instrument_overhead.py)
    where module ranges cost under 2%; ``call_site=False`` skips the
    stack walk for ``site`` under nsys. ``domain``/``color`` go to NVTX.
    """
    return Instrumentation(model, ops=ops, call_site=call_site, domain=domain, color=color)


@dataclass(slots=True)
class _Frame:
    """A running module call: its path, its children's counts, its open range."""

    path: str
    counters: dict[str, int]
    module: Any
    token: Any


@dataclass(frozen=True)
class _OpInfo:
    """What is worked out once per op overload."""

    leaf: str
    skip: bool
    concrete: bool
    #: (name, encoded default) per schema input; the default as (sizes, dtype, concrete) text
    schema: tuple[tuple[str, tuple[str, str, str]], ...]


def _numbered(counters: dict[str, int], leaf: str) -> str:
    n = counters.get(leaf, 0) + 1
    counters[leaf] = n
    return leaf if n == 1 else f"{leaf}({n})"


_ACTIVE: Instrumentation | None = None
_ACTIVE_LOCK = threading.Lock()


class Instrumentation:
    """The handle :func:`instrument` returns: a context manager, or ``enable``/``disable``.

    Only one can be enabled at a time. ``enable`` and ``disable`` must run on the
    same thread (the op hook is a thread-local ``TorchDispatchMode``; autograd
    carries it into its own threads).
    """

    def __init__(
        self,
        model: torch.nn.Module | None,
        *,
        ops: bool,
        call_site: bool,
        domain: str | None,
        color: str | int | None,
    ) -> None:
        self.model = model
        self.ops = ops
        self.call_site = call_site
        self.domain = domain
        self.color = color
        self._enabled = False
        self._hooks: list[Any] = []
        self._mode: Any = None
        self._nvtx: Any = None
        self._attrs: dict[str, Any] = {}
        self._local = threading.local()
        self._members: set[int] | None = None
        self._static: dict[int, str] = {}
        self._children: dict[int, dict[int, str]] = {}
        self._fwd: dict[int, tuple[str, str | None]] = {}
        self._ops: dict[Any, _OpInfo] = {}
        self._internal: dict[Any, bool] = {}
        self._prefixes: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """True between :meth:`enable` and :meth:`disable`."""
        return self._enabled

    def __enter__(self) -> Instrumentation:
        return self.enable()

    def __exit__(self, *exc: object) -> None:
        self.disable()

    def enable(self) -> Instrumentation:
        """Start emitting ranges (module hooks, and the op dispatch mode on this thread)."""
        global _ACTIVE
        try:
            import torch
            from torch.nn.modules import module as nn_module
        except ImportError as exc:
            raise ImportError(
                f"perfguard.instrument needs PyTorch ({exc}); install it, e.g. "
                "pip install 'perfguard[torch]'"
            ) from exc

        with _ACTIVE_LOCK:
            if _ACTIVE is not None:
                raise RuntimeError(
                    "perfguard.instrument is already enabled; disable the active one first "
                    "(instrumentations do not nest)"
                )
            _ACTIVE = self
        self._nvtx = _annotate._nvtx_domain(self.domain)
        self._attrs = {}
        self._fwd = {}
        self._local = threading.local()
        self._prefixes = (
            os.path.dirname(torch.__file__) + os.sep,
            _PERFGUARD_DIR,
            "<frozen ",
        )
        if self.model is not None:
            root = "/" + type(self.model).__name__
            self._static = {}
            for n, m in self.model.named_modules(remove_duplicate=False):
                self._static.setdefault(id(m), root + ("/" + n.replace(".", "/") if n else ""))
            self._members = set(self._static)
        else:
            self._static, self._members = {}, None
        self._hooks = [
            nn_module.register_module_forward_pre_hook(self._pre_hook),
            nn_module.register_module_forward_hook(self._post_hook, always_call=True),
        ]
        mode_class = _bind_torch()
        if self.ops:
            self._mode = mode_class(self)
            self._mode.__enter__()
        self._enabled = True
        return self

    def disable(self) -> None:
        """Stop emitting ranges; a no-op when not enabled."""
        global _ACTIVE
        if not self._enabled:
            return
        try:
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
        finally:
            self._mode = None
            for handle in self._hooks:
                handle.remove()
            self._hooks = []
            self._enabled = False
            # drop what refers to the model and to autograd nodes
            self._local = threading.local()
            self._fwd, self._children, self._attrs = {}, {}, {}
            with _ACTIVE_LOCK:
                _ACTIVE = None

    # --- ranges ---------------------------------------------------------------------------

    def _begin(self, path: str, message: str | None) -> Any:
        """Open the NVTX range (``message``) and the profiler mirror (``path``)."""
        nv = self._nvtx
        if nv is not None:
            attrs = self._attrs.get(message)  # type: ignore[arg-type]
            if attrs is None:
                if len(self._attrs) >= _ATTR_LIMIT:
                    self._attrs.clear()
                attrs = nv.get_event_attributes(message=message, color=self.color)
                self._attrs[message] = attrs  # type: ignore[index]
            nv.push_range(attrs)
        if _profiler_enabled() and _annotate._profiler_recording():
            return _annotate._record_enter(path)
        return None

    def _end(self, token: Any) -> None:
        if token is not None:
            _annotate._record_exit(token)
        if self._nvtx is not None:
            self._nvtx.pop_range()

    def _stack(self) -> list[_Frame]:
        d = self._local.__dict__
        stack = d.get("stack")
        if stack is None:
            stack = d["stack"] = []
        return stack

    def _site(self) -> str | None:
        """``file:line`` of the innermost frame outside torch and perfguard."""
        frame = sys._getframe(2)
        internal = self._internal
        while frame is not None:
            code = frame.f_code
            inside = internal.get(code)
            if inside is None:
                inside = internal[code] = code.co_filename.startswith(self._prefixes)
            if not inside:
                return f"{code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back  # type: ignore[assignment]
        return None

    # --- modules --------------------------------------------------------------------------

    def _segment(self, parent: Any, child: Any) -> str:
        """The name of ``child`` as seen from ``parent`` (cached per parent)."""
        names = self._children.get(id(parent))
        if names is None or id(child) not in names:
            if names is None:
                names = self._children[id(parent)] = {}
            for n, m in parent._modules.items():
                if m is not None:
                    names.setdefault(id(m), n)
            if id(child) not in names:
                found = next(
                    (n for n, m in parent.named_modules(remove_duplicate=False) if m is child),
                    None,
                )
                names[id(child)] = found.replace(".", "/") if found else type(child).__name__
        return names[id(child)]

    def _pre_hook(self, module: Any, args: Any) -> None:
        if self._members is not None and id(module) not in self._members:
            return
        stack = self._stack()
        if stack:
            parent = stack[-1]
            leaf = self._segment(parent.module, module)
            path = parent.path + "/" + _numbered(parent.counters, leaf)
        else:
            path = self._static.get(id(module)) or "/" + type(module).__name__
        message = None
        if self._nvtx is not None:
            site = self._site() if self.call_site else None
            message = encode_message(path, site=site)
        stack.append(_Frame(path, {}, module, self._begin(path, message)))

    def _post_hook(self, module: Any, args: Any, output: Any) -> None:
        stack = self._stack()
        if stack and stack[-1].module is module:
            self._end(stack.pop().token)

    # --- ops ------------------------------------------------------------------------------

    def _op_info(self, func: Any) -> _OpInfo:
        schema = func._schema
        leaf = schema.name
        info = _OpInfo(
            leaf=leaf,
            skip=func.namespace == "profiler",
            concrete=_CONCRETE_OPS.search(leaf) is not None,
            schema=tuple(
                (a.name, _encode(a.default_value if a.has_default_value() else None))
                for a in schema.arguments
            ),
        )
        self._ops[func] = info
        return info

    def _remember(self, seq: int, path: str, site: str | None) -> None:
        """Name the autograd node ``seq`` after its forward op (bounded)."""
        fwd = self._fwd
        if len(fwd) >= _FWD_LIMIT:
            for key in list(fwd)[: _FWD_LIMIT // 2]:
                del fwd[key]
        fwd[seq] = (path, site)

    def _op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        info = self._ops.get(func) or self._op_info(func)
        if info.skip:
            return func(*args, **kwargs)
        local = self._local.__dict__
        nv = self._nvtx
        task = _graph_task_id()
        site = None
        if task == -1:
            stack = local.get("stack")
            if stack:
                parent = stack[-1]
                path = parent.path + "/" + _numbered(parent.counters, info.leaf)
            else:
                path = "/" + info.leaf
            direction = "fprop"
            if nv is not None and self.call_site:
                site = self._site()
            seq = _sequence_nr()
            if seq != local.get("seq"):
                local["seq"] = seq
                if _grad_enabled() and _needs_grad(args):
                    self._remember(seq - 1, path, site)
        else:
            node = _current_node()
            if node is not local.get("bwd_node") or task != local.get("bwd_task"):
                # a new node execution: its ops are counted afresh under its forward op
                local["bwd_node"], local["bwd_task"] = node, task
                local["bwd_counters"] = {}
                found = self._fwd.get(node._sequence_nr()) if node is not None else None
                if found is None:
                    kind = node.name().rsplit("::", 1)[-1] if node is not None else "backward"
                    found = ("/" + kind, None)
                local["bwd_base"] = found
            base, site = local["bwd_base"]
            path = base + "/" + _numbered(local["bwd_counters"], info.leaf)
            direction = "bprop"
        if nv is None and not (_profiler_enabled() and _annotate._profiler_recording()):
            return func(*args, **kwargs)
        message = None
        if nv is not None:
            message = _message(path, *_payload(info, args, kwargs), direction, site)
        token = self._begin(path, message)
        try:
            return func(*args, **kwargs)
        finally:
            self._end(token)


# --- torch-side helpers, bound on first use -------------------------------------------------

_graph_task_id: Any = None
_current_node: Any = None
_sequence_nr: Any = None
_grad_enabled: Any = None
_Tensor: Any = None
_profiler_enabled: Any = None
_ENUMS: Any = ()
_DTYPE_JSON: dict[Any, str] = {}
_MODE_CLASS: Any = None


def _bind_torch() -> Any:
    """Bind the torch functions the hot paths call; returns the dispatch mode class."""
    global _MODE_CLASS, _graph_task_id, _current_node, _sequence_nr, _grad_enabled, _Tensor
    global _profiler_enabled, _ENUMS
    if _MODE_CLASS is not None:
        return _MODE_CLASS
    import torch  # optional and heavy: only when instrumentation is switched on
    from torch.utils._python_dispatch import TorchDispatchMode

    _graph_task_id = torch._C._current_graph_task_id
    _current_node = torch._C._current_autograd_node
    _sequence_nr = torch._C._autograd._get_sequence_nr
    _grad_enabled = torch.is_grad_enabled
    _profiler_enabled = torch._C._autograd._profiler_enabled
    _ENUMS = (torch.dtype, torch.layout, torch.memory_format)
    _Tensor = torch.Tensor

    class _OpRanges(TorchDispatchMode):
        """Every aten op, through :meth:`Instrumentation._op`."""

        def __init__(self, owner: Instrumentation) -> None:
            super().__init__()
            self.owner = owner

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            return self.owner._op(func, args, kwargs or {})

    _MODE_CLASS = _OpRanges
    return _OpRanges


def _needs_grad(args: tuple[Any, ...]) -> bool:
    """True when a tensor input requires grad (so the op made an autograd node)."""
    for a in args:
        if isinstance(a, _Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)):
            if any(isinstance(t, _Tensor) and t.requires_grad for t in a):
                return True
    return False


def _dtype_json(dtype: Any) -> str:
    """``torch.float16`` -> ``"c10::Half"`` (with the JSON quotes), cached."""
    text = _DTYPE_JSON.get(dtype)
    if text is None:
        text = _DTYPE_JSON[dtype] = json.dumps(kineto_dtype(dtype))
    return text


def _shape_json(t: Any) -> str:
    return str(list(t.shape)).replace(" ", "")


def _encode(v: Any) -> tuple[str, str, str]:
    """One input as Kineto records it: (shape JSON, dtype JSON, concrete value)."""
    if isinstance(v, _Tensor):
        return _shape_json(v), _dtype_json(v.dtype), ""
    if isinstance(v, (bool, int, float, complex)):
        return "[]", '"Scalar"', str(v)
    if isinstance(v, (list, tuple)):
        # aten lists are homogeneous: the first element tells the kind
        first = v[0] if v else 0
        if isinstance(first, _Tensor):
            if all([isinstance(t, _Tensor) for t in v]):
                return "[" + ",".join([_shape_json(t) for t in v]) + "]", '"TensorList"', ""
            return "[]", '""', ""  # a list of optional tensors with holes
        if isinstance(first, (bool, int, float)):
            return "[]", '"ScalarList"', str(list(v))
        return "[]", '""', ""
    if isinstance(v, _ENUMS):  # Kineto records these as their integer codes
        return "[]", '"Scalar"', ""
    return "[]", '""', ""


def _payload(
    info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, str, str | None]:
    """Kineto-aligned ``sizes``, ``dtypes`` and (conv/pool only) ``concrete`` as JSON text.

    Inputs follow the schema, defaults filled in, as Kineto records them (a dispatch
    mode gets positional inputs first, keyword-only ones in ``kwargs``). Built as text
    directly: the same bytes as :func:`_json` of the lists, at a fraction of the cost.
    """
    sizes: list[str] = []
    dtypes: list[str] = []
    concrete: list[str] = []
    n = len(args)
    for i, (name, default) in enumerate(info.schema):
        if i < n:
            v = args[i]
            if isinstance(v, _Tensor):  # the common case, inline
                sizes.append(str(list(v.shape)).replace(" ", ""))
                dtypes.append(_DTYPE_JSON.get(v.dtype) or _dtype_json(v.dtype))
                concrete.append("")
                continue
            size, dtype, value = _encode(v)
        elif kwargs and name in kwargs:
            size, dtype, value = _encode(kwargs[name])
        else:
            size, dtype, value = default
        sizes.append(size)
        dtypes.append(dtype)
        concrete.append(value)
    return (
        "[" + ",".join(sizes) + "]",
        "[" + ",".join(dtypes) + "]",
        # str() of numbers and number lists: no quote or backslash to escape
        ('["' + '","'.join(concrete) + '"]').replace(", ", ",\\u0020") if info.concrete else None,
    )
