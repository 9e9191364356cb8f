"""``perfguard.compare.stats`` against hand-computed cases and scipy (test-only dependency)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfguard.compare.stats import (
    compare_samples,
    exact_u_cdf,
    mann_whitney,
    normal_ppf,
    normal_sf,
    rank_rows,
)


def test_exact_u_distribution_by_enumeration() -> None:
    # m = n = 2: the 6 equally likely rank sets give U = 0, 1, 2, 2, 3, 4
    assert np.allclose(exact_u_cdf(2, 2), [1 / 6, 2 / 6, 4 / 6, 5 / 6, 1.0])
    # m = 3, n = 4: enumerate all C(7, 3) = 35 rank sets and count U = sum(ranks) - 6
    from itertools import combinations

    counts = np.zeros(13)
    for ranks in combinations(range(1, 8), 3):
        counts[sum(ranks) - 6] += 1
    assert np.allclose(exact_u_cdf(3, 4), np.cumsum(counts) / 35)
    assert np.allclose(exact_u_cdf(4, 3), exact_u_cdf(3, 4))


def test_separated_samples_exact_p() -> None:
    u, p, exact = mann_whitney([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])
    assert u[0] == 25 and exact[0]
    assert p[0] == pytest.approx(2 / math.comb(10, 5))  # 2/252: only the two extreme orderings


def test_rank_rows_average_ranks_and_tie_term() -> None:
    ranks, ties = rank_rows(np.array([[3.0, 1.0, 2.0, 2.0], [5.0, 5.0, 5.0, 1.0]]))
    assert ranks.tolist() == [[4.0, 1.0, 2.5, 2.5], [3.0, 3.0, 3.0, 1.0]]
    assert ties.tolist() == [2**3 - 2, 3**3 - 3]


def test_normal_approximation_by_hand() -> None:
    x, y = [1.0, 2.0, 2.0, 3.0, 4.0], [2.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    # ranks of the pooled 11 values: 1 -> 1, the three 2s -> 3, 3 -> 5, 4 -> 6, 5..9 -> 7..11
    u_y = (3 + 7 + 8 + 9 + 10 + 11) - 6 * 7 / 2
    var = 5 * 6 / 12 * ((11 + 1) - (3**3 - 3) / (11 * 10))
    z = (abs(u_y - 15) - 0.5) / math.sqrt(var)
    u, p, exact = mann_whitney(y, x)
    assert not exact[0] and u[0] == u_y
    assert p[0] == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-12)


def test_normal_helpers() -> None:
    assert normal_ppf(0.995) == pytest.approx(2.5758293035489004, abs=1e-12)
    assert normal_ppf(0.5) == pytest.approx(0.0, abs=1e-15)
    assert normal_ppf(1e-10) == pytest.approx(-6.361340902404056, abs=1e-9)
    assert float(normal_sf(1.959963984540054)) == pytest.approx(0.025, rel=1e-12)


def test_hodges_lehmann_on_a_pure_scale_change() -> None:
    x = np.array([1.0, 3.0, 9.0, 27.0, 81.0])  # 2x shares no value with x: no ties
    r = compare_samples(x, 2 * x, alpha=0.01)
    assert r.exact[0] and r.p_value[0] > 0.5  # the ranks interleave: x, 2x, x, 2x, ...
    assert r.delta[0] == pytest.approx(1.0) and r.hl[0] == pytest.approx(1.0)
    # 5/5 at 99 %: k = 1, so the interval spans the extreme pairwise ratios 2*1/81 .. 2*81/1
    assert r.ci_low[0] == pytest.approx(2 / 81 - 1) and r.ci_high[0] == pytest.approx(162 - 1)
    # 5/5 at 99.9 %: 2/252 > 0.001, the level is out of reach
    assert math.isnan(compare_samples(x, 2 * x, alpha=0.001).ci_low[0])


def test_zero_values_use_the_additive_scale() -> None:
    x = np.array([0.0, 10.0, 10.0, 10.0, 10.0, 10.0])
    y = x + 5.0
    r = compare_samples(x, y)
    assert r.delta[0] == pytest.approx(0.5) and r.hl[0] == pytest.approx(0.5)


def test_batch_rows_are_independent() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.lognormal(0, 0.1, (4, 12)), rng.lognormal(0.05, 0.1, (4, 9))
    batch = compare_samples(x, y)
    for i in range(4):
        one = compare_samples(x[i], y[i])
        assert one.p_value[0] == batch.p_value[i] and one.ci_low[0] == batch.ci_low[i]


def test_interval_agrees_with_the_test() -> None:
    """At level 1 - alpha the interval excludes 0 iff p < alpha (ties may put a bound on 0)."""
    rng = np.random.default_rng(11)
    for trial in range(300):
        m, n = rng.integers(5, 40, size=2)
        x = rng.lognormal(0, 0.2, m)
        y = rng.lognormal(rng.normal(0, 0.1), 0.2, n)
        if trial % 2:
            x, y = np.round(x, 2), np.round(y, 2)
        r = compare_samples(x, y, 0.01)
        lo, hi, p = r.ci_low[0], r.ci_high[0], r.p_value[0]
        if p < 0.01:
            assert lo >= 0 or hi <= 0
        else:
            assert lo <= 0 <= hi


def test_large_samples_are_thinned_deterministically() -> None:
    rng = np.random.default_rng(5)
    x, y = rng.lognormal(0, 0.05, 3000), rng.lognormal(0.02, 0.05, 2500)
    a, b = compare_samples(x, y), compare_samples(x, y)
    assert a.ci_low[0] == b.ci_low[0] and a.ci_low[0] < math.expm1(0.02) < a.ci_high[0]


scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is the test-only cross-check")


@pytest.mark.parametrize("m,n", [(1, 4), (5, 5), (3, 8), (7, 6), (10, 12), (30, 30), (50, 50)])
def test_exact_p_matches_scipy(m: int, n: int) -> None:
    rng = np.random.default_rng(m * 100 + n)
    for _ in range(10):
        x, y = rng.lognormal(0, 0.3, m), rng.lognormal(0.2, 0.3, n)
        u, p, exact = mann_whitney(y, x)
        ref = scipy_stats.mannwhitneyu(y, x, alternative="two-sided", method="exact")
        assert exact[0] and u[0] == ref.statistic
        assert p[0] == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("m,n", [(5, 5), (10, 12), (30, 30), (200, 150)])
def test_tied_p_matches_scipy_asymptotic(m: int, n: int) -> None:
    rng = np.random.default_rng(m + n)
    for _ in range(10):
        x = np.round(rng.lognormal(0, 0.3, m), 1)
        y = np.round(rng.lognormal(0.2, 0.3, n), 1)
        u, p, exact = mann_whitney(y, x)
        ref = scipy_stats.mannwhitneyu(
            y, x, alternative="two-sided", method="asymptotic", use_continuity=True
        )
        assert not exact[0]
        assert p[0] == pytest.approx(ref.pvalue, rel=1e-9)
