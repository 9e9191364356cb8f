"""Process-wide allocator settings for the ``perfguard`` command.

Analysing a large capture allocates and frees many arrays of tens of MB.
glibc serves each from a fresh ``mmap`` and unmaps it on free, so every new
array is a new set of pages the kernel must zero: on the 1M-kernel
benchmark, ``perf`` put 30 % of all CPU time in the kernel's
``clear_page`` and the run spent 11 s in the kernel against 15 s in
user code. Keeping freed memory in the heap for reuse (no ``mmap`` for
large blocks, no trimming, one arena) cut that to 4 s, with the same peak
RSS (the peak is set by what is alive at once, not by what was freed).

numpy also asks the kernel for transparent huge pages (``madvise``) for
every array of 4 MB or more. For this process that costs more than it
saves: each array is touched a few times, and the kernel zeroes (and,
with ``defrag=madvise``, compacts memory for) 2 MB pages on the first
touch. On the same benchmark, turning it off took system time from 1.55 s
to 0.67 s and the run from 5.4 s to 4.6 s, at the same peak RSS.

Only the command line does this, for its own short-lived process
(``perfguard.cli.main`` called with no arguments, as the console script and
``python -m perfguard`` call it): a library import, or ``main([...])``
called from a test or a notebook, must not change how that process
allocates. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any

# mallopt parameters (glibc <malloc.h>)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
#: free heap below which :func:`release_free_pages` leaves the pages resident
TRIM_MIN_FREE = 256 << 20


def reuse_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse, and numpy not to ask for huge pages;
    True when glibc took the settings."""
    if not sys.platform.startswith("linux"):
        return False
    _no_huge_pages()
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int), ctypes.c_int)
    if mallopt is None:  # not glibc (musl has no mallopt)
        return False
    ok = mallopt(_M_MMAP_MAX, 0)  # large blocks from the heap, not one mmap each
    ok &= mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # keep freed memory for the next array
    ok &= mallopt(_M_ARENA_MAX, 1)  # reader threads share the heap instead of their own
    return bool(ok)


def release_free_pages() -> None:
    """Give the kernel back the pages of freed heap memory (``malloc_trim``).

    With freed memory kept in the heap, the pieces a reader concatenated
    and dropped stay resident: after reading the 1M-kernel Kineto trace
    1.6 GB of the 2.9 GB RSS was free memory, in holes too small for the
    analysis' large arrays, which then grew the heap past it (peak 4.0 GB;
    3.5 GB with this call between reading and analysing). It costs the page
    faults of reusing those holes later (0.06 s at 50k kernels, with 85 MiB
    free), so it is skipped below :data:`TRIM_MIN_FREE` of free heap.
    """
    trim = _libc_function("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)
    if trim is None:
        return
    free = _free_heap()
    if free is None or free >= TRIM_MIN_FREE:
        trim(0)


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _free_heap() -> int | None:
    """Bytes of freed memory the heap holds (``mallinfo2().fordblks``); None if unknown
    (not glibc, or glibc before 2.33)."""
    info = _libc_function("mallinfo2", (), _MallInfo2)
    return None if info is None else int(info().fordblks)


@functools.cache
def _libc_function(name: str, argtypes: tuple[Any, ...], restype: Any) -> Any | None:
    """glibc's ``name`` with its C signature, or None where there is no such function
    (not Linux, not glibc). Looked up once, when first needed: finding the C library
    costs a few ms, not to be paid by every command at start-up."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = getattr(_libc(), name)
    except (OSError, AttributeError):
        return None
    func.argtypes = list(argtypes)
    func.restype = restype
    return func


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _no_huge_pages() -> None:
    """Stop numpy's ``madvise(MADV_HUGEPAGE)`` on large arrays (see the module doc)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)
