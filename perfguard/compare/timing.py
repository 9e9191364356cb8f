"""The timing half of a verdict: is the change bigger than the noise between runs?

The unit of replication is the **round** (one execution of the test's
iteration loop), never the iteration: iterations of one run share the
machine's state (clock, caches, the other processes, the memory layout), so
their spread says nothing about the next run, and a test on them calls
unchanged code "regressed" whenever two runs differ by more than one run's
jitter. A round's value is its fastest iteration for host timings (wall,
CPU) and the median for GPU time (:data:`perfguard.baseline.record.ROUND_STATISTIC`).

Two ways to judge, each on the log scale (a change is a ratio):

* **store** (:func:`judge_store`): this session's rounds against the
  baseline run's rounds, with the between-run noise of the test on this
  machine estimated from its stored history: the spread of successive
  differences of the run levels, by the median absolute deviation, so a
  real step in the history moves one difference and not the estimate. The
  standard error of the change is the larger of what the rounds and what
  history say; with too little history (:data:`MIN_HISTORY` runs) the
  rounds are used with a stated prior for the between-run noise
  (:data:`PRIOR_RUN_SD`), and the verdict says how many more runs are needed.
* **A/B** (:func:`judge_ab`): both commits measured on one machine in
  alternating rounds (ABBA); the paired log ratios of adjacent rounds
  cancel the machine's drift, and their 20 % trimmed mean with Yuen's
  interval judges the change (a pair spoilt by a slow spell of the machine
  is set aside; below 5 pairs it is the plain paired t interval).

In both, ``regressed`` needs the interval of the change to exclude zero
*and* the change to exceed the tolerance; so the threshold is the larger of
the tolerance and what the noise allows (``threshold_pct``). ``noisy``: not
significant either way and the rounds disagree by more than the tolerance
(or the interval is wider than the tolerance), so a change of the
tolerance's size could not have been seen; a change larger than the noise
still regresses. A CPU-time or wall-time round measured while other
processes held the CPU (``load``, the share of the machine's CPU time used
by other processes) is not judged against an idle baseline: it is
``noisy`` with the load in the message; A/B pairs share the load and are
judged.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from perfguard.compare.halves import BUSY_WAIT, TimingVerdict
from perfguard.compare.outcomes import Outcome
from perfguard.compare.student import t_ppf, t_sf
from perfguard.compare.units import interval, percent

#: stored runs of a test on one machine needed to estimate its between-run noise
MIN_HISTORY = 5
#: rounds a side needs before any timing is judged
MIN_ROUNDS = 3
#: A/B: the share of the smallest and of the largest paired differences that Yuen's
#: trimmed mean sets aside (trimmed_interval); nothing is trimmed below 5 pairs
AB_TRIM = 0.2
#: a session whose reference workload (capture/speed.py) ran this much slower or faster
#: (log scale) than the baseline's ran on a machine at another speed: not judged on timing
SPEED_DIFF = 0.05
#: between-run standard deviation (log scale) assumed until a test has MIN_HISTORY stored
#: runs: one session's rounds cannot see the drift between sessions (another
#: process layout, another hour), so a first comparison must not be sharper than a
#: typical drift; GPU kernel time drifts far less than CPU timings
PRIOR_RUN_SD = {"gpu_time": 0.01, "wall_time": 0.03, "cpu_time": 0.03}
#: MAD -> standard deviation for a normal distribution
_MAD_SD = 1.4826


def not_judged(metric: str, reason: str, tolerance: float, **figures: Any) -> TimingVerdict:
    """A timing that could not be judged (too few rounds, no baseline figures)."""
    nan = math.nan
    base: dict[str, Any] = dict(
        outcome=Outcome.NOT_JUDGED,
        mode="none",
        metric=metric,
        n_current=0,
        n_baseline=0,
        median_current_ns=nan,
        median_baseline_ns=nan,
        level_baseline_ns=nan,
        level_current_ns=nan,
        delta_pct=nan,
        ci_low_pct=nan,
        ci_high_pct=nan,
        ci_level_pct=nan,
        p_value=nan,
        tolerance_pct=100 * tolerance,
        threshold_pct=nan,
        noise_pct=nan,
        spread_pct=nan,
        history_runs=0,
        load=nan,
        wait=nan,
        replicated="",
        message=reason,
    )
    base.update(figures)
    return TimingVerdict(**base)


def spread(rounds: np.ndarray) -> float:
    """(max - min) / median of round values: how much one session's rounds disagree."""
    r = np.asarray(rounds, dtype=np.float64)
    if len(r) < 2 or np.median(r) <= 0:
        return math.nan
    return float((r.max() - r.min()) / np.median(r))


def between_run_sd(levels: np.ndarray) -> float:
    """Robust standard deviation of one run's log level, from a history of run levels.

    Successive differences remove slow trends and steps (a step moves one
    difference), their MAD ignores the odd outlier run; the difference of two
    runs has twice a run's variance, hence the ``sqrt(2)``.
    """
    x = np.log(np.asarray(levels, dtype=np.float64))
    x = x[np.isfinite(x)]
    if len(x) < 3:
        return math.nan
    d = np.diff(x)
    mad = float(np.median(np.abs(d - np.median(d))))
    sd = _MAD_SD * mad / math.sqrt(2.0)
    # a MAD of 0 (identical runs, e.g. deterministic simulations) would claim
    # infinite precision; the plain SD of the differences bounds it from below
    return max(sd, float(np.std(d, ddof=1)) / math.sqrt(2.0) / 3.0)


def _interval(delta: float, se: float, df: float, alpha: float) -> tuple[float, float, float]:
    if not (se > 0 and math.isfinite(se)) or df < 1:
        return math.nan, math.nan, math.nan
    t = float(t_ppf(1 - alpha / 2, df))
    p = float(2 * t_sf(abs(delta) / se, df))
    return delta - t * se, delta + t * se, p


def trimmed_interval(
    d: np.ndarray, alpha: float, trim: float = 0.2
) -> tuple[float, float, float, float]:
    """Yuen's trimmed-mean interval of paired differences: (estimate, low, high, p).

    The ``trim`` share of the smallest and of the largest differences is set
    aside; the standard error comes from the winsorized variance (Yuen 1974;
    Wilcox, *Introduction to Robust Estimation and Hypothesis Testing*, 5.4),
    with ``n - 2g - 1`` degrees of freedom. One child slowed as a whole (the
    host stole its CPU for a second) moves a t interval by its full size and
    widens it; here it is one of the ``g`` set aside.
    """
    x, g, w = _winsorized(d, trim)
    n = len(x)
    h = n - 2 * g
    if h < 2:
        return math.nan, math.nan, math.nan, math.nan
    est = float(x[g : n - g].mean())
    sw = float(w.std(ddof=1))
    se = sw / ((1 - 2 * g / n) * math.sqrt(n))
    if se == 0:
        return est, est, est, (0.0 if est != 0 else 1.0)
    lo, hi, p = _interval(est, se, h - 1, alpha)
    return est, lo, hi, p


def _winsorized(d: np.ndarray, trim: float) -> tuple[np.ndarray, int, np.ndarray]:
    """(sorted ``d``, ``g`` = floor(trim * n), ``d`` sorted with its ``g`` smallest and
    largest values pulled in to their neighbours)."""
    x = np.sort(np.asarray(d, dtype=np.float64))
    n = len(x)
    g = int(math.floor(trim * n))
    w = x.copy()
    if 0 < g < n - g:
        w[:g], w[n - g :] = x[g], x[n - g - 1]
    return x, g, w


def _pct(log_ratio: float) -> float:
    return 100.0 * math.expm1(log_ratio) if math.isfinite(log_ratio) else math.nan


def _decide(
    lo: float,
    hi: float,
    delta: float,
    tolerance: float,
    noisy: bool,
    clear_below: float | None = None,
) -> Outcome:
    """The timing's outcome from its interval (log scale); ``noisy``: the measurement is
    not to be trusted at the tolerance's size (its rounds spread, the machine was busy).

    Red must mean slower (issue 55): a change beyond the tolerance whose interval lies
    above zero is a regression only where the interval resolves the tolerance (half as
    wide as it or less), or where even its low end is beyond it. A wide interval whose
    low end is barely above zero is what a burst of load makes of a change worth nothing
    (two costless catalogue changes confirmed at +5.8 % [+0.1, +11.7] and +7.0 % [+0.5,
    +13.9] over 12 loaded A/B pairs); it reads ``noisy``. Green must mean not slower: an
    interval whose high end is below the tolerance rules out a slowdown of its size
    however wide it is on the fast side, so it reads ``unchanged`` rather than ``noisy``.
    ``clear_below`` (log scale, default the tolerance's): the bound the high end must be
    under for that; a busy machine passes the bare tolerance with ``hi`` already moved up
    by what the machine explains, since a busier baseline can hide a slowdown that much.
    """
    tol = math.log1p(tolerance)
    wide = not (math.isfinite(lo) and math.isfinite(hi)) or (hi - lo) / 2 > tol
    if math.isfinite(lo) and lo > 0 and delta > tol and (not wide or lo > tol):
        return Outcome.REGRESSED
    if math.isfinite(hi) and hi < 0 and delta < -tol and (not wide or hi < -tol):
        return Outcome.IMPROVED
    clear = tol if clear_below is None else clear_below
    if noisy and not (math.isfinite(hi) and hi < clear):
        return Outcome.NOISY
    if wide and math.isfinite(lo) and lo > 0:  # slower, by how much it cannot tell
        return Outcome.NOISY
    return Outcome.UNCHANGED


def judge_store(
    current: np.ndarray,
    baseline: np.ndarray,
    history: np.ndarray,
    *,
    metric: str,
    tolerance: float,
    alpha: float,
    baseline_runs: int = 1,
    load: float = math.nan,
    wait: float = math.nan,
    baseline_wait: float = math.nan,
    iterations: int = 0,
    speed_ns: float = math.nan,
    baseline_speed_ns: float = math.nan,
) -> TimingVerdict:
    """Judge this session's round values against the baseline's (ns), with history.

    ``history``: one level per stored run of this test on this machine (the
    baseline's runs included), oldest first. ``baseline_runs``: how many
    runs the baseline rounds were pooled from.
    """
    cur = np.log(np.asarray(current, dtype=np.float64))
    base = np.log(np.asarray(baseline, dtype=np.float64))
    cur, base = cur[np.isfinite(cur)], base[np.isfinite(base)]
    sp = spread(np.exp(cur)) if len(cur) else math.nan
    common: dict[str, Any] = dict(
        n_current=len(cur),
        n_baseline=len(base),
        load=load,
        wait=wait,
        spread_pct=100 * sp,
        median_current_ns=float(np.exp(np.median(cur))) if len(cur) else math.nan,
        median_baseline_ns=float(np.exp(np.median(base))) if len(base) else math.nan,
        # each side's level (baseline.record.run_level), judged or not
        level_current_ns=float(np.exp(cur.mean())) if len(cur) else math.nan,
        level_baseline_ns=float(np.exp(base.mean())) if len(base) else math.nan,
        history_runs=int(len(history)),
    )
    if len(cur) < MIN_ROUNDS or len(base) < MIN_ROUNDS:
        side = "this session" if len(cur) < MIN_ROUNDS else "the baseline"
        return not_judged(
            metric,
            f"too few rounds to judge timing: {side} has {min(len(cur), len(base))} "
            f"(at least {MIN_ROUNDS} needed: rounds are of the test's "
            "`for _ in gpuprofile.iterations()` loop, set by rounds= on the marker or "
            "--perfguard-rounds; a test without the loop is one round)",
            tolerance,
            mode="store",
            **common,
        )
    delta = float(cur.mean() - base.mean())
    se_rounds = math.sqrt(cur.var(ddof=1) / len(cur) + base.var(ddof=1) / len(base))
    sd_run = between_run_sd(history) if len(history) >= MIN_HISTORY else math.nan
    if math.isfinite(sd_run):
        se_history = sd_run * math.sqrt(1.0 + 1.0 / max(baseline_runs, 1))
        se, df = max(se_rounds, se_history), max(len(history) - 1, 1)
        noise_from = f"between-run noise from {len(history)} stored runs on this machine"
    else:
        prior = PRIOR_RUN_SD.get(metric, 0.03)
        se_prior = prior * math.sqrt(1.0 + 1.0 / max(baseline_runs, 1))
        se, df = max(se_rounds, se_prior), len(cur) + len(base) - 2
        more = MIN_HISTORY - len(history)
        noise_from = (
            f"history has {len(history)} of the {MIN_HISTORY} runs needed for a between-run "
            f"noise estimate ({more} more saved run(s) on this machine): judged on the "
            f"rounds, with a between-run noise of {percent(100 * prior, digits=None)} "
            "assumed until then"
        )
    lo, hi, p = _interval(delta, se, df, alpha)
    t = float(t_ppf(1 - alpha / 2, df)) if df >= 1 else math.nan
    threshold = max(tolerance, math.expm1(t * se)) if math.isfinite(t) else tolerance
    shift, busy, speed = machine_shift(metric, wait, baseline_wait, speed_ns, baseline_speed_ns)
    noisy = busy or (math.isfinite(sp) and sp > tolerance)
    if busy:  # only a change beyond what the waiting explains counts
        tolerance_b = math.expm1(math.log1p(tolerance) + shift)
        outcome = _decide(
            lo - shift, hi + shift, delta, tolerance_b, noisy, clear_below=math.log1p(tolerance)
        )
        threshold = max(threshold, tolerance_b)
    else:
        outcome = _decide(lo, hi, delta, tolerance, noisy)
    per = f" x {iterations} iterations" if iterations else ""
    replicated = (
        f"{len(cur)} rounds{per} this session vs {len(base)} rounds of the baseline "
        f"({baseline_runs} run(s)); {noise_from}"
    )
    verdict = TimingVerdict(
        outcome=outcome,
        mode="store",
        metric=metric,
        delta_pct=_pct(delta),
        ci_low_pct=_pct(lo),
        ci_high_pct=_pct(hi),
        ci_level_pct=100 * (1 - alpha),
        p_value=p,
        tolerance_pct=100 * tolerance,
        threshold_pct=100 * threshold,
        noise_pct=100 * math.expm1(sd_run) if math.isfinite(sd_run) else math.nan,
        replicated=replicated,
        message="",
        **common,
    )
    return _with_message(verdict, busy, baseline_wait, speed)


def machine_shift(
    metric: str, wait: float, baseline_wait: float, speed_ns: float, baseline_speed_ns: float
) -> tuple[float, bool, float]:
    """(shift, busy, speed): how much (log scale) of a CPU timing's change the machine
    explains between two measurements, whether that makes the comparison busy, and the
    log ratio of the reference workload's times (NaN when a side lacks it). Wait beyond
    the other side's stretches the time (:func:`busy_allowance`); a machine at another
    speed (a slow spell of a VM, another clock, a CPU spinner per core) stretches it by
    the reference workload's ratio. GPU kernel time: none."""
    if metric == "gpu_time":
        return 0.0, False, math.nan
    excess, shift = 0.0, 0.0
    if math.isfinite(wait):
        quiet = baseline_wait if math.isfinite(baseline_wait) else 0.0
        excess = abs(wait - quiet)
        shift = busy_allowance(max(wait, quiet), min(wait, quiet))
    speed = math.nan
    if speed_ns > 0 and baseline_speed_ns > 0:
        speed = math.log(speed_ns / baseline_speed_ns)
    off_speed = math.isfinite(speed) and abs(speed) > SPEED_DIFF
    if off_speed:
        shift += abs(speed)
    return shift, excess > BUSY_WAIT or off_speed, speed


def machine_notes(metric: str, speed_ns: np.ndarray, wait: np.ndarray) -> list[str]:
    """Per run of one test's series, what made the machine unlike the series' usual (its
    median run), by :func:`machine_shift`'s rule: ``"machine 61% slower than usual"`` (the
    reference workload), ``"machine busy: waited 35% of the time"``, or ``""``: what
    ``perfguard history`` and the reports' history tables show beside the run's level, so
    a level the machine made is read as the machine's."""
    speed = np.asarray(speed_ns, dtype=np.float64)
    waits = np.asarray(wait, dtype=np.float64)
    ok_speed = speed[np.isfinite(speed) & (speed > 0)]
    ok_wait = waits[np.isfinite(waits)]
    usual_speed = float(np.median(ok_speed)) if len(ok_speed) else math.nan
    usual_wait = float(np.median(ok_wait)) if len(ok_wait) else math.nan
    out = []
    for s, w in zip(speed, waits, strict=True):
        _, busy, ratio = machine_shift(metric, w, usual_wait, s, usual_speed)
        if not busy:
            out.append("")
        elif math.isfinite(ratio) and abs(ratio) > SPEED_DIFF:
            # "than usual": against the series' median run, a fact of its own, unlike a
            # verdict's speed note (against the baseline's run)
            out.append(
                f"machine {percent(100 * math.expm1(abs(ratio)), digits=0)} "
                f"{'slower' if ratio > 0 else 'faster'} than usual"
            )
        else:
            out.append(f"machine busy: waited {percent(100 * w, digits=0)} of the time")
    return out


def busy_allowance(busier: float, quieter: float) -> float:
    """How much (log scale) a busier machine can stretch a CPU timing.

    Waiting a share ``w`` of the wall time stretches it by ``1 / (1 - w)``
    against running alone; a machine that busy also slows the running part
    (shared caches, memory bandwidth, a sibling hyperthread), allowed for by
    a further ``1 + (w - w0)``, ``w0`` being the quieter side's wait. The
    calibration in ``benchmarks/calibration.py`` measures loaded sessions
    against it.
    """
    busier, quieter = min(busier, 0.95), min(quieter, 0.95)
    return math.log((1 - quieter) / (1 - busier)) + math.log1p(busier - quieter)


def judge_ab(
    base: np.ndarray,
    head: np.ndarray,
    *,
    metric: str,
    tolerance: float,
    alpha: float,
    load: float = math.nan,
    wait: float = math.nan,
    iterations: int = 0,
    in_turn: bool = False,
) -> TimingVerdict:
    """Judge paired rounds: ``base[i]`` and ``head[i]`` ran next to each other (ABBA), or
    in one process stepping in turn (``in_turn``: an A/B pair child)."""
    a = np.log(np.asarray(base, dtype=np.float64))
    b = np.log(np.asarray(head, dtype=np.float64))
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    d = b - a
    common: dict[str, Any] = dict(
        n_current=len(b),
        n_baseline=len(a),
        load=load,
        wait=wait,
        median_current_ns=float(np.exp(np.median(b))) if len(b) else math.nan,
        median_baseline_ns=float(np.exp(np.median(a))) if len(a) else math.nan,
        spread_pct=100 * spread(np.exp(b)) if len(b) else math.nan,
        history_runs=0,
    )
    if len(d) < MIN_ROUNDS:
        return not_judged(
            metric,
            f"too few A/B pairs to judge timing: {len(d)} (at least {MIN_ROUNDS} needed)",
            tolerance,
            mode="ab",
            **common,
        )
    # Yuen's trimmed mean: a child that ran in a slow spell of the machine (one pair off
    # by 15-20 % among pairs within 2 %, seen in the calibration) is set aside, not
    # averaged in; below 5 pairs nothing is trimmed and this is the paired t interval
    delta, lo, hi, p = trimmed_interval(d, alpha, AB_TRIM)
    level = float(np.exp(a.mean()))
    common.update(level_baseline_ns=level, level_current_ns=level * math.exp(delta))
    _, g, w = _winsorized(d, AB_TRIM)
    sd = float(w.std(ddof=1))  # the winsorized spread the interval used
    half = (hi - lo) / 2 if math.isfinite(hi) else math.inf
    noisy = half > math.log1p(tolerance)
    outcome = _decide(lo, hi, delta, tolerance, noisy)
    per = f" x {iterations} iterations" if iterations else ""
    verdict = TimingVerdict(
        outcome=outcome,
        mode="ab",
        metric=metric,
        delta_pct=_pct(delta),
        ci_low_pct=_pct(lo),
        ci_high_pct=_pct(hi),
        ci_level_pct=100 * (1 - alpha),
        p_value=p,
        tolerance_pct=100 * tolerance,
        threshold_pct=100 * max(tolerance, math.expm1(half)) if math.isfinite(half) else math.nan,
        noise_pct=100 * math.expm1(sd),
        replicated=(
            (
                f"{len(d)} A/B pairs{per}, each one process stepping both trees in turn"
                if in_turn
                else f"{len(d)} A/B pairs of rounds{per}, alternating ABBA on this machine"
            )
            + (
                f"; {percent(100 * AB_TRIM, digits=0)} trimmed mean ({g} pair(s) set aside "
                "each side)"
                if g
                else ""
            )
        ),
        message="",
        **common,
    )
    return _with_message(verdict, False, math.nan)


def ab_resolved(verdict: TimingVerdict, tolerance: float) -> bool:
    """Auto-sampling may stop: the change is decided, or its interval is narrower than
    the tolerance (tachometer's rule)."""
    if verdict.outcome in (Outcome.REGRESSED, Outcome.IMPROVED):
        return True
    lo, hi = verdict.ci_low_pct, verdict.ci_high_pct
    return lo is not None and hi is not None and (hi - lo) / 2 < 100 * tolerance


def _with_message(
    v: TimingVerdict, busy: bool, baseline_wait: float, speed: float = math.nan
) -> TimingVerdict:
    threshold, tolerance = percent(v.threshold_pct), percent(v.tolerance_pct, digits=None)
    change = (
        f"{v.metric} {percent(v.delta_pct, True)} {interval(v.ci_low_pct, v.ci_high_pct)} "
        f"({percent(v.ci_level_pct, digits=0)} interval, {v.replicated})"
        if v.ci_low_pct is not None
        else f"{v.metric} {percent(v.delta_pct, True)} ({v.replicated})"
    )
    o = v.outcome
    if o is Outcome.REGRESSED:
        why = f"slower beyond the threshold {threshold} (tolerance {tolerance})"
    elif o is Outcome.IMPROVED:
        why = f"faster beyond the threshold {threshold}"
    elif o is Outcome.NOISY and busy and math.isfinite(speed) and abs(speed) > SPEED_DIFF:
        why = (
            f"machine at another speed: a fixed reference workload ran "
            f"{percent(100 * math.expm1(abs(speed)), digits=0)} "
            f"{'slower' if speed > 0 else 'faster'} than when the baseline was measured, "
            f"which can explain a change up to the threshold {threshold}; use A/B mode or "
            "rely on the gates here"
        )
    elif o is Outcome.NOISY and busy:
        base = percent(100 * baseline_wait, digits=0)
        waited = percent(100 * (v.wait or 0.0), digits=0)
        why = (
            f"machine busy: the test waited for a CPU {waited} of its "
            f"rounds' time (baseline {'unknown' if base == 'n/a' else base}), which can "
            f"explain a change up to the threshold {threshold}; use A/B mode or rely on the "
            "gates here"
        )
    elif o is Outcome.NOISY and v.mode == "ab":
        # the pairs' differences are the A/B unit: the two sides' levels may spread
        # widely across pairs while each pair agrees closely
        why = (
            f"too noisy to resolve a {tolerance} change: its A/B pairs differ by "
            f"{percent(v.noise_pct)} (SD), smallest change this run can see {threshold}"
        )
    elif o is Outcome.NOISY:
        why = (
            f"too noisy to resolve a {tolerance} change: rounds spread "
            f"{percent(v.spread_pct)}, smallest change this run can see {threshold}"
        )
    elif (
        (v.threshold_pct or 0.0) > (v.tolerance_pct or 0.0)
        and v.ci_high_pct is not None
        and v.ci_high_pct < (v.tolerance_pct or 0.0)
    ):
        machine = ""
        if busy and math.isfinite(speed) and abs(speed) > SPEED_DIFF:
            machine = (
                f" (the machine ran a fixed reference workload "
                f"{percent(100 * math.expm1(abs(speed)), digits=0)} "
                f"{'slower' if speed > 0 else 'faster'} than for the baseline)"
            )
        why = (
            f"not slower by the tolerance {tolerance}: the interval's high end "
            f"{percent(v.ci_high_pct, True)} is below it, though the run could not resolve a "
            f"change smaller than {threshold} either way{machine}"
        )
    else:
        why = f"within the threshold {threshold} (tolerance {tolerance})"
    return msgspec.structs.replace(v, message=f"{why}: {change}")
