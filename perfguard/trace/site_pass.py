"""The call-site pass's file: which statement of the user's code called each op of one step.

torch's Python tracer (``with_stack``) records every Python call of every profiled
iteration, knows only the line a function starts on, and is tied to ops by time: a
real model's profiled round cost 4x its timed rounds, and a site read "in forward() at
model.py:52" where the softmax is on line 64. So the capture runs without it, and one
extra step runs under the *call-site pass* (:mod:`perfguard.capture.sites`): a
``TorchFunctionMode`` that opens a ``perfguard.site#N`` range around every torch call,
``N`` naming the exact statement (file, line, function, source text) and the user's
frames above it. The pass writes what it learnt beside the capture
(``<capture>.sites.json``): its sites, and for each op name the site of each of its calls
in the step, in call order.

A reader then gives each op range of the capture's iterations its site
(:func:`apply_sites`): the k-th call of op ``X`` in an iteration is the k-th call of
``X`` in the pass's step (a step runs the same ops in the same order every time: the
pass runs after the warm-up). An iteration whose calls of ``X`` differ in number from
the pass's takes them in turn (a note counts them). The site of an op the pass saw
only under another op (the kernels of a backward node, an op inside
``scaled_dot_product_attention``) is the enclosing call's; a backward node's is its
forward op's (the autograd sequence number), as :func:`event_sites` works it out in
the pass.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.arrays import levels
from perfguard.trace.nesting import range_tree

SITES_SUFFIX = ".sites.json"
SITES_VERSION = 1
#: the pass's range around one torch call: ``perfguard.site#<site index>``
MARKER = "perfguard.site#"
ITERATION = "perfguard.iteration"
_AUTOGRAD = "autograd::engine::evaluate_function"


@dataclass(frozen=True)
class Site:
    """One statement of the user's code that called torch: ``model.py:64``, the function
    it is in (``CausalSelfAttention.forward``), its source text, and the user's frames
    above it, innermost first, up to the test (``model.py:80 in Block.forward``)."""

    where: str
    function: str = ""
    code: str = ""
    stack: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """What a range's ``call_site`` holds: ``model.py:64 in CausalSelfAttention.forward``."""
        return f"{self.where} in {self.function}" if self.function else self.where

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.where,
            "function": self.function,
            "code": self.code,
            "stack": list(self.stack),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Site:
        return cls(
            where=str(d["site"]),
            function=str(d.get("function") or ""),
            code=str(d.get("code") or ""),
            stack=tuple(str(s) for s in d.get("stack") or ()),
        )


@dataclass(frozen=True)
class SitePass:
    """What one pass found: its sites, and per op name the site index of each call
    (``calls``, matched by order: torch), or of every op of that name (``named``: graph
    ops, whose node names are unique in their graph, as TensorFlow's are)."""

    sites: tuple[Site, ...]
    calls: dict[str, list[int]]
    named: dict[str, int] = field(default_factory=dict)
    source: str = "perfguard call-site pass (a TorchFunctionMode over one step)"
    #: ``[site, function, source text, runs]``: how many times each line of the user's
    #: code ran in the step (the most run first)
    lines: list[list[Any]] = field(default_factory=list)
    #: the markers are in the capture itself (``perfguard profile``'s window ran under
    #: the mode): each op takes its innermost marker there, and the markers are dropped
    marked: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SITES_VERSION,
            "source": self.source,
            "sites": [s.to_dict() for s in self.sites],
            "ops": self.calls,
            "named": self.named,
            "lines": self.lines,
            "marked": self.marked,
        }


def sites_path(capture: Path) -> Path:
    """Where the pass's file of ``capture`` lives (not ``*.json`` alone: a folder of rank
    traces must not read it as a trace)."""
    return capture.with_name(capture.name + SITES_SUFFIX)


def write_sites(capture: Path, found: SitePass) -> Path:
    path = sites_path(capture)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(found.to_dict(), ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path


def read_sites(capture: Path, notes: list[str]) -> SitePass | None:
    """The pass's file beside ``capture``; None (with a note when it is damaged) else."""
    path = sites_path(capture)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if int(doc.get("version", 0)) > SITES_VERSION:
            raise ValueError(f"version {doc.get('version')} is newer than this perfguard's")
        sites = tuple(Site.from_dict(d) for d in doc["sites"])
        calls = {str(k): [int(i) for i in v] for k, v in doc["ops"].items()}
        named = {str(k): int(v) for k, v in (doc.get("named") or {}).items()}
        if any(i < -1 or i >= len(sites) for v in (*calls.values(), named.values()) for i in v):
            raise ValueError("a call names a site the file does not have")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        notes.append(f"{path.name}: not read ({type(exc).__name__}: {exc}); no exact call sites")
        return None
    lines = [[str(a), str(b), str(c), int(d)] for a, b, c, d in doc.get("lines") or []]
    return SitePass(
        sites, calls, named, str(doc.get("source") or ""), lines, bool(doc.get("marked"))
    )


def event_sites(
    names: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    tid: np.ndarray,
    seq: np.ndarray,
    own: np.ndarray,
) -> np.ndarray:
    """Each event's site index (-1: none) in the pass's step.

    ``own``: the site of each marker range (-1 for every other event). An event takes the
    innermost marker around it on its thread; a backward node (autograd's
    ``evaluate_function`` range, run by the engine with no Python frame around it) takes
    the site of the forward op with its sequence number; and what runs inside a
    backward node takes the node's."""
    codes = np.asarray(own, dtype=np.int64).copy()
    if not len(codes):
        return codes
    depth, parent = range_tree(start, end, tid)
    depth, parent = np.asarray(depth, np.int64), np.asarray(parent, np.int64)
    layers = levels(depth)[1:]
    _inherit(codes, parent, layers)
    backward = pd.Series(names, dtype=object).str.startswith(_AUTOGRAD).to_numpy(bool)
    seq = np.asarray(seq, dtype=np.int64)
    forward = ~backward & (seq >= 0) & (codes >= 0)
    if backward.any() and forward.any():
        by_seq = pd.Series(codes[forward], index=seq[forward])
        by_seq = by_seq[~by_seq.index.duplicated()]
        want = np.flatnonzero(backward & (seq >= 0))
        got = by_seq.reindex(seq[want]).to_numpy(dtype=np.float64)
        ok = ~np.isnan(got)
        codes[want[ok]] = got[ok].astype(np.int64)
        _inherit(codes, parent, layers, override=backward)
    return codes


def _inherit(
    codes: np.ndarray,
    parent: np.ndarray,
    layers: list[np.ndarray],
    override: np.ndarray | None = None,
) -> None:
    """Fill each event without a site from its parent's, parents first; under a range of
    ``override`` (a backward node) the node's site wins over the marker around
    ``loss.backward()``."""
    under = np.zeros(len(codes), dtype=bool) if override is None else override.copy()
    for at in layers:
        up = parent[at]
        ok = up >= 0
        at, up = at[ok], up[ok]
        take = (codes[at] < 0) | under[up]
        if override is not None:
            under[at] |= under[up]
            take &= codes[up] >= 0
        codes[at[take]] = codes[up[take]]


def apply_sites(ranges: pd.DataFrame, found: SitePass, notes: list[str]) -> pd.DataFrame:
    """``ranges`` (a reader's, before :func:`finalize_ranges`) with the pass's sites in
    ``call_site`` for the ops inside ``perfguard.iteration`` ranges (module docstring).

    Vectorised over the ranges: one pass per distinct op name the pass saw (hundreds),
    none per range."""
    if found.marked and not ranges.empty:
        return _apply_markers(ranges, found)
    if not ranges.empty and found.named:
        ranges = _apply_named(ranges, found)
    if ranges.empty or not found.calls:
        return ranges
    name = ranges["name"].astype(object).to_numpy()
    start = ranges["start"].to_numpy(np.int64)
    end = ranges["end"].to_numpy(np.int64)
    is_it = name == ITERATION
    if not is_it.any():
        notes.append("call-site pass: the capture has no perfguard.iteration range to match")
        return ranges
    it_order = np.argsort(start[is_it], kind="stable")
    it_start, it_end = start[is_it][it_order], end[is_it][it_order]
    pos = np.searchsorted(it_start, start, side="right") - 1
    inside = (pos >= 0) & ~is_it
    inside[inside] = start[inside] <= it_end[pos[inside]]
    labels = np.array([s.label for s in found.sites] + [None], dtype=object)
    out_site = np.full(len(ranges), -1, dtype=np.int64)
    rows = np.flatnonzero(inside)
    codes, uniques = pd.factorize(pd.Series(name[rows], dtype=object))
    uneven = 0
    for k, op in enumerate(uniques):
        want = found.calls.get(str(op))
        if not want:
            continue
        mine = rows[codes == k]
        mine = mine[np.lexsort((end[mine], start[mine], pos[mine]))]
        it = pos[mine]
        first = np.searchsorted(it, it, side="left")
        nth = np.arange(len(mine)) - first
        per_it = np.bincount(np.searchsorted(np.unique(it), it))
        uneven += int((per_it != len(want)).sum())
        out_site[mine] = np.asarray(want, dtype=np.int64)[nth % len(want)]
    if uneven:
        notes.append(
            f"call-site pass: {uneven} (iteration, op) pair(s) ran a different number of calls "
            "than the pass's step; their sites are taken in turn"
        )
    out = ranges.copy()
    site = out["call_site"].astype(object).to_numpy().copy() if "call_site" in out else None
    if site is None:
        site = np.full(len(out), None, dtype=object)
    have = out_site >= 0
    site[have] = labels[out_site[have]]
    out["call_site"] = site
    return out


def _apply_markers(ranges: pd.DataFrame, found: SitePass) -> pd.DataFrame:
    """Ranges of a capture that ran under the mode: each takes its innermost marker (a
    backward node its forward op's, :func:`event_sites`), and the markers go."""
    name = ranges["name"].astype(object).to_numpy()
    marker = pd.Series(name, dtype=object).str.startswith(MARKER).to_numpy(bool)
    if not marker.any():
        return ranges
    own = np.full(len(ranges), -1, dtype=np.int64)
    index = (
        pd.to_numeric(pd.Series(name[marker], dtype=object).str[len(MARKER) :], errors="coerce")
        .fillna(-1)
        .astype(np.int64)
        .to_numpy()
    )
    own[marker] = np.where(index < len(found.sites), index, -1)
    seq = (
        pd.to_numeric(ranges["seq"], errors="coerce").fillna(-1).astype(np.int64).to_numpy()
        if "seq" in ranges
        else np.full(len(ranges), -1, dtype=np.int64)
    )
    tid = (
        pd.factorize(pd.Series(list(zip(ranges["pid"], ranges["tid"], strict=True))))[0]
        if "pid" in ranges
        else ranges["tid"].to_numpy()
    )
    codes = event_sites(
        name,
        ranges["start"].to_numpy(np.int64),
        ranges["end"].to_numpy(np.int64),
        np.asarray(tid),
        seq,
        own,
    )
    labels = np.array([s.label for s in found.sites] + [None], dtype=object)
    out = ranges.copy()
    site = (
        out["call_site"].astype(object).to_numpy().copy()
        if "call_site" in out
        else np.full(len(out), None, dtype=object)
    )
    have = codes >= 0
    site[have] = labels[codes[have]]
    out["call_site"] = site
    return out[~marker].reset_index(drop=True)


def _apply_named(ranges: pd.DataFrame, found: SitePass) -> pd.DataFrame:
    """Graph ops by node name (one lookup per distinct name)."""
    labels = pd.Series({k: found.sites[i].label for k, i in found.named.items() if i >= 0})
    site = ranges["name"].astype(object).map(labels)
    if not site.notna().any():
        return ranges
    out = ranges.copy()
    old = out["call_site"].astype(object) if "call_site" in out else pd.Series(None, out.index)
    out["call_site"] = site.where(site.notna(), old).astype(object)
    return out


def site_details(found: SitePass) -> dict[str, dict[str, Any]]:
    """Label -> the site's function, source text and stack, for the record and reports."""
    return {
        s.label: {"function": s.function, "code": s.code, "stack": list(s.stack)}
        for s in found.sites
    }
