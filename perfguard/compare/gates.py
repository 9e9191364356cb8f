"""The deterministic half of a verdict: counters compared exactly, against budgets.

Calls, kernel launches, FLOPs and bytes, memcpy count and bytes, host-device
synchronisations (per op and iteration, :mod:`perfguard.analysis.counters`),
the set of kernel names of each op, Tensor Core use, an op's input dtypes
and the peak memory do not vary between runs of the same code, so a change
beyond the test's budget is a regression with no statistics needed, on any
machine; on a CPU-only runner these are the main gate. Each finding names
the gate, the op (and kernel), both values and the budget.

Budgets (the marker's ``gates=``, merged over :data:`DEFAULT_GATES`):

* a number: the increase per iteration allowed (``"syncs": 0``);
* ``"N%"``: the relative increase allowed, per op and for the test's total
  (``"flops": "1%"``: an op whose FLOPs grow by more than 1 % fails even when
  the test's total hides it);
* ``True``/``False`` (or ``None``): a yes/no gate on or off (``tc_lost``,
  ``kernel_set``, ``dtypes``); ``None`` or ``False`` also turns a counter off.

Every finding is then weighed (:mod:`perfguard.compare.weigh`): a change that costs
nothing measurable (its ops' time under the tolerance, its size under the budget as a
share of the step's total) is listed with its line as ``immaterial`` and neither fails
nor improves; a sync, a copy, a lost Tensor Core path and the whole-test totals always
count, and so does every gate the marker makes strict (``gates={"strict": ["dtypes"]}``,
or ``True`` for all).

A decrease beyond the budget is reported as an improvement. A counter that
moved between rounds of one run (``stable`` false: data-dependent work) is
listed and never gates. Neither does the *kernel choice* of an op that a
library autotunes at run time: with ``torch.backends.cudnn.benchmark`` on
(recorded with each capture, ``meta["autotuned"]``), cuDNN times its
candidate algorithms in each process and keeps the fastest, so which
convolution kernels run, how many, and whether they use Tensor Cores differ
between two runs of the same code (a real H200 run read three of five
unchanged sessions ``regressed`` on them). The kernel-level gates
(``kernels``, ``kernel_set``, ``tc_lost``) skip the ops that launch cuDNN
kernels then, and say so; op calls, FLOPs, bytes, syncs and dtypes still gate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from perfguard.analysis.counters import COMPILED_OPS, COUNTERS, REWRITE_SPLIT, REWRITE_VARIANT
from perfguard.baseline.record import INSTRUCTION_COUNTERS, TestRecord
from perfguard.compare.explanation import Scalar
from perfguard.compare.halves import GateFinding, GateVerdict
from perfguard.compare.host_functions import explain_move, layout_floor
from perfguard.compare.outcomes import Outcome
from perfguard.compare.tolerance import parse_tolerance
from perfguard.compare.units import count, human, percent
from perfguard.compare.weigh import BY_SIZE, SIZE_SHARE, StepCosts, material, weigh

#: the defaults, chosen so that the changes a reviewer always wants to hear about
#: fail (a new sync, a lost Tensor Core path, more launches or copies, an op whose
#: FLOPs grew) while allocator jitter does not (peak memory 10 %)
DEFAULT_GATES: dict[str, Any] = {
    "calls": 0,
    "kernels": 0,
    "flops": "1%",
    "bytes": "1%",
    "memcpy": 0,
    "memcpy_bytes": "1%",
    "syncs": 0,
    "host_reads": 0,
    "peak_memory": "10%",
    # host instructions under Callgrind, the mean of 4 heap layouts (benchmarks/README.md,
    # instructions.py): between 20 sessions each with its own heap shift (what a code change
    # does to an unchanged step), an MLP step's count differed by at most 0.122 % (0 of 380
    # pairs beyond 0.15 %); one extra small op read +0.21 to +0.44 %, a strided kernel path
    # +0.19 to +0.43 %, +2 % of Python +3.4 % (all 380 beyond 0.15 %)
    "instructions": "0.15%",
    "est_cycles": "1%",
    "kernel_set": True,
    "tc_lost": True,
    "dtypes": True,
}
SWITCHES = ("kernel_set", "tc_lost", "dtypes")
#: the marker's key that makes gates strict (never weighed): True, or a list of gate names
STRICT = "strict"
#: how each counter is named in a message
LABELS = {
    "calls": "op calls",
    "kernels": "kernel launches",
    "flops": "FLOPs",
    "bytes": "bytes",
    "memcpy": "memcpy",
    "memcpy_bytes": "memcpy bytes",
    "syncs": "host-device syncs",
    "host_reads": "host reads of device values (.item(), nonzero)",
    "peak_memory": "peak memory (bytes)",
    "instructions": "host instructions",
    "est_cycles": "estimated host cycles",
}
#: whole-test counters measured outside the trace: gated only when both records have them
WHOLE_TEST = ("peak_memory", *INSTRUCTION_COUNTERS)


@dataclass(frozen=True)
class Budget:
    """How much a counter may grow: ``kind`` "abs" (per iteration), "rel" or "off"."""

    kind: str
    value: float = 0.0

    def exceeded(self, base: float, cur: float) -> bool:
        if self.kind == "off":
            return False
        allowed = self.value if self.kind == "abs" else self.value * abs(base)
        return cur - base > allowed + 1e-9 * max(abs(base), 1.0)

    def __str__(self) -> str:
        if self.kind == "off":
            return "off"
        return count(self.value) if self.kind == "abs" else percent(100 * self.value, digits=None)


def parse_gates(spec: dict[str, Any] | None) -> dict[str, Budget | bool]:
    """The marker's ``gates=`` over the defaults; ValueError names a bad key or value."""
    merged = dict(DEFAULT_GATES)
    spec = dict(spec or {})
    strict = spec.pop(STRICT, None)
    for key, value in spec.items():
        if key not in DEFAULT_GATES:
            known = ", ".join(DEFAULT_GATES)
            raise ValueError(f"gates: unknown gate {key!r}; known: {known}")
        merged[key] = value
    out: dict[str, Budget | bool] = {}
    for key, value in merged.items():
        if key in SWITCHES:
            if value not in (True, False, None):
                raise ValueError(f"gates: {key} is on or off (True/False), got {value!r}")
            out[key] = bool(value)
        elif value is None or value is False:
            out[key] = Budget("off")
        elif isinstance(value, str) and value.strip().endswith("%"):
            out[key] = Budget("rel", parse_tolerance(value, f"gates[{key!r}]"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            out[key] = Budget("abs", float(value))
        else:
            raise ValueError(
                f"gates: {key} takes a number (increase per iteration), 'N%' or None, got {value!r}"
            )
    for name in _strict_names(strict):
        out[f"{STRICT}.{name}"] = True
    return out


def _strict_names(value: Any) -> list[str]:
    """The gates the marker's ``strict`` names (True: all of them)."""
    if value is None or value is False:
        return []
    if value is True:
        return list(DEFAULT_GATES)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple | set | frozenset):
        raise ValueError(f"gates: strict is True or a list of gate names, got {value!r}")
    unknown = [n for n in names if n not in DEFAULT_GATES]
    if unknown:
        raise ValueError(
            f"gates: strict names unknown gate(s) {unknown}; known: {', '.join(DEFAULT_GATES)}"
        )
    return [str(n) for n in names]


def is_strict(budgets: dict[str, Budget | bool], gate: str) -> bool:
    """Whether the marker made ``gate`` strict: never weighed (:mod:`.weigh`)."""
    return bool(budgets.get(f"{STRICT}.{gate}"))


def _scalar(value: object) -> Scalar:
    """A kernel change's before/after as a finding holds it (a count, a flag, or None)."""
    if value is None or value is pd.NA or isinstance(value, bool | int | float | str):
        return value  # type: ignore[return-value]
    if isinstance(value, np.generic):
        item: Scalar = value.item()
        return item
    return str(value)


def _per_op(record: TestRecord, counter: str) -> pd.Series:
    """``counter`` per op id of ``record`` (summed over its rows)."""
    c = _counter_table(record)
    return c[c["counter"] == counter].groupby("op_id")["value"].sum()


def _short(op_name: str) -> str:
    return op_name.rsplit("/", 1)[-1] if op_name else "the test"


#: counters that follow the kernel an op's library chose, not the op's work
_KERNEL_CHOICE = ("kernels",)
#: a kernel name that marks cuDNN's own kernels (its namespaces and its SASS kernels'
#: ``__5x_cudnn`` suffix), the library ``cudnn.benchmark`` autotunes
_CUDNN = "cudnn"


def autotuned_ops(current: TestRecord, baseline: TestRecord) -> dict[str, str]:
    """op_id -> op_name of the ops whose kernels were chosen by autotuning in either
    record (cuDNN kernels under ``cudnn.benchmark``): their kernel choice varies between
    runs of the same code (module docstring)."""
    if not any("cudnn.benchmark" in (r.meta.get("autotuned") or []) for r in (current, baseline)):
        return {}
    out: dict[str, str] = {}
    for record in (baseline, current):
        k = record.kernels
        if k.empty:
            continue
        hit = k["kernel_name"].astype(str).str.contains(_CUDNN, case=False, regex=False)
        for op_id, name in zip(k.loc[hit, "op_id"], k.loc[hit, "op_name"], strict=True):
            out[str(op_id)] = str(name)
    return out


def _counter_table(record: TestRecord) -> pd.DataFrame:
    c = record.counters
    if c is None or c.empty:
        return pd.DataFrame(columns=["op_id", "op_name", "counter", "value", "stable"])
    return c


def _layout_budget(
    budget: Budget, baseline: TestRecord, current: TestRecord, counter: str
) -> tuple[Budget, str]:
    """The instructions budget widened to what the heap layouts alone move the count by
    (:func:`perfguard.compare.host_functions.layout_floor`), and how a message shows it ("" when
    not widened): a step whose count spreads widely between layouts cannot be judged finer
    than that."""
    floor = layout_floor(baseline, current) if counter == "instructions" else None
    if budget.kind != "rel" or floor is None or floor[0] <= budget.value:
        return budget, ""
    wide = Budget("rel", floor[0])
    return wide, (
        f"{budget}, widened to {percent(100 * floor[0], digits=2)}: this step's count moves "
        f"{percent(100 * floor[1], digits=2)} between heap layouts"
    )


def judge_gates(
    current: TestRecord,
    baseline: TestRecord,
    budgets: dict[str, Budget | bool],
    changes: pd.DataFrame,
    tolerance: float = 0.05,
) -> GateVerdict:
    """Compare the deterministic counters of ``current`` with ``baseline``'s.

    ``changes``: :func:`perfguard.compare.comparison.kernel_changes` of the two records
    (the judge computes it once and shows it too). ``tolerance``: the test's, the share of
    the step a change's time must reach to fail (:mod:`perfguard.compare.weigh`).
    """
    cb, cc = _counter_table(baseline), _counter_table(current)
    tuned = autotuned_ops(current, baseline)
    if cb.empty and not baseline.ops.empty:
        return GateVerdict(
            Outcome.NOT_JUDGED,
            message="gates not judged: the baseline run has no counters "
            "(saved by an older perfguard); the next saved run will have them",
        )
    worse: list[GateFinding] = []
    better: list[GateFinding] = []
    unstable: set[str] = set()
    checked: list[str] = []
    totals: dict[str, list[float]] = {}
    widened: dict[str, str] = {}
    compiled = any(r.meta.get(COMPILED_OPS) for r in (current, baseline))  # analysis/counters
    for counter in (*COUNTERS, *WHOLE_TEST):
        budget = budgets.get(counter)
        if not isinstance(budget, Budget) or budget.kind == "off":
            continue
        b = cb[cb["counter"] == counter]
        c = cc[cc["counter"] == counter]
        if counter in WHOLE_TEST and (b.empty or c.empty):
            continue  # measured on one side only (no CUDA allocator, no Callgrind): not gated
        checked.append(counter)
        drop = set(b.loc[~b["stable"].astype(bool), "op_id"])
        drop |= set(c.loc[~c["stable"].astype(bool), "op_id"])
        if counter in _KERNEL_CHOICE and tuned:
            tuned_here = (set(b["op_id"]) | set(c["op_id"])) & set(tuned)
            unstable.update(f"{counter} of {_short(tuned[i])} (autotuned)" for i in tuned_here)
            b, c = b[~b["op_id"].isin(tuned_here)], c[~c["op_id"].isin(tuned_here)]
        if drop:
            rows = pd.concat([b, c])
            shaky = rows[rows["op_id"].isin(drop)]["op_name"]
            unstable.update(f"{counter} of {_short(str(n))}" for n in set(shaky))
            b, c = b[~b["op_id"].isin(drop)], c[~c["op_id"].isin(drop)]
        vb = b.groupby("op_id")["value"].sum()
        vc = c.groupby("op_id")["value"].sum()
        names = pd.concat([b.set_index("op_id")["op_name"], c.set_index("op_id")["op_name"]])
        names = names[~names.index.duplicated()]
        ids = vb.index.union(vc.index)
        vb, vc = vb.reindex(ids, fill_value=0.0), vc.reindex(ids, fill_value=0.0)
        tb, tc = float(vb.sum()), float(vc.sum())
        if counter in WHOLE_TEST:
            totals[counter] = [tb, tc]
        moved = (vc - vb).abs().sort_values(ascending=False)
        moved = moved[moved > 0]
        # by the name the line shows: two paths ending in one op (aten::transpose under
        # the forward and under TransposeBackward0) read as one op, not the same text twice
        short = pd.Series([_short(str(names.get(i, i))) for i in moved.index], index=moved.index)
        sb, sc = vb[moved.index].groupby(short).sum(), vc[moved.index].groupby(short).sum()
        by_name = (sc - sb).abs().sort_values(ascending=False, kind="stable")
        top = "; ".join(
            f"{n} {human(float(sb[n]), counter)} → {human(float(sc[n]), counter)}"
            for n in by_name.index[:3]
            if by_name[n] > 0
        )
        if counter in INSTRUCTION_COUNTERS:
            top = explain_move(baseline, current, counter)
            budget, wide = _layout_budget(budget, baseline, current, counter)
            if wide:
                widened[counter] = wide
        shown = widened.get(counter) or str(budget)
        label = LABELS[counter]
        per = "" if counter == "peak_memory" else " per iteration"
        # a graph compiler's rewrites vary between sessions of the same code (Grappler's
        # optimizers run to a deadline): the step's FLOPs or bytes moving by less than the
        # tolerance there is the compiler's, not the change's, either way (unless strict)
        rewritten = (
            compiled
            and counter in REWRITE_SPLIT
            and tb > 0
            and abs(tc / tb - 1.0) < tolerance
            and not is_strict(budgets, counter)
        )
        if not rewritten and (budget.exceeded(tb, tc) or budget.exceeded(tc, tb)):
            up = tc > tb
            pct = (
                f", {percent(100 * (tc / tb - 1), True, 2)}"
                if counter in INSTRUCTION_COUNTERS and tb
                else ""
            )
            msg = (
                f"{label}{per} {human(tb, counter)} → {human(tc, counter)}{pct} (budget {shown})"
                + (f": {top}" if top else "")
            )
            top_op = str(names.get(moved.index[0], "")) if len(moved) else ""
            finding = GateFinding(counter, top_op, "", tb, tc, str(budget), msg, whole_test=True)
            if budget.exceeded(tb, tc) and up:
                worse.append(finding)
            elif (
                budget.exceeded(tc, tb) and not up and not (compiled and counter in REWRITE_VARIANT)
            ):
                better.append(finding)
        if budget.kind == "rel" and not (
            compiled and counter in REWRITE_SPLIT and (rewritten or not budget.exceeded(tb, tc))
        ):
            both = ids[(vb > 0) & (vc > 0)]
            for i in both:
                x, y = float(vb[i]), float(vc[i])
                if budget.exceeded(x, y) and not any(
                    f.op_name == names.get(i) and f.gate == counter for f in worse
                ):
                    op = str(names.get(i, i))
                    worse.append(
                        GateFinding(
                            counter,
                            op,
                            "",
                            x,
                            y,
                            str(budget),
                            f"{label}{per} of {_short(op)} "
                            f"{human(x, counter)} → {human(y, counter)} "
                            f"({percent(100 * (y / x - 1), True)}, budget {budget})",
                        )
                    )
    if tuned:
        names = set(tuned.values())
        moved = changes["op_name"].isin(names) & changes["kind"].isin(
            ["tc_lost", "tc_gained", "added", "removed"]
        )
        unstable.update(
            f"kernel choice of {_short(str(n))} (autotuned)" for n in changes.loc[moved, "op_name"]
        )
        changes = changes[~moved]
    _switch_gates(current, baseline, budgets, changes, worse, better, checked)
    costs = StepCosts(current, baseline, current.metric)
    worse, better, immaterial = _weighed(worse, better, budgets, costs, tolerance)
    if worse:
        outcome = Outcome.REGRESSED
        msg = "gates: " + "; ".join(f.message for f in worse[:3])
    elif better:
        outcome = Outcome.IMPROVED
        msg = "gates improved: " + "; ".join(f.message for f in better[:3])
    else:
        outcome = Outcome.UNCHANGED
        msg = f"gates unchanged ({', '.join(checked)})"
    if immaterial:
        msg += "; " + immaterial_text(immaterial)
    if unstable:
        msg += f"; not gated, they vary between rounds: {', '.join(sorted(unstable)[:5])}"
    return GateVerdict(
        outcome, worse, better, sorted(unstable), checked, msg, totals, widened, immaterial
    )


def _weighed(
    worse: list[GateFinding],
    better: list[GateFinding],
    budgets: dict[str, Budget | bool],
    costs: StepCosts,
    tolerance: float,
) -> tuple[list[GateFinding], list[GateFinding], list[GateFinding]]:
    """The findings with their costs, split into those that count and those that cost
    nothing measurable (:mod:`perfguard.compare.weigh`).

    A time an improvement saves is set against the time of every op the change added or
    grew: ``nn.Linear``'s addmm written as ``matmul`` + ``add`` lowered the step's op
    calls 40 → 38, which weighed by the removed ops' time alone read ``improved`` in the
    culprit catalogue (the addmm_split case) though the new ops took that time back.
    What is left after the offset must itself pass the tolerance. Likewise a
    FLOPs or bytes improvement of one op counts only where the step's total fell by the
    budget: the split op's FLOPs had moved to its parts."""
    keep: tuple[list[GateFinding], list[GateFinding]] = ([], [])
    immaterial: list[GateFinding] = []
    for found, kept in ((worse, keep[0]), (better, keep[1])):
        for f in found:
            weighed = weigh(f, costs)
            # a dtype is weighed by the bytes it moves: against the bytes gate's budget
            budget = budgets.get("bytes" if f.gate == "dtypes" else f.gate)
            rel = budget.value if isinstance(budget, Budget) and budget.kind == "rel" else None
            strict = is_strict(budgets, f.gate)
            share = rel if rel is not None else SIZE_SHARE
            moved_only = found is better and weighed.cost_basis in BY_SIZE and not strict
            moved_only = moved_only and costs.fell(weighed.cost_basis) < share
            if material(weighed, tolerance, rel, strict) and not moved_only:
                kept.append(weighed)
            else:
                immaterial.append(weighed)
    saved = [
        f
        for f in keep[1]
        if f.gate in ("calls", "kernels") and f.cost_basis == "time"
        if not is_strict(budgets, f.gate)
    ]
    nets = {f.gate: costs.net_saved(f.gate) for f in saved}
    offset = [f for f in saved if nets[f.gate] < tolerance]
    if offset:  # the ops it added or grew took back what it saved
        immaterial.extend(
            replace(f, cost_pct=100 * max(nets[f.gate], 0.0), cost_basis="net time") for f in offset
        )
        keep = (keep[0], [f for f in keep[1] if f not in offset])
    return keep[0], keep[1], immaterial


def cost_text(finding: GateFinding) -> str:
    """``0.4 % of the step's time`` (or its bytes, FLOPs): what a finding was weighed by."""
    if finding.cost_pct is None:
        return ""
    what = {
        "time": "time",
        "net time": "time, net of the ops it added",
        "bytes": "bytes",
        "flops": "FLOPs",
        "memcpy_bytes": "memcpy bytes",
    }.get(finding.cost_basis, finding.cost_basis)
    return f"{percent(finding.cost_pct, digits=None)} of the step's {what}"


def immaterial_text(found: list[GateFinding]) -> str:
    """One clause for the changes that cost nothing measurable (every view's words)."""
    parts = []
    for f in found[:3]:
        cost = cost_text(f)
        parts.append(f"{f.message}" + (f" (costs {cost})" if cost else ""))
    more = f"; … and {len(found) - 3} more" if len(found) > 3 else ""
    return "changed at no measurable cost, not failing: " + "; ".join(parts) + more


def _switch_gates(
    current: TestRecord,
    baseline: TestRecord,
    budgets: dict[str, Budget | bool],
    changes: pd.DataFrame,
    worse: list[GateFinding],
    better: list[GateFinding],
    checked: list[str],
) -> None:
    """The yes/no gates: Tensor Cores lost, kernels added or removed, input dtypes."""
    if budgets.get("tc_lost"):
        checked.append("tc_lost")
        for row in changes[changes["kind"] == "tc_lost"].itertuples():
            kernel = str(row.kernel_name or "")
            worse.append(
                GateFinding(
                    "tc_lost",
                    str(row.op_name),
                    kernel,
                    True,
                    False,
                    "on",
                    f"{_short(str(row.op_name))} lost Tensor Cores "
                    f"(was: {kernel or 'a TC kernel'})",
                )
            )
        for row in changes[changes["kind"] == "tc_gained"].itertuples():
            better.append(
                GateFinding(
                    "tc_lost",
                    str(row.op_name),
                    str(row.kernel_name or ""),
                    False,
                    True,
                    "on",
                    f"{_short(str(row.op_name))} now uses Tensor Cores",
                )
            )
    if budgets.get("kernel_set"):
        checked.append("kernel_set")
        for kind, verb in (("added", "launches a new kernel"), ("removed", "no longer launches")):
            for row in changes[changes["kind"] == kind].itertuples():
                (worse if kind == "added" else better).append(
                    GateFinding(
                        "kernel_set",
                        str(row.op_name),
                        str(row.kernel_name or ""),
                        _scalar(row.baseline),
                        _scalar(row.current),
                        "on",
                        f"{_short(str(row.op_name))} {verb} {row.kernel_name}",
                    )
                )
    if budgets.get("dtypes"):
        checked.append("dtypes")
        ob = baseline.ops.drop_duplicates("op_id").set_index("op_id")
        oc = current.ops.drop_duplicates("op_id").set_index("op_id")
        if "dtypes" in ob and "dtypes" in oc:
            both = ob.index.intersection(oc.index)
            db, dc = ob.loc[both, "dtypes"], oc.loc[both, "dtypes"]
            differ = db.notna() & dc.notna() & (db.astype(str) != dc.astype(str))
            # an op's dtypes are its first call's: where its calls changed, a new call can
            # displace them with no input changing type (a tiny GPT's reshape-clone of int64
            # labels read "int64 → fp32" when two fp32 clones were added); the calls gate
            # names that op
            calls_b, calls_c = (
                _per_op(r, "calls").reindex(both).fillna(-1.0) for r in (baseline, current)
            )
            differ &= calls_b.eq(calls_c)
            for op_id in both[differ.to_numpy()]:
                name = str(oc.at[op_id, "op_name"])
                worse.append(
                    GateFinding(
                        "dtypes",
                        name,
                        "",
                        str(db[op_id]),
                        str(dc[op_id]),
                        "on",
                        f"input dtypes of {_short(name)} changed: {db[op_id]} → {dc[op_id]}",
                    )
                )
