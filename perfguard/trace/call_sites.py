"""The user's line behind an op: which frame of a Python stack is the user's code.

One rule for every source of call sites (the PyTorch profiler's Python frames and
``Call stack``, the capture's in-memory results): the innermost frame whose file is
not in torch, perfguard, the standard library or an installed package
(site-packages), nor a frame Python made up (``<frozen ...>``, ``<string>``,
built-ins). A call site reads ``file:line`` with the file as the profiler wrote it
(torch writes paths relative to their ``sys.path`` entry: ``model.py:63``). A Python
function event of torch's profiler carries the line its function starts on, not the
line that ran the op: such a site names the function, ``forward() at model.py:15``.

Frames are judged once per distinct file: a capture repeats a few hundred files
millions of times.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from functools import lru_cache

import numpy as np
import pandas as pd

from perfguard.trace.nesting import range_tree

#: ``file(line): function`` (torch's Python frames and ``Call stack`` entries)
_FRAME = re.compile(r"^(?P<file>[^()]+?)\((?P<line>\d+)\)(?::|$)")
#: path parts that are never the user's, wherever the trace was made
_LIBRARY_PART = re.compile(
    r"(?:^|[/\\])(?:site-packages|dist-packages|torch|perfguard|_pytest|pluggy|pyprof|"
    r"nvidia_dlprof_pytorch_nvtx|apex|tensorflow|jax|jaxlib|keras|numpy)(?:[/\\]|$)"
)


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """This interpreter's standard library and package folders, and perfguard's own."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(sorted(os.path.join(r, "") for r in roots if r))


@lru_cache(maxsize=4096)
def is_library_file(file: str) -> bool:
    """True when ``file`` (absolute, or relative to a ``sys.path`` entry as torch writes
    it) belongs to torch, perfguard, the standard library or an installed package."""
    file = file.strip()
    if not file or file.startswith("<"):
        return True
    if _LIBRARY_PART.search(file):
        return True
    roots = _library_roots()
    if os.path.isabs(file):
        return file.startswith(roots)
    top = re.split(r"[/\\]", file, maxsplit=1)[0].removesuffix(".py")
    if top in sys.stdlib_module_names:
        return True
    return any(os.path.exists(os.path.join(r, file)) for r in roots)


def site_text(file: str, line: int | str) -> str:
    """``file:line``, an absolute file under the working directory written relative to it
    (the project's ``model.py:63``, not ``/home/ci/build/src/model.py:63``)."""
    file = file.strip()
    if os.path.isabs(file):
        cwd = os.path.join(os.getcwd(), "")
        if file.startswith(cwd):
            file = file[len(cwd) :]
    return f"{file}:{line}"


#: between a function's name and where it starts, in a site that names the function
_FUNCTION_AT = "() at "


def names_function(site: str) -> bool:
    """Whether ``site`` names the function an op ran in (``forward() at model.py:15``: a
    place to read "in"), not the line that ran it (``model.py:63``: "at")."""
    return _FUNCTION_AT in site


def frame_site(frame: str, *, entry: bool = False) -> str | None:
    """``file:line`` of a ``file(line): function`` frame in the user's code, else None.
    ``entry``: the frame is a Python function event, whose line is where the function
    starts (its ``def``), not the line that ran the op: the site then names the function,
    ``forward() at model.py:15``, so no reader looks for the op on that line."""
    frame = frame.strip()
    m = _FRAME.match(frame)
    if m is None or is_library_file(m.group("file")):
        return None
    site = site_text(m.group("file"), m.group("line"))
    function = frame[m.end() :].strip() if entry else ""
    return f"{function}{_FUNCTION_AT}{site}" if function else site


def user_sites(frames: np.ndarray, *, entry: bool = False) -> np.ndarray:
    """:func:`frame_site` of each frame name (object array; None where not the user's),
    computed once per distinct name."""
    codes, uniques = pd.factorize(pd.Series(frames, dtype=object))
    sites = np.array(
        [frame_site(u, entry=entry) if isinstance(u, str) else None for u in uniques], object
    )
    out = np.full(len(codes), None, dtype=object)
    ok = codes >= 0
    out[ok] = sites[codes[ok]]
    return out


def first_user_frame(stacks: pd.Series) -> pd.Series:
    """The innermost user frame of each ``;``-joined stack, innermost first (torch's
    ``Call stack``), as ``file:line``; None where there is none. Once per distinct stack."""
    codes, uniques = pd.factorize(stacks)
    sites = np.array([_first(u) if isinstance(u, str) else None for u in uniques], dtype=object)
    out = np.full(len(codes), None, dtype=object)
    ok = codes >= 0
    out[ok] = sites[codes[ok]]
    return pd.Series(out, index=stacks.index, dtype=object)


def _first(stack: str) -> str | None:
    for frame in stack.split(";"):
        site = frame_site(frame)
        if site is not None:
            return site
    return None


def innermost_sites(
    op_start: np.ndarray,
    op_end: np.ndarray,
    op_tid: np.ndarray,
    frame_start: np.ndarray,
    frame_end: np.ndarray,
    frame_tid: np.ndarray,
    frame_site_of: np.ndarray,
) -> np.ndarray:
    """For each op, the site of the innermost frame that encloses it on its thread.

    ``frame_*`` are the user frames only (Python calls in the user's code: they nest,
    as calls do); ``frame_site_of`` their ``file:line``. Sorted by (thread, start), the
    candidate is the latest frame that started at or before the op; while it ended
    before the op did, its enclosing frame is the one to look at, so the walk goes up
    the frames' own nesting (computed here with a stack-free pass over depths).
    """
    n = len(op_start)
    out = np.full(n, None, dtype=object)
    if n == 0 or len(frame_start) == 0:
        return out
    order = np.lexsort((-frame_end, frame_start, frame_tid))
    fs, fe, ft = frame_start[order], frame_end[order], frame_tid[order]
    site = frame_site_of[order]
    parent = _parents(fs, fe, ft)
    key_f = _thread_key(ft, op_tid)
    fk, ok_ = key_f
    # position of the last frame with (tid, start) <= (op tid, op start)
    pos = _search(fk, fs, ok_, op_start) - 1
    cur = pos.copy()
    for _ in range(256):  # bounded by the frames' depth
        valid = cur >= 0
        same = np.zeros(n, dtype=bool)
        same[valid] = fk[cur[valid]] == ok_[valid]
        cur[valid & ~same] = -1
        valid = cur >= 0
        bad = np.zeros(n, dtype=bool)
        bad[valid] = fe[cur[valid]] < op_end[valid]
        if not bad.any():
            break
        cur[bad] = parent[cur[bad]]
    found = cur >= 0
    out[found] = site[cur[found]]
    return out


def _thread_key(frame_tid: np.ndarray, op_tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense thread codes shared by frames and ops."""
    both = np.concatenate([frame_tid, op_tid])
    _, codes = np.unique(both, return_inverse=True)
    return codes[: len(frame_tid)], codes[len(frame_tid) :]


def _search(fk: np.ndarray, fs: np.ndarray, ok: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``searchsorted`` over (thread, start) pairs, side right."""
    lo = np.searchsorted(fk, ok, side="left")
    hi = np.searchsorted(fk, ok, side="right")
    out = np.empty(len(ok), dtype=np.int64)
    for t in np.unique(ok):  # one pass per thread: a handful
        sel = ok == t
        a, b = lo[sel][0], hi[sel][0]
        out[sel] = a + np.searchsorted(fs[a:b], start[sel], side="right")
    return out


def _parents(fs: np.ndarray, fe: np.ndarray, ft: np.ndarray) -> np.ndarray:
    """Each sorted frame's enclosing frame (-1 for none): frames are calls, so they nest
    (:func:`perfguard.trace.nesting.range_tree`, vectorised)."""
    _, parent = range_tree(fs, fe, ft)
    return np.asarray(parent, dtype=np.int64)


def top_sites_text(sites: list[tuple[str, float]], top: int = 3) -> str:
    """``a.py:3`` for one site; ``a.py:3 (72%); b.py:9 (28%)`` for several, by time."""
    if not sites:
        return ""
    if len(sites) == 1:
        return sites[0][0]
    total = sum(max(t, 0.0) for _, t in sites) or 1.0
    shown = [f"{s} ({100 * max(t, 0.0) / total:.0f}%)" for s, t in sites[:top]]
    more = len(sites) - top
    return "; ".join(shown) + (f"; +{more} more" if more > 0 else "")
