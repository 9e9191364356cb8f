"""The timing half of the verdict and the gates' budgets, on hand-computed cases.

Real sessions go through these in tests/test_verdict_modes.py; here each rule
is checked against an independent computation (scipy's t distribution, a
hand-made history with a step, the budget arithmetic).
"""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from scipy import stats

from perfguard.compare.gates import Budget, parse_gates
from perfguard.compare.halves import TimingVerdict
from perfguard.compare.outcomes import Outcome
from perfguard.compare.timing import (
    MIN_HISTORY,
    PRIOR_RUN_SD,
    ab_resolved,
    between_run_sd,
    judge_ab,
    judge_store,
    not_judged,
)
from perfguard.compare.units import interval, percent


@pytest.fixture
def rng() -> np.random.Generator:
    """Each test its own generator: no test's draws depend on which tests ran before it
    (``benchmarks/seed_sweep.py`` runs these tests over 1,000 seeds)."""
    return np.random.default_rng(7)


def test_between_run_sd_ignores_a_step_in_history(rng: np.random.Generator) -> None:
    """A long history (400 runs), so the estimate is tight enough for tolerances that hold
    for any seed (``benchmarks/seed_sweep.py``: over 1,000 seeds ``sd_flat`` lies within
    0.83-1.20 of the true 0.01, ``sd_step`` within 0.97-1.04 of ``sd_flat``, the levels' SD
    at least 10.8x ``sd_step``). At 40 runs the spread is 0.51-1.80, and the SD floor lets
    a +30 % step double the estimate (the ratio reaches 2.05)."""
    n = 400
    noise = 0.01 * rng.standard_normal(n)
    flat = 1e6 * np.exp(noise)
    stepped = flat * np.where(np.arange(n) >= n // 2, 1.3, 1.0)  # a real +30 % step
    sd_flat, sd_step = between_run_sd(flat), between_run_sd(stepped)
    assert sd_flat == pytest.approx(0.01, rel=0.25)
    # the step moves one successive difference: the MAD barely notices it, while the
    # plain standard deviation of the levels is ~13x larger
    assert sd_step == pytest.approx(sd_flat, rel=0.1)
    assert np.std(np.log(stepped)) > 8 * sd_step
    assert math.isnan(between_run_sd(flat[:2]))


def test_store_interval_is_a_t_interval_with_the_larger_standard_error(
    rng: np.random.Generator,
) -> None:
    base = 1e6 * np.exp(0.002 * rng.standard_normal(5))
    cur = 1.08 * 1e6 * np.exp(0.002 * rng.standard_normal(5))
    history = 1e6 * np.exp(0.01 * rng.standard_normal(12))
    v = judge_store(cur, base, history, metric="wall_time", tolerance=0.05, alpha=0.01)
    delta = np.log(cur).mean() - np.log(base).mean()
    se = between_run_sd(history) * math.sqrt(2.0)  # history dominates the rounds' 0.2 %
    t = stats.t.ppf(0.995, len(history) - 1)
    assert v.delta_pct == pytest.approx(100 * math.expm1(delta))
    assert v.ci_low_pct == pytest.approx(100 * math.expm1(delta - t * se))
    assert v.ci_high_pct == pytest.approx(100 * math.expm1(delta + t * se))
    assert v.history_runs == 12 and "12 stored runs" in v.replicated
    expected = Outcome.REGRESSED if delta - t * se > 0 else Outcome.UNCHANGED
    assert v.outcome is expected


def test_store_without_history_uses_the_stated_prior() -> None:
    base = 1e6 * np.ones(5) * np.exp(0.001 * np.arange(5))
    cur = base * 1.06
    v = judge_store(cur, base, np.zeros(0), metric="wall_time", tolerance=0.05, alpha=0.01)
    # one session's rounds are tight (0.1 %), but the prior (3 %) sets the noise
    se = PRIOR_RUN_SD["wall_time"] * math.sqrt(2.0)
    t = stats.t.ppf(0.995, 8)
    assert v.threshold_pct == pytest.approx(100 * math.expm1(t * se))
    assert v.outcome is Outcome.UNCHANGED  # +6 % is inside that
    # its high end is past the tolerance: the words say the threshold, never "below it"
    assert v.ci_high_pct is not None and v.ci_high_pct > 5
    assert v.message.startswith("within the threshold") and "below it" not in v.message
    assert f"{MIN_HISTORY} runs needed" in v.replicated and "3% assumed" in v.replicated
    big = judge_store(base * 1.5, base, np.zeros(0), metric="wall_time", tolerance=0.05, alpha=0.01)
    assert big.outcome is Outcome.REGRESSED


def test_busy_machine_widens_the_threshold_by_the_excess_wait(rng: np.random.Generator) -> None:
    base = 1e6 * np.exp(0.002 * rng.standard_normal(5))
    history = 1e6 * np.exp(0.005 * rng.standard_normal(10))
    slowed = base * 1.3  # the machine's doing: the thread waited for a CPU 40 % of the time

    def judged(current: np.ndarray, wait: float, baseline_wait: float) -> TimingVerdict:
        return judge_store(
            current,
            base,
            history,
            metric="wall_time",
            tolerance=0.05,
            alpha=0.01,
            wait=wait,
            baseline_wait=baseline_wait,
        )

    v = judged(slowed, 0.40, 0.0)
    assert v.outcome is Outcome.NOISY and v.message.startswith("machine busy")
    # waiting 40 % stretches by 1/0.6, the shared machine slows the rest by 1.4 more
    allowed = 100 * ((1 / 0.6) * 1.4 * 1.05 - 1)
    assert v.threshold_pct == pytest.approx(allowed, rel=1e-6)
    # the same rounds as the baseline's, but the baseline waited 40 %: a busier baseline can
    # hide a slowdown that large, so "not slower" cannot be said (noisy, not unchanged)
    v = judged(base, 0.0, 0.40)
    assert v.ci_high_pct is not None and v.ci_high_pct < 5
    assert v.outcome is Outcome.NOISY and v.message.startswith("machine busy")
    # three and a half times as slow is more than the waiting explains: a regression
    assert judged(base * 3.5, 0.40, 0.0).outcome is Outcome.REGRESSED
    # GPU kernel time is not stretched by CPU load: no allowance
    v = judge_store(
        slowed,
        base,
        history,
        metric="gpu_time",
        tolerance=0.05,
        alpha=0.01,
        wait=0.40,
        baseline_wait=0.0,
    )
    assert v.outcome is Outcome.REGRESSED


def test_a_session_on_a_slower_machine_is_not_called_regressed(rng: np.random.Generator) -> None:
    """The whole VM ran a third slower during the session (capture/speed.py's reference
    workload says so): tight rounds 30 % slower are the machine's, not the code's."""
    base = 1e6 * np.exp(0.002 * rng.standard_normal(5))
    history = 1e6 * np.exp(0.005 * rng.standard_normal(10))
    slowed = base * 1.3
    v = judge_store(
        slowed,
        base,
        history,
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
        speed_ns=1.3e6,
        baseline_speed_ns=1.0e6,
    )
    assert v.outcome is Outcome.NOISY, v.message
    assert v.message.startswith(
        "machine at another speed: a fixed reference workload ran 30% slower"
    )
    # the same rounds with the machine at its usual speed: the code got slower
    v = judge_store(
        slowed,
        base,
        history,
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
        speed_ns=1.01e6,
        baseline_speed_ns=1.0e6,
    )
    assert v.outcome is Outcome.REGRESSED
    # far beyond what the machine explains: still a regression
    v = judge_store(
        base * 2.5,
        base,
        history,
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
        speed_ns=1.3e6,
        baseline_speed_ns=1.0e6,
    )
    assert v.outcome is Outcome.REGRESSED
    # a faster machine does not make unchanged code "improved": it is not slower, and the
    # verdict says the machine was faster
    v = judge_store(
        base / 1.3,
        base,
        history,
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
        speed_ns=0.77e6,
        baseline_speed_ns=1.0e6,
    )
    assert v.outcome is Outcome.UNCHANGED
    assert "not slower by the tolerance 5%" in v.message
    assert "faster than for the baseline" in v.message
    # a slower machine: the same rounds slowed by what the machine explains read noisy
    v = judge_store(
        base * 1.3,
        base,
        history,
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
        speed_ns=1.3e6,
        baseline_speed_ns=1.0e6,
    )
    assert v.outcome is Outcome.NOISY and "slower than when the baseline" in v.message
    # GPU kernel time: the host's speed does not enter
    v = judge_store(
        slowed,
        base,
        history,
        metric="gpu_time",
        tolerance=0.05,
        alpha=0.01,
        speed_ns=1.3e6,
        baseline_speed_ns=1.0e6,
    )
    assert v.outcome is Outcome.REGRESSED


def test_trimmed_interval_matches_scipy_and_sets_a_slow_child_aside(
    rng: np.random.Generator,
) -> None:
    from scipy.stats import mstats

    from perfguard.compare.timing import trimmed_interval

    # a change of 2 % with 0.5 % noise: with any seed (1,000 checked) the interval clears
    # zero by 0.46 points at least with the slow child, and the estimate moves < 0.3 points
    d = 0.02 + 0.005 * rng.standard_normal(10)  # n = 10: g = 2
    est, lo, hi, p = trimmed_interval(d, 0.01)
    assert (lo, hi) == pytest.approx(tuple(mstats.trimmed_mean_ci(d, (0.2, 0.2), alpha=0.01)))
    assert est == pytest.approx(stats.trim_mean(d, 0.2))
    assert (p < 0.01) == (lo > 0 or hi < 0)  # the p-value and the interval agree
    spoilt = d.copy()
    spoilt[3] = 0.40  # one child ran in a slow spell of the VM
    e2, lo2, hi2, _ = trimmed_interval(spoilt, 0.01)
    assert lo2 > 0 and abs(e2 - est) < 0.005
    mean_half = stats.t.ppf(0.995, 9) * spoilt.std(ddof=1) / np.sqrt(10)
    assert spoilt.mean() - mean_half < 0  # the plain t interval loses the change to it


def test_ab_pairs_cancel_a_shared_drift(rng: np.random.Generator) -> None:
    drift = np.exp(np.linspace(0, 0.3, 8))  # the machine slows by 35 % during the run
    base = 1e6 * drift * np.exp(0.003 * rng.standard_normal(8))
    head = 1.03e6 * drift * np.exp(0.003 * rng.standard_normal(8))
    v = judge_ab(base, head, metric="wall_time", tolerance=0.02, alpha=0.01)
    d = np.log(head) - np.log(base)
    # 8 pairs: Yuen's 20 % trimmed mean sets floor(1.6) = 1 pair aside each side; by hand
    x = np.sort(d)
    w = np.concatenate([[x[1]], x[1:-1], [x[-2]]])  # winsorized
    se = w.std(ddof=1) / ((1 - 2 / 8) * math.sqrt(8))
    lo = x[1:-1].mean() - stats.t.ppf(0.995, 8 - 2 - 1) * se
    assert v.delta_pct == pytest.approx(100 * math.expm1(x[1:-1].mean()))
    assert v.ci_low_pct == pytest.approx(100 * math.expm1(lo))
    assert "trimmed mean (1 pair(s) set aside each side)" in v.replicated
    assert v.outcome is Outcome.REGRESSED and v.ci_low_pct > 0
    assert ab_resolved(v, 0.02)
    # unpaired, the drift would swamp a 3 % change
    assert np.log(base).std() > 5 * d.std()
    same = judge_ab(
        base,
        base * np.exp(0.003 * rng.standard_normal(8)),
        metric="wall_time",
        tolerance=0.02,
        alpha=0.01,
    )
    assert same.outcome is Outcome.UNCHANGED
    # below 5 pairs nothing is trimmed: the paired t interval
    four = judge_ab(base[:4], head[:4], metric="wall_time", tolerance=0.02, alpha=0.01)
    d4 = d[:4]
    half = stats.t.ppf(0.995, 3) * d4.std(ddof=1) / 2
    assert four.ci_low_pct == pytest.approx(100 * math.expm1(d4.mean() - half))
    # one pair spoilt by a slow spell of the machine does not hide the change
    spoilt = head.copy()
    spoilt[5] *= 0.8
    v = judge_ab(base, spoilt, metric="wall_time", tolerance=0.02, alpha=0.01)
    assert v.outcome is Outcome.REGRESSED, v.message
    few = judge_ab(base[:2], head[:2], metric="wall_time", tolerance=0.02, alpha=0.01)
    assert few.outcome is Outcome.NOT_JUDGED and "too few A/B pairs" in few.message


def test_ab_pairs_in_one_process_say_so_and_a_noisy_one_names_the_pairs_spread(
    rng: np.random.Generator,
) -> None:
    """A pair child's verdict: the sides' levels may differ a lot from pair to pair (each
    process its own offset) while the pairs agree: 'noisy' cites the pairs' SD, the unit
    the interval is built on, and the smallest change the run could see."""
    levels = 1e6 * np.exp(0.3 * rng.standard_normal(8))  # 30 % between processes
    d = np.array([0.03, -0.02, 0.025, -0.03, 0.02, -0.025, 0.03, -0.02])
    v = judge_ab(
        levels, levels * np.exp(d), metric="wall_time", tolerance=0.02, alpha=0.01, in_turn=True
    )
    assert "each one process stepping both trees in turn" in v.replicated
    assert v.outcome is Outcome.NOISY, v.message
    x = np.sort(d)
    w = np.concatenate([[x[1]], x[1:-1], [x[-2]]])
    assert v.noise_pct == pytest.approx(100 * math.expm1(w.std(ddof=1)))
    assert f"its A/B pairs differ by {v.noise_pct:.1f}% (SD)" in v.message
    assert f"smallest change this run can see {v.threshold_pct:.1f}%" in v.message
    assert "rounds spread" not in v.message


@pytest.mark.parametrize(
    "spec, key, budget",
    [
        ({"flops": "2%"}, "flops", Budget("rel", 0.02)),
        ({"syncs": 1}, "syncs", Budget("abs", 1.0)),
        ({"calls": None}, "calls", Budget("off")),
        ({}, "peak_memory", Budget("rel", 0.10)),
        ({"tc_lost": False}, "tc_lost", False),
    ],
)
def test_gate_budgets(spec: dict, key: str, budget: object) -> None:
    assert parse_gates(spec)[key] == budget


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({"speed": 0}, "unknown gate 'speed'"),
        ({"syncs": -1}, "takes a number"),
        ({"tc_lost": "yes"}, "on or off"),
    ],
)
def test_bad_gate_budgets(spec: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_gates(spec)


def test_budget_arithmetic() -> None:
    assert Budget("abs", 0).exceeded(3, 4) and not Budget("abs", 0).exceeded(3, 3)
    assert not Budget("abs", 1).exceeded(3, 4) and Budget("abs", 1).exceeded(3, 4.5)
    assert not Budget("rel", 0.01).exceeded(1e9, 1.005e9)
    assert Budget("rel", 0.01).exceeded(1e9, 1.02e9)
    assert not Budget("off").exceeded(0, 1e9)


def test_round_value_is_the_fastest_host_step_and_the_median_gpu_step():
    """A stray slow step (another process, a page fault) moves neither; work added to
    every step moves both by its size (record.ROUND_STATISTIC)."""
    from perfguard.baseline.record import round_statistic, round_value

    steps = np.array([5.0, 4.0, 4.2, 40.0, 4.1, np.nan])
    assert round_value(steps, "wall_time") == 4.0
    assert round_value(steps, "cpu_time") == 4.0
    assert round_value(steps, "gpu_time") == np.median([5.0, 4.0, 4.2, 40.0, 4.1])
    assert round_value(steps + 1.0, "wall_time") - round_value(steps, "wall_time") == 1.0
    assert np.isnan(round_value(np.array([]), "wall_time"))
    assert [round_statistic(m) for m in ("gpu_time", "wall_time", "cpu_time")] == [
        "median",
        "min",
        "min",
    ]


def test_a_confirmed_timing_says_each_figure_once() -> None:
    """A stored comparison that read +30 % on a noisy machine, measured again A/B on unchanged
    code: the message leads with what the same machine found, quotes the stored reading once
    (suite_trust parses it), and gives the A/B's change and interval once, in its own
    reason (they were said twice, and "the stored comparison" twice)."""
    from perfguard.compare.confirm import Confirmation, confirmed

    rng = np.random.default_rng(7)
    stored = judge_store(
        np.full(5, 13e6) * (1 + rng.normal(0, 0.08, 5)),
        np.full(5, 10e6) * (1 + rng.normal(0, 0.08, 5)),
        np.array([]),
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
    )
    base = np.full(10, 10e6) * (1 + rng.normal(0, 0.01, 10))
    head = base * (1 + rng.normal(0, 0.005, 10))
    v = confirmed(stored, Confirmation("a" * 40, base, head), tolerance=0.05, alpha=0.01)
    said = v.message
    assert said.startswith(f"not confirmed on this machine over 10 A/B pairs against {'a' * 12}: ")
    assert said.count("the stored comparison") == 1, said
    ab = percent(v.delta_pct, True) + " " + interval(v.ci_low_pct, v.ci_high_pct)
    assert said.count(ab) == 1, (ab, said)
    stored_said = (
        f"{percent(stored.delta_pct, True)} {interval(stored.ci_low_pct, stored.ci_high_pct)}"
    )
    assert (
        f"the stored comparison read {stored_said} ({stored.outcome.value}), the machine's" in said
    )


def test_a_green_that_cannot_rule_out_a_slowdown_is_measured_again() -> None:
    """Green must mean not slower (issue 55): a first comparison's ``unchanged`` whose
    interval reaches past the tolerance ("within the threshold 15 %") could hide a +5 %
    change, so the same machine measures it again, and its A/B decides: a real +10 % reads
    ``regressed``, unchanged code ``unchanged`` with the stored reading quoted. A green
    whose interval rules the slowdown out is not measured again."""
    from perfguard.compare.confirm import Confirmation, blind_green, confirmed, wants_confirmation

    rng = np.random.default_rng(3)
    base_rounds = np.full(5, 10e6) * (1 + rng.normal(0, 0.01, 5))
    wide = judge_store(
        base_rounds * 1.02,
        base_rounds[::-1],
        np.array([]),
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
    )
    assert wide.outcome is Outcome.UNCHANGED and wide.ci_high_pct > 5, wide.message
    assert blind_green(wide) and wants_confirmation(wide, gates_regressed=False)
    assert not wants_confirmation(wide, gates_regressed=True)  # the gates failed it already
    tight = judge_store(  # ten stored runs within 0.3 % of each other
        np.full(5, 10e6) * (1 + rng.normal(0, 0.002, 5)),
        np.full(5, 10e6) * (1 + rng.normal(0, 0.002, 5)),
        np.full(10, 10e6) * (1 + rng.normal(0, 0.003, 10)),
        metric="wall_time",
        tolerance=0.05,
        alpha=0.01,
    )
    assert tight.outcome is Outcome.UNCHANGED and tight.ci_high_pct < 5, tight.message
    assert not blind_green(tight) and not wants_confirmation(tight, gates_regressed=False)

    base = np.full(12, 10e6) * (1 + rng.normal(0, 0.01, 12))
    slower = confirmed(wide, Confirmation("b" * 40, base, base * 1.10), tolerance=0.05, alpha=0.01)
    assert slower.outcome is Outcome.REGRESSED and slower.mode == "ab", slower.message
    assert slower.message.startswith("slower on this machine over 12 A/B pairs")
    assert slower.message.count("the stored comparison read") == 1  # its reading, once
    assert "(unchanged) and could not rule out a slowdown" in slower.message
    same = confirmed(
        wide,
        Confirmation("b" * 40, base, base * (1 + rng.normal(0, 0.003, 12))),
        tolerance=0.05,
        alpha=0.01,
    )
    assert same.outcome is Outcome.UNCHANGED, same.message
    assert same.message.startswith("measured again on this machine over 12 A/B pairs"), same.message
    assert "(unchanged) and could not rule out a slowdown" in same.message


def test_a_short_confirmation_budget_takes_the_most_suspect_tests_that_fit() -> None:
    """A pair child's first pairs are not cut short, so the confirmer chooses before it
    starts: the suspects whose first pairs fit the budget left, a timing read ``noisy``
    before a green that could not rule out a slowdown, and among those the interval that
    reaches furthest past the tolerance; the rest keep their stored verdict and say why."""
    from types import SimpleNamespace

    from perfguard.compare.comparison import TestComparison
    from perfguard.compare.explanation import Explanation
    from perfguard.plugin.confirm import CONFIRM_PAIRS, Confirmer, pair_cost_s

    def suspect(name: str, outcome: Outcome, hi: float, step_ms: float) -> TestComparison:
        timing = msgspec.structs.replace(
            not_judged("wall_time", "", 0.05),
            outcome=outcome,
            mode="store",
            delta_pct=0.0,
            ci_low_pct=-hi,
            ci_high_pct=hi,
        )
        return TestComparison(
            nodeid=f"t.py::{name}",
            outcome=outcome,
            message="",
            timing=timing,
            gates=None,
            explanation=Explanation.plain(outcome.value, ""),
            alpha=0.01,
            baseline_commit="c" * 40,
            samples_current=[int(step_ms * 1e6)] * 50,  # 5 rounds of 10 steps
            rounds_current=[int(step_ms * 1e6)] * 5,
        )

    wide = suspect("wide_green", Outcome.UNCHANGED, 15.0, 1.0)
    narrow = suspect("narrow_green", Outcome.UNCHANGED, 6.0, 1.0)
    noisy = suspect("noisy", Outcome.NOISY, 8.0, 1.0)
    slow = suspect("slow_noisy", Outcome.NOISY, 30.0, 200.0)  # 12 s a pair
    assert pair_cost_s(slow) == pytest.approx(0.25 + 2 * 3 * 10 * 0.2)
    each = CONFIRM_PAIRS * pair_cost_s(wide)
    context = SimpleNamespace(settings=SimpleNamespace(confirm_budget=2.5 * each))
    confirmer = Confirmer(context, print)  # type: ignore[arg-type]
    fits, left = confirmer._fitting([narrow, wide, slow, noisy])
    assert [c.nodeid for c in fits] == ["t.py::noisy", "t.py::wide_green"]
    assert [c.nodeid for c in left] == ["t.py::slow_noisy", "t.py::narrow_green"]
    # a test no budget left can fit keeps its stored verdict, saying why and what to do
    # (nothing is measured: no pair child starts, no worktree is made)
    tight = Confirmer(SimpleNamespace(settings=SimpleNamespace(confirm_budget=1.0)), print)  # type: ignore[arg-type]
    tight._later = {slow.nodeid: (slow, lambda c: c)}  # type: ignore[dict-item]
    (said,) = tight.finish()
    assert "had no room for its 8 A/B pairs (about 98 s) after 0 more suspect" in str(
        said.unavailable  # type: ignore[attr-defined]
    )
