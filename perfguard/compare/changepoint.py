"""Change points of a noisy series of run levels: where a test's timing moved.

Two stages, as Apache Otava and MongoDB's e-divisive split the work
(candidates first, then a test that keeps the real ones), with both
stages built for CI timings: skewed, heavy-tailed, with rare runs slowed
by a busy neighbour, and only a few dozen values.

1. **Candidates** by binary segmentation on ranks. Within the stretch
   being split the values are replaced by their ranks (one wild run moves
   a rank sum by at most one place) and every interval ``[a, b)`` is
   scored by the standardised sum of its centred ranks (mean 0, variance
   ``L (m - L) / (m - 1) * mean(c^2)`` exactly, ties included, under no
   change). The best interval may end before the stretch does: that is
   Matteson & James's two-ended search (their kappa), which finds a
   regression and its fix a few commits later, a shape whose two ends sit
   at the same level and that a split searched from one end misses. Both
   ends become candidates and each side is searched again, down to a low
   bar (:data:`CANDIDATE_Z`): this stage only proposes.
2. **Refining**: each candidate moved to the best single split between its
   neighbours (rank CUSUM, then the least absolute deviation within 5
   runs of it: a run at the edge of the old level ranks like the new one's).
3. **Pruning** with the noise: the candidate whose two neighbouring
   segments differ least (their interquartile means, robust to a quarter
   of slow runs yet not stuck on one band of a two-valued series as a
   median is, over the standard error ``sigma * sqrt(LEVEL_VAR * (1/n1 +
   1/n2))``) is removed while that ratio is below the bar, :data:`STEP_Z`
   plus :data:`STEP_Z_PER_LOG` per log of the length past 50 runs (a longer
   series has more places where noise alone looks like a step); each
   removal merges two segments and their neighbours are re-scored (Otava
   prunes its candidates the same way with a t-test). ``sigma`` is the
   largest of the history's noise estimate (the verdicts',
   :func:`perfguard.compare.timing.between_run_sd`), the series' own (a
   trimmed mean of squared successive differences: a step or a slow run
   moves one or two differences, which the trim drops) and the two
   segments' pooled robust spread; once pruned, the spread left around the
   levels found (winsorised, so two-valued banding keeps its band gap)
   replaces it when larger and the pruning runs again. Last, runs that wander
   (the residuals around the levels autocorrelated at lag 1, by at least
   :data:`AR_Z` standard errors) carry less information than independent
   ones: ``sigma`` grows by the AR(1) factor ``sqrt((1 + rho) / (1 - rho))``
   and the pruning runs once more.

A series that repeats a cycle (:func:`_period`) is split only into
segments of at least one period, with the noise at least that of its
differences one period apart: a cycle is not a staircase of steps. A cycle
too long for that rule (fewer than four in the series) or too noisy for it
is found as a model that beats the steps (:func:`_cycle`): a level and a
sinusoid, with at most one break of level, amplitude and phase, fitted by
least squares at every period from 4 runs to half the series, beats the
step model found when its BIC is lower (each stretch of one spread its own
variance; the period costs :data:`CYCLE_PERIOD` log n, as the best of about
n / 2 tried). Then the steps are those of the series less its wave, and a
break that changes the wave itself (beyond what a level step alone explains,
by the BIC) is a ``cycle`` change: a periodic job that shifted phase. A
cycle the autocorrelation rule found is fitted the same way (at its period
and the two next to it) for that break only; its steps stay as found.
Segments that are ramps (a line tells them better than a flat level) make
one ``drift`` change with the ramps next to them, at the first run of the
ramp, not a staircase of steps. Then the residuals around the levels (or
ramps) are searched the same way for a change of spread alone, scored by
the log ratio of clipped RMS residuals, refined and pruned twice as the
levels are, against a bar calibrated on pure noise (:data:`VARIANCE_Z`):
such a point is a ``variance`` change, never a level step.

Everything is O(m^2) numpy per searched stretch (the cycle model too, once),
no permutations: a few ms for a 200-run history (benchmarks/change_points.py,
benchmarks/README.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

__all__ = ["CANDIDATE_Z", "STEP_Z", "Split", "detect", "noise_sigma", "runs_needed"]

#: fewest runs on each side of a change point
MIN_SIZE = 3
#: standardised rank-sum at which a stretch is split into candidates
CANDIDATE_Z = 2.5
#: a level change is kept when the medians of its two sides differ by this many standard
#: errors (the candidates are the best of many intervals: a nominal 2-sided p of 1e-4)
STEP_Z = 3.6
#: the bar rises with the log of the series' length past 50 runs (more places to split).
#: In n independent normal values the largest level z passes it about 3 times in 100 at
#: 50 runs and under 1 in 200 at 500 (``benchmarks/change_points.py --calibrate``); the
#: 99th-percentile bars in its place did worse on the benchmark's tuning halves
STEP_Z_PER_LOG = 0.6
#: variance of the interquartile mean over n runs, in sigma^2 / n (normal noise: 1.15;
#: rounded up for the few-run segments where it is a median of 3 or 4, pi / 2)
LEVEL_VAR = 1.3
#: a spread change: the log ratio of the two sides' RMS residuals over its standard error
#: must reach ``VARIANCE_Z + VARIANCE_Z_PER_LOG * log(n / 50)`` (no lower below 50 runs):
#: the 99th percentile of the largest such z in n independent normal values (fitted over
#: n = 50 to 800, 600 series each: ``benchmarks/change_points.py --calibrate``), so pure
#: noise reports a change of spread about once in 100 series at any length (a flat bar of
#: 5 did so 0.5 times in 100 at 50 runs and 5 at 500). Chosen over the 98th and 95th
#: percentiles on the tuning halves of the benchmark's suites; the 98th also read a
#: 30-run real history's unfound -5 % step as a wider spread (tests/test_history.py)
VARIANCE_Z = 4.59
VARIANCE_Z_PER_LOG = 0.70
#: a cycle (:func:`_period`): the differences' autocorrelation at its period, at least
#: this and this many of its standard errors
CYCLE_AC = 0.25
CYCLE_Z = 5.0
#: share of the largest squared successive differences dropped from the noise estimate
TRIM = 0.3
#: periods (the best-fitting without a break) at which a cycle's break is searched
CYCLE_TRIES = 8
#: a cycle's break is kept when it beats the cycle without one by the BIC of its four
#: more parameters (a level, an amplitude, a phase and the place): this many log n
CYCLE_BREAK = 4.0
#: what the period costs in the cycle's BIC, in log n: one parameter, and the best of
#: about n / 2 periods tried (the largest of m chi-square(2) gains is about 2 log m)
CYCLE_PERIOD = 3
#: a wandering series (:func:`_lag1`): its residuals' lag-1 autocorrelation is counted less
#: this many of its standard errors (chosen on the benchmark's tuning halves, over 0.5-2:
#: 0.75-1 best, 1.25 and up as without it), and at most AR_CAP
AR_Z = 1.0
AR_CAP = 0.9
_NORMAL = NormalDist()  # the standard library's: no scipy.stats import in a pytest session
_Q = _NORMAL.inv_cdf(1 - TRIM / 2)
#: E[z^2 | z^2 below its (1 - TRIM) quantile] for a standard normal z: makes the trimmed
#: mean an estimate of the variance
_TRIM_FACTOR = 1 - 2 * _Q * _NORMAL.pdf(_Q) / (1 - TRIM)


@dataclass(frozen=True)
class Split:
    """A change at ``index`` (the first value after it): ``kind`` "step", "drift",
    "variance" or "cycle" (a repeating wave changed phase or amplitude); ``z`` the
    difference over its standard error (a cycle's: the root of its likelihood ratio);
    ``p_value`` its nominal two-sided normal p."""

    index: int
    kind: str
    z: float
    until: int | None = None  # a drift: the first run after the ramp

    @property
    def p_value(self) -> float:
        return math.erfc(abs(float(self.z)) / math.sqrt(2.0))


def runs_needed(min_size: int = MIN_SIZE) -> int:
    """Runs a history needs before a change point can be found (one side each)."""
    return 2 * min_size


def noise_sigma(x: np.ndarray) -> float:
    """Run-to-run noise of ``x``: sqrt of the trimmed mean of half the squared successive
    differences, scaled to a standard deviation (module docstring)."""
    d2 = np.sort(np.diff(x) ** 2)
    if len(d2) == 0:
        return 0.0
    keep = d2[: max(1, int(np.ceil(len(d2) * (1 - TRIM))))]
    return float(np.sqrt(keep.mean() / 2 / _TRIM_FACTOR))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their places), as ``scipy.stats.rankdata``
    without its per-call overhead."""
    values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    return (upper - (counts - 1) / 2.0)[inverse]


@lru_cache(maxsize=64)
def _length_weights(m: int, min_size: int) -> np.ndarray:
    """By interval length L (index L, 0..m): 1 / sqrt(L (m - L)) where an interval of L
    runs may be split off (L and m - L at least ``min_size``), 0 elsewhere."""
    length = np.arange(m + 1, dtype=np.float64)
    ok = (length >= min_size) & (m - length >= min_size)
    w = np.zeros(m + 1)
    w[ok] = 1.0 / np.sqrt(length[ok] * (m - length[ok]))
    w.flags.writeable = False
    return w


def _interval_weights(m: int, min_size: int) -> np.ndarray:
    """1 / sqrt(L (m - L)) at [a, b] for L = b - a (0 where b <= a or no split of L runs
    is allowed): an (m + 1) x (m + 1) read-only Toeplitz *view* of one vector, so a search
    builds no table (gathering one from the lengths was 40 % of a series' search). The
    pieces of fewer than ``min_size`` runs before a or after b are not masked here: a
    view's cells are shared; :func:`_best_interval` zeroes them in its own table."""
    v = np.concatenate((np.zeros(m), _length_weights(m, min_size)))  # v[m + L]: L's weight
    step = v.strides[0]
    return np.lib.stride_tricks.as_strided(
        v[m:], shape=(m + 1, m + 1), strides=(-step, step), writeable=False
    )


def _best_interval(seg: np.ndarray, min_size: int) -> tuple[int, int, float]:
    """The interval [a, b) of ``seg`` whose centred ranks sum furthest from 0 in standard
    deviations: (a, b, |z|); a == 0 or b == len(seg) is a one-ended split."""
    m = len(seg)
    c = _ranks(seg) - (m + 1) / 2.0
    var_c = float(np.mean(c * c))
    if var_c == 0:
        return 0, m, 0.0
    s = np.concatenate(([0.0], np.cumsum(c)))
    z = np.subtract.outer(s, s)  # |s[b] - s[a]| at [a, b], in one table
    np.abs(z, out=z)
    z *= _interval_weights(m, min_size)
    z[1:min_size, :] = 0.0  # a piece of fewer than min_size runs before a
    z[:, max(m - min_size + 1, 0) : m] = 0.0  # ... or after b
    k = int(np.argmax(z))
    return k // (m + 1), k % (m + 1), float(z.flat[k]) * np.sqrt((m - 1) / var_c)


def _candidates(x: np.ndarray, min_size: int) -> list[int]:
    found: set[int] = set()
    todo = [(0, len(x))]
    while todo:
        start, stop = todo.pop()
        if stop - start < 2 * min_size:
            continue
        a, b, z = _best_interval(x[start:stop], min_size)
        if z < CANDIDATE_Z:
            continue
        cuts = [c for c in (a, b) if 0 < c < stop - start]
        found.update(start + c for c in cuts)
        edges = [start, *(start + c for c in cuts), stop]
        todo += list(zip(edges[:-1], edges[1:], strict=True))
    return sorted(found)


def _level_spread(seg: np.ndarray) -> tuple[float, float]:
    """(level, spread) of one segment from one sort: the level its interquartile mean (a
    quarter of the values cut from each end, at least one each from three on: robust to a
    quarter of slow runs, yet not stuck on one of two bands as a median of two-valued runs
    is), the spread 1.4826 times the median absolute deviation (a robust SD)."""
    v = np.sort(seg)
    n = len(v)
    cut = max(n // 4, 1 if n >= 3 else 0)
    med = 0.5 * (v[(n - 1) // 2] + v[n // 2])
    dev = np.abs(v - med)
    k = (n - 1) // 2
    part = np.partition(dev, [k, n // 2])
    return float(v[cut : n - cut].mean()), 1.4826 * 0.5 * float(part[k] + part[n // 2])


def _step_z(left: tuple[float, float, int], right: tuple[float, float, int], sigma: float) -> float:
    """Difference of the levels of two neighbouring segments (level, spread, runs: from
    :func:`_level_spread`) over its standard error, the noise the larger of the series'
    ``sigma`` and the segments' own pooled spread (a side that is noisier than the series,
    or a wave the successive differences miss, needs a larger difference)."""
    (l1, s1, n1), (l2, s2, n2) = left, right
    diff = abs(l2 - l1)
    if diff == 0:
        return 0.0
    own = np.sqrt((n1 * s1**2 + n2 * s2**2) / (n1 + n2))
    se = max(sigma, own) * np.sqrt(LEVEL_VAR * (1 / n1 + 1 / n2))
    return float("inf") if se == 0 else diff / se


def _spread_z(
    left: tuple[float, float, int], right: tuple[float, float, int], sigma: float
) -> float:
    """Log ratio of the two segments' root-mean-square residuals (``(rms, 0, runs)``) over
    its standard error (``sqrt(1 / 2 n1 + 1 / 2 n2)`` under normal noise). The residuals
    come in clipped (:func:`_clip_residuals`), so a rare slow run does not read as a wider
    spread."""
    (a, _, n1), (b, _, n2) = left, right
    if a == b:
        return 0.0
    if min(a, b) == 0:
        return float("inf")
    return abs(np.log(b / a)) / np.sqrt(0.5 / n1 + 0.5 / n2)


def _rms(seg: np.ndarray) -> tuple[float, float]:
    return float(np.sqrt(np.mean(seg * seg))), 0.0


def _clip_residuals(r: np.ndarray) -> np.ndarray:
    """Residuals with each beyond 5 times their median size set to that size: a slow
    run counts as a large residual, not as an unbounded one."""
    bound = 5 * float(np.median(np.abs(r)))
    return np.clip(r, -bound, bound)


def _prune(
    x: np.ndarray, cuts: list[int], sigma: float, bar: float, spread: bool = False
) -> list[tuple[int, float]]:
    """Remove the weakest candidate while it is below ``bar``: (index, z) kept. A removal
    merges two segments, so only its two neighbours are scored again. ``spread``: score
    changes of spread (:func:`_spread_z`), else of level (:func:`_step_z`)."""
    cuts = list(cuts)
    stats_of, score = (_rms, _spread_z) if spread else (_level_spread, _step_z)
    memo: dict[tuple[int, int], tuple[float, float, int]] = {}

    def stats(lo: int, hi: int) -> tuple[float, float, int]:
        if (lo, hi) not in memo:
            memo[lo, hi] = (*stats_of(x[lo:hi]), hi - lo)
        return memo[lo, hi]

    def z_at(i: int) -> float:
        lo = cuts[i - 1] if i else 0
        hi = cuts[i + 1] if i + 1 < len(cuts) else len(x)
        return score(stats(lo, cuts[i]), stats(cuts[i], hi), sigma)

    z = [z_at(i) for i in range(len(cuts))]
    while cuts:
        worst = int(np.argmin(z))
        if z[worst] >= bar:
            return list(zip(cuts, z, strict=True))
        del cuts[worst], z[worst]
        for i in (worst - 1, worst):
            if 0 <= i < len(cuts):
                z[i] = z_at(i)
    return []


def _refine(x: np.ndarray, cuts: list[int], min_size: int, window: int = 5) -> list[int]:
    """Each change point moved to the best single split of the stretch between its
    neighbours: first by rank CUSUM (one end fixed), then, within ``window`` runs of
    that, to the split whose two sides' medians leave the least absolute deviation (ranks
    find the stretch, the deviations the exact run: a run at the edge of the old level
    ranks like the new one's; the candidates came from intervals scored on a longer
    stretch)."""
    cuts = list(cuts)
    for k in range(len(cuts)):
        lo = cuts[k - 1] if k else 0
        hi = cuts[k + 1] if k + 1 < len(cuts) else len(x)
        seg = x[lo:hi]
        m = len(seg)
        t = np.arange(1, m)
        ok = (t >= min_size) & (m - t >= min_size)
        if not ok.any():
            continue
        c = _ranks(seg) - (m + 1) / 2.0
        z = np.where(ok, np.abs(np.cumsum(c)[:-1]) / np.sqrt(t * (m - t)), -1.0)
        first = int(t[np.argmax(z)])
        near = [
            j for j in range(first - window, first + window + 1) if min_size <= j <= m - min_size
        ]
        cost = [
            np.abs(seg[:j] - np.median(seg[:j])).sum() + np.abs(seg[j:] - np.median(seg[j:])).sum()
            for j in near
        ]
        cuts[k] = lo + near[int(np.argmin(cost))]
    return cuts


def _refine_spread(r: np.ndarray, cuts: list[int], min_size: int) -> list[int]:
    """Each change of spread moved to the split of the stretch between its neighbours that
    fits two normal variances best (``t log s1^2 + (m - t) log s2^2`` least), on residuals
    clipped to 5 times their median size (one slow run would else pull it)."""
    cuts = list(cuts)
    r2 = np.minimum(np.abs(r), 5 * np.median(np.abs(r)) + 1e-300) ** 2
    for k in range(len(cuts)):
        lo = cuts[k - 1] if k else 0
        hi = cuts[k + 1] if k + 1 < len(cuts) else len(r)
        seg = r2[lo:hi]
        m = len(seg)
        t = np.arange(min_size, m - min_size + 1)
        if len(t) == 0:
            continue
        s = np.concatenate(([0.0], np.cumsum(seg)))
        left, right = s[t] / t, (s[m] - s[t]) / (m - t)
        with np.errstate(divide="ignore"):
            cost = t * np.log(left) + (m - t) * np.log(right)
        cuts[k] = lo + int(t[np.argmin(cost)])
    return cuts


def _residuals(x: np.ndarray, cuts: list[int], sigma: float = 0.0) -> np.ndarray:
    """``x`` less the median of its segment between ``cuts``, or less the segment's line
    where it is a ramp (:func:`_ramp`, given the noise ``sigma``)."""
    r = x.astype(np.float64)
    edges = [0, *cuts, len(x)]
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if sigma and _ramp(x[lo:hi], sigma):
            t = np.arange(hi - lo, dtype=np.float64)
            r[lo:hi] -= np.polyval(np.polyfit(t, x[lo:hi], 1), t)
        else:
            r[lo:hi] -= np.median(x[lo:hi])
    return r


#: E[min(z^2, q^2)] for a standard normal z and q its 95th percentile of |z|: makes the
#: winsorised mean square an estimate of the variance
_WINSOR_Q = _NORMAL.inv_cdf(0.95)
_WINSOR_FACTOR = (0.9 - 2 * _WINSOR_Q * _NORMAL.pdf(_WINSOR_Q)) + 0.1 * _WINSOR_Q**2


def _winsorized_sd(r: np.ndarray) -> float:
    """Standard deviation of residuals, each beyond the 90th percentile of their sizes
    counted at that size: a slow run counts once, as a large residual, and a two-valued
    series keeps its bands' spread (a trimmed or median-based one would drop it)."""
    a = np.abs(r)
    q = float(np.quantile(a, 0.9))
    return float(np.sqrt(np.mean(np.minimum(a, q) ** 2) / _WINSOR_FACTOR))


def _lag1(r: np.ndarray) -> float:
    """Lag-1 autocorrelation of residuals ``r`` (winsorised at the 90th percentile of their
    sizes, as the noise is), less :data:`AR_Z` of its standard errors (``1 / sqrt(n)``
    when the runs are independent): the least autocorrelation the residuals show."""
    a = np.abs(r)
    q = float(np.quantile(a, 0.9)) if len(a) else 0.0
    r = np.clip(r, -q, q)
    den = float(r @ r)
    if den == 0:
        return 0.0
    return min(float(r[1:] @ r[:-1]) / den - AR_Z / np.sqrt(len(r)), AR_CAP)


def _robust_sd(d: np.ndarray) -> float:
    """1.4826 times the median absolute deviation: a standard deviation robust to a few
    wild values."""
    return 1.4826 * float(np.median(np.abs(d - np.median(d))))


def _period(x: np.ndarray) -> int:
    """The period of a cycle that ``x`` repeats, or 0: the lag (2 to a quarter of the
    length, so at least four cycles) at which its successive differences correlate most,
    when that autocorrelation is at least :data:`CYCLE_AC` and :data:`CYCLE_Z` standard
    errors (``1 / sqrt(n)`` under independent noise), and ``x`` comes back to where it was
    one period earlier (the median difference at that lag within half their robust
    spread: a staircase of evenly spaced steps also repeats its differences, but climbs).
    The differences are winsorised at their 90th percentile first, as the noise is."""
    d = np.diff(x)
    d = d - np.median(d)
    q = float(np.quantile(np.abs(d), 0.9)) if len(d) else 0.0
    if q > 0:
        d = np.clip(d, -q, q)
    den = float(np.dot(d, d))
    lags = np.arange(2, len(d) // 4 + 1)
    if den == 0 or len(lags) == 0:
        return 0
    ac = np.array([np.dot(d[k:], d[:-k]) for k in lags]) / den
    k = int(np.argmax(ac))
    if ac[k] < CYCLE_AC or ac[k] * np.sqrt(len(d)) < CYCLE_Z:
        return 0
    period = int(lags[k])
    back = x[period:] - x[:-period]
    return period if abs(np.median(back)) <= 0.5 * _robust_sd(back) else 0


def _ramp(seg: np.ndarray, sigma: float) -> float:
    """The rise of a line through ``seg`` when a line tells it better than a flat level
    (sum of absolute residuals at most 0.7 of the flat's) and it rises beyond the
    noise; else 0."""
    if len(seg) < 2 * MIN_SIZE:
        return 0.0
    t = np.arange(len(seg), dtype=np.float64)
    slope, icpt = np.polyfit(t, seg, 1)
    line = np.abs(seg - (slope * t + icpt)).sum()
    flat = np.abs(seg - np.median(seg)).sum()
    rise = float(slope * (len(seg) - 1))
    return rise if line <= 0.7 * flat and abs(rise) > 3 * sigma else 0.0


def _drifts(x: np.ndarray, steps: list[tuple[int, float]], sigma: float) -> list[Split]:
    """The level splits as Splits, where a level crept instead of stepping one ``drift``:
    a segment that is a ramp (:func:`_ramp`), with the ramps next to it that rise the
    same way, is one drift at its first run (``until``: the first run after it); the
    split points at its ends and inside it are that one change."""
    edges = [0, *(i for i, _ in steps), len(x)]
    z_at = dict(steps)
    rise = [_ramp(x[lo:hi], sigma) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    taken: set[int] = set()
    out: list[Split] = []
    k = 0
    while k < len(rise):
        if rise[k] == 0:
            k += 1
            continue
        end = k
        while end + 1 < len(rise) and rise[end + 1] * rise[k] > 0:
            end += 1
        cps = [i for i in edges[k : end + 2] if i in z_at]
        start = edges[k] if k else edges[end + 1]
        if cps and start in z_at and start not in taken:
            out.append(Split(start, "drift", max(z_at[i] for i in cps), until=edges[end + 1]))
        taken.update(cps)
        k = end + 1
    out += [Split(i, "step", z) for i, z in steps if i not in taken]
    return sorted(out, key=lambda s: s.index)


@lru_cache(maxsize=4)
def _harmonic_basis(n: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cos and sin of each period ``lo..hi`` over ``n`` runs, and their normal equations'
    matrices (with the level), read only: they depend on the length alone, and computing
    them was most of the cycle model's cost (8 MB at 1,000 runs, every period to 500)."""
    periods = np.arange(lo, hi + 1, dtype=np.float64)
    w = 2 * np.pi * np.outer(1.0 / periods, np.arange(n))
    c, s = np.cos(w), np.sin(w)
    g = np.empty((len(periods), 3, 3))
    g[:, 0, 0] = n
    g[:, 0, 1] = g[:, 1, 0] = c.sum(1)
    g[:, 0, 2] = g[:, 2, 0] = s.sum(1)
    g[:, 1, 1] = (c * c).sum(1)
    g[:, 1, 2] = g[:, 2, 1] = (c * s).sum(1)
    g[:, 2, 2] = (s * s).sum(1)
    g += 1e-9 * n * np.eye(3)
    for a in (c, s, g):
        a.flags.writeable = False
    return c, s, g


def _harmonic_rss(y: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Residual sum of squares of ``y`` around its least-squares fit by a level and one
    sinusoid of each whole period ``lo..hi`` (normal equations, all periods at once)."""
    c, s, g = _harmonic_basis(len(y), lo, hi)
    h = np.stack([np.full(len(g), y.sum()), c @ y, s @ y], axis=1)
    fit = np.linalg.solve(g, h[..., None])[..., 0]
    return np.maximum(float(y @ y) - np.einsum("ij,ij->i", h, fit), 0.0)


def _cycle_design(n: int, period: float) -> np.ndarray:
    w = 2 * np.pi * np.arange(n) / period
    return np.column_stack([np.ones(n), np.cos(w), np.sin(w)])


def _split_rss(a: np.ndarray, y: np.ndarray, min_side: int) -> tuple[int, float]:
    """The break ``t`` (each side at least ``min_side`` runs) at which fitting the columns
    of ``a`` to each side on its own leaves the least residual sum of squares: (t, rss),
    from prefix sums of the normal equations (one batched solve for every t)."""
    n, k = a.shape
    t = np.arange(min_side, n - min_side + 1)
    if len(t) == 0:
        return 0, float("inf")
    g = np.cumsum(a[:, :, None] * a[:, None, :], axis=0)
    h = np.cumsum(a * y[:, None], axis=0)
    s = np.cumsum(y * y)
    ridge = 1e-9 * n * np.eye(k)
    total = np.zeros(len(t))
    for gg, hh, ss in (
        (g[t - 1], h[t - 1], s[t - 1]),
        (g[-1] - g[t - 1], h[-1] - h[t - 1], s[-1] - s[t - 1]),
    ):
        fit = np.linalg.solve(gg + ridge, hh[..., None])[..., 0]
        total += np.maximum(ss - np.einsum("ij,ij->i", hh, fit), 0.0)
    best = int(np.argmin(total))
    return int(t[best]), float(total[best])


def _lstsq(a: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    r = y - a @ coef
    return coef, float(r @ r)


@dataclass(frozen=True)
class _Cycle:
    resid: np.ndarray  # around a level and the sinusoid, no break
    change: int  # the best break of level, amplitude and phase together
    resid_change: np.ndarray  # ... around that break's two fits
    rss_level: float  # sum of squares around the same break with the level alone changing
    wave: np.ndarray  # the sinusoid fitted without a break (no level)
    waves: np.ndarray  # the two sinusoids fitted on either side of the break (no level)


def _cycle(x: np.ndarray, period: int, min_size: int) -> _Cycle | None:
    """The sinusoid that ``x`` repeats best, fitted with and without one break, or None
    (fewer than two cycles of 4 runs). ``period``: the one :func:`_period` found (refined
    to the best of it and its neighbours), else every period from 4 runs to half the
    series is tried. Least squares on ``x`` clipped to its quartiles +- 3 IQR (a slow
    run must not make a wave). A change of phase blurs the best single period: the break
    is fitted at the :data:`CYCLE_TRIES` periods that fit best without one (each side at
    least a period), and the best of those kept."""
    n = len(x)
    y = _clip_tails(x) - np.median(x)
    if period:
        periods = np.arange(max(period - 1, 4), period + 2, dtype=np.float64)
    else:
        periods = np.arange(4, n // 2 + 1, dtype=np.float64)
    if len(periods) == 0:
        return None
    rss = _harmonic_rss(y, int(periods[0]), int(periods[-1]))
    order = np.argsort(rss, kind="stable")[:CYCLE_TRIES]
    fits = []
    for p in periods[order].tolist():
        a = _cycle_design(n, p)
        fits.append((*_split_rss(a, y, max(min_size, int(np.ceil(p)))), a))
    t, _, a = min(fits, key=lambda f: f[1])
    if t == 0:
        return None
    _, rss_level = _lstsq(np.column_stack([a, np.arange(n) >= t]), y)
    waves, resid = np.zeros(n), np.zeros(n)
    for lo, hi in ((0, t), (t, n)):
        c, _ = _lstsq(a[lo:hi], y[lo:hi])
        waves[lo:hi] = a[lo:hi, 1:] @ c[1:]
        resid[lo:hi] = y[lo:hi] - a[lo:hi] @ c
    a = fits[0][2]  # the best period without a break
    coef, _ = _lstsq(a, y)
    return _Cycle(y - a @ coef, t, resid, rss_level, a[:, 1:] @ coef[1:], waves)


def _clip_tails(x: np.ndarray) -> np.ndarray:
    """``x`` clipped to its quartiles +- 3 IQR: the models compared by their least squares
    see a slow run as a large value, not an unbounded one."""
    q1, q3 = np.quantile(x, [0.25, 0.75])
    return np.clip(x, q1 - 3 * (q3 - q1), q3 + 3 * (q3 - q1))


def _floor(x: np.ndarray) -> float:
    """The least residual sum of squares a model of ``x`` is credited with (a noiseless
    series fits exactly; the log of 0 would make every exact fit equally good)."""
    return max(len(x) * (1e-9 * float(np.ptp(x))) ** 2, 1e-300) if len(x) else 1e-300


def _fit(r: np.ndarray, spread: list[int], params: int, floor: float) -> float:
    """The BIC of residuals ``r`` of a model of ``params`` parameters: normal, with one
    variance between each two of ``spread`` (the changes of spread found, so a wide stretch
    of noise counts as noise, not as something a wave could explain)."""
    n = len(r)
    edges = np.array([0, *spread, n])
    sizes = np.diff(edges)
    sums = np.add.reduceat(r * r, edges[:-1])
    return float(np.sum(sizes * np.log(np.maximum(sums, floor * sizes / n) / sizes))) + (
        params * float(np.log(n))
    )


def _step_residuals(x: np.ndarray, cuts: list[int], sigma: float) -> tuple[np.ndarray, int]:
    """Residuals of the step model, least-squares levels (a line on a ramp) between
    ``cuts``, and its parameters: a level and a place per step, one more per ramp."""
    edges = [0, *cuts, len(x)]
    r = np.empty(len(x))
    params = 2 * len(cuts) + 1
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        seg = x[lo:hi]
        if sigma and _ramp(seg, sigma):
            t = np.arange(hi - lo, dtype=np.float64)
            r[lo:hi] = seg - np.polyval(np.polyfit(t, seg, 1), t)
            params += 1
        else:
            r[lo:hi] = seg - seg.mean()
    return r, params


def detect(
    values: np.ndarray,
    *,
    noise: float = 0.0,
    min_size: int = MIN_SIZE,
    step_z: float | None = None,
    variance_z: float | None = None,
) -> list[Split]:
    """Change points of ``values`` (module docstring), sorted by index. ``noise``: the
    history's run-to-run standard deviation (same unit as the values) when known; the
    series' own estimate is used when larger. ``step_z``/``variance_z``: the bars (default
    :data:`STEP_Z`, :data:`VARIANCE_Z`). Deterministic."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2 * min_size or np.ptp(x) == 0:
        return []
    if step_z is None:
        step_z = STEP_Z + STEP_Z_PER_LOG * max(0.0, float(np.log(len(x) / 50)))
    if variance_z is None:
        variance_z = VARIANCE_Z + VARIANCE_Z_PER_LOG * max(0.0, float(np.log(len(x) / 50)))
    period = _period(x)
    out, steps, sigma = _changes(x, noise, min_size, step_z, variance_z, period)
    if len(x) < 8:
        return out
    cycle = _cycle(x, period, min_size)
    if cycle is None:
        return out
    n, floor = len(x), _floor(x)
    # a cycle: a level and a sinusoid (with a break or not) beat the steps found, by the
    # BIC (the period one more parameter), each stretch of one spread its own variance
    spread = [s.index for s in out if s.kind == "variance"]
    resid, params = _step_residuals(_clip_tails(x), [i for i, _ in steps], sigma)
    margin = _fit(resid, spread, params, floor) - min(
        _fit(cycle.resid, spread, 3 + CYCLE_PERIOD, floor),
        _fit(cycle.resid_change, spread, 7 + CYCLE_PERIOD, floor),
    )
    if margin <= 0:
        return out
    rss_change = max(float(cycle.resid_change @ cycle.resid_change), floor)
    gain = n * np.log(max(float(cycle.resid @ cycle.resid), floor) / rss_change)
    shape = n * np.log(max(cycle.rss_level, floor) / rss_change)
    changed = gain > CYCLE_BREAK * np.log(n) and shape > 2 * np.log(n)
    if not period:
        # steps and spread of the series less its wave
        wave = cycle.waves if changed else cycle.wave
        out, _, _ = _changes(x - wave, noise, min_size, step_z, variance_z, 0)
    if changed and all(abs(s.index - cycle.change) >= min_size for s in out):
        out.append(Split(cycle.change, "cycle", float(np.sqrt(gain))))
    return sorted(out, key=lambda s: s.index)


def _changes(
    x: np.ndarray, noise: float, min_size: int, step_z: float, variance_z: float, period: int
) -> tuple[list[Split], list[tuple[int, float]], float]:
    """The steps, drifts and spread changes of ``x`` (module docstring), the level steps
    as (index, z) and the noise they were judged against."""
    if np.ptp(x) <= 1e-12 * np.max(np.abs(x)):  # constant, to rounding (a wave taken off)
        return [], [], 0.0
    sigma = max(noise_sigma(x), float(noise))
    if period:
        # a cycle is not a step: segments span whole cycles, and the noise is at least the
        # spread of the differences one period apart (what a cycle leaves unexplained)
        min_size = max(min_size, period)
        sigma = max(sigma, _robust_sd(x[period:] - x[:-period]) / np.sqrt(2))
    steps = _prune(x, _candidates(x, min_size), sigma, step_z)
    cuts = _refine(x, [i for i, _ in steps], min_size)
    steps = _prune(x, sorted(set(cuts)), sigma, step_z)
    # the spread left around the levels found: more than the successive differences said
    # when runs fall in bands or wander (their differences are small, their levels not)
    left = _winsorized_sd(_residuals(x, [i for i, _ in steps], sigma))
    if left > 1.1 * sigma:
        sigma = left
        steps = _prune(x, [i for i, _ in steps], sigma, step_z)
    # runs that wander around the levels found (each run like the one before it) carry
    # less information than independent ones: the standard errors of levels grow by the
    # AR(1) factor sqrt((1 + rho) / (1 - rho)) of the residuals' lag-1 autocorrelation
    rho = _lag1(_residuals(x, [i for i, _ in steps], sigma))
    if rho > 0:
        steps = _prune(x, [i for i, _ in steps], sigma * np.sqrt((1 + rho) / (1 - rho)), step_z)
    out = _drifts(x, steps, sigma)
    edges = [0, *(i for i, _ in steps), len(x)]
    resid = _residuals(x, edges[1:-1], sigma)
    if len(x) >= 6 * min_size:
        clipped = _clip_residuals(resid)
        cuts = _candidates(np.abs(resid), 3 * min_size)
        for _ in range(2):  # as the levels: refined between neighbours, pruned, once more
            cuts = _refine_spread(resid, cuts, 3 * min_size)
            kept = _prune(clipped, sorted(set(cuts)), 0.0, variance_z, spread=True)
            cuts = [i for i, _ in kept]
        out += [Split(i, "variance", z) for i, z in kept]
    return sorted(out, key=lambda s: s.index), steps, sigma
