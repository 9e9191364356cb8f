"""A test's history across stored commits, and the change points in it.

One value per stored run (:func:`run_levels`: the median over the run's
rounds of each round's value, :func:`~perfguard.baseline.record.round_value`,
the same reduction the verdict makes of a run), in first-parent order of the
branch on one machine fingerprint, and the commits where its level moved
(:func:`find_change_points`).

Change points come from e-divisive means (Matteson & James, "A
Nonparametric Approach for Multiple Change Point Analysis of Multivariate
Data", JASA 2014), the method MongoDB's CI and DataStax's Hunter use on
performance histories: the split that maximises the energy distance
between the two sides is kept when a permutation test says a split that
large is unlikely in the same values shuffled (no level shift), then each
side is split again. It assumes no distribution (CI timings are skewed and
heavy-tailed) and needs no noise level or penalty chosen beforehand, the
weak point of penalised methods such as PELT on series of a few dozen
runs. The distances are taken between the ranks of the values within the
stretch being split, not the values: on raw values one run slowed 30 % by
a busy neighbour outweighs a real 5 % step; on ranks it counts as one
more slow run (the permutation test is unchanged: ranks are permuted as
values are). Written here (a few numpy lines, O(n^2) per split) rather than taken
from ``ruptures``, which offers PELT/binary segmentation with a penalty but
not the permutation-tested e-divisive, or ``signal-processing-algorithms``,
which pins old numpy/scipy.

Each change point names its commit, its size (% change of the run-level
median, with the levels before and after, each the median of the runs
between it and the neighbouring change points) and the ops whose per-
iteration time moved most between the same two stretches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfguard.baseline.record import (
    INSTRUCTION_COUNTERS,
    METRICS,
    Fingerprint,
    profiled_mask,
    round_statistic,
    timing_mask,
)
from perfguard.errors import BaselineError

if TYPE_CHECKING:
    from perfguard.baseline.store import Store

__all__ = [
    "ChangePoint",
    "History",
    "OpMove",
    "e_divisive",
    "find_change_points",
    "load_history",
    "run_levels",
]

#: significance level of the permutation test that keeps a split
ALPHA = 0.01
#: permutations per test (the smallest p-value it can give is 1 / (PERMUTATIONS + 1))
PERMUTATIONS = 499
#: fewest runs on each side of a change point
MIN_SIZE = 3
#: ops listed under each change point
TOP_OPS = 3


@dataclass(frozen=True)
class OpMove:
    """How one op's per-iteration time (GPU time, or CPU time for a CPU metric) moved."""

    op_id: str
    op_name: str
    before_ns: float
    after_ns: float

    @property
    def change_ns(self) -> float:
        return self.after_ns - self.before_ns

    @property
    def change_pct(self) -> float:
        return 100.0 * self.change_ns / self.before_ns if self.before_ns else float("nan")


@dataclass(frozen=True)
class ChangePoint:
    """The level of the test moved at ``commit`` (the first run of the new level)."""

    index: int  # position in History.levels
    run_id: int
    commit: str
    before_ns: float  # median run level from the previous change point (or start) to here
    after_ns: float  # median run level from here to the next change point (or end)
    p_value: float
    ops: tuple[OpMove, ...] = ()

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.after_ns - self.before_ns) / self.before_ns


@dataclass
class History:
    """A test's runs in first-parent order on one machine, their counters and change points.

    ``levels``: :func:`run_levels` columns plus ``position`` (first-parent
    distance from the oldest commit shown); ``counters``: one row per run
    (run_id), one column per counter (summed over ops, per iteration).
    """

    nodeid: str
    metric: str
    fingerprint: Fingerprint | None
    levels: pd.DataFrame
    counters: pd.DataFrame
    change_points: list[ChangePoint] = field(default_factory=list)


# --------------------------------------------------------------------------- levels


def _runs_on(store: Store, fingerprint: Fingerprint | None) -> pd.DataFrame:
    runs = store.runs()
    if fingerprint is not None and len(runs):
        ok = [fingerprint.incompatibility(fp) is None for fp in runs["fingerprint"]]
        runs = runs[ok]
    return runs


def run_levels(
    store: Store, nodeid: str, fingerprint: Fingerprint | None = None, metric: str | None = None
) -> pd.DataFrame:
    """One row per stored run of ``nodeid`` (on machines comparable with ``fingerprint``).

    Columns: run_id, commit, time, metric, value (ns: the median over the
    run's rounds of each round's value of ``metric``, default the record's
    primary metric), n_rounds. Runs ordered by time; a run that has no value
    of the metric (e.g. no CPU time measured) is left out.
    """
    runs = _runs_on(store, fingerprint)
    if metric in INSTRUCTION_COUNTERS:
        return _counter_levels(store, nodeid, runs, metric)
    samples = store.test_rows(nodeid, "samples")
    samples = samples[samples["run_id"].isin(runs["run_id"])]
    cols = ["run_id", "commit", "time", "metric", "value", "n_rounds"]
    if samples.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    if metric is not None and metric not in METRICS:
        raise BaselineError(f"unknown metric {metric!r}: choose from {', '.join(METRICS)}")
    wanted = samples["metric"] if metric is None else pd.Series(metric, index=samples.index)
    value = pd.Series(np.nan, index=samples.index)
    for name, col in METRICS.items():
        mask = (wanted == name).to_numpy()
        value[mask] = samples.loc[mask, col].astype(np.float64)
    value[~timing_mask(samples, wanted, by="run_id")] = np.nan
    # each round reduced as the verdict reduces it (record.round_value), per row's metric
    grouped = (
        pd.DataFrame({"run_id": samples["run_id"], "round": samples["round"], "v": value,
                      "stat": wanted.map(round_statistic).to_numpy()})
        .dropna()
        .groupby(["run_id", "round"])
    )  # fmt: skip
    stats = grouped["v"].agg(["min", "median"])
    use_min = grouped["stat"].first() == "min"
    per_round = stats["min"].where(use_min, stats["median"])
    per_run = per_round.groupby(level="run_id").agg(["median", "size"])
    metric_of = samples.groupby("run_id")["metric"].first()
    out = runs.set_index("run_id").loc[per_run.index, ["commit", "time"]].reset_index()
    out["metric"] = metric or out["run_id"].map(metric_of)
    out["value"] = per_run["median"].to_numpy(np.float64)
    out["n_rounds"] = per_run["size"].to_numpy(np.int64)
    out["run_id"] = out["run_id"].astype(np.int64)
    return out.sort_values(["time", "run_id"], kind="stable").reset_index(drop=True)[cols]


def _counter_levels(store: Store, nodeid: str, runs: pd.DataFrame, counter: str) -> pd.DataFrame:
    """:func:`run_levels` of a whole-test counter measured once per run (the host
    instructions per iteration): the run's value, one "round"."""
    rows = store.test_rows(nodeid, "counters")
    rows = rows[(rows["counter"] == counter) & (rows["op_id"] == "")]
    rows = rows[rows["run_id"].isin(runs["run_id"])]
    value = rows.groupby("run_id")["value"].sum()
    out = runs.set_index("run_id").loc[value.index, ["commit", "time"]].reset_index()
    out["metric"] = counter
    out["value"] = value.to_numpy(np.float64)
    out["n_rounds"] = np.ones(len(out), dtype=np.int64)
    out["run_id"] = out["run_id"].astype(np.int64)
    cols = ["run_id", "commit", "time", "metric", "value", "n_rounds"]
    return out.sort_values(["time", "run_id"], kind="stable").reset_index(drop=True)[cols]


def first_parent_order(
    levels: pd.DataFrame, repo: str | os.PathLike[str], ref: str = "HEAD", max_depth: int = 1000
) -> pd.DataFrame:
    """``levels`` of the runs on the first-parent history of ``ref``, oldest commit first
    (runs of one commit by time); a ``position`` column counts commits from the oldest."""
    from perfguard.baseline.git import first_parent_commits

    walk = first_parent_commits(repo, ref, max_depth=max_depth)[::-1]  # oldest first
    position = {sha: i for i, sha in enumerate(walk)}
    out = levels.assign(position=levels["commit"].map(position)).dropna(subset=["position"])
    out["position"] = out["position"].astype(np.int64)
    return out.sort_values(["position", "time", "run_id"], kind="stable").reset_index(drop=True)


def run_counters(store: Store, nodeid: str, run_ids: pd.Series) -> pd.DataFrame:
    """Per run, each counter summed over the test's ops (per iteration): run_id + a column
    per counter, in the order of ``run_ids``."""
    rows = store.test_rows(nodeid, "counters")
    rows = rows[rows["run_id"].isin(run_ids)]
    if rows.empty:
        return pd.DataFrame({"run_id": run_ids.to_numpy(np.int64)})
    wide = rows.pivot_table(index="run_id", columns="counter", values="value", aggfunc="sum")
    wide = wide.reindex(run_ids.to_numpy()).rename_axis(columns=None)
    return wide.reset_index()


# --------------------------------------------------------------------------- detection


def _energy_stat(d: np.ndarray, min_size: int) -> tuple[int, float]:
    """The best split of a series from its distance matrix ``d``: (tau, q) with tau the
    first index of the right side and q the scaled energy distance (Matteson & James's
    Q-hat with the right end at the series' end)."""
    n = len(d)
    s = np.zeros((n + 1, n + 1))
    s[1:, 1:] = d.cumsum(0).cumsum(1)
    tau = np.arange(min_size, n - min_size + 1)
    m = n - tau
    between = s[tau, n] - s[tau, tau]
    within_left = s[tau, tau] / 2
    within_right = (s[n, n] - 2 * s[tau, n] + s[tau, tau]) / 2
    e = (
        2 * between / (tau * m)
        - within_left / (tau * (tau - 1) / 2)
        - within_right / (m * (m - 1) / 2)
    )
    q = tau * m / n * e
    best = int(np.argmax(q))
    return int(tau[best]), float(q[best])


def e_divisive(
    values: np.ndarray,
    *,
    alpha: float = ALPHA,
    permutations: int = PERMUTATIONS,
    min_size: int = MIN_SIZE,
    seed: int = 0,
) -> list[tuple[int, float]]:
    """Change points of ``values``: sorted (index of the first value after the change,
    permutation p-value). Deterministic for a given ``seed``."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    found: list[tuple[int, float]] = []
    todo = [(0, len(x))]
    while todo:
        start, stop = todo.pop()
        seg = x[start:stop]
        if len(seg) < 2 * min_size or np.ptp(seg) == 0:
            continue
        r = pd.Series(seg).rank().to_numpy()  # ranks: one wild run moves a distance by <= 1/n
        d = np.abs(r[:, None] - r[None, :])
        tau, q = _energy_stat(d, min_size)
        exceed = 0
        for _ in range(permutations):
            p = rng.permutation(len(seg))
            exceed += _energy_stat(d[np.ix_(p, p)], min_size)[1] >= q
        p_value = (exceed + 1) / (permutations + 1)
        if p_value <= alpha:
            found.append((start + tau, p_value))
            todo += [(start, start + tau), (start + tau, stop)]
    return sorted(found)


def _op_levels(store: Store, nodeid: str, levels: pd.DataFrame) -> pd.DataFrame:
    """Per (run, op): the op's median per-iteration time (an iteration without it counts 0),
    GPU time for a GPU-time history, else CPU time. Index run_id, columns op ids."""
    ops = store.test_rows(nodeid, "op_samples")
    ops = ops[ops["run_id"].isin(levels["run_id"])]
    if ops.empty:
        return pd.DataFrame(index=levels["run_id"])
    gpu = ops["metric"] == "gpu_time"
    value = np.where(gpu, ops["gpu_time_ns"], ops["cpu_time_ns"]).astype(np.float64)
    per_iter = (
        ops.assign(v=value)
        .groupby(["run_id", "iteration", "op_id"])["v"]
        .sum()
        .unstack("op_id", fill_value=0.0)
    )
    samples = store.test_rows(nodeid, "samples")
    samples = samples[profiled_mask(samples)][["run_id", "iteration"]]
    full = pd.MultiIndex.from_frame(samples[samples["run_id"].isin(levels["run_id"])])
    per_iter = per_iter.reindex(full, fill_value=0.0)
    return per_iter.groupby(level="run_id").median()


def _op_names(store: Store, nodeid: str) -> dict[str, str]:
    ops = store.test_rows(nodeid, "ops")
    return dict(zip(ops["op_id"], ops["op_name"], strict=True))


def find_change_points(
    levels: pd.DataFrame,
    *,
    alpha: float = ALPHA,
    permutations: int = PERMUTATIONS,
    min_size: int = MIN_SIZE,
    op_levels: pd.DataFrame | None = None,
    op_names: dict[str, str] | None = None,
    top_ops: int = TOP_OPS,
) -> list[ChangePoint]:
    """The change points of ``levels["value"]`` (in the frame's order), each with the
    levels around it and, given ``op_levels`` (:func:`_op_levels`), the ops that moved most."""
    values = levels["value"].to_numpy(np.float64)
    splits = e_divisive(values, alpha=alpha, permutations=permutations, min_size=min_size)
    bounds = [0, *(i for i, _ in splits), len(values)]
    out = []
    for k, (index, p_value) in enumerate(splits):
        before = slice(bounds[k], index)
        after = slice(index, bounds[k + 2])
        moves: tuple[OpMove, ...] = ()
        if op_levels is not None and not op_levels.empty:
            ids = levels["run_id"].to_numpy()
            b = op_levels.reindex(ids[before]).median()
            a = op_levels.reindex(ids[after]).median()
            change = (a - b).abs().sort_values(ascending=False, kind="stable")
            moves = tuple(
                OpMove(str(op), (op_names or {}).get(str(op), str(op)), float(b[op]), float(a[op]))
                for op in change.index[:top_ops]
                if change[op] > 0
            )
        out.append(
            ChangePoint(
                index=index,
                run_id=int(levels["run_id"].iloc[index]),
                commit=str(levels["commit"].iloc[index]),
                before_ns=float(np.median(values[before])),
                after_ns=float(np.median(values[after])),
                p_value=p_value,
                ops=moves,
            )
        )
    return out


def load_history(
    store: Store,
    nodeid: str,
    *,
    repo: str | os.PathLike[str] = ".",
    ref: str = "HEAD",
    fingerprint: Fingerprint | None = None,
    metric: str | None = None,
    limit: int | None = None,
    alpha: float = ALPHA,
    top_ops: int = TOP_OPS,
) -> History:
    """The history of ``nodeid`` on the first-parent line of ``ref``, with its change points.

    ``fingerprint`` defaults to the machine of the test's latest run on that
    line: one machine's runs only, as any comparison of timings needs.
    ``limit``: only the latest runs.
    """
    levels = first_parent_order(run_levels(store, nodeid, None, metric), repo, ref)
    if levels.empty:
        raise BaselineError(f"{store.name}: no stored run of {nodeid} on the history of {ref}")
    runs = store.runs().set_index("run_id")["fingerprint"]
    if fingerprint is None:
        fingerprint = runs[int(levels["run_id"].iloc[-1])]
    ok = [fingerprint.incompatibility(runs[int(r)]) is None for r in levels["run_id"]]
    levels = levels[ok].reset_index(drop=True)
    if limit is not None:
        levels = levels.tail(limit).reset_index(drop=True)
    points = find_change_points(
        levels,
        alpha=alpha,
        op_levels=None if metric in INSTRUCTION_COUNTERS else _op_levels(store, nodeid, levels),
        op_names=_op_names(store, nodeid),
        top_ops=top_ops,
    )
    counters = run_counters(store, nodeid, levels["run_id"])
    metric_name = str(levels["metric"].iloc[0]) if len(levels) else (metric or "")
    return History(nodeid, metric_name, fingerprint, levels, counters, points)
