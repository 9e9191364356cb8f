"""Valgrind client requests from Python, with no compiler and no torch.

Callgrind is steered from inside the program it runs by *client requests*: a
magic instruction sequence that does nothing on a real CPU and that
Valgrind's translator recognises. ``valgrind.h`` writes it as inline
assembly, which Python cannot; so this module puts the same bytes for
x86-64 in one executable page and calls them through ``ctypes``. A natively
running process executes them as no-ops and gets the default back, so the
measured code needs no branch of its own.

The sequence and the request numbers are facts of Valgrind's public headers
(``/usr/include/valgrind/valgrind.h``, ``callgrind.h``, Valgrind 3.19):
on amd64, ``rolq $3, %rdi; rolq $13, %rdi; rolq $61, %rdi; rolq $51, %rdi``
(rotations adding up to 128 bits, so ``%rdi`` is unchanged) then
``xchgq %rbx, %rbx``, with ``%rax`` pointing at six words (request and five
arguments) and the result in ``%rdx``. ``torch._C._valgrind_toggle`` offers
only the toggle; starting instrumentation late (``--instr-atstart=no``) is
what makes importing torch under Callgrind cheap, and it needs
``START_INSTRUMENTATION``, which torch does not expose.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys
from collections.abc import Callable
from functools import lru_cache

#: ``VG_USERREQ__RUNNING_ON_VALGRIND`` (valgrind.h)
RUNNING_ON_VALGRIND = 0x1001
#: ``VG_USERREQ_TOOL_BASE('C','T')`` (callgrind.h): the first Callgrind request
_CT = (ord("C") << 24) | (ord("T") << 16)
DUMP_STATS = _CT
ZERO_STATS = _CT + 1
TOGGLE_COLLECT = _CT + 2
DUMP_STATS_AT = _CT + 3
START_INSTRUMENTATION = _CT + 4
STOP_INSTRUMENTATION = _CT + 5

#: ``uint64 request(uint64 *args, uint64 default)``: args in %rdi, default in %rsi
_CODE = bytes.fromhex(
    "4889f8"  # mov %rdi, %rax        the argument block
    "4889f2"  # mov %rsi, %rdx        the default result
    "48c1c703"
    "48c1c70d"
    "48c1c73d"
    "48c1c733"  # the special-instruction preamble
    "4887db"  # xchg %rbx, %rbx       %rdx = client_request(%rax)
    "4889d0"  # mov %rdx, %rax
    "c3"  # ret
)

_Request = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)


def supported() -> str | None:
    """Why client requests cannot be made here, or None."""
    if sys.platform != "linux":
        return f"Valgrind client requests need Linux (this is {sys.platform})"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"Valgrind client requests are written for x86-64 (this is {platform.machine()})"
    return None


@lru_cache(maxsize=1)
def _request_function() -> tuple[mmap.mmap, Callable[[int, int], int]]:
    reason = supported()
    if reason:
        raise OSError(reason)
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(_CODE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    return page, _Request(address)  # the page must outlive the function pointer


def request(code: int, arg1: int = 0, default: int = 0) -> int:
    """Make client request ``code`` with one argument; ``default`` when not under Valgrind."""
    args = (ctypes.c_uint64 * 6)(code, arg1, 0, 0, 0, 0)
    return int(_request_function()[1](ctypes.addressof(args), default))


def running_on_valgrind() -> bool:
    """Whether this process runs under Valgrind (False off Linux/x86-64)."""
    return supported() is None and request(RUNNING_ON_VALGRIND) > 0


def start_instrumentation() -> None:
    """Callgrind instruments from here on (``--instr-atstart=no`` ran the start-up plain)."""
    request(START_INSTRUMENTATION)


def toggle_collect() -> None:
    """Callgrind counts events from here until the next toggle (``--collect-atstart=no``)."""
    request(TOGGLE_COLLECT)


def zero_stats() -> None:
    request(ZERO_STATS)


def dump_stats_at(name: str) -> None:
    """Write the counts since the last dump to a new file whose trigger is ``name``."""
    text = ctypes.create_string_buffer(name.replace("\n", " ").encode("utf-8", "replace"))
    request(DUMP_STATS_AT, ctypes.addressof(text))
