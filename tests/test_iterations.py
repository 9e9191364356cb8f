"""Iteration assignment against its definition, by brute force."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfguard.analysis.iterations import assign_iteration, iteration_numbers


def _by_definition(rank: np.ndarray, t: np.ndarray, intervals: pd.DataFrame) -> list[int]:
    """Per time: the iteration whose ``[start, end)`` holds it on its rank (the last
    interval of a rank includes its end), -1 for none."""
    out = []
    for r, x in zip(rank.tolist(), t.tolist(), strict=True):
        mine = intervals[intervals["rank"] == r].sort_values("start")
        found = -1
        for k, (s, e, it) in enumerate(mine[["start", "end", "iteration"]].itertuples(index=False)):
            last = k == len(mine) - 1
            if s <= x < e or (last and x == e):
                found = it
                break
        out.append(found)
    return out


@pytest.mark.parametrize("ranks", [[0], [2], [0, 1], [3, 0, 5]])
def test_iteration_numbers_are_their_definition(ranks):
    rng = np.random.default_rng(len(ranks) * 7 + ranks[0])
    for _ in range(40):
        rows = []
        for r in ranks:
            edges = np.sort(
                rng.choice(np.arange(0, 200), size=int(rng.integers(2, 7)), replace=False)
            )
            for i, (s, e) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
                rows.append((r, i + int(rng.integers(0, 3)), int(s), int(e)))
        intervals = pd.DataFrame(rows, columns=["rank", "iteration", "start", "end"])
        intervals = intervals.sample(frac=1, random_state=int(rng.integers(0, 1000)))  # unsorted
        n = int(rng.integers(0, 60))
        # a capture of one rank (also one the intervals do not cover), or several
        pool = ranks if len(ranks) > 1 or rng.random() < 0.7 else [ranks[0] + 1]
        rank = rng.choice(pool, n).astype(np.int32)
        t = rng.integers(-5, 210, n)
        ends = intervals["end"].to_numpy()
        t[: n // 3] = rng.choice(ends, n // 3)  # at an end: outside, or inside the last one
        got = iteration_numbers(rank, t, intervals)
        assert got.tolist() == _by_definition(rank, t, intervals)
        series = assign_iteration(rank, t, intervals)
        assert series.fillna(-1).astype(np.int64).tolist() == got.tolist()
