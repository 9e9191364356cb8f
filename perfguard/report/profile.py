"""A test's profile as the reports show it: one line for ``summary.md`` and the terminal,
and the HTML section's facts, op rows and two small pictures (SVG drawn directly,
:mod:`perfguard.report.svg`).

The figures are :class:`~perfguard.compare.profile.TestProfile`'s; every number goes
through :mod:`perfguard.compare.units`, and what a number is stays in its label.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from perfguard.compare.profile import ProfileOp, TestProfile
from perfguard.compare.results import TestEntry
from perfguard.compare.units import format_ns, human, percent, rate

#: ops the HTML section lists (the profile in results.json keeps more)
SHOWN_OPS = 10
#: ops the split bar names (the rest are one grey part)
SPLIT_OPS = 6
_METRIC_WORDS = {"gpu_time": "GPU time", "wall_time": "wall time", "cpu_time": "CPU time"}


def _metric(t: TestEntry) -> str:
    return _METRIC_WORDS.get(t.metric or "", t.metric or "time")


def level_of(t: TestEntry) -> float | None:
    """The test's current level: the judged one, else its rounds' median."""
    return t.level_current_ns if t.level_current_ns is not None else t.median_current_ns


def _tc_text(p: TestProfile) -> str:
    if p.basis == "gpu":
        if p.tc_utilization is None:
            return "TC: no eligible op ran GPU work"
        return f"TC {percent(p.tc_utilization, digits=0)} of eligible ops' kernel time"
    if not p.tc_eligible_pct:
        return "TC: no eligible op"
    return f"TC-eligible ops {percent(p.tc_eligible_pct, digits=0)} of op time (no GPU)"


def _efficiency_text(p: TestProfile) -> str:
    if p.flop_efficiency is not None:
        device = f" {p.device}" if p.device else ""
        return f"FLOP efficiency {percent(p.flop_efficiency)} of the{device} peak"
    if p.flop_rate is not None:
        where = "no peak for a CPU" if p.basis == "cpu" else "no peak known for this GPU"
        return f"{rate(p.flop_rate)} achieved ({where})"
    return "no FLOP model for its ops"


def one_line(t: TestEntry) -> str:
    """The profile of a test at a glance: level per iteration, top op and its share, Tensor
    Core use, FLOP efficiency (``""`` for a test without a profile)."""
    p = t.profile
    if p is None:
        return ""
    parts = [f"{format_ns(level_of(t))}/iteration ({_metric(t)})"]
    top = p.top
    if top is not None and top.share_pct is not None:
        parts.append(
            f"top op {top.short_name} {percent(top.share_pct, digits=0)} of {p.time_label}"
        )
    parts += [_tc_text(p), _efficiency_text(p)]
    if p.input_ns is not None and p.input_pct is not None:
        parts.append(
            f"input pipeline {format_ns(p.per_iteration(p.input_ns))}/iteration "
            f"({percent(p.input_pct, digits=0)} of {p.time_label})"
        )
    return "; ".join(parts)


@dataclass
class OpRow:
    """One op of the HTML table, its figures per iteration and formatted."""

    name: str  # the short name
    path: str  # the full op path (the cell's title)
    direction: str
    time: str
    share: str
    share_value: float | None
    cpu_time: str
    calls: str
    tensor_cores: str
    flops: str
    efficiency: str
    call_site: str


@dataclass
class ProfileView:
    """The HTML section of one test's profile."""

    summary: str  # the <summary> line (:func:`one_line`)
    time_label: str
    metric: str  # the timing's metric, in words
    #: a GPU capture: only then are the Tensor Core and FLOP-efficiency columns figures
    #: (a CPU run's were "eligible, not used" and a column of n/a in every row, issue 54)
    gpu: bool = True
    facts: list[tuple[str, str]] = field(default_factory=list)
    rows: list[OpRow] = field(default_factory=list)
    more: str = ""  # the ops not listed, in words
    split_svg: str | None = None
    strip_svg: str | None = None


def _tc_cell(op: ProfileOp) -> str:
    if not op.tc_eligible:
        return "not eligible"
    if op.tc_utilization is not None:
        return f"eligible, {percent(op.tc_utilization, digits=0)} TC"
    return "eligible, used" if op.using_tc else "eligible, not used"


def _row(p: TestProfile, op: ProfileOp) -> OpRow:
    per = p.per_iteration
    calls = per(op.calls)
    return OpRow(
        name=op.short_name,
        path=op.op_name,
        direction=op.direction,
        time=format_ns(per(op.time_ns)),
        share=percent(op.share_pct),
        share_value=op.share_pct,
        cpu_time=format_ns(per(op.cpu_time_ns)),
        calls=human(round(calls, 3) if calls is not None else None),
        tensor_cores=_tc_cell(op),
        flops=_flops_text(op, per),
        efficiency=percent(op.flop_efficiency),
        call_site=op.call_site,
    )


def _flops_text(op: ProfileOp, per: Callable[[float | None], float | None]) -> str:
    """The op's FLOPs per iteration; a parent that counts none itself, its nested ops'
    (marked so: each FLOP is counted once, on the innermost op with a formula)."""
    if op.flops:
        return human(per(op.flops), "flops")
    if op.nested_flops:
        return f"{human(per(op.nested_flops), 'flops')} (nested ops)"
    return "-"


def _facts(t: TestEntry, p: TestProfile) -> list[tuple[str, str]]:
    per = p.per_iteration
    c = p.counters
    facts = [
        ("Level", f"{format_ns(level_of(t))} per iteration ({_metric(t)})"),
        (
            "Profiled",
            f"{p.iterations} iterations under the profiler; ops' {p.time_label} "
            f"{format_ns(per(p.op_time_ns))} per iteration",
        ),
    ]
    if p.device:
        facts.append(("Device", p.device))
    if p.gpu_idle_pct is not None:
        facts.append(("GPU idle", f"{percent(p.gpu_idle_pct)} of the profiled window"))
    facts.append(("Tensor Cores", _tc_text(p)))
    if p.flops is not None:
        facts.append(("FLOPs", f"{human(p.flops, 'flops')} per iteration; {_efficiency_text(p)}"))
    facts.append(
        (
            "Syncs and copies",
            f"{human(c.get('syncs', 0))} syncs, "
            f"{human(c.get('host_reads', 0))} host reads, "
            f"{human(c.get('memcpy', 0))} copies "
            f"({human(c.get('memcpy_bytes', 0), 'bytes')}) per iteration",
        )
    )
    if p.peak_memory is not None:
        facts.append(("Peak memory", human(p.peak_memory, "peak_memory")))
    return facts


def profile_view(t: TestEntry, index: int) -> ProfileView | None:
    """The HTML section of ``t``'s profile, pictures drawn; None without one."""
    from perfguard.report.svg import SPLIT_COLOURS, iteration_strip, split_bar

    p = t.profile
    if p is None:
        return None
    view = ProfileView(
        summary=one_line(t),
        time_label=p.time_label,
        metric=_metric(t),
        facts=_facts(t, p),
        gpu=p.basis == "gpu",
    )
    view.rows = [_row(p, op) for op in p.ops[:SHOWN_OPS]]
    hidden = len(p.ops) - len(view.rows) + p.other_ops
    if hidden:
        view.more = f"{hidden} more op{'' if hidden == 1 else 's'} not listed"
    named = [op for op in p.ops[:SPLIT_OPS] if op.share_pct]
    if named:
        parts = [
            (op.short_name, float(op.share_pct or 0.0), f"{op.short_name} {percent(op.share_pct)}")
            for op in named
        ]
        rest = max(100.0 - sum(s for _, s, _ in parts), 0.0)
        if rest > 0.05:
            parts.append(("", rest, f"other ops {percent(rest, digits=0)}"))
        view.split_svg = split_bar(parts, f"{t.nodeid}: {p.time_label} split by op")
    samples = np.asarray(t.samples_current, dtype=float)
    if len(samples) >= 2:
        scale, unit = _scale(float(np.nanmax(samples)))
        rounds = _rounds_of(t, len(samples))
        label = f"{t.nodeid}: each iteration's time"
        view.strip_svg = iteration_strip(samples / scale, rounds, unit, label, SPLIT_COLOURS[0])
    return view


def _scale(max_ns: float) -> tuple[float, str]:
    from perfguard.report.figures import time_unit

    return time_unit(max_ns)


def _rounds_of(t: TestEntry, n: int) -> np.ndarray:
    """The round of each of the current samples: the rounds are equal slices of them."""
    rounds = max(len(t.rounds_current), 1)
    if n % rounds:
        return np.zeros(n, dtype=np.int64)
    return np.repeat(np.arange(rounds), n // rounds)
