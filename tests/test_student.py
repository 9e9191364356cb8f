"""perfguard's Student t (compare/student.py) against scipy.stats.t, the independent
reference, over the degrees of freedom and levels the timing verdicts use (Welch's df is
fractional; A/B pairs give 1-20; history gives up to hundreds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from perfguard.compare.student import t_ppf, t_sf

DFS = [0.5, 1.0, 1.7, 2.0, 3.0, 4.5, 7.0, 12.3, 30.0, 99.0, 1e4]


@pytest.mark.parametrize("df", DFS)
def test_quantiles_match_scipy(df: float) -> None:
    for q in (1e-6, 0.005, 0.025, 0.1, 0.4, 0.6, 0.9, 0.975, 0.995, 1 - 1e-6):
        want = stats.t.ppf(q, df)
        assert t_ppf(q, df) == pytest.approx(want, rel=1e-10, abs=1e-12), q


@pytest.mark.parametrize("df", DFS)
def test_tail_matches_scipy(df: float) -> None:
    for t in np.r_[-50.0, -3.2, -1.0, -1e-3, 0.0, 1e-3, 0.7, 2.5, 9.0, 40.0, 1e3]:
        want = stats.t.sf(t, df)
        assert t_sf(float(t), df) == pytest.approx(want, rel=1e-10, abs=1e-300), t


def test_edges() -> None:
    assert t_ppf(0.5, 3) == 0.0
    assert t_ppf(1.0, 3) == math.inf and t_ppf(0.0, 3) == -math.inf
    assert math.isnan(t_ppf(0.3, 0)) and math.isnan(t_ppf(1.5, 3)) and math.isnan(t_sf(1, -1))
    assert t_sf(math.inf, 2) == 0.0 and t_sf(-math.inf, 2) == 1.0
    assert t_ppf(0.995, 5) == -t_ppf(0.005, 5)
