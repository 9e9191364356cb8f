"""User annotations that both capture backends see.

:class:`annotate` opens an NVTX range (through the ``nvtx`` package, for
nsys) *and*, when PyTorch is already imported and its profiler is
recording, a ``record_function`` range (a ``user_annotation`` event in the
Kineto trace), so one annotation works whichever backend ran the test.
torch is never imported here: a profiler can only be recording if the
program imported torch itself, so ``sys.modules`` is checked instead.

:func:`annotate_function` wraps a function of someone else's package in
place (no source edit), :func:`unannotate_function` puts it back, and
:func:`name_thread` names the calling OS thread. These three were asked for
in the NVTX Python announcement.

When no NVTX tool is attached (no nsys), the ``nvtx`` package hands out a
dummy domain and every NVTX call here is skipped; nothing fails.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import nvtx

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "annotate",
    "annotate_function",
    "name_thread",
    "unannotate_function",
]


def _nvtx_domain(name: str | None) -> Any | None:
    """The live ``nvtx.Domain`` called ``name``, or None when no NVTX tool is attached.

    Tests replace this function to record what would reach nsys.
    """
    domain = nvtx.get_domain(name)
    return domain if isinstance(domain, nvtx.Domain) else None


# --- the torch profiler side ------------------------------------------------------------

#: ``ActiveProfilerType.NVTX`` (``emit_nvtx``): its record functions would become a second
#: NVTX range next to ours, so ranges are not mirrored while it is the active profiler.
_NVTX_PROFILER = "NVTX"


def _profiler_recording() -> bool:
    """True when a torch profiler (Kineto) is recording on this thread; never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        autograd = torch._C._autograd
        return bool(autograd._profiler_enabled()) and (
            autograd._profiler_type().name != _NVTX_PROFILER
        )
    except AttributeError:  # a torch too old or too new for these hooks: no mirror
        return False


_RECORD: tuple[Callable[[str], Any], Callable[[Any], None]] | None = None


def _record_functions() -> tuple[Callable[[str], Any], Callable[[Any], None]]:
    """``(enter, exit)`` of a ``user_annotation`` range, looked up once torch is in use.

    The private C entry points ``record_function`` itself is built on are used when
    present (no dispatcher op, so no ``TorchDispatchMode`` sees them, and cheaper);
    otherwise the public ``torch.autograd.profiler.record_function``.
    """
    global _RECORD
    if _RECORD is None:
        torch = sys.modules["torch"]
        enter = getattr(torch._C._autograd, "_record_function_with_args_enter", None)
        leave = getattr(torch._C._autograd, "_record_function_with_args_exit", None)
        if enter is None or leave is None:

            def enter(name: str) -> Any:
                rf = torch.autograd.profiler.record_function(name)
                rf.__enter__()
                return rf

            def leave(rf: Any) -> None:
                rf.__exit__(None, None, None)

        _RECORD = (enter, leave)
    return _RECORD


def _record_enter(name: str) -> Any:
    """Open a ``record_function`` range named ``name``; returns the handle to close.

    Only call it after :func:`_profiler_recording` said True (torch is imported).
    """
    return _record_functions()[0](name)


def _record_exit(handle: Any) -> None:
    """Close a range opened by :func:`_record_enter`."""
    _record_functions()[1](handle)


class _Range:
    """One message, pushed to NVTX and mirrored to the torch profiler (internal)."""

    __slots__ = ("message", "domain", "attributes")

    def __init__(
        self,
        message: str,
        color: str | int | None = None,
        domain: str | None = None,
        category: str | int | None = None,
        payload: int | float | None = None,
    ) -> None:
        self.message = message
        self.domain = _nvtx_domain(domain)
        self.attributes = (
            self.domain.get_event_attributes(
                message=message, color=color, category=category, payload=payload
            )
            if self.domain is not None
            else None
        )

    def begin(self) -> Any:
        """Open the range; returns the token :meth:`end` needs."""
        if self.domain is not None:
            self.domain.push_range(self.attributes)
        return _record_enter(self.message) if _profiler_recording() else None

    def end(self, token: Any) -> None:
        """Close the range opened by :meth:`begin` (same thread)."""
        if token is not None:
            _record_exit(token)
        if self.domain is not None:
            self.domain.pop_range()


class annotate:  # noqa: N801 - lower case like nvtx.annotate, which it stands in for
    """An annotated range, as decorator or context manager, visible to nsys and torch.profiler.

    Args:
        message: the range's name. As a decorator it defaults to the function's
            ``__qualname__``; as a context manager to the empty string (as in ``nvtx``).
        color: a colour for the nsys timeline (``nvtx`` names, matplotlib names, or ARGB int).
        domain: the NVTX domain (default: NVTX's default domain).
        category: an NVTX category (name or number) within the domain.

    The torch profiler only gets the name; colour, domain and category are NVTX notions.
    One object may be entered again, recursively or from several threads.
    """

    def __init__(
        self,
        message: str | None = None,
        color: str | int | None = None,
        domain: str | None = None,
        category: str | int | None = None,
    ) -> None:
        self.message = message
        self.color = color
        self.domain = domain
        self.category = category
        self._range: _Range | None = None
        self._local: threading.local | None = None

    def _get_range(self) -> _Range:
        if self._range is None:
            self._range = _Range(self.message or "", self.color, self.domain, self.category)
        return self._range

    def __enter__(self) -> annotate:
        if self._local is None:
            self._local = threading.local()
        tokens = self._local.__dict__.setdefault("tokens", [])
        tokens.append(self._get_range().begin())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._local is not None, "annotate.__exit__ without __enter__"
        self._get_range().end(self._local.tokens.pop())

    def __call__(self, func: F) -> F:
        """Decorate ``func``: every call runs inside the range."""
        rng = (
            self._get_range()
            if self.message is not None
            else _Range(func.__qualname__, self.color, self.domain, self.category)
        )

        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            token = rng.begin()
            try:
                return func(*args, **kwargs)
            finally:
                rng.end(token)

        return inner  # type: ignore[return-value]


# --- wrapping third-party functions in place ---------------------------------------------

#: (id(owner), attr) -> (owner, attr, original attribute as found in the owner)
_ANNOTATED: dict[tuple[int, str], tuple[Any, str, Any]] = {}
_MARK = "__perfguard_annotated__"


def _resolve(target: str | object, attr: str | None) -> tuple[Any, str, str]:
    """``(owner, attribute, default message)`` for the two call forms."""
    if attr is not None:
        owner_name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
        owner_name = owner_name or type(target).__name__
        return target, attr, f"{owner_name}.{attr}"
    if not isinstance(target, str):
        raise TypeError(
            f"annotate_function({target!r}): give 'package.module:function' or (object, 'attr')"
        )
    if ":" in target:
        module_name, _, path = target.partition(":")
        owner: Any = importlib.import_module(module_name)
    else:  # 'package.module.function': the longest importable prefix is the module
        parts = target.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            try:
                owner = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            path = ".".join(parts[cut:])
            break
        else:
            raise ValueError(
                f"annotate_function({target!r}): no importable module in the name; "
                "write it as 'package.module:function'"
            )
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    if not name:
        raise ValueError(f"annotate_function({target!r}): no function named after the module")
    return owner, name, target.replace(":", ".")


def annotate_function(
    target: str | object,
    attr: str | None = None,
    *,
    message: str | None = None,
    color: str | int | None = None,
    domain: str | None = None,
    category: str | int | None = None,
) -> Callable[..., Any]:
    """Wrap a function in place so every call is an :class:`annotate` range.

    For code you do not own: ``annotate_function("numpy.linalg:solve")``,
    ``annotate_function("pkg.mod:Class.method")`` or
    ``annotate_function(obj, "attr")``. Static and class methods keep their kind.
    Calling it twice on the same attribute is a no-op. Returns the wrapper.

    Callers that copied the function earlier (``from pkg.mod import func`` before
    this call) keep the unwrapped one: wrap before they import it, or wrap their copy.
    """
    owner, name, default_message = _resolve(target, attr)
    raw = inspect.getattr_static(owner, name)
    if getattr(raw, _MARK, False) or getattr(getattr(raw, "__func__", None), _MARK, False):
        return getattr(owner, name)
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    func = raw.__func__ if kind is not None else raw
    if not callable(func):
        raise TypeError(f"annotate_function: {default_message} is not callable ({raw!r})")
    wrapper = annotate(message or default_message, color, domain, category)(func)
    setattr(wrapper, _MARK, True)
    setattr(owner, name, kind(wrapper) if kind is not None else wrapper)
    _ANNOTATED[(id(owner), name)] = (owner, name, raw)
    return wrapper


def unannotate_function(target: str | object, attr: str | None = None) -> None:
    """Undo :func:`annotate_function` for the same target (raises if it was not wrapped)."""
    owner, name, default_message = _resolve(target, attr)
    entry = _ANNOTATED.pop((id(owner), name), None)
    if entry is None:
        raise ValueError(
            f"unannotate_function: {default_message} was not wrapped by annotate_function"
        )
    setattr(owner, name, entry[2])


# --- thread names -------------------------------------------------------------------------

_PR_SET_NAME = 15  # linux/prctl.h
_OS_NAME_MAX = 15  # TASK_COMM_LEN - 1


def _libc() -> Any | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def _libnvtoolsext() -> Any | None:
    path = ctypes.util.find_library("nvToolsExt")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def name_thread(name: str) -> tuple[str, ...]:
    """Name the calling thread for the timelines; returns which names were set.

    * ``"python"``: ``threading.current_thread().name`` (always).
    * ``"os"``: the OS thread name (Linux ``prctl(PR_SET_NAME)``, cut to 15 bytes;
      macOS ``pthread_setname_np``). nsys shows OS thread names, and the torch
      profiler writes them into its ``thread_name`` rows (``thread <tid> (<name>)``).
      Naming the main thread renames the process in ``ps``/``top`` too.
    * ``"nvtx"``: ``nvtxNameOsThreadA``, only where a ``libnvToolsExt`` shared library
      is installed (CUDA toolkit). The ``nvtx`` Python package has no thread-naming
      call and its NVTX entry points are not exported, so without that library
      nsys only gets the OS name.
    """
    threading.current_thread().name = name
    done = ["python"]
    encoded = name.encode("utf-8", "replace")
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux"):
        if libc.prctl(_PR_SET_NAME, ctypes.c_char_p(encoded[:_OS_NAME_MAX]), 0, 0, 0) == 0:
            done.append("os")
    elif libc is not None and sys.platform == "darwin":
        if libc.pthread_setname_np(ctypes.c_char_p(encoded[:63])) == 0:
            done.append("os")
    lib = _libnvtoolsext()
    if lib is not None and hasattr(lib, "nvtxNameOsThreadA"):
        lib.nvtxNameOsThreadA(ctypes.c_uint32(threading.get_native_id()), ctypes.c_char_p(encoded))
        done.append("nvtx")
    return tuple(done)
