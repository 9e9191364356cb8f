"""Rank statistics for noise-aware verdicts: Mann-Whitney U and a Hodges-Lehmann interval.

Why these. Per-iteration timings are skewed and heavy-tailed (a page fault,
a clock change, another process on the GPU), so tests that assume normal
data give false alarms. The Mann-Whitney U test only uses ranks. For the
size of a change, we use the Hodges-Lehmann estimator on **log** values,
with its distribution-free interval. That interval is the one that inverts
the same U test (Bauer 1972; Hollander & Wolfe, ch. 4).

* A slowdown multiplies times. On a log scale it is a shift, which is the
  model under which the interval has its stated coverage. ``exp`` of the
  bounds gives an interval for the ratio current/baseline of the medians.
* The interval and the p-value come from one rank distribution. At level
  ``1 - alpha`` the interval excludes 0 exactly when ``p < alpha``, so a
  verdict never reads "significant" next to an interval that contains 0.
  That holds for the exact path and for the normal path with its continuity
  correction. A bootstrap of the ratio of medians has neither property: at
  n = 5 to 10 its 99 % percentile interval is coarse and too narrow.
* It needs no random numbers, so results are deterministic without a seed.
  Above :data:`MAX_PAIRS` pairwise differences, each sample is replaced by
  evenly spaced order statistics, which is deterministic too.

Values <= 0 cannot be logged. An op with no kernels in some iteration has a
GPU time of 0 there. Such rows use the plain differences, divided by the
baseline median.

The p-value is two-sided. It is **exact** (the null distribution of U, from
the Gaussian-binomial generating function) when a row has no ties and
``m * n <= EXACT_MAX_PAIRS``. Otherwise it is the normal approximation with
the tie correction of the variance and a continuity correction of 0.5. That
is what ``scipy.stats.mannwhitneyu(..., method="exact" | "asymptotic",
use_continuity=True)`` computes, and the tests check against it.

Everything works on a batch: row ``i`` of ``x`` (k x m) is compared with row
``i`` of ``y`` (k x n). The per-op comparison of a test is one call, not a
loop over ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from perfguard.compare.tolerance import ALPHA

#: largest m*n for which the exact null distribution of U is used (no ties)
EXACT_MAX_PAIRS = 10_000
#: largest m*n for which all pairwise differences are formed per row
MAX_PAIRS = 1 << 20
#: rows of the batch handled together, bounding memory to ~ CHUNK_ELEMENTS floats
CHUNK_ELEMENTS = 1 << 22

__all__ = [
    "EXACT_MAX_PAIRS",
    "ShiftResult",
    "compare_samples",
    "exact_u_cdf",
    "mann_whitney",
    "normal_sf",
    "normal_ppf",
    "rank_rows",
]


def normal_sf(z: np.ndarray | float) -> np.ndarray:
    """Upper tail of the standard normal, accurate far into the tail (erfc, not 1 - cdf)."""
    z = np.asarray(z, dtype=np.float64)
    return 0.5 * _erfc(z / math.sqrt(2.0))


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def normal_ppf(p: float) -> float:
    """Quantile of the standard normal (Acklam's rational approximation, then one Newton step).

    Only used for the interval's critical value, at a single probability.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {p}")
    a = (
        -3.969683028665376e01,
        2.209460984245205e02,
        -2.759285104469687e02,
        1.383577518672690e02,
        -3.066479806614716e01,
        2.506628277459239e00,
    )
    b = (
        -5.447609879822406e01,
        1.615858368580409e02,
        -1.556989798598866e02,
        6.680131188771972e01,
        -1.328068155288572e01,
    )
    c = (
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e00,
        -2.549732539343734e00,
        4.374664141464968e00,
        2.938163982698783e00,
    )
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    elif p <= 1 - lo:
        q = p - 0.5
        r = q * q
        x = (
            (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
            * q
            / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
        )
    else:
        q = math.sqrt(-2 * math.log(1 - p))
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    # one Newton step on the cdf brings the 1e-9 approximation to machine precision
    err = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p
    return x - err * math.sqrt(2 * math.pi) * math.exp(x * x / 2)


@lru_cache(maxsize=64)
def exact_u_cdf(m: int, n: int) -> np.ndarray:
    """``P(U <= u)`` for u = 0..m*n under the null, samples of sizes m and n, no ties.

    The counts of U are the coefficients of the Gaussian binomial
    ``[m+n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i)``. Each factor
    is applied to a power series truncated at degree m*n: multiplying by
    ``1 - q^k`` subtracts a shifted copy, and dividing by ``1 - q^i`` is a
    cumulative sum with stride i (a reshape and one ``cumsum``). Floats keep
    ~1e-16 absolute accuracy in the tails, which is all a p-value needs.
    """
    if m > n:
        m, n = n, m
    size = m * n + 1
    coef = np.zeros(size, dtype=np.float64)
    coef[0] = 1.0
    for i in range(1, m + 1):
        k = n + i
        if k < size:
            coef[k:] = coef[k:] - coef[: size - k].copy()
        pad = (-size) % i
        strided = np.concatenate([coef, np.zeros(pad)]).reshape(-1, i)
        coef = np.cumsum(strided, axis=0).reshape(-1)[:size]
    cdf = np.cumsum(coef) / math.comb(m + n, m)
    return np.minimum(cdf, 1.0)


def rank_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) of each row, and each row's tie term ``sum(t^3 - t)``.

    Vectorised over rows: sort each row, find where each run of equal values
    starts and ends with running max/min accumulations, and give every member
    of a run the mean of its first and last position.
    """
    k, w = values.shape
    order = np.argsort(values, axis=1, kind="stable")
    s = np.take_along_axis(values, order, axis=1)
    pos = np.broadcast_to(np.arange(w), (k, w))
    new = np.ones((k, w), dtype=bool)
    new[:, 1:] = s[:, 1:] != s[:, :-1]
    first = np.maximum.accumulate(np.where(new, pos, 0), axis=1)
    end = np.ones((k, w), dtype=bool)
    end[:, :-1] = new[:, 1:]
    last = np.minimum.accumulate(np.where(end, pos, w - 1)[:, ::-1], axis=1)[:, ::-1]
    avg = (first + last) / 2.0 + 1.0
    ranks = np.empty_like(avg)
    np.put_along_axis(ranks, order, avg, axis=1)
    t = (last - first + 1).astype(np.float64)
    ties = (t * t - 1.0).sum(axis=1)  # each member of a run of t adds t^2 - 1: sum = t^3 - t
    return ranks, ties


def mann_whitney(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-sided Mann-Whitney U test of each row of ``x`` against the same row of ``y``.

    Returns ``(u, p, exact)``: U of ``x`` (pairs with x > y, ties counted
    half), the two-sided p-value, and whether the exact distribution was
    used. 1-D inputs are treated as one row.
    """
    x2, y2 = np.atleast_2d(np.asarray(x, np.float64)), np.atleast_2d(np.asarray(y, np.float64))
    m, n = x2.shape[1], y2.shape[1]
    ranks, ties = rank_rows(np.concatenate([x2, y2], axis=1))
    u = ranks[:, :m].sum(axis=1) - m * (m + 1) / 2.0
    mu = m * n / 2.0
    big_n = m + n
    var = m * n / 12.0 * ((big_n + 1) - ties / (big_n * (big_n - 1)))
    sd = np.sqrt(np.maximum(var, 0.0))
    dev = np.abs(u - mu)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, (dev - 0.5) / sd, 0.0)
    p = np.where(sd > 0, np.minimum(2.0 * normal_sf(np.maximum(z, 0.0)), 1.0), 1.0)
    exact = (ties == 0) & (m * n <= EXACT_MAX_PAIRS)
    if exact.any():
        cdf = exact_u_cdf(m, n)
        lower = np.minimum(u, m * n - u).astype(np.int64)  # U is symmetric about mn/2
        p = np.where(exact, np.minimum(2.0 * cdf[lower], 1.0), p)
    return u, p, exact


def _interval_rank(m: int, n: int, alpha: float, ties: np.ndarray) -> np.ndarray:
    """1-based rank k of the lower bound among the sorted m*n differences, per row.

    The lower bound is D(k), the upper D(mn - k + 1), where k is the smallest
    count whose two-sided U-test p-value is >= alpha (that shift is not
    rejected). Rows whose k is 0 cannot reach the level: their bounds are NaN.
    """
    pairs = m * n
    exact_ok = (ties == 0) & (pairs <= EXACT_MAX_PAIRS)
    k = np.zeros(len(ties), dtype=np.int64)
    if exact_ok.any():
        cdf = exact_u_cdf(m, n)
        # a shift in [D(c), D(c+1)) leaves U = mn - c pairs above it, p = 2 F(c): the
        # first c with 2 F(c) >= alpha is not rejected, so the interval starts at D(c)
        c = int(np.searchsorted(2.0 * cdf, alpha, side="left"))
        k[exact_ok] = c
    if (~exact_ok).any():
        z = normal_ppf(1.0 - alpha / 2.0)
        big_n = m + n
        var = pairs / 12.0 * ((big_n + 1) - ties / (big_n * (big_n - 1)))
        ks = np.ceil(pairs / 2.0 - 0.5 - z * np.sqrt(np.maximum(var, 0.0))).astype(np.int64)
        k[~exact_ok] = ks[~exact_ok]
    return np.minimum(k, (pairs + 1) // 2)


def _thin(a: np.ndarray, size: int) -> np.ndarray:
    """Evenly spaced order statistics of each row (deterministic stand-in for a large sample)."""
    if a.shape[1] <= size:
        return a
    idx = np.round(np.linspace(0, a.shape[1] - 1, size)).astype(np.int64)
    return np.sort(a, axis=1)[:, idx]


@dataclass
class ShiftResult:
    """Per row: medians, the relative change of the median, its interval, and the U test."""

    median_x: np.ndarray
    median_y: np.ndarray
    delta: np.ndarray  # median_y / median_x - 1
    hl: np.ndarray  # Hodges-Lehmann estimate of the same ratio - 1
    ci_low: np.ndarray  # relative change, NaN when the level is out of reach
    ci_high: np.ndarray
    p_value: np.ndarray
    exact: np.ndarray
    n_x: int
    n_y: int
    level: float


def compare_samples(x: np.ndarray, y: np.ndarray, alpha: float = ALPHA) -> ShiftResult:
    """Baseline rows ``x`` (k x m) against current rows ``y`` (k x n): change, interval, p.

    ``delta`` is the ratio of the sample medians minus 1 (the figure a reader
    checks against the printed medians). The ``1 - alpha`` interval is the
    Hodges-Lehmann one on logs (ratio scale), or on raw values divided by the
    baseline median for rows with values <= 0. A row whose baseline median
    is 0 has NaN change.
    """
    x2, y2 = np.atleast_2d(np.asarray(x, np.float64)), np.atleast_2d(np.asarray(y, np.float64))
    if x2.shape[0] != y2.shape[0]:
        raise ValueError(f"row counts differ: {x2.shape[0]} vs {y2.shape[0]}")
    k, m, n = x2.shape[0], x2.shape[1], y2.shape[1]
    med_x = np.median(x2, axis=1) if m else np.full(k, np.nan)
    med_y = np.median(y2, axis=1) if n else np.full(k, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        delta = np.where(med_x > 0, med_y / med_x - 1.0, np.nan)
    nan = np.full(k, np.nan)
    if m == 0 or n == 0:
        return ShiftResult(
            med_x,
            med_y,
            delta,
            nan,
            nan,
            nan.copy(),
            nan.copy(),
            np.zeros(k, bool),
            m,
            n,
            1 - alpha,
        )
    _, p, exact = mann_whitney(y2, x2)

    positive = np.asarray((x2 > 0).all(axis=1) & (y2 > 0).all(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        lx = np.where(positive[:, None], np.log(np.where(x2 > 0, x2, 1.0)), x2)
        ly = np.where(positive[:, None], np.log(np.where(y2 > 0, y2, 1.0)), y2)
    side = int(math.isqrt(MAX_PAIRS))
    if m * n > MAX_PAIRS:
        lx, ly = _thin(lx, side), _thin(ly, side)
    mm, nn = lx.shape[1], ly.shape[1]
    _, ties = rank_rows(np.concatenate([lx, ly], axis=1))
    kk = _interval_rank(mm, nn, alpha, ties)
    pairs = mm * nn
    hl, lo, hi = np.empty(k), np.empty(k), np.empty(k)
    step = max(1, CHUNK_ELEMENTS // max(pairs, 1))
    for s in range(0, k, step):  # chunks bound memory; one chunk for any realistic test
        e = min(k, s + step)
        d = np.sort((ly[s:e, None, :] - lx[s:e, :, None]).reshape(e - s, pairs), axis=1)
        hl[s:e] = np.median(d, axis=1)
        kc = kk[s:e]
        ok = kc >= 1
        rows = np.arange(e - s)
        lo[s:e] = np.where(ok, d[rows, np.maximum(kc - 1, 0)], np.nan)
        hi[s:e] = np.where(ok, d[rows, np.minimum(pairs - kc, pairs - 1)], np.nan)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = np.where(med_x != 0, med_x, np.nan)
        hl_rel = np.where(positive, np.expm1(hl), hl / scale)
        lo_rel = np.where(positive, np.expm1(lo), lo / scale)
        hi_rel = np.where(positive, np.expm1(hi), hi / scale)
    return ShiftResult(med_x, med_y, delta, hl_rel, lo_rel, hi_rel, p, exact, m, n, 1 - alpha)
