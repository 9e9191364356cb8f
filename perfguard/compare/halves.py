"""The two halves of a verdict as types: :class:`TimingVerdict` (judged in
:mod:`perfguard.compare.timing`) and :class:`GateVerdict` of :class:`GateFinding`
(:mod:`perfguard.compare.gates`).

They are what the judge returns and what ``results.json`` holds, as they are: msgspec
writes and reads them (:mod:`perfguard.compare.results`). Standard library and msgspec at
import, so a report reads a results file without numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from perfguard.compare.explanation import Scalar
from perfguard.compare.outcomes import Outcome

#: excess wait (share of round time the thread waited for a CPU, over the baseline's)
#: above which a timing is called busy rather than quiet
BUSY_WAIT = 0.02


class TimingVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """The timing evidence of one test, the one home of its figures in ``results.json``
    (the change, its interval, the medians and levels): figures in % of the baseline,
    None when unknown (a NaN made while judging is stored as None, so every reader meets
    one rule)."""

    outcome: Outcome
    mode: str  # "store" | "ab" | "none"
    metric: str
    n_current: int  # rounds (A/B: pairs)
    n_baseline: int
    median_current_ns: float | None
    median_baseline_ns: float | None
    #: the levels the change is the ratio of: the geometric mean of the baseline's
    #: rounds, and the current level = baseline level x (1 + delta) (store mode: the
    #: geometric mean of this session's rounds; A/B: the paired estimate applied)
    level_baseline_ns: float | None
    level_current_ns: float | None
    delta_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    ci_level_pct: float | None
    p_value: float | None
    tolerance_pct: float | None
    threshold_pct: float | None
    noise_pct: float | None  # between-run (store) or between-pair (A/B) standard deviation
    spread_pct: float | None  # this session's rounds: (max - min) / median
    history_runs: int
    load: float | None  # other processes' share of the CPU during this session's rounds
    wait: float | None  # share of this session's round time its thread waited for a CPU
    replicated: str  # what was replicated, and how many times
    message: str

    def __post_init__(self) -> None:
        for name in _FLOATS:
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                msgspec.structs.force_setattr(self, name, None)
            elif v is not None and type(v) is not float:  # a numpy or integer figure
                msgspec.structs.force_setattr(self, name, float(v))


_FLOATS = tuple(f.name for f in msgspec.structs.fields(TimingVerdict) if f.type == (float | None))


@dataclass(frozen=True)
class GateFinding:
    """One gate that moved: ``baseline``/``current`` per iteration, of the op ``op_name``,
    or of the whole test (``whole_test``: ``op_name`` is then the op that moved most)."""

    gate: str
    op_name: str  # "" for the whole test
    kernel_name: str
    baseline: Scalar
    current: Scalar
    budget: str
    message: str
    whole_test: bool = False
    #: what the change costs, as a share of the step (%): its ops' time, or its FLOPs or
    #: bytes against the step's (:mod:`perfguard.compare.weigh`); None where not weighed
    cost_pct: float | None = None
    #: how the cost was read ("time", "flops", "bytes", "kind", "strict", "total"; "net
    #: time": an improvement set against the ops the change added, gates._weighed)
    cost_basis: str = ""


@dataclass(frozen=True)
class GateVerdict:
    """The deterministic evidence of one test."""

    outcome: Outcome  # regressed | improved | unchanged | not-judged
    regressions: list[GateFinding] = field(default_factory=list)
    improvements: list[GateFinding] = field(default_factory=list)
    unstable: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    message: str = ""
    #: the whole-test counters both sides measured (:data:`WHOLE_TEST`: host instructions,
    #: peak memory): ``[baseline, current]``, so a view can show them when they did not move
    totals: dict[str, list[float]] = field(default_factory=dict)
    #: a budget the gate widened, by counter: the text every view shows beside the figure
    #: ("0.15%, widened to 0.93%: this step's count moves 0.33% between heap layouts")
    widened: dict[str, str] = field(default_factory=dict)
    #: counter changes that cost nothing measurable (:mod:`perfguard.compare.weigh`): shown
    #: with their line in every view, never failing, never an improvement
    immaterial: list[GateFinding] = field(default_factory=list)


class TimingFigures:
    """The timing half's figures, read where they live (``self.timing``; None when unknown
    or when nothing was timed): the one reading of them that the session's entry
    (:class:`~perfguard.compare.results.TestEntry`) and the judge's verdict
    (:class:`~perfguard.compare.comparison.TestComparison`) share."""

    __slots__ = ()
    timing: TimingVerdict | None

    @property
    def metric(self) -> str | None:
        return self.timing.metric or None if self.timing is not None else None

    @property
    def n_current(self) -> int | None:
        return None if self.timing is None else self.timing.n_current

    @property
    def n_baseline(self) -> int | None:
        return None if self.timing is None else self.timing.n_baseline

    @property
    def median_current_ns(self) -> float | None:
        return None if self.timing is None else self.timing.median_current_ns

    @property
    def median_baseline_ns(self) -> float | None:
        return None if self.timing is None else self.timing.median_baseline_ns

    @property
    def level_current_ns(self) -> float | None:
        """The current level ``delta_pct`` is the change to."""
        return None if self.timing is None else self.timing.level_current_ns

    @property
    def level_baseline_ns(self) -> float | None:
        return None if self.timing is None else self.timing.level_baseline_ns

    @property
    def delta_pct(self) -> float | None:
        return None if self.timing is None else self.timing.delta_pct

    @property
    def ci_low_pct(self) -> float | None:
        return None if self.timing is None else self.timing.ci_low_pct

    @property
    def ci_high_pct(self) -> float | None:
        return None if self.timing is None else self.timing.ci_high_pct

    @property
    def p_value(self) -> float | None:
        return None if self.timing is None else self.timing.p_value

    @property
    def tolerance_pct(self) -> float | None:
        return None if self.timing is None else self.timing.tolerance_pct

    @property
    def load(self) -> float | None:
        """Other processes' share of the CPU during the test's rounds."""
        return None if self.timing is None else self.timing.load

    @property
    def wait(self) -> float | None:
        """Share of the rounds' time the test's thread waited for a CPU (busy machine)."""
        return None if self.timing is None else self.timing.wait
