"""Read one Callgrind profile dump (``callgrind.out.<pid>.<n>``) into per-function costs.

The format (Valgrind manual, "Callgrind Format Specification"): header lines
(``events:``, ``summary:``/``totals:``, ``desc: Trigger: ...``), then cost
lines grouped under position specifications: ``ob=`` (object), ``fl=``/``fi=``/
``fe=`` (file), ``fn=`` (function); a ``calls=`` line followed by one cost line
is the *inclusive* cost of a call from the current function to ``cfn=``/
``cob=``, every other cost line is the current function's own (self) cost.
Names may be compressed: ``(id) name`` defines an id, ``(id)`` reuses it
(functions share one id space with ``cfn=``, files with ``cfi=``/``cfl=``,
objects with ``cob=``). A cost line is the position numbers (one per
``positions:`` entry; ``+n``, ``-n``, ``*`` relative) then the event counts,
trailing zeros left out.

A function's *inclusive* cost is its self cost plus the inclusive costs of
the calls it makes, as ``callgrind_annotate --inclusive=yes`` sums them
(a recursive call counts twice there too).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfguard.errors import TraceError

_POSITION_KEYS = {
    "ob": "ob",
    "cob": "ob",
    "fl": "fl",
    "fi": "fl",
    "fe": "fl",
    "cfi": "fl",
    "cfl": "fl",
    "fn": "fn",
    "cfn": "fn",
}


@dataclass(frozen=True)
class CallgrindProfile:
    """One dump: event names, the totals, the trigger, and one row per function.

    ``functions`` columns: ``function``, ``object``, ``file``, then per event
    its self cost (``Ir``, ...) and inclusive cost (``Ir_inclusive``, ...),
    int64.
    """

    path: str
    events: tuple[str, ...]
    totals: dict[str, int]
    trigger: str
    functions: pd.DataFrame


def read_callgrind(path: str | os.PathLike[str]) -> CallgrindProfile:
    """Parse ``path``; :class:`TraceError` (one line naming the file and the line) when it is
    not a Callgrind dump or is damaged."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8", errors="replace") as f:
            return _parse(name, f)
    except OSError as exc:
        raise TraceError(name, f"cannot read the callgrind dump: {exc.strerror}") from None


def _parse(name: str, lines: Iterable[str]) -> CallgrindProfile:  # noqa: C901 - one state machine
    names: dict[str, dict[str, str]] = {"ob": {}, "fl": {}, "fn": {}}
    events: list[str] = []
    n_pos = 1
    totals: list[int] | None = None
    trigger = ""
    self_cost: dict[tuple[str, str], list[int]] = {}
    incl_cost: dict[tuple[str, str], list[int]] = {}
    file_of: dict[tuple[str, str], str] = {}
    ob = fl = ""
    fn: tuple[str, str] | None = None
    in_call = False
    seen_header = False
    width = 0

    def resolve(kind: str, text: str, lineno: int) -> str:
        space = names[_POSITION_KEYS[kind]]
        text = text.strip()
        if text.startswith("("):
            close = text.find(")")
            if close < 0:
                raise TraceError(name, f"line {lineno}: bad compressed name {text[:40]!r}")
            key, rest = text[1:close], text[close + 1 :].strip()
            if rest:
                space[key] = rest
                return rest
            if key not in space:
                raise TraceError(name, f"line {lineno}: name id ({key}) used before it is defined")
            return space[key]
        return text

    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if not line or line[0] == "#":
            continue
        head = line[0]
        if head.isdigit() or head in "+-*":
            if fn is None or not width:
                raise TraceError(name, f"line {lineno}: a cost line before any function")
            parts = line.split()
            try:
                values = [int(v, 0) for v in parts[n_pos : n_pos + width]]
            except ValueError:
                raise TraceError(name, f"line {lineno}: bad cost line {line[:60]!r}") from None
            target = incl_cost[fn]
            if not in_call:
                self_target = self_cost[fn]
                for i, v in enumerate(values):
                    self_target[i] += v
            for i, v in enumerate(values):
                target[i] += v
            in_call = False
            continue
        key, sep, value = line.partition("=")
        if sep and key in _POSITION_KEYS:
            text = resolve(key, value, lineno)
            if key == "ob":
                ob = text
            elif key == "fl":
                fl = text
            elif key == "fn":
                fn = (ob, text)
                if fn not in self_cost:
                    self_cost[fn] = [0] * width
                    incl_cost[fn] = [0] * width
                    file_of[fn] = fl
            continue
        if sep and key == "calls":
            in_call = True
            continue
        if sep and key in ("jump", "jcnd"):
            continue
        field, colon, rest = line.partition(":")
        if not colon:
            raise TraceError(name, f"line {lineno}: not a callgrind line: {line[:60]!r}")
        rest = rest.strip()
        if field == "events":
            events = rest.split()
            width = len(events)
        elif field == "positions":
            n_pos = len(rest.split())
        elif field in ("summary", "totals"):
            totals = [int(v) for v in rest.split()]
        elif field == "desc" and rest.startswith("Trigger:"):
            trigger = rest[len("Trigger:") :].strip()
        elif field in ("version", "creator", "cmd", "pid", "part", "thread", "desc"):
            seen_header = seen_header or field in ("version", "creator", "cmd")
    if not events:
        raise TraceError(name, "not a callgrind dump (no 'events:' line)")
    if not seen_header and not self_cost:
        raise TraceError(name, "not a callgrind dump (no header, no costs)")
    keys = list(self_cost)
    own = np.array([self_cost[k] for k in keys], dtype=np.int64).reshape(len(keys), width)
    inc = np.array([incl_cost[k] for k in keys], dtype=np.int64).reshape(len(keys), width)
    table = pd.DataFrame(
        {
            "function": [k[1] for k in keys],
            "object": [k[0] for k in keys],
            "file": [file_of[k] for k in keys],
        }
    )
    for i, ev in enumerate(events):
        table[ev] = own[:, i]
    for i, ev in enumerate(events):
        table[f"{ev}_inclusive"] = inc[:, i]
    summed = own.sum(axis=0)
    if totals is None:
        totals = summed.tolist()
    return CallgrindProfile(
        name,
        tuple(events),
        {ev: int(totals[i]) if i < len(totals) else 0 for i, ev in enumerate(events)},
        trigger,
        table,
    )
