"""Student's t distribution: the tail probability and the quantile the timing verdicts need.

Written here, from the standard library, because importing ``scipy.stats`` for two numbers
per verdict cost every ``pytest --perfguard`` session 0.7-2.6 s of start-up on the 2-core
VM (``python -X importtime``), more than the analysis of a small test. The tail comes from
the regularized incomplete beta function, P(T > t) = I_x(df/2, 1/2) / 2 with
x = df / (df + t^2) (Abramowitz & Stegun 26.7.1, 26.5.x), evaluated by its continued
fraction (A&S 26.5.8) with the modified Lentz method; the quantile is found by bisection
on that tail, to the last bit of a double. ``tests/test_student.py`` checks both against
``scipy.stats.t`` over the degrees of freedom and levels the verdicts use.
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["t_ppf", "t_sf"]

_TINY = 1e-300
_EPS = 1e-15
_MAX_TERMS = 500


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (A&S 26.5.8), by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS + 1):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            step = c * d
            h *= step
        if abs(step - 1.0) < _EPS:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` > 0 degrees of freedom."""
    if math.isnan(t) or not df > 0:
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t > 0 else 1.0 - tail


@lru_cache(maxsize=1024)
def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` > 0 degrees of freedom (kept: a
    bisection of ~55 tails, asked again for the same level and degrees by every test)."""
    if math.isnan(q) or not df > 0 or not 0.0 <= q <= 1.0:
        return math.nan
    if q in (0.0, 1.0):
        return math.inf if q == 1.0 else -math.inf
    if q == 0.5:
        return 0.0
    p = min(q, 1.0 - q)  # the upper tail of |t|
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > p:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            break
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if t_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
    t = 0.5 * (lo + hi)
    return t if q > 0.5 else -t
