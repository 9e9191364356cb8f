"""The judge's explanation of a verdict: which ops changed, how, ranked (one culprit rule).

Built once per test by :func:`perfguard.compare.judge.judge` from what the
judge already has (the timing half, the gates half, the per-op comparison and
both records' counters); the types are in
:mod:`perfguard.compare.explanation`, and every view renders them.

The rule, in order:

1. **What changed, minimally.** Ops that appeared or vanished (an op path
   whose parent path appeared too is the parent's change, not its own: adding
   ``aten::masked_fill`` also adds ``aten::masked_fill/aten::clone``); per-op
   counter moves (calls, FLOPs, bytes, kernel launches, copies, syncs) on ops
   both sides have, a child's move dropped where its parent moved the same way
   (a new ``nn.Linear`` call adds one ``aten::linear`` and, under it, one
   ``aten::addmm``: one culprit); dtype changes, Tensor Cores lost, new
   kernels and peak memory from the gates' findings; and, when timing decided,
   the ops whose time moved significantly.
2. **Ranked** (:func:`_rank`): the evidence that decided first (a culprit
   beyond a gate's budget before one within it), then by kind
   (:data:`KIND_ORDER`: a dtype or Tensor Core change, then a new sync, then
   ops added or removed, then counters, then time), then the user's own calls
   before what changed inside an op both sides call, forward before backward,
   then the largest (counters by how much they moved, the rest by time).
3. **Grouped** for reading: two or more ops added or removed under one
   parent become one line ("ops changed under X: A removed; B ×2, C added").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from perfguard.baseline.record import INSTRUCTION_COUNTERS, TestRecord
from perfguard.compare.explanation import KIND_ORDER, RANKED_AS, SHOWN, Culprit, Explanation
from perfguard.compare.gates import LABELS, Budget, cost_text
from perfguard.compare.halves import GateVerdict, TimingVerdict
from perfguard.compare.outcomes import Outcome
from perfguard.compare.sites import (
    Place,
    SiteTable,
    line_growth,
    optimizer_changes,
    parameter_change,
    place_of,
)
from perfguard.compare.units import count, format_ns, human, interval, percent, signed

#: counters a culprit can name, in the gates' words; peak memory is the test's alone
_COUNTERS = ("syncs", "host_reads", "calls", "flops", "bytes", "kernels", "memcpy", "memcpy_bytes")
#: op names a grouped line lists per kind before "and N more"
_GROUP_NAMES = 5
_METRIC_LABEL = {"gpu_time": "GPU time", "wall_time": "wall time", "cpu_time": "CPU time"}


# ---------------------------------------------------------------------------- figures


def _pct(base: float, cur: float) -> str:
    if not (math.isfinite(base) and math.isfinite(cur)) or base == 0:
        return ""
    if round(100 * (cur / base - 1), 1) == 0:
        return ""  # "+0.0%" beside a change reads as none: the figures say its size
    return percent(100 * (cur / base - 1), True)


def change_figures(base: float, cur: float, counter: str) -> str:
    """``5 → 10 per iteration``; where the two print alike (35 bytes of 7.41 MB), the
    change itself: ``+35 B per iteration (of 7.41 MB)``, never ``7.41 MB → 7.41 MB``."""
    a, b = human(base, counter), human(cur, counter)
    if a != b or not (math.isfinite(base) and math.isfinite(cur)):
        return f"{a} → {b} per iteration"
    return f"{signed(cur - base, counter)} per iteration (of {a})"


def times(calls: Any) -> str:
    """`` ×2`` for an op called twice per iteration; nothing for once."""
    try:
        c = float(calls)
    except (TypeError, ValueError):
        return ""
    if not math.isfinite(c) or c == 1:
        return ""
    return f" ×{count(c)}"


def _parent(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


# ---------------------------------------------------------------------------- moves


def _op_names(*records: TestRecord) -> pd.DataFrame:
    """op_id -> op_name, direction over the records (the current one wins)."""
    frames = [r.ops[["op_id", "op_name", "direction"]] for r in records if len(r.ops)]
    if not frames:
        return pd.DataFrame(columns=["op_name", "direction"])
    ops = pd.concat(frames).drop_duplicates("op_id").set_index("op_id")
    return ops


def counter_moves(current: TestRecord, baseline: TestRecord) -> pd.DataFrame:
    """Per op and counter, the per-iteration values that differ between the records.

    Columns: op_id, op_name, direction, counter, baseline, current. Counters that vary
    between a run's rounds (``stable`` false) are left out, as the gates leave them.
    """
    cols = ["op_id", "op_name", "direction", "counter", "baseline", "current"]
    cb, cc = baseline.counters, current.counters
    if cb is None or cc is None or cb.empty and cc.empty:
        return pd.DataFrame(columns=cols)
    parts = []
    for side, frame in (("baseline", cb), ("current", cc)):
        f = frame[frame["counter"].isin(_COUNTERS)]
        shaky = set(
            zip(
                f.loc[~f["stable"].astype(bool), "op_id"],
                f.loc[~f["stable"].astype(bool), "counter"],
                strict=True,
            )
        )
        v = f.groupby(["op_id", "counter"])["value"].sum().rename(side)
        if shaky:
            v = v[[k not in shaky for k in v.index]]
        parts.append(v)
    both = pd.concat(parts, axis=1)
    in_b = set(cb["op_id"])
    in_c = set(cc["op_id"])
    ids = both.index.get_level_values(0)
    both = both[np.fromiter((i in in_b and i in in_c for i in ids), bool, len(ids))]
    both = both.fillna(0.0)
    moved = both[(both["current"] - both["baseline"]).abs() > 1e-9 * both.abs().max(axis=1)]
    if moved.empty:
        return pd.DataFrame(columns=cols)
    out = moved.reset_index()
    names = _op_names(current, baseline)
    out["op_name"] = out["op_id"].map(names["op_name"]).fillna(out["op_id"]).astype(str)
    out["direction"] = out["op_id"].map(names["direction"])
    return out[cols]


def _minimal_moves(moves: pd.DataFrame) -> pd.DataFrame:
    """Drop a child's move where its parent op moved the same counter the same way."""
    if moves.empty:
        return moves
    sign = np.sign(moves["current"].to_numpy(float) - moves["baseline"].to_numpy(float))
    key = set(zip(moves["op_name"], moves["counter"], sign, strict=True))
    keep = [
        (_parent(n), c, s) not in key or not _parent(n)
        for n, c, s in zip(moves["op_name"], moves["counter"], sign, strict=True)
    ]
    return moves[np.asarray(keep, dtype=bool)]


def _structural(ops: pd.DataFrame) -> pd.DataFrame:
    """Ops added or removed whose parent op was not itself added or removed."""
    if ops.empty:
        return ops
    changed = ops[ops["status"].isin(["added", "removed"])]
    if changed.empty:
        return changed
    paths = set(zip(changed["op_name"].astype(str), changed["direction"].astype(str), strict=True))
    keep = [
        (_parent(n), d) not in paths
        for n, d in zip(
            changed["op_name"].astype(str), changed["direction"].astype(str), strict=True
        )
    ]
    return changed[np.asarray(keep, dtype=bool)]


# ---------------------------------------------------------------------------- culprits


@dataclass(frozen=True)
class Evidence:
    """What the judge found on one test, all an explanation is made from: the outcome, its
    two halves, the per-op comparison (:func:`perfguard.compare.comparison.compare_ops`), both
    records (their per-op counters) and the gates' budgets."""

    outcome: Outcome
    timing: TimingVerdict
    gates: GateVerdict | None
    ops: pd.DataFrame
    current: TestRecord
    baseline: TestRecord
    budgets: dict[str, Budget | bool]


def _impacts(ops: pd.DataFrame) -> dict[tuple[str, str], float]:
    if ops.empty:
        return {}
    d = ops["current_ns"].astype(float).fillna(0.0) - ops["baseline_ns"].astype(float).fillna(0.0)
    return dict(
        zip(
            zip(ops["op_name"].astype(str), ops["direction"].astype(str), strict=True),
            d.to_numpy(float),
            strict=True,
        )
    )


def _culprits(e: Evidence) -> list[Culprit]:
    outcome, timing, gates, ops = e.outcome, e.timing, e.gates, e.ops
    impact = _impacts(ops)
    found: list[Culprit] = []
    fired = (
        {f.gate for f in [*gates.regressions, *gates.improvements]} if gates is not None else set()
    )

    where = _Placer(e)
    struct_gated = "calls" in fired  # an op added or removed moves the calls it had
    syncing = _syncing_ops(e.current, e.baseline)
    for row in _structural(ops).itertuples(index=False):
        name, direction = str(row.op_name), str(row.direction)
        added = row.status == "added"
        calls = row.calls_current if added else row.calls_baseline
        t = _num(row.current_ns if added else row.baseline_ns)
        site = where(str(row.status), name, _dir(row.direction))
        at = f" {site}" if site else ""
        kind, text = str(row.status), f"{name}{times(calls)} {row.status}{at}"
        if name in syncing:  # a host sync said as one: what a reviewer looks for first
            kind = "syncs"
            text = f"host sync {row.status}{at}: {_display(name)}{times(calls)}"
        found.append(
            Culprit(
                kind=kind,
                op=name,
                direction=_dir(row.direction),
                text=f"{text} ({format_ns(t)} per iteration)",
                baseline=None if added else _num(calls),
                current=_num(calls) if added else None,
                gated=struct_gated,
                impact_ns=impact.get((name, direction), math.nan),
                site=site,
            )
        )

    all_moves = counter_moves(e.current, e.baseline)
    moves = _minimal_moves(all_moves)
    for row in moves.itertuples(index=False):
        name, counter = str(row.op_name), str(row.counter)
        b, c = _num(row.baseline), _num(row.current)
        budget = e.budgets.get(counter)
        gated = (
            isinstance(budget, Budget)
            and counter in fired
            and (budget.exceeded(b, c) or budget.exceeded(c, b))
        )
        place = where.place(counter, name, _dir(row.direction))
        site = place.text if place is not None else ""
        at = f" {site}" if site else ""
        label = LABELS[counter].split(" (")[0]
        here = place.here if place is not None else None
        if here is not None and here != (b, c):  # the op runs elsewhere too: this site's
            figures = f"{label} {change_figures(here[0], here[1], counter)} there"
            rest = f"all its sites {change_figures(b, c, counter)}"
        else:
            figures, rest = f"{label} {change_figures(b, c, counter)}", ""
        detail = ", ".join(x for x in (rest, _pct(b, c), f"budget {budget}" if gated else "") if x)
        figures += f" ({detail})" if detail else ""
        text = f"{name}{at}: {figures}"
        if counter in ("syncs", "host_reads") and c > b:
            text = f"host sync added{at}: {_display(name)} ({figures})"
        found.append(
            Culprit(
                kind=counter,
                op=name,
                direction=_dir(row.direction),
                text=text,
                baseline=b,
                current=c,
                budget=str(budget) if isinstance(budget, Budget) else "",
                gated=bool(gated),
                impact_ns=impact.get((name, str(row.direction)), math.nan),
                site=site,
            )
        )

    if gates is not None:
        findings = gates.regressions if outcome is not Outcome.IMPROVED else gates.improvements
        every = [*gates.regressions, *gates.improvements]
        # the user's lines that ran more: read once, for the instruction counts that cite them
        python_lines = (
            _python_lines(e) if any(f.gate in INSTRUCTION_COUNTERS for f in every) else ""
        )
        for f in every:
            if f.gate not in SWITCH_CULPRITS:
                continue
            if f.gate == "tc_lost" and f not in findings:
                continue  # Tensor Cores gained is an improvement's culprit only
            found.append(_switch_culprit(f, impact, where, python_lines))

    # a finding on an op whose parent op has the same finding is the parent's (the dtype of
    # aten::softmax and of the aten::_softmax it calls changed together: one culprit)
    same = {(c.kind, c.op) for c in found}
    found = [c for c in found if not ("/" in c.op and (c.kind, _parent(c.op)) in same)]
    if timing.outcome in (Outcome.REGRESSED, Outcome.IMPROVED) and not ops.empty:
        found += _timing_culprits(timing, ops, {(c.op, c.kind) for c in found}, where)
    found += _parameter_culprits(e, found)
    called = set(all_moves.loc[all_moves["counter"] == "calls", "op_name"].astype(str))
    return sorted(found, key=lambda c: _rank(c, called))


def _python_lines(e: Evidence) -> str:
    """``Python lines that ran more per step: test_x.py:12 in step 1,000 → 1,020``: the
    user's lines whose runs moved the outcome's way (the call-site pass counts them), for
    a change no op shows (pure Python work, seen by an instruction count or the timing)."""
    up = e.outcome is not Outcome.IMPROVED
    moved = line_growth(e.baseline.meta, e.current.meta, up=up)
    if not moved:
        return ""
    parts = [f"{label} {human(a, 'calls')} → {human(b, 'calls')}" for label, a, b in moved]
    return f"Python lines that ran {'more' if up else 'less'} per step: " + "; ".join(parts)


class _Placer:
    """Where each culprit's change happened (:func:`perfguard.compare.sites.place_of`:
    per call site, matched across the commits by statement), ``""`` where neither
    record knows its op's sites; records of the capture alone (no per-site table) fall
    back to the op's top site, which may only name its function (``in forward() at
    model.py:15``)."""

    def __init__(self, e: Evidence) -> None:
        self.base = SiteTable(e.baseline.meta)
        self.head = SiteTable(e.current.meta)
        self.tops = {
            **(e.baseline.meta.get("call_sites") or {}),
            **(e.current.meta.get("call_sites") or {}),
        }

    def __call__(self, kind: str, op: str, direction: str | None) -> str:
        place = self.place(kind, op, direction)
        return place.text if place is not None else ""

    def place(self, kind: str, op: str, direction: str | None) -> Place | None:
        """The per-site :class:`Place` where the record's sites know it, else the op's top
        site (its text reads "in"/"at" by the same rule), None where none is known."""
        if not op:
            return None
        place = place_of(kind, op, direction, self.base, self.head)
        if place is not None:
            return place
        top = str(self.tops.get(op) or "").split(";")[0]
        top = _SHARE.sub("", top).strip()
        return Place(top) if top else None


#: a site's share of its op's time in a top-sites text: `` (72%)``
_SHARE = re.compile(r"\s\(\d+%\)$")


def _syncing_ops(current: TestRecord, baseline: TestRecord) -> set[str]:
    """Ops that read a device value on the host (``.item()``, ``.cpu()``, a ``nonzero``:
    the host-reads and syncs counters), themselves or an op inside them, on either side."""
    out: set[str] = set()
    for r in (current, baseline):
        c = r.counters
        if c is None or c.empty:
            continue
        rows = c[c["counter"].isin(("syncs", "host_reads")) & (c["value"] > 0)]
        for name in rows["op_name"].dropna().astype(str):
            parts = name.split("/")
            out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return out


#: op path components of the work an optimizer (or autograd's gradient accumulation) does
#: once per parameter tensor: it grows with the model's parameter tensors
_PER_TENSOR = re.compile(
    r"^Optimizer\.|AccumulateGrad|^autograd::engine::evaluate_function: "
    r"torch::autograd::AccumulateGrad"
)


def _per_tensor(op: str) -> bool:
    return any(_PER_TENSOR.search(part) for part in op.split("/"))


def _parameter_culprits(e: Evidence, found: list[Culprit]) -> list[Culprit]:
    """When the test's models hold another number of parameter tensors, or an optimizer
    was built with another class or settings, that change (a cause the reviewer can see
    in the code), and the per-tensor work of the optimizer marked as following from it
    (ranked after its cause, :func:`_rank`)."""
    causes: list[Culprit] = []
    reasons: list[str] = []
    change = parameter_change(e.baseline.meta, e.current.meta)
    if change is not None:
        a, b = change
        reasons.append(f"parameter tensors {a} → {b}")
        follows = any(_per_tensor(c.op) for c in found)
        why = (
            "the model's parameters changed: the optimizer's per-tensor work follows"
            if follows
            else "the model's parameters changed"
        )
        causes.append(
            Culprit(
                kind="params",
                op="",
                text=f"parameter tensors {a} → {b} ({why})",
                baseline=a,
                current=b,
            )
        )
    for what, where in optimizer_changes(e.baseline.meta, e.current.meta):
        at = f" at {where}" if where else ""
        reasons.append(what.split(":", 1)[0] + " changed")
        step = what.split("(", 1)[1].split(")", 1)[0] if "(" in what else ""
        op = f"Optimizer.step#{step}.step" if step else ""  # torch's range of its step
        causes.insert(0, Culprit(kind="optimizer", op=op, text=f"{what}{at}", site=at.strip()))
    if not causes:
        return []
    for i, c in enumerate(found):
        if _per_tensor(c.op):
            why = f"follows from {' and '.join(reasons)}"
            found[i] = replace(c, consequence=True, text=f"{c.text} ({why})")
    # as decisive as the gated work it explains
    gated = any(c.gated for c in found if c.consequence)
    return [replace(c, gated=gated) for c in causes]


#: gate findings that become culprits as they are (no per-op counter row behind them)
SWITCH_CULPRITS = ("dtypes", "tc_lost", "kernel_set", "peak_memory", *INSTRUCTION_COUNTERS)


def _dir(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def dtype_change(before: Any, after: Any) -> str:
    """``fp32 → fp64`` for the inputs that changed type, from torch's per-input type lists
    (``["float", "long int", "", "Scalar"]``: a JSON list per op), with the input's position
    when the op has several; the two texts as they are when they are not such lists."""
    import json

    from perfguard.analysis.flops import COMPUTE_DTYPE

    try:
        a, b = json.loads(str(before)), json.loads(str(after))
    except ValueError:
        return f"{before} → {after}"
    if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
        return f"{before} → {after}"

    def short(t: Any) -> str:
        return COMPUTE_DTYPE.get(str(t), str(t)) or "none"

    changed = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if not changed:
        return f"{before} → {after}"
    if len(a) == 1:
        return f"{short(a[0])} → {short(b[0])}"
    return ", ".join(f"{short(a[i])} → {short(b[i])} (input {i + 1} of {len(a)})" for i in changed)


def _switch_culprit(
    f: Any, impact: dict[tuple[str, str], float], where: Any = None, python_lines: str = ""
) -> Culprit:
    name = str(f.op_name)
    # the op's (name, direction) key: its change of time, and whether it is a backward op
    # (the rank puts a forward op's change before the backward one that follows from it)
    key = next((k for k in impact if k[0] == name), None)
    imp = impact[key] if key is not None else math.nan
    direction = _dir(key[1]) if key is not None else None
    site = where(f.gate, name, direction) if where is not None and name else ""
    at = f" {site}" if site else ""
    if f.gate == "dtypes":
        text = f"{name}{at}: input dtypes {dtype_change(f.baseline, f.current)}"
    elif f.gate == "tc_lost":
        lost = f.baseline is True or f.baseline == "True"
        text = (
            f"{name}{at} lost Tensor Cores (was {f.kernel_name or 'a Tensor Core kernel'})"
            if lost
            else f"{name}{at} now uses Tensor Cores"
        )
    elif f.gate == "kernel_set":
        new = f.current is not None and not (isinstance(f.current, float) and math.isnan(f.current))
        verb = "launches a new kernel" if new else "no longer launches"
        text = f"{name}{at} {verb} {f.kernel_name}"
    elif f.gate in INSTRUCTION_COUNTERS:  # the gate's message names the functions and ops
        text, name = f.message, ""
        if python_lines:
            text += f"; {python_lines}"
    else:  # peak_memory
        b, c = _num(f.baseline), _num(f.current)
        text = (
            f"peak memory {human(b, 'peak_memory')} → {human(c, 'peak_memory')} "
            f"({_pct(b, c)}, budget {f.budget})"
        )
        name = ""
    return Culprit(
        kind=f.gate,
        op=name,
        text=text,
        baseline=f.baseline,
        current=f.current,
        budget=str(f.budget),
        gated=True,
        impact_ns=imp,
        direction=direction,
        site=site if name else "",
    )


def _timing_culprits(
    timing: TimingVerdict, ops: pd.DataFrame, named: set[tuple[str, str]], where: Any
) -> list[Culprit]:
    """The ops whose time moved the outcome's way: significant ones, else the largest
    mover, said to be unjudged. Up to three, outermost first where they nest."""
    up = timing.outcome is Outcome.REGRESSED
    want = "regressed" if up else "improved"
    both = ops[ops["baseline_ns"].notna() & ops["current_ns"].notna()]
    d = both["current_ns"].astype(float) - both["baseline_ns"].astype(float)
    sig = both[(both["status"] == want).to_numpy()]
    judged = not sig.empty
    pick = sig if judged else both[((d > 0) if up else (d < 0)).to_numpy()]
    label = _METRIC_LABEL.get(timing.metric, timing.metric)
    out = []
    for row in pick.head(3).itertuples(index=False):
        name = str(row.op_name)
        if (name, "timing") in named:
            continue
        b, c = _num(row.baseline_ns), _num(row.current_ns)
        note = "" if judged else "; per-op times not judged"
        site = where("timing", name, _dir(row.direction))
        at = f" {site}" if site else ""
        out.append(
            Culprit(
                kind="timing",
                op=name,
                direction=_dir(row.direction),
                text=f"{name}{at}: {label} {format_ns(b)} → {format_ns(c)} per iteration "
                f"({_pct(b, c)}{note})",
                baseline=b,
                current=c,
                gated=False,
                impact_ns=c - b,
                site=site,
            )
        )
    return out


#: a path component that is the framework's own op (its implementation calls ops of its own)
_FRAMEWORK_OP = re.compile(r"^(aten|prim|torch_c10|autograd)::|Backward\d*$")


def _internal(op: str) -> bool:
    """The change happened inside an op both sides call (SDPA choosing its math path, a
    convolution adding a ``contiguous``): a consequence of what the user's code changed,
    ranked after changes at the level of the user's own calls."""
    parent = _parent(op)
    return bool(parent) and bool(_FRAMEWORK_OP.search(parent.rsplit("/", 1)[-1]))


def _rank(c: Culprit, called: set[str]) -> tuple[Any, ...]:
    """Causes before consequences (the optimizer's per-tensor work after the parameter
    change that made it), gated first, the forward's changes before the backward's (which
    follow from them), then by kind; within a kind, ops added or removed at the user's
    level before those inside an unchanged op, then the largest: FLOPs, bytes and launches
    by how much the counter moved (deterministic: a leaf op holds them, whatever its
    parent), calls and the rest by the op's change of time. A dtype change on an op whose
    calls changed too is new call sites, not a changed call: it ranks as calls."""
    k = RANKED_AS.get(c.kind, c.kind)
    if k == "dtypes" and c.op in called:
        k = "calls"
    kind = KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)
    b, cur = _num(c.baseline), _num(c.current)
    if c.kind in _COUNTERS and c.kind != "calls" and math.isfinite(b) and math.isfinite(cur):
        size = abs(cur - b)  # FLOPs, bytes, launches: where the work moved, not the noise
    else:
        size = abs(c.impact_ns) if c.impact_ns is not None and math.isfinite(c.impact_ns) else 0.0
    inside = c.kind in ("added", "removed") and _internal(c.op)
    # the backward follows from the forward the user wrote: its changes come second
    backward = c.direction == "bprop"
    return (c.consequence, not c.gated, backward, kind, inside, -size, c.op)


# ---------------------------------------------------------------------------- lines


_AUTOGRAD = "autograd::engine::evaluate_function: "


def _display(name: str) -> str:
    """An op name as a line shows it: autograd's engine prefix dropped (the node's name,
    ``BmmBackward0``, is what the user's code made)."""
    return name.replace(_AUTOGRAD, "")


_BASE = " (base)"


#: a place as :class:`perfguard.compare.sites.Place` writes it
_PLACE = re.compile(r"^at (?P<file>.+):(?P<line>\d+) in (?P<function>.+?)(?: \(base\))?$")


def _group_key(c: Culprit) -> tuple[str, str | None, str]:
    """Structural culprits read as one line when they share a parent op, a direction and
    a function (an edit of a few lines of one function is one change: the statements
    that were rewritten, a removed op's base line beside an added op's head line)."""
    m = _PLACE.match(c.site)
    where = f"{m['file']} in {m['function']}" if m else c.site.removesuffix(_BASE)
    return (_parent(c.op), c.direction, where)


def _group_place(members: list[Culprit]) -> str:
    """``at model.py:15-18 in attend``: the lines the members name in one function, the
    head's where any member was added (the base's, marked, where all were removed)."""
    found = [(m, _PLACE.match(m.site)) for m in members]
    if not all(p for _, p in found):
        return members[0].site
    head = [int(p["line"]) for m, p in found if p and not m.site.endswith(_BASE)]
    lines = head or [int(p["line"]) for _, p in found if p]
    first = next(p for _, p in found if p)
    span = f"{min(lines)}" if min(lines) == max(lines) else f"{min(lines)}-{max(lines)}"
    return f"at {first['file']}:{span} in {first['function']}" + ("" if head else _BASE)


def _group_lines(culprits: list[Culprit]) -> tuple[list[str], list[Culprit], int]:
    """The reader's lines, structural culprits under one parent grouped, in rank order;
    and the culprits in the order the lines name them (those past :data:`SHOWN` lines
    last, in rank order), and how many of them the lines name."""
    groups: dict[tuple[str, str | None, str], list[Culprit]] = {}
    for c in culprits:
        if c.kind in ("added", "removed"):
            groups.setdefault(_group_key(c), []).append(c)
    lines: list[str] = []
    order: list[Culprit] = []
    done: set[tuple[str, str | None, str]] = set()
    for c in culprits:
        if len(lines) >= SHOWN:
            break
        key = _group_key(c)
        if c.kind in ("added", "removed") and len(groups[key]) > 1:
            if key in done:
                continue
            done.add(key)
            parts = []
            for kind in ("removed", "added"):
                members = [m for m in groups[key] if m.kind == kind]
                order += members
                names = [
                    _display(m.leaf if key[0] else m.op)
                    + times(m.current if kind == "added" else m.baseline)
                    for m in members
                ]
                if names:
                    shown = ", ".join(names[:_GROUP_NAMES])
                    more = len(names) - _GROUP_NAMES
                    parts.append(f"{shown}{f' and {more} more' if more > 0 else ''} {kind}")
            where = f"under {_display(key[0])}" if key[0] else ("" if key[2] else "in the step")
            if key[2]:
                where = " ".join(w for w in (where, _group_place(groups[key])) if w)
            dirn = f" ({key[1]})" if key[1] and key[1] not in ("fprop", "None") else ""
            lines.append(f"ops changed {where}{dirn}: {'; '.join(parts)}")
        else:
            order.append(c)
            lines.append(_display(c.text))
    seen = {id(c) for c in order}
    return lines, order + [c for c in culprits if id(c) not in seen], len(order)


def _counter_line(gates: GateVerdict | None) -> str:
    """The test's counters that fired, per iteration, humanized."""
    if gates is None:
        return ""
    parts = []
    for f in [*gates.regressions, *gates.improvements]:
        if f.gate not in _COUNTERS:
            continue
        b, c = _num(f.baseline), _num(f.current)
        label = LABELS[f.gate]
        if not f.message.startswith(label) or f.message.startswith(f"{label} per iteration of "):
            continue  # a per-op finding ("bytes per iteration of aten::x"): its culprit says it
        pct = _pct(b, c)
        parts.append(
            f"{LABELS[f.gate].split(' (')[0]} {human(b, f.gate)} → {human(c, f.gate)}"
            + (
                f" ({pct}, budget {f.budget})"
                if pct and "%" in f.budget
                else f" (budget {f.budget})"
            )
        )
    return ("counters per iteration: " + "; ".join(parts)) if parts else ""


def timing_clause(timing: TimingVerdict) -> str:
    """The timing half in one clause: its outcome, the change with its interval, the
    levels it is the change between, the replicates and the threshold, and why."""
    if timing.mode == "none":  # why, in its first two parts ("workers differs: 1 vs 2")
        why = timing.message.removeprefix("timing not compared: ").split(";")[0]
        return f"timing not judged: {':'.join(why.split(':')[:2]).strip()}"
    label = _METRIC_LABEL.get(timing.metric, timing.metric)
    ci = (
        f" {interval(timing.ci_low_pct, timing.ci_high_pct)}"
        if timing.ci_low_pct is not None and timing.ci_high_pct is not None
        else ""
    )
    levels = ""
    if timing.level_baseline_ns is not None and timing.level_current_ns is not None:
        levels = f", level {format_ns(timing.level_baseline_ns)} → "
        levels += format_ns(timing.level_current_ns)
    n = f"{timing.n_baseline}/{timing.n_current} {'pairs' if timing.mode == 'ab' else 'rounds'}"
    why = timing.message.split(":")[0]
    change = percent(timing.delta_pct, True)
    return f"timing {timing.outcome.value}: {label} {change}{ci}{levels} ({n}; {why})"


def explain(e: Evidence) -> Explanation:
    """The explanation of a judged test (module docstring)."""
    outcome, timing, gates = e.outcome, e.timing, e.gates
    gates_said = gates is not None and gates.outcome is outcome
    timing_said = timing.outcome is outcome
    if outcome in (Outcome.REGRESSED, Outcome.IMPROVED):
        decided = " and ".join(w for w, s in (("gates", gates_said), ("timing", timing_said)) if s)
        culprits = _culprits(e)
        if not timing_said:  # time did not decide: its op movers are no culprits
            culprits = [c for c in culprits if c.kind != "timing"]
        lines, culprits, named = _group_lines(culprits)
        if named < len(culprits):
            lines.append(f"… and {len(culprits) - named} more change(s) in the report")
        counters = _counter_line(gates)
        if counters:
            lines.append(counters)
        clause = timing_clause(timing)
        lead, rest = (lines[0], lines[1:]) if lines else ("", [])
        if gates_said:  # the gates lead; the timing is the last line, or joins the headline
            lead = lead or (gates.message if gates else "")
            headline = f"gates: {lead}" + (f"; {clause}" if timing_said else "")
            rest.append(clause)
        else:  # the timing alone decided: it is the headline, with its largest mover
            headline = clause + (f"; largest mover {lead}" if lead else "")
            python_lines = _python_lines(e)
            if python_lines:  # work no op shows: the user's lines that ran more
                rest.insert(0, python_lines)
        rest += _immaterial_lines(e)
        return Explanation(
            outcome=outcome.value,
            headline=headline,
            decided_by=decided,
            culprits=tuple(culprits),
            lead=lead,
            lines=tuple(rest),
            timing=clause,
        )
    # not a regression or improvement: the reason, noise excuse included, is the headline;
    # a change of no measurable cost follows it with its line (the gates' own words lack it)
    parts = [timing.message]
    if gates is not None and (
        gates.outcome is not Outcome.UNCHANGED or outcome is Outcome.NOT_JUDGED
    ):
        parts.append(gates.message.split("; changed at no measurable cost")[0])
    free = _immaterial_lines(e)
    if free:
        parts.append(free[0] + (f" (and {len(free) - 1} more)" if len(free) > 1 else ""))
    return Explanation(
        outcome=outcome.value,
        headline="; ".join(p for p in parts if p),
        timing=timing_clause(timing),
        lines=tuple(free),
    )


def _immaterial_lines(e: Evidence) -> list[str]:
    """Each change that cost nothing measurable, at its line, once (a change an op and the
    ops inside it share, as ``aten::to`` and its ``copy_`` a dtype, is its outermost op's):
    shown in every view, never failing."""
    if e.gates is None or not e.gates.immaterial:
        return []
    where = _Placer(e)
    same = {(f.gate, f.op_name) for f in e.gates.immaterial}
    lines = []
    for f in e.gates.immaterial:
        parts = f.op_name.split("/")
        if any((f.gate, "/".join(parts[:k])) in same for k in range(1, len(parts))):
            continue
        if f.gate in SWITCH_CULPRITS:
            text = _switch_culprit(f, {}, where).text
        else:
            site = where(f.gate, f.op_name, None) if f.op_name else ""
            text = f"{f.op_name}{f' {site}' if site else ''}: {f.message}"
        cost = cost_text(f)
        lines.append(
            f"no measurable cost: {text}"
            + (f" (costs {cost}, not failing)" if cost else " (not failing)")
        )
    return lines
