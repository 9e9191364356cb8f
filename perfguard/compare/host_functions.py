"""Where a change of a test's host instructions went: the functions and ops that moved.

Two records measured under Callgrind carry a ``functions`` table each (per
iteration: self and inclusive ``Ir``, the aten op of a dispatcher entry).
The functions whose self instructions moved most name *what* got slower
(``_PyEval_EvalFrameDefault`` in ``libpython``: Python code; a BLAS kernel:
a kernel path); the dispatcher entries whose inclusive instructions moved
most name the aten op it happened under (an extra ``aten::abs`` call is
its entry appearing). A function kept on one side only (the table keeps
the costliest) counts 0 on the other.
"""

from __future__ import annotations

import math
import statistics

import pandas as pd

from perfguard.baseline.record import TestRecord, instruction_counts, instruction_layouts
from perfguard.compare.units import human

#: the moves a message names
TOP = 3
#: standard errors of the difference of two layouts' means the instructions budget widens to:
#: on round 12's 20 sessions (benchmarks/data/instructions_layouts4.json) the floor stays
#: under 0.15 % for every pair but one, keeping 0/380 A/A and 380/380 of each small change;
#: a pure-Python step growing lists (glibc's realloc copies or extends by the heap's holes)
#: spread 0.27 % between layouts and its two sessions 0.2 % apart (benchmarks/README.md)
LAYOUT_SE = 4.0


def layout_floor(baseline: TestRecord, current: TestRecord) -> tuple[float, float] | None:
    """:func:`floor_of` the two records' layouts (:func:`instruction_layouts`)."""
    return floor_of(instruction_layouts(baseline), instruction_layouts(current))


def floor_of(baseline: list[float], current: list[float]) -> tuple[float, float] | None:
    """How far the mean of a test's heap layouts moves with no code change, from the spread
    of the layouts' counts each side has: ``(floor, spread)``, both relative. ``floor`` is
    :data:`LAYOUT_SE` standard errors of the difference of the two means, ``spread`` the
    layouts' larger relative SD. A side saved before perfguard kept its layouts borrows the
    other's spread; ``None`` when neither side has two layouts."""
    spreads = []
    for values in (baseline, current):
        mean = statistics.fmean(values) if len(values) >= 2 else 0.0
        if mean > 0:
            spreads.append((statistics.stdev(values) / mean, len(values)))
    if not spreads:
        return None
    if len(spreads) == 1:
        spreads *= 2
    se = math.sqrt(sum(sd**2 / n for sd, n in spreads))
    return LAYOUT_SE * se, max(sd for sd, _ in spreads)


def _frame(record: TestRecord) -> pd.DataFrame:
    f = record.functions
    return f if f is not None and len(f) else pd.DataFrame(columns=["function", "object", "op"])


def function_moves(baseline: TestRecord, current: TestRecord, column: str = "ir") -> pd.DataFrame:
    """One row per function of either record: ``function, object, op, baseline, current,
    delta`` (``column`` per iteration), largest increase first."""
    key = ["function", "object"]
    b, c = _frame(baseline), _frame(current)
    cols = [*key, "op", column]
    both = pd.merge(
        b.reindex(columns=cols),
        c.reindex(columns=cols),
        on=key,
        how="outer",
        suffixes=("_b", "_c"),
    )
    out = pd.DataFrame(
        {
            "function": both["function"].astype(str),
            "object": both["object"].astype(str),
            "op": both["op_c"].fillna(both["op_b"]).fillna("").astype(str),
            "baseline": pd.to_numeric(both[f"{column}_b"]).fillna(0.0),
            "current": pd.to_numeric(both[f"{column}_c"]).fillna(0.0),
        }
    )
    out["delta"] = out["current"] - out["baseline"]
    return out.sort_values("delta", ascending=False, kind="stable").reset_index(drop=True)


def _short(function: str) -> str:
    """A C++ signature without its argument list (``at::_ops::abs::call``): the last
    balanced ``(...)``, so a template argument such as ``function_ref<void (long)>`` stays."""
    text = function.removesuffix(" const").rstrip()
    if not text.endswith(")"):
        return function
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return text[:i].rstrip() or function
    return function


def explain_move(baseline: TestRecord, current: TestRecord, counter: str) -> str:
    """The functions and ops that explain a move of ``counter`` (``instructions`` or
    ``est_cycles``), one clause each, in the direction of the move; '' without tables."""
    column = "ir" if counter == "instructions" else "est_cycles"
    if not len(_frame(baseline)) or not len(_frame(current)):
        return ""
    total_b = _total(baseline, counter)
    total_c = _total(current, counter)
    up = total_c >= total_b
    moves = function_moves(baseline, current, column)
    moves = moves if up else moves.iloc[::-1]
    moves = moves[(moves["delta"] > 0) if up else (moves["delta"] < 0)]
    moves = moves[~unresolved(moves)]  # an address names nothing a reviewer can open
    top = moves.head(TOP)
    parts = [
        f"{_short(str(function))} ({obj}) {_signed(delta, counter)}"
        for function, obj, delta in zip(top["function"], top["object"], top["delta"], strict=True)
    ]
    ops = function_moves(baseline, current, "ir_inclusive")
    ops = ops[ops["op"] != ""]
    ops = ops if up else ops.iloc[::-1]
    ops = ops[(ops["delta"] > 0) if up else (ops["delta"] < 0)]
    ops = ops.drop_duplicates("op").head(TOP)
    text = "functions: " + "; ".join(parts) if parts else ""
    if len(ops):
        named = "; ".join(
            f"{op} {_signed(delta, 'instructions')}" + (" (new)" if base == 0 else "")
            for op, delta, base in zip(ops["op"], ops["delta"], ops["baseline"], strict=True)
        )
        text += ("; " if text else "") + f"under ops: {named}"
    return text


#: a function Callgrind could not name: a bare address, or an object it could not map
_ADDRESS = r"^(?:0x[0-9a-fA-F]+|\?\?\?)$"


def unresolved(moves: pd.DataFrame) -> pd.Series:
    """Rows whose function is a bare address or whose object is unknown (``???``: JIT code,
    a stripped library): left out of the text a reviewer reads."""
    return moves["function"].str.match(_ADDRESS) | moves["object"].str.match(_ADDRESS)


def _total(record: TestRecord, counter: str) -> float:
    return instruction_counts(record).get(counter, 0.0)


def _signed(value: float, counter: str) -> str:
    return ("+" if value >= 0 else "-") + human(abs(float(value)), counter)
