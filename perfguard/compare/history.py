"""A test's history across stored commits, and the change points in it.

One value per stored run (:func:`run_levels`: the median over the run's
rounds of each round's value, :func:`~perfguard.baseline.record.round_value`,
the same reduction the verdict makes of a run), in first-parent order of the
branch on one machine fingerprint, and the commits where its level moved
(:func:`find_change_points`).

Timing change points come from :func:`perfguard.compare.changepoint.detect`
(candidates by a rank-based, two-ended binary segmentation, kept when the
levels on their two sides differ by more than the history's run-to-run
noise allows; each a ``step``, ``drift``, ``variance`` or ``cycle`` change), given the
noise estimate the verdicts use (:func:`perfguard.compare.timing.between_run_sd`).
Counter change points are exact (:mod:`perfguard.compare.counter_steps`):
counters have no noise, so any change between two stored runs is one.
A history shorter than :func:`~perfguard.compare.changepoint.runs_needed`
cannot show a timing change point; :attr:`History.runs_needed` says so.

Each change point names its commit, its size (% change of the run-level
median, with the levels before and after, each the median of the runs
between it and the neighbouring change points) and the ops whose per-
iteration time moved most between the same two stretches.
"""

from __future__ import annotations

import dataclasses
import math
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
    run_levels_of,
    timing_mask,
)
from perfguard.compare.changepoint import detect, runs_needed
from perfguard.compare.counter_steps import CounterStep, counter_steps
from perfguard.compare.units import human, percent
from perfguard.errors import BaselineError

if TYPE_CHECKING:
    from perfguard.baseline.store import Store

__all__ = [
    "ChangePoint",
    "CounterStep",
    "History",
    "OpMove",
    "change_marks",
    "find_change_points",
    "load_history",
    "run_levels",
]

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
    z: float  # the change over its standard error (changepoint.Split.z)
    # "step", "drift" (the level crept), "variance" (the spread moved) or "cycle" (a
    # repeating wave changed its phase or amplitude)
    kind: str = "step"
    ops: tuple[OpMove, ...] = ()

    @property
    def p_value(self) -> float:
        """Nominal two-sided normal p of ``z`` (before any allowance for the search)."""
        return math.erfc(abs(float(self.z)) / math.sqrt(2.0))

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.after_ns - self.before_ns) / self.before_ns

    @property
    def what(self) -> str:
        """The kind in plain words, as every view prints it before the change (``history``
        printed ``cycle +4.2 %`` and left the reader to guess, issue 54)."""
        return KIND_WORDS.get(self.kind, self.kind)


#: a timing change point's kind in words (the level's change follows them)
KIND_WORDS = {
    "step": "level stepped",
    "drift": "level crept (drift)",
    "variance": "spread changed, level",
    "cycle": "a repeating wave changed (cycle), level",
}


@dataclass
class History:
    """A test's runs in first-parent order on one machine, their counters and change points.

    ``levels``: :func:`run_levels` columns plus ``position`` (first-parent
    distance from the oldest commit shown); ``counters``: one row per run
    (run_id), one column per counter (summed over ops, per iteration);
    ``counter_steps``: the exact counter change points; ``runs_needed``: the
    runs a timing change point needs (more than ``len(levels)``: none could be found).
    """

    nodeid: str
    metric: str
    fingerprint: Fingerprint | None
    levels: pd.DataFrame
    counters: pd.DataFrame
    change_points: list[ChangePoint] = field(default_factory=list)
    counter_steps: list[CounterStep] = field(default_factory=list)
    runs_needed: int = field(default_factory=runs_needed)


# --------------------------------------------------------------------------- levels


def _runs_on(store: Store, fingerprint: Fingerprint | None) -> pd.DataFrame:
    runs = store.reader.runs()
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
    samples = store.reader.test_rows(nodeid, "samples")
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
    per_run = run_levels_of(samples["run_id"], samples["round"], value, wanted)
    metric_of = samples.groupby("run_id")["metric"].first()
    out = runs.set_index("run_id").loc[per_run.index, ["commit", "time"]].reset_index()
    out["metric"] = metric or out["run_id"].map(metric_of)
    out["value"] = per_run["level"].to_numpy(np.float64)
    out["n_rounds"] = per_run["size"].to_numpy(np.int64)
    out["run_id"] = out["run_id"].astype(np.int64)
    return out.sort_values(["time", "run_id"], kind="stable").reset_index(drop=True)[cols]


def _counter_levels(store: Store, nodeid: str, runs: pd.DataFrame, counter: str) -> pd.DataFrame:
    """:func:`run_levels` of a whole-test counter measured once per run (the host
    instructions per iteration): the run's value, one "round"."""
    rows = store.reader.test_rows(nodeid, "counters")
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
    rows = store.reader.test_rows(nodeid, "counters", [int(r) for r in run_ids])
    if rows.empty:
        return pd.DataFrame({"run_id": run_ids.to_numpy(np.int64)})
    wide = rows.pivot_table(index="run_id", columns="counter", values="value", aggfunc="sum")
    wide = wide.reindex(run_ids.to_numpy()).rename_axis(columns=None)
    return wide.reset_index()


# --------------------------------------------------------------------------- detection


def _op_levels(store: Store, nodeid: str, levels: pd.DataFrame) -> pd.DataFrame:
    """Per (run, op): the op's median per-iteration time (an iteration without it counts 0),
    GPU time for a GPU-time history, else CPU time. Index run_id, columns op ids."""
    ids = [int(r) for r in levels["run_id"]]
    ops = store.reader.test_rows(nodeid, "op_samples", ids)
    if ops.empty:
        return pd.DataFrame(index=levels["run_id"])
    gpu = ops["metric"] == "gpu_time"
    value = np.where(gpu, ops["gpu_time_ns"], ops["cpu_time_ns"]).astype(np.float64)
    per_iter = (
        ops.assign(v=value)
        .groupby(["run_id", "iteration", "op_id"])["v"]
        .sum()
        # pandas-stubs: fill_value is typed int | str | dict, pandas takes any scalar
        .unstack("op_id", fill_value=0.0)  # type: ignore[arg-type]
    )
    samples = store.reader.test_rows(nodeid, "samples", ids)
    full = pd.MultiIndex.from_frame(samples[profiled_mask(samples)][["run_id", "iteration"]])
    per_iter = per_iter.reindex(full, fill_value=0.0)
    return per_iter.groupby(level="run_id").median()


def _op_names(store: Store, nodeid: str, run_ids: list[int]) -> dict[str, str]:
    ops = store.reader.test_rows(nodeid, "ops", run_ids)
    return dict(zip(ops["op_id"], ops["op_name"], strict=True))


def find_change_points(
    levels: pd.DataFrame,
    *,
    noise: float | None = None,
    op_levels: pd.DataFrame | None = None,
    op_names: dict[str, str] | None = None,
    top_ops: int = TOP_OPS,
) -> list[ChangePoint]:
    """The change points of ``levels["value"]`` (in the frame's order), each with the
    levels around it and, given ``op_levels`` (:func:`_op_levels`), the ops that moved most.
    ``noise``: run-to-run standard deviation in ns; default the history's own estimate
    (:func:`perfguard.compare.timing.between_run_sd` of the levels, times their median).
    A run measured on an unusual machine (:func:`with_machine`'s ``machine`` column) is
    left out of the search while such runs are a minority: a slowdown the machine explains
    then makes no change point by itself (an 18-run history read ``cycle +34.5 %`` on
    unchanged code at a run marked "machine 22 % slower"); where they are most of the
    history (a busy machine's) they stay, or the search would have nothing left. A change
    point found on the rest is placed at its run in ``levels``."""
    marked = (
        levels["machine"].astype(str).ne("").to_numpy()
        if "machine" in levels.columns
        else np.zeros(len(levels), dtype=bool)
    )
    if 0 < marked.sum() < len(levels) / 2:
        kept = levels[~marked].reset_index(drop=True)
        where = np.flatnonzero(~marked)
        found = find_change_points(
            kept.drop(columns="machine"),
            noise=noise,
            op_levels=op_levels,
            op_names=op_names,
            top_ops=top_ops,
        )
        return [dataclasses.replace(cp, index=int(where[cp.index])) for cp in found]
    from perfguard.compare.timing import between_run_sd

    values = levels["value"].to_numpy(np.float64)
    if noise is None:
        sd = between_run_sd(values) if len(values) >= 3 else float("nan")
        noise = float(sd * np.median(values)) if np.isfinite(sd) else 0.0
    splits = detect(values, noise=noise)
    steps = sorted({s.index for s in splits})
    bounds = [0, *steps, len(values)]
    out = []
    for split in splits:
        k = steps.index(split.index)
        before = slice(bounds[k], split.index)
        after = slice(split.index, bounds[k + 2])
        before_ns, after_ns = float(np.median(values[before])), float(np.median(values[after]))
        moves: tuple[OpMove, ...] = ()
        if op_levels is not None and not op_levels.empty:
            ids = levels["run_id"].to_numpy()
            b = op_levels.reindex(ids[before]).median()
            a = op_levels.reindex(ids[after]).median()
            # an op whose move did not happen at this commit moved at another one (a later
            # commit's new op read as this one's): at least half of its move is the step
            # from the run before the change point to the run at it
            at = op_levels.reindex(ids[[split.index - 1, split.index]]).fillna(0.0)
            jump = at.iloc[1] - at.iloc[0]
            moved = (a - b).fillna(0.0)
            here = (np.sign(jump) == np.sign(moved)) & (jump.abs() >= 0.5 * moved.abs())
            # and a move worth naming: a tenth of the step's own size or more (an op's
            # run-to-run noise is no explanation of it)
            here &= moved.abs() >= 0.1 * abs(after_ns - before_ns)
            change = moved.abs()[here.to_numpy(bool)].sort_values(ascending=False, kind="stable")
            moves = tuple(
                OpMove(str(op), (op_names or {}).get(str(op), str(op)), float(b[op]), float(a[op]))
                for op in change.index[:top_ops]
                if change[op] > 0
            )
        out.append(
            ChangePoint(
                index=split.index,
                run_id=int(levels["run_id"].iloc[split.index]),
                commit=str(levels["commit"].iloc[split.index]),
                before_ns=before_ns,
                after_ns=after_ns,
                z=split.z,
                kind=split.kind,
                ops=moves,
            )
        )
    return out


def change_marks(store: Store, nodeid: str, levels: pd.DataFrame) -> list[str]:
    """One short text per run of ``levels`` (run_id, commit, value in ns, history order):
    the timing and counter change points that start at that run, "" elsewhere; what the
    reports' history tables show beside each run."""
    marks: list[list[str]] = [[] for _ in range(len(levels))]
    if "machine" in levels.columns:
        for i, note in enumerate(levels["machine"]):
            if note:
                marks[i].append(note)
    for cp in find_change_points(levels):
        if cp.kind in ("variance", "cycle"):
            what = "spread changed" if cp.kind == "variance" else "cycle changed"
        else:
            what = f"{cp.kind} {percent(cp.change_pct, True)}"
        marks[cp.index].append(what)
    for step in counter_steps(store, nodeid, levels, top_ops=0):
        if step.counter in ("kernel_set", "tc_ops", "dtypes"):
            marks[step.index].append(f"{step.counter} changed")
        else:
            marks[step.index].append(
                f"{step.counter} {human(step.before, step.counter)} → "
                f"{human(step.after, step.counter)}"
            )
    return ["; ".join(m) for m in marks]


def with_machine(store: Store, nodeid: str, levels: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``levels`` (a ``run_id`` column) with a ``machine`` column: what was unusual about the
    machine when each run was measured (:func:`perfguard.compare.timing.machine_notes`,
    from the evidence the session stored with the record), "" for a usual run."""
    from perfguard.compare.timing import machine_notes

    evidence = store.reader.machine_evidence(nodeid).drop_duplicates("run_id").set_index("run_id")
    ev = evidence.reindex(levels["run_id"].to_numpy())
    notes = machine_notes(metric, ev["speed_ns"].to_numpy(), ev["wait"].to_numpy())
    return levels.assign(machine=notes)


def load_history(
    store: Store,
    nodeid: str,
    *,
    repo: str | os.PathLike[str] = ".",
    ref: str = "HEAD",
    fingerprint: Fingerprint | None = None,
    metric: str | None = None,
    limit: int | None = None,
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
    runs = store.reader.runs().set_index("run_id")["fingerprint"]
    if fingerprint is None:
        fingerprint = runs[int(levels["run_id"].iloc[-1])]
    ok = [fingerprint.incompatibility(runs[int(r)]) is None for r in levels["run_id"]]
    levels = levels[ok].reset_index(drop=True)
    if limit is not None:
        levels = levels.tail(limit).reset_index(drop=True)
    if len(levels) and metric not in INSTRUCTION_COUNTERS:
        levels = with_machine(store, nodeid, levels, str(levels["metric"].iloc[0]))
    points = find_change_points(
        levels,
        op_levels=None if metric in INSTRUCTION_COUNTERS else _op_levels(store, nodeid, levels),
        op_names=_op_names(store, nodeid, [int(r) for r in levels["run_id"]]),
        top_ops=top_ops,
    )
    counters = run_counters(store, nodeid, levels["run_id"])
    steps = counter_steps(store, nodeid, levels, top_ops=top_ops)
    metric_name = str(levels["metric"].iloc[0]) if len(levels) else (metric or "")
    return History(nodeid, metric_name, fingerprint, levels, counters, points, steps)
