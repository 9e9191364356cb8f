"""What the in-process PyTorch profiler knows that its JSON loses, kept beside the trace.

torch's Chrome-trace writer names a ``record_function`` with non-ASCII or control
characters ``unknown`` and writes ``"``/``\\`` unescaped (torch 2.13); and with
``with_stack`` the user's line behind an op is only implied by the Python-call
events around it. The profiler's in-memory results (``prof.profiler.kineto_results``)
hold the exact strings, so once the JSON is written (it stays the timeline the
user opens) :func:`write_sidecar` writes ``<trace>.perfguard`` (JSON): for each op
whose name the writer damages, its exact name, and for each op inside a user
frame, that frame's ``file:line`` (:mod:`perfguard.trace.call_sites`), keyed by
the op's start and end on the JSON's clock. The Kineto reader applies it
(:mod:`perfguard.trace.kineto_sidecar`).

torch's results are one Python object per event (its API); the fields are read
in one pass each into numpy arrays and the rest is array work.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.arrays import not_none
from perfguard.trace.call_sites import innermost_sites, user_sites
from perfguard.trace.kineto_sidecar import SIDECAR_SUFFIX

SIDECAR_VERSION = 1
_BASE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
#: what torch's JSON writer keeps as written: printable ASCII without ``"`` and ``\``
_SAFE = re.compile(r"^[\x20-\x21\x23-\x5b\x5d-\x7e]*$")


def sidecar_path(trace: Path) -> Path:
    """Where the sidecar of ``trace`` lives (not ``*.json``: a folder of rank traces
    must not read it as a trace)."""
    return trace.with_name(trace.name + SIDECAR_SUFFIX)


def _base_ns(trace: Path) -> int:
    """The JSON's ``baseTimeNanoseconds`` (its ``ts`` are µs after it); 0 when absent."""
    opener: Any = gzip.open if trace.name.endswith(".gz") else open
    try:
        with opener(trace, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return 0
    m = _BASE.search(head)
    return int(m.group(1)) if m else 0


def _name(event: Any) -> str | None:
    try:
        return str(event.name())
    except (UnicodeDecodeError, RuntimeError):  # a name that is not UTF-8
        return None


def write_sidecar(prof: Any, trace: Path) -> Path | None:
    """Write ``trace``'s sidecar from ``prof`` (a ``torch.profiler.profile``, or the
    ``autograd.profiler.profile`` session a program ran, that has stopped and whose
    trace is ``trace``); None when there is nothing to add."""
    inner = getattr(prof, "profiler", None)
    results = getattr(inner if inner is not None else prof, "kineto_results", None)
    path = sidecar_path(trace)
    path.unlink(missing_ok=True)  # a sidecar of an earlier capture must not outlive it
    if results is None:
        return None
    events = list(results.events())
    if not events:
        return None
    names = np.array([_name(e) for e in events], dtype=object)
    start = np.fromiter((e.start_ns() for e in events), np.int64, len(events))
    dur = np.fromiter((e.duration_ns() for e in events), np.int64, len(events))
    # thread ids are compared for equality only; torch gives them as unsigned 64-bit
    # values, which a signed array cannot hold for every thread (OverflowError seen)
    tid = pd.factorize(pd.Series([e.start_thread_id() for e in events], dtype=object))[0]
    python = np.fromiter((bool(e.is_python_function()) for e in events), bool, len(events))
    cpu = np.fromiter((str(e.device_type()).endswith("CPU") for e in events), bool, len(events))
    op = cpu & ~python
    end = start + dur
    sites = np.full(len(events), None, dtype=object)
    if python.any():
        frame = python.copy()
        frame_site = user_sites(names[frame], entry=True)  # each function's def line
        mine = np.flatnonzero(frame)[not_none(frame_site)]
        if len(mine):
            sites[op] = innermost_sites(
                start[op],
                end[op],
                tid[op],
                start[mine],
                end[mine],
                tid[mine],
                frame_site[not_none(frame_site)],
            )
    codes, uniques = pd.factorize(pd.Series(names, dtype=object))
    bad = ~pd.Series(uniques, dtype=object).str.match(_SAFE.pattern).fillna(True).to_numpy(bool)
    damaged = (codes >= 0) & bad[np.maximum(codes, 0)] if len(uniques) else codes < -1
    keep = op & (damaged | not_none(sites))
    if not keep.any():
        return None
    base = _base_ns(trace)
    site_codes, site_names = _codes(sites[keep])
    doc = {
        "version": SIDECAR_VERSION,
        "source": "torch.profiler in-memory results",
        "start": (start[keep] - base).tolist(),
        "end": (end[keep] - base).tolist(),
        "name": [n if d else None for n, d in zip(names[keep], damaged[keep], strict=True)],
        "site": site_codes.tolist(),
        "sites": site_names,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path


def _codes(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes (-1 for None) and the distinct texts, in first-appearance order."""
    table: dict[str, int] = {}
    codes = np.array(
        [-1 if v is None else table.setdefault(v, len(table)) for v in values], dtype=np.int64
    )
    return codes, list(table)
