"""One test on one machine across first-parent commits: the unit a published page shows.

:func:`plan_series` cuts the store's index (:mod:`perfguard.publish.data`)
into series per (machine, test) and fingerprints each; :func:`cut_series`
makes a :class:`Series` of each from the records read (one stable sort per
table, no query and no record object per test or run). :func:`analyse` then finds
what a reader looks for, with the library's own detectors only (the same
as ``perfguard history``): timing change points
(:func:`perfguard.compare.history.find_change_points`, which calls
:func:`perfguard.compare.changepoint.detect`, with the ops whose time per
iteration moved), exact counter steps
(:func:`perfguard.compare.counter_steps.numeric_steps` and ``set_steps``),
and the latest run's outcome: its rounds judged against the runs of the
commit before it by :func:`perfguard.compare.timing.judge_store` with the
series as history (since the last acceptance, as store mode does), and a
counter step at the latest run makes it a gate regression or improvement.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.baseline.record import MACHINE_EVIDENCE
from perfguard.compare.counter_steps import numeric_steps, set_steps
from perfguard.compare.history import ChangePoint, OpMove, find_change_points
from perfguard.compare.timing import judge_store, machine_notes
from perfguard.compare.tolerance import ALPHA, TOLERANCE
from perfguard.compare.units import human
from perfguard.publish.data import StoreTables

__all__ = [
    "Analysed",
    "CounterStepView",
    "Series",
    "SeriesPlan",
    "analyse",
    "cut_series",
    "plan_series",
    "split_series",
]

#: op table column of each counter a step may name ops for
OP_COUNTERS = {"calls": "calls", "kernels": "kernels", "flops": "flops", "bytes": "bytes"}
#: counters whose increase is a gate regression (as the gates judge them)
GATED_UP = (
    "calls",
    "kernels",
    "flops",
    "bytes",
    "memcpy",
    "memcpy_bytes",
    "syncs",
    "host_reads",
    "peak_memory",
    "instructions",
    "est_cycles",
)
#: ops charted per test (by time per iteration over the series)
TOP_OPS = 5


def _compare_version() -> str:
    """A hash of the compare layer's source (the change-point search, the noise estimate)."""
    h = hashlib.sha256()
    for path in sorted((Path(__file__).parents[1] / "compare").glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


#: what a cached change point was found with (see :func:`analyse`)
COMPARE_VERSION = _compare_version()


@dataclass
class Series:
    """A test's runs on one machine, oldest first, and their rounds, counters and ops."""

    machine: str
    machine_label: str
    nodeid: str
    metric: str
    #: run_id, test_id, commit, time, position (first-parent index), level, n_rounds, and
    #: what each run's session saw of the machine (speed_ns, wait, load)
    runs: pd.DataFrame
    #: run (row of ``runs``), value: every judged round
    rounds: pd.DataFrame
    #: run, counter, value, stable_value
    counters: pd.DataFrame
    #: run, op_id, op_name, time_ns, calls, kernels, flops, bytes, using_tc, dtypes
    ops: pd.DataFrame
    #: (position, commit, reason, time, author) of the test's acceptances on this line
    acceptances: list[tuple[int, str, str, str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class CounterStepView:
    """An exact counter change at ``index`` (a row of the series' runs)."""

    index: int
    commit: str
    counter: str
    before: float
    after: float
    ops: tuple[tuple[str, float, float], ...]


@dataclass
class Analysed:
    """What a page shows beyond the series itself."""

    change_points: list[ChangePoint]
    counter_steps: list[CounterStepView]
    outcome: str  # the latest run's outcome (an Outcome value)
    reason: str
    change_pct: float  # latest run vs its baseline, % (NaN when not judged)
    top_ops: list[str]
    #: op_id -> op name
    op_names: dict[str, str] = field(default_factory=dict)
    #: what the change points were found from (see :func:`analyse`'s ``known``)
    points_key: str = ""


def _positions(runs: pd.DataFrame, walk: list[str] | None) -> pd.Series:
    """First-parent index of each run's commit (NaN off the line); by time without git."""
    if walk is None:
        order = runs["time"].rank(method="dense").astype(np.int64) - 1
        return order.astype(np.float64)
    index = {sha: i for i, sha in enumerate(walk)}
    return runs["commit"].map(index).astype(np.float64)


def _rows(frame: pd.DataFrame, at: np.ndarray, lo: int, hi: int) -> pd.DataFrame:
    """The rows of ``frame`` (sorted by ``at``, a row of the tests table) of tests
    ``lo..hi-1``, their ``run`` counted from ``lo``."""
    a, b = np.searchsorted(at, [lo, hi])
    sub = frame.iloc[a:b].drop(columns="test_id")
    return sub.assign(row=sub["row"] - lo).rename(columns={"row": "run"}).reset_index(drop=True)


Accepted = list[tuple[int, str, str, str, str]]


@dataclass
class SeriesPlan:
    """Which records make which series, from the store's index alone (no sample read)."""

    #: test_id, run_id, commit, time, position, machine, machine_label, nodeid, metric,
    #: run_hash (of the run's id, commit, time and machine), series (its number): the
    #: records on the line, sorted by machine, test, position, time and run
    records: pd.DataFrame
    #: series i is ``records[bounds[i]:bounds[i + 1]]``
    bounds: np.ndarray
    #: each series' acceptances on the line
    accepted: list[Accepted]

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def key(self, i: int) -> tuple[str, str, str]:
        """(machine, machine_label, nodeid) of series ``i``."""
        first = self.records.iloc[int(self.bounds[i])]
        return str(first["machine"]), str(first["machine_label"]), str(first["nodeid"])

    def ids(self, which: Sequence[int]) -> np.ndarray:
        """The test ids of the records of series ``which``."""
        ids = self.records["test_id"].to_numpy()
        return np.concatenate(
            [ids[self.bounds[i] : self.bounds[i + 1]] for i in which] or [ids[:0]]
        )

    def fingerprints(self, salt: str) -> list[str]:
        """A hash per series of what its page is made of, from the index alone: each
        record's id, run (id, commit, time, machine), first-parent position and metric, and
        the acceptances. A stored record never changes (a run saved again gets new test
        ids), so the same records make the same page; the run's commit and time are in
        the hash so that ids reused after a store was rolled back do not pass for the
        records they replaced."""
        r = self.records
        run_hash = r["run_hash"].to_numpy(np.uint64)  # hashed once per run, not per record
        metric = pd.util.hash_pandas_object(r["metric"], index=False).to_numpy()
        table = np.column_stack(
            [
                r["test_id"].to_numpy(np.int64).view(np.uint64),
                run_hash,
                r["position"].to_numpy(np.int64).view(np.uint64),
                metric,
            ]
        )
        out = []
        for i in range(len(self)):
            h = hashlib.sha256(salt.encode())
            machine, label, nodeid = self.key(i)
            h.update(f"{machine}\0{label}\0{nodeid}\0".encode())
            h.update(np.ascontiguousarray(table[self.bounds[i] : self.bounds[i + 1]]).tobytes())
            h.update(repr(self.accepted[i]).encode())
            out.append(h.hexdigest()[:32])
        return out


def plan_series(
    runs: pd.DataFrame, tests: pd.DataFrame, acceptances: pd.DataFrame, walk: list[str] | None
) -> SeriesPlan:
    """The series (machine, test) of the records ``tests`` of ``runs`` on ``walk`` (shas
    oldest first; None: every run, ordered by time), with one sort of integer codes."""
    runs = runs.assign(position=_positions(runs, walk)).dropna(subset=["position"])
    # a run's hash and its machine's and time's sort codes: once per run, not per record
    runs = runs.assign(
        run_hash=pd.util.hash_pandas_object(
            runs[["run_id", "commit", "time", "machine", "machine_label"]], index=False
        ).to_numpy(),
        machine_code=pd.factorize(runs["machine"], sort=True)[0],
        time_code=pd.factorize(runs["time"], sort=True)[0],
    )
    t = tests[["test_id", "run_id", "nodeid", "metric"]].merge(
        runs[
            [
                "run_id",
                "commit",
                "time",
                "position",
                "machine",
                "machine_label",
                "run_hash",
                "machine_code",
                "time_code",
            ]
        ],
        on="run_id",
    )
    t["position"] = t["position"].astype(np.int64)
    if t.empty:
        return SeriesPlan(t.assign(series=np.zeros(0, np.int64)), np.zeros(1, np.int64), [])
    # sorted by machine, test, position, time and run: on codes that sort as the texts do
    machine = t.pop("machine_code").to_numpy()
    when = t.pop("time_code").to_numpy()
    nodeid = pd.factorize(t["nodeid"], sort=True)[0]
    order = np.lexsort((t["run_id"].to_numpy(), when, t["position"].to_numpy(), nodeid, machine))
    t = t.iloc[order].reset_index(drop=True)
    code = (machine * (nodeid.max() + 1) + nodeid)[order]
    bounds = np.flatnonzero(np.r_[True, code[1:] != code[:-1], True])
    t["series"] = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    pos_of = {sha: i for i, sha in enumerate(walk)} if walk is not None else {}
    by_test: dict[str, Accepted] = {}
    for a in acceptances.itertuples(index=False):
        if str(a.commit) in pos_of:
            by_test.setdefault(str(a.nodeid), []).append(
                (
                    int(pos_of[str(a.commit)]),
                    str(a.commit),
                    str(a.reason),
                    str(a.time),
                    str(a.author or ""),
                )
            )
    nodeids = t["nodeid"].to_numpy()[bounds[:-1]]
    return SeriesPlan(t, bounds, [by_test.get(str(n), []) for n in nodeids])


def cut_series(tables: StoreTables, plan: SeriesPlan, which: Sequence[int]) -> dict[int, Series]:
    """Series ``which`` of ``plan`` with their records' rounds, counters and ops from
    ``tables`` (read for those records at least); a record without a level (no sample) is
    left out, and a series left without a run too."""
    rows = np.concatenate(
        [np.arange(plan.bounds[i], plan.bounds[i + 1]) for i in which] or [np.zeros(0, np.int64)]
    )
    t = plan.records.iloc[rows]
    by_id = tables.tests.set_index("test_id")
    t = t.assign(
        level=t["test_id"].map(by_id["level"]).astype(np.float64),
        n_rounds=t["test_id"].map(by_id["n_rounds"]),
        **{k: t["test_id"].map(by_id[k]).astype(np.float64) for k in MACHINE_EVIDENCE},
    )
    t = t.dropna(subset=["level"]).reset_index(drop=True)
    if t.empty:
        return {}
    t["n_rounds"] = t["n_rounds"].astype(np.int64)
    code = t["series"].to_numpy()
    bounds = np.flatnonzero(np.r_[True, code[1:] != code[:-1], True])
    # row of each test_id in t (its series and run): lookups by array, not per record
    row_of = pd.Series(np.arange(len(t)), index=t["test_id"].to_numpy())

    def by_series(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        row = frame["test_id"].map(row_of)
        frame = frame.assign(row=row).dropna(subset=["row"])
        frame["row"] = frame["row"].astype(np.int64)
        frame = frame.sort_values("row", kind="stable").reset_index(drop=True)
        return frame, frame["row"].to_numpy()

    rounds, r_rows = by_series(tables.rounds)
    counters, c_rows = by_series(tables.counters)
    ops, o_rows = by_series(tables.ops)
    out = {}
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        part = t.iloc[lo:hi]
        first = part.iloc[0]
        i = int(first["series"])
        out[i] = Series(
            machine=str(first["machine"]),
            machine_label=str(first["machine_label"]),
            nodeid=str(first["nodeid"]),
            metric=str(first["metric"]),
            runs=part[
                [
                    "run_id",
                    "test_id",
                    "commit",
                    "time",
                    "position",
                    "level",
                    "n_rounds",
                    *MACHINE_EVIDENCE,
                ]
            ].reset_index(drop=True),
            rounds=_rows(rounds, r_rows, lo, hi),
            counters=_rows(counters, c_rows, lo, hi),
            ops=_rows(ops, o_rows, lo, hi),
            acceptances=plan.accepted[i],
        )
    return out


def split_series(tables: StoreTables, walk: list[str] | None) -> list[Series]:
    """One Series per (machine, test) with runs on ``walk`` (shas oldest first; None: every
    run, ordered by time)."""
    plan = plan_series(tables.runs, tables.tests, tables.acceptances, walk)
    cut = cut_series(tables, plan, range(len(plan)))
    return [cut[i] for i in sorted(cut)]


def _op_levels(s: Series) -> tuple[pd.DataFrame, dict[str, str]]:
    """Index run_id, a column per op (sorted by op_id): its time per iteration, summed over
    the op's rows of a run (0 where a run lacks it); and op_id -> op name."""
    run_ids = s.runs["run_id"].to_numpy()
    if s.ops.empty:
        return pd.DataFrame(index=run_ids), {}
    codes, ops = pd.factorize(s.ops["op_id"].astype(str), sort=True)
    wide = np.zeros((len(run_ids), len(ops)))
    time = np.nan_to_num(s.ops["time_ns"].to_numpy(np.float64))  # a sum skips NaN
    np.add.at(wide, (s.ops["run"].to_numpy(), codes), time)
    frame = pd.DataFrame(wide, index=run_ids, columns=pd.Index(ops, name="op_id"))
    first = np.unique(codes, return_index=True)[1]
    names = s.ops["op_name"].astype(str).to_numpy()[first]
    return frame, dict(zip(map(str, ops), names.tolist(), strict=True))


def _counter_steps(s: Series) -> list[CounterStepView]:
    """The exact counter steps of ``s``: :func:`numeric_steps` and :func:`set_steps` on the
    runs where something changed only (and the run before each): two runs with the same
    totals or sets make no step, and both cost a pandas pass per counter or run."""
    run_ids = s.runs["run_id"].to_numpy(np.int64)
    found: list[tuple[int, str, float, float, tuple[tuple[str, float, float], ...]]] = []
    if len(s.counters):
        c = s.counters
        code = pd.factorize(c["counter"])[0]
        table = np.zeros((len(run_ids), code.max() + 1))
        run = c["run"].to_numpy()
        table[run, code] = c["stable_value"].to_numpy(np.float64)
        keep = _moved(np.unique(run), table)
        if len(keep):
            c = c[np.isin(run, keep)]
            rows = pd.DataFrame(
                {
                    "run_id": run_ids[c["run"].to_numpy()],
                    "op_id": "",
                    "op_name": "",
                    "counter": c["counter"].astype(str),
                    "value": c["stable_value"],
                    "stable": True,
                }
            )
            found += numeric_steps(rows, run_ids, top_ops=0)
    if len(s.ops):
        found += _set_steps(s, run_ids)
    commits = s.runs["commit"].astype(str).to_numpy()
    steps = []
    for i, counter, before, after, named in sorted(found, key=lambda f: (f[0], f[1])):
        if not named and counter in OP_COUNTERS:
            named = _ops_moved(s, i, OP_COUNTERS[counter])
        steps.append(CounterStepView(i, str(commits[i]), counter, before, after, named))
    return steps


def _moved(observed: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The runs of ``observed`` (sorted rows of ``table``, one row per run) whose row differs
    from the previous observed run's, and those previous runs."""
    rows = table[observed]
    moved = np.flatnonzero(np.any(rows[1:] != rows[:-1], axis=tuple(range(1, rows.ndim)))) + 1
    return observed[np.unique(np.r_[moved, moved - 1])]


def _mix(*codes: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of integer ``codes`` (a set's hash is the sum of its
    members': equal sets, equal sums)."""
    x = np.zeros(len(codes[0]), dtype=np.uint64)
    for k, c in zip(
        (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB), codes, strict=False
    ):
        x += np.asarray(c, dtype=np.int64).view(np.uint64) * np.uint64(k)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xD6E8FEB86659FD93)
    return x ^ (x >> np.uint64(32))


def _set_steps(s: Series, run_ids: np.ndarray) -> list[Any]:
    """:func:`set_steps` of the Tensor Core ops and the ops' dtypes on the runs where a set
    changed only (and the run before each). A run's sets are compared by a hash of the
    members' codes (factorised once per series); the members' text is built for the
    runs kept only. Positions map back to ``run_ids``."""
    ops = s.ops
    run = ops["run"].to_numpy()
    name = pd.factorize(ops["op_name"])[0]
    dtypes, dtype_values = pd.factorize(ops["dtypes"])
    blank = pd.Index(dtype_values).astype(str).isin(["", "nan", "None"])
    typed = (dtypes >= 0) & ~blank[np.maximum(dtypes, 0)]
    tc = ops["using_tc"].fillna(0).astype(bool).to_numpy()
    sig = np.zeros(len(run_ids), dtype=np.uint64)
    np.add.at(sig, run[tc], _mix(np.ones(int(tc.sum()), np.int64), name[tc]))
    np.add.at(sig, run[typed], _mix(np.full(int(typed.sum()), 2), name[typed], dtypes[typed]))
    keep = _moved(np.unique(run), sig)
    if not len(keep):
        return []
    at = np.isin(run, keep)
    sub_tc, sub_typed = ops[tc & at], ops[typed & at]
    members = pd.concat(
        [
            pd.DataFrame(
                {
                    "run_id": run_ids[sub_tc["run"].to_numpy()],
                    "counter": "tc_ops",
                    "member": sub_tc["op_name"].astype(str),
                    "key": sub_tc["op_name"].astype(str),
                }
            ),
            pd.DataFrame(
                {
                    "run_id": run_ids[sub_typed["run"].to_numpy()],
                    "counter": "dtypes",
                    "member": sub_typed["op_name"].astype(str)
                    + "\x1f"
                    + sub_typed["dtypes"].astype(str),
                    "key": sub_typed["op_name"].astype(str),
                }
            ),
        ],
        ignore_index=True,
    )
    if members.empty:
        return []
    ids = run_ids[keep]
    found = set_steps(members, {int(r) for r in ids}, ids)
    return [(int(keep[i]), *rest) for i, *rest in found]


def _ops_moved(s: Series, i: int, column: str) -> tuple[tuple[str, float, float], ...]:
    """The ops whose ``column`` moved most between run ``i - 1`` and run ``i``."""
    run = s.ops["run"].to_numpy()
    two = s.ops[(run == i - 1) | (run == i)]
    names = two["op_name"].astype(str).to_numpy()
    values = np.nan_to_num(two[column].to_numpy(np.float64))
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for name, value, at in zip(names, values, two["run"].to_numpy(), strict=True):
        side = after if at == i else before
        side[name] = side.get(name, 0.0) + float(value)
    moved = {n: abs(after.get(n, 0.0) - before.get(n, 0.0)) for n in {*before, *after}}
    top = sorted((n for n in moved if moved[n] > 0), key=lambda n: (-moved[n], n))[:3]
    return tuple((n, before.get(n, 0.0), after.get(n, 0.0)) for n in top)


def _latest(s: Series, steps: list[CounterStepView], tolerance: float) -> tuple[str, str, float]:
    """(outcome, reason, change %) of the latest run against the commit before it."""
    runs = s.runs
    last = len(runs) - 1
    pos = runs["position"].to_numpy()
    start = max((a[0] for a in s.acceptances if a[0] <= pos[last]), default=-1)
    earlier = np.flatnonzero((pos < pos[last]) & (pos >= start))
    if not len(earlier):
        why = "no run since the acceptance" if start >= 0 else "first run on this machine"
        return ("no-baseline" if start >= 0 else "new"), why, math.nan
    base_pos = pos[earlier[-1]]
    base_runs = np.flatnonzero(pos == base_pos)
    rnd = s.rounds
    current = rnd.loc[rnd["run"] == last, "value"].to_numpy()
    baseline = rnd.loc[rnd["run"].isin(base_runs), "value"].to_numpy()
    history = runs["level"].to_numpy()[earlier]
    # the machine's evidence as the live verdict had it: a run the session called noisy
    # for the machine's speed is not an improvement or regression here either
    wait, speed = (runs[k].to_numpy() for k in ("wait", "speed_ns"))
    verdict = judge_store(
        current,
        baseline,
        history,
        metric=s.metric,
        tolerance=tolerance,
        alpha=ALPHA,
        baseline_runs=len(base_runs),
        wait=float(wait[last]),
        baseline_wait=_median(wait[base_runs]),
        speed_ns=float(speed[last]),
        baseline_speed_ns=_median(speed[base_runs]),
    )
    outcome, reason = verdict.outcome.value, verdict.message
    at_last = [st for st in steps if st.index == last and st.counter in GATED_UP]
    up = [st for st in at_last if st.after > st.before]
    if up:
        outcome = "regressed"
        reason = "; ".join(_step_text(st) for st in up)
    elif at_last and outcome in ("unchanged", "noisy", "not-judged"):
        outcome = "improved"
        reason = "; ".join(_step_text(st) for st in at_last)
    return outcome, reason, math.nan if verdict.delta_pct is None else verdict.delta_pct


def _step_text(st: CounterStepView) -> str:
    """A counter step as the latest outcome's reason: ``flops 839 MFLOP → 1.68 GFLOP``."""
    return f"{st.counter} {human(st.before, st.counter)} → {human(st.after, st.counter)}"


def _median(values: np.ndarray) -> float:
    """The median of the finite ``values`` (NaN when none), as
    :func:`perfguard.compare.judge.machine_evidence` pools a baseline's runs."""
    ok = values[np.isfinite(values)]
    return float(np.median(ok)) if len(ok) else math.nan


def _points_key(levels: pd.DataFrame, op_levels: pd.DataFrame, names: dict[str, str]) -> str:
    """A hash of everything :func:`find_change_points` reads, and of the compare layer's
    source: the same key, the same change points."""
    h = hashlib.sha256(COMPARE_VERSION.encode())
    h.update(levels["run_id"].to_numpy(np.int64).tobytes())
    h.update("\0".join(levels["commit"]).encode())
    h.update(levels["value"].to_numpy(np.float64).tobytes())
    if "machine" in levels.columns:  # which runs the search leaves out
        h.update("\0".join(levels["machine"].astype(str)).encode())
    h.update(repr([list(map(str, op_levels.columns)), names]).encode())
    h.update(np.ascontiguousarray(op_levels.to_numpy(np.float64)).tobytes())
    return h.hexdigest()[:32]


def points_to_json(points: list[ChangePoint]) -> list[dict[str, Any]]:
    """Change points as JSON (a float's repr reads back the same float)."""
    return [asdict(cp) for cp in points]


def points_from_json(found: list[dict[str, Any]]) -> list[ChangePoint]:
    return [ChangePoint(**{**cp, "ops": tuple(OpMove(**op) for op in cp["ops"])}) for cp in found]


def analyse(
    s: Series,
    *,
    tolerance: float = TOLERANCE,
    top_ops: int = TOP_OPS,
    known: dict[str, Any] | None = None,
) -> Analysed:
    """Change points, counter steps, the latest outcome and the top ops of ``s``.
    ``known``: change points found before (``Analysed.points_key``, ``points`` as
    :func:`points_to_json` writes them), reused when the key is the same (the change-point
    search is most of the time a page costs)."""
    op_levels, names = _op_levels(s)
    levels = pd.DataFrame(
        {
            "run_id": s.runs["run_id"],
            "commit": s.runs["commit"].astype(str),
            "value": s.runs["level"],
        }
    )
    if {"speed_ns", "wait"} <= set(s.runs.columns):
        # a run the machine explains makes no change point by itself, as in `history`
        notes = machine_notes(
            s.metric, s.runs["speed_ns"].to_numpy(np.float64), s.runs["wait"].to_numpy(np.float64)
        )
        levels = levels.assign(machine=notes)
    key = _points_key(levels, op_levels, names)
    if known is not None and known.get("key") == key:
        points = points_from_json(known["points"])
    else:
        points = find_change_points(levels, op_levels=op_levels, op_names=names)
    steps = _counter_steps(s)
    outcome, reason, change = _latest(s, steps, tolerance)
    mean = op_levels.mean().sort_values(ascending=False, kind="stable")
    top = [str(op) for op in mean.index[:top_ops] if mean[op] > 0]
    return Analysed(points, steps, outcome, reason, change, top, names, key)


def op_names(s: Series) -> dict[str, str]:
    """op_id -> op name of the series' ops."""
    return _op_levels(s)[1]


def plain(value: Any) -> Any:
    """A JSON-safe copy of ``value`` (numpy scalars unboxed, NaN as None)."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
