"""The verdict's types and its per-op evidence: :class:`TestComparison`, the per-op
comparison (:func:`compare_ops`) and the deterministic kernel findings
(:func:`kernel_changes`).

The decision itself is :func:`perfguard.compare.judge.judge` (timing: rounds
against history or A/B pairs, :mod:`perfguard.compare.timing`; gates:
deterministic counters, :mod:`perfguard.compare.gates`), and its
explanation is :mod:`perfguard.compare.culprits`; ``judge.compare_records`` is
the judge with one baseline record, for notebooks.

Per op (evidence, not the verdict): a Mann-Whitney U test with a Hodges-Lehmann
interval (:func:`perfguard.compare.stats.compare_samples`) on per-round (else
per-iteration) samples; an op missing from an iteration counts as 0 there, and
ops found on one side only are ``added`` or ``removed``. Per-op statuses are
corrected for many comparisons (Benjamini-Hochberg). The test's own verdict uses
no rank test: it is the interval of the level's change in :mod:`perfguard.compare.timing`.

:meth:`TestComparison.entry` is the test's entry of ``results.json`` (a typed
:class:`perfguard.compare.results.TestEntry`): its ``timing`` holds the judge's change, the
ratio of ``level_current_ns`` to ``level_baseline_ns`` (the geometric means of the rounds;
A/B: the paired estimate applied to the base level), with the rounds' plain medians for
reference. ``explanation`` is the :class:`~perfguard.compare.explanation.Explanation` every
view renders, and ``message`` its headline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfguard.baseline.record import TestRecord, profiled_mask
from perfguard.compare.explanation import Explanation
from perfguard.compare.halves import GateVerdict, TimingFigures, TimingVerdict
from perfguard.compare.outcomes import Outcome
from perfguard.compare.sites import per_site_flops
from perfguard.compare.stats import compare_samples
from perfguard.compare.tolerance import ALPHA, TOLERANCE

if TYPE_CHECKING:
    from perfguard.compare.results import TestEntry

#: fewer samples than this on either side: no statistics, outcome ``unchanged``
MIN_SAMPLES = 5
#: launches per iteration an op's kernel count must move by to be reported
COUNT_CHANGE = 0.5

OP_COLUMNS = (
    "op_id",
    "op_name",
    "direction",
    "status",
    "baseline_ns",
    "current_ns",
    "delta_pct",
    "ci_low_pct",
    "ci_high_pct",
    "p_value",
    "calls_baseline",
    "calls_current",
    "tc_util_baseline",
    "tc_util_current",
    "flop_eff_baseline",
    "flop_eff_current",
    "call_site",
)
CHANGE_COLUMNS = ("kind", "op_name", "kernel_name", "baseline", "current", "site")
CHANGE_KINDS = ("tc_lost", "tc_gained", "added", "removed", "count_changed", "flops_changed")


@dataclass
class TestComparison(TimingFigures):
    """The judge's verdict on one test, with its per-op evidence as tables (for a notebook
    and ``perfguard compare``'s op table); :meth:`entry` is the session's typed
    :class:`~perfguard.compare.results.TestEntry` of it. The figures (change, interval,
    medians, levels) are the timing half's, read through properties, never copied."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    message: str
    timing: TimingVerdict
    #: None: nothing to gate against
    gates: GateVerdict | None
    explanation: Explanation
    alpha: float
    baseline_commit: str | None = None
    ops: pd.DataFrame = field(default_factory=lambda: _empty(OP_COLUMNS))
    kernel_changes: pd.DataFrame = field(default_factory=lambda: _empty(CHANGE_COLUMNS))
    samples_current: list[int] = field(default_factory=list)
    samples_baseline: list[int] = field(default_factory=list)
    #: one value per round (record.round_value of its iterations), ns: the replicates
    rounds_current: list[int] = field(default_factory=list)
    rounds_baseline: list[int] = field(default_factory=list)
    mode: str = "store"  # "store" | "ab"

    @property
    def ci_level_pct(self) -> float:
        return round(100.0 * (1.0 - self.alpha), 6)

    def entry(self, **extras: Any) -> TestEntry:
        """The session's entry of this verdict, typed as it is kept and written, plus the
        session's ``extras`` (``findings``, ``history``, ``capture``, ``backend``, ``notes``,
        ``worker``, ``accepted``, ``phase_s``, ``counted``, ``profile``, ``timeline``)."""
        from perfguard.compare.results import KernelChange, OpRow, TestEntry

        return TestEntry(
            nodeid=self.nodeid,
            outcome=self.outcome,
            message=self.message,
            mode=self.mode,
            alpha=self.alpha,
            baseline_commit=self.baseline_commit,
            timing=self.timing,
            gates=self.gates,
            explanation=self.explanation,
            ops=[OpRow(**r) for r in _records(self.ops, OP_COLUMNS)],
            kernel_changes=[
                KernelChange(**r) for r in _records(self.kernel_changes, CHANGE_COLUMNS)
            ],
            samples_current=list(self.samples_current),
            samples_baseline=list(self.samples_baseline),
            rounds_current=list(self.rounds_current),
            rounds_baseline=list(self.rounds_baseline),
            **extras,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the entry's ``results.json`` object."""
        return self.entry().to_dict()


def with_empty_capture(comparison: TestComparison, why: str) -> TestComparison:
    """A verdict on a capture that saw no op (a pure-Python step, the wrong framework's
    profiler) is never silent: ``why`` leads its message and explanation, and an outcome
    the timing alone would call ``unchanged`` reads ``not-judged`` (nothing was gated,
    no op attributed). A timing regression or improvement stands, said with ``why``."""
    from dataclasses import replace

    outcome = comparison.outcome
    if outcome is Outcome.UNCHANGED:
        outcome = Outcome.NOT_JUDGED
    message = f"{why}; timing alone: {comparison.message}" if comparison.message else why
    head = comparison.explanation.headline
    explanation = replace(
        comparison.explanation, outcome=outcome.value, headline=f"{why}; {head}" if head else why
    )
    return replace(comparison, outcome=outcome, message=message, explanation=explanation)


def classify(
    delta: np.ndarray | float, p: np.ndarray | float, tolerance: float, alpha: float
) -> np.ndarray:
    """The gate, vectorised: "regressed" / "improved" when ``p < alpha`` and the median
    moved past ``tolerance`` that way, else "unchanged" (also for NaN figures).

    One function for the test, its ops and ``benchmarks/calibration.py``, so the
    calibrated rule is the rule in use.
    """
    d = np.asarray(delta, dtype=np.float64)
    sig = np.asarray(p, dtype=np.float64) < alpha  # NaN compares False
    return np.where(
        sig & (d > tolerance),
        "regressed",
        np.where(sig & (d < -tolerance), "improved", "unchanged"),
    )


# ---------------------------------------------------------------------------- per op


def _by_round(record: TestRecord, frame: pd.DataFrame) -> pd.DataFrame:
    """Columns iteration -> round: the median of each round's iterations (rounds are the
    replicates; iterations of one round are not independent)."""
    prof = record.samples[profiled_mask(record.samples)]
    rounds = pd.Series(
        prof["round"].to_numpy(dtype=np.int64, na_value=0), index=prof["iteration"].to_numpy()
    )
    if frame.shape[1] == 0:
        return frame
    keys = rounds.reindex(frame.columns).fillna(-1).to_numpy()
    return frame.T.groupby(keys).median().T


def _op_matrix(record: TestRecord) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-iteration (metric, calls) of each op: rows op_id, columns iteration, absent = 0."""
    col = "gpu_time_ns" if record.metric == "gpu_time" else "cpu_time_ns"
    s = record.op_samples
    captured = record.samples["iteration"][profiled_mask(record.samples)]
    iters = pd.Index(captured).union(pd.Index(s["iteration"])).unique()
    if s.empty:
        empty = pd.DataFrame(index=pd.Index([], dtype=object, name="op_id"), columns=iters)
        return empty, empty
    s = s.astype({col: np.float64, "calls": np.float64})
    value = s.pivot_table(index="op_id", columns="iteration", values=col, aggfunc="sum")
    calls = s.pivot_table(index="op_id", columns="iteration", values="calls", aggfunc="sum")
    return value.reindex(columns=iters, fill_value=0.0).fillna(0.0), calls.reindex(
        columns=iters, fill_value=0.0
    ).fillna(0.0)


def _op_info(record: TestRecord) -> pd.DataFrame:
    ops = record.ops.drop_duplicates("op_id").set_index("op_id")
    return ops.reindex(columns=["op_name", "direction", "tc_utilization", "flop_efficiency"])


def compare_ops(
    current: TestRecord,
    baseline: TestRecord,
    *,
    tolerance: float = TOLERANCE,
    alpha: float = ALPHA,
    statistics: bool = True,
) -> pd.DataFrame:
    """One row per op of either record (:data:`OP_COLUMNS`), largest |delta time| first.

    ``baseline_ns``/``current_ns`` are per-iteration medians. ``calls_*``
    are median calls per iteration. The statistics for all ops shared by
    both records come from one batched call.
    """
    vb, cb = _op_matrix(baseline)
    vc, cc = _op_matrix(current)
    ib, ic = _op_info(baseline), _op_info(current)
    in_b = vb.index.union(ib.index)
    in_c = vc.index.union(ic.index)
    ids = in_b.union(in_c)
    if len(ids) == 0:
        return _empty(OP_COLUMNS)
    out = pd.DataFrame(index=pd.Index(ids, name="op_id"))
    info = ic.combine_first(ib).reindex(ids)
    out["op_name"] = info["op_name"].where(info["op_name"].notna(), pd.Series(ids, index=ids))
    out["direction"] = info["direction"]
    both = in_b.intersection(in_c)
    xb = vb.reindex(both, fill_value=0.0).to_numpy(np.float64)
    xc = vc.reindex(both, fill_value=0.0).to_numpy(np.float64)
    out["baseline_ns"] = np.nan
    out["current_ns"] = np.nan
    out.loc[in_b, "baseline_ns"] = _row_median(vb.reindex(in_b, fill_value=0.0))
    out.loc[in_c, "current_ns"] = _row_median(vc.reindex(in_c, fill_value=0.0))
    for name in ("delta_pct", "ci_low_pct", "ci_high_pct", "p_value"):
        out[name] = np.nan
    status = pd.Series(Outcome.UNCHANGED.value, index=ids, dtype=object)
    status[~ids.isin(in_b)] = "added"
    status[~ids.isin(in_c)] = "removed"
    if len(both):
        rb = _by_round(baseline, vb.reindex(both, fill_value=0.0)).to_numpy(np.float64)
        rc = _by_round(current, vc.reindex(both, fill_value=0.0)).to_numpy(np.float64)
        if rb.shape[1] >= 3 and rc.shape[1] >= 3:
            xb, xc = rb, rc  # several rounds a side: they are the samples
        elif baseline.timed_apart or current.timed_apart:
            # one profiled round: its iterations are not replicates, so per-op times are
            # shown but not judged (the test's timing is judged on its timing rounds)
            statistics = False
            status[both] = Outcome.NOT_JUDGED.value
        if (
            statistics
            and xb.shape[1] >= MIN_SAMPLES
            and xc.shape[1] >= MIN_SAMPLES
            or (statistics and xb is rb and xb.shape[1] >= 3)
        ):
            r = compare_samples(xb, xc, alpha)
            p_adj = benjamini_hochberg(r.p_value)
            out.loc[both, "ci_low_pct"] = 100 * r.ci_low
            out.loc[both, "ci_high_pct"] = 100 * r.ci_high
            out.loc[both, "p_value"] = p_adj
            status[both] = classify(r.delta, p_adj, tolerance, alpha)
        mb = out.loc[both, "baseline_ns"].to_numpy(np.float64)
        mc = out.loc[both, "current_ns"].to_numpy(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            out.loc[both, "delta_pct"] = np.where(mb > 0, 100 * (mc / mb - 1.0), np.nan)
    out["status"] = status
    out["calls_baseline"] = _row_median(cb.reindex(ids, fill_value=0.0)) if len(cb) else np.nan
    out["calls_current"] = _row_median(cc.reindex(ids, fill_value=0.0)) if len(cc) else np.nan
    out.loc[~ids.isin(in_b), "calls_baseline"] = np.nan
    out.loc[~ids.isin(in_c), "calls_current"] = np.nan
    out["tc_util_baseline"] = ib["tc_utilization"].reindex(ids).astype("Float64")
    out["tc_util_current"] = ic["tc_utilization"].reindex(ids).astype("Float64")
    out["flop_eff_baseline"] = ib["flop_efficiency"].reindex(ids).astype("Float64")
    out["flop_eff_current"] = ic["flop_efficiency"].reindex(ids).astype("Float64")
    # the user's line behind each op (record meta: this run's, the baseline's for a gone op)
    sites = {**(baseline.meta.get("call_sites") or {}), **(current.meta.get("call_sites") or {})}
    if sites:
        site = out["op_name"].map(lambda n: sites.get(str(n)))
        out["call_site"] = site.astype(object).where(site.notna(), None)
    else:
        out["call_site"] = None
    gap = (out["current_ns"].fillna(0.0) - out["baseline_ns"].fillna(0.0)).abs()
    size = out[["current_ns", "baseline_ns"]].max(axis=1).fillna(0.0)
    out = out.assign(_gap=gap, _size=size).reset_index()
    out = out.sort_values(
        ["_gap", "_size", "op_name"], ascending=[False, False, True], kind="stable"
    )
    return out[list(OP_COLUMNS)].reset_index(drop=True)


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (NaN kept): 40 ops tested at alpha 0.01 must
    not yield false "regressed" rows by chance; the false discovery rate is held at
    alpha instead."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    m = int(ok.sum())
    if m == 0:
        return out
    q = p[ok]
    order = np.argsort(q)
    scaled = q[order] * m / np.arange(1, m + 1)
    adj = np.minimum.accumulate(scaled[::-1])[::-1]
    res = np.empty(m)
    res[order] = np.minimum(adj, 1.0)
    out[ok] = res
    return out


def _op_change(
    kind: str, ops: pd.Index, names: pd.Series, baseline: pd.Series, current: pd.Series
) -> pd.DataFrame:
    """One ``kernel_changes`` row per op in ``ops`` whose per-op figure moved (empty if none)."""
    return pd.DataFrame(
        {
            "kind": kind,
            "op_name": names.reindex(ops).to_numpy(object),
            "kernel_name": None,
            "baseline": baseline[ops].to_numpy(np.float64),
            "current": current[ops].to_numpy(np.float64),
            "site": None,
        }
    )


def _row_median(frame: pd.DataFrame) -> np.ndarray:
    a = frame.to_numpy(np.float64)
    return np.median(a, axis=1) if a.shape[1] else np.full(a.shape[0], np.nan)


# ---------------------------------------------------------------------------- kernels


def _bool_or_na(values: pd.Series) -> pd.Series:
    """True/False where the value is a real boolean (or 0/1), NA otherwise."""

    def one(v: Any) -> Any:
        if isinstance(v, bool | np.bool_):
            return bool(v)
        if isinstance(v, int | np.integer | float | np.floating) and v in (0, 1):
            return bool(v)
        return pd.NA

    return pd.Series([one(v) for v in values.to_numpy(object)], index=values.index, dtype="boolean")


def _uses_tc(record: TestRecord) -> pd.Series:
    """Per op_id: does the op use Tensor Cores (ops.using_tc, else any kernel's uses_tc)."""
    ops = record.ops.drop_duplicates("op_id").set_index("op_id")
    own = _bool_or_na(ops["using_tc"]) if "using_tc" in ops else pd.Series(dtype="boolean")
    k = record.kernels
    if len(k) and "uses_tc" in k:
        flag = _bool_or_na(k["uses_tc"])
        known = flag.notna()
        from_k = (
            flag[known].astype(bool).groupby(k.loc[known, "op_id"].to_numpy()).any()
            if known.any()
            else pd.Series(dtype=bool)
        )
        own = own.combine_first(from_k.astype("boolean"))
    return own


def _tc_kernels(record: TestRecord) -> pd.Series:
    """Per op_id: names of its Tensor Core kernels, '; '-joined."""
    k = record.kernels
    if k.empty or "uses_tc" not in k:
        return pd.Series(dtype=object)
    tc = k[_bool_or_na(k["uses_tc"]).fillna(False).to_numpy(bool)]
    return tc.groupby("op_id")["kernel_name"].agg(lambda s: "; ".join(sorted(set(s))))


def _iterations(record: TestRecord) -> int:
    return max(len(record.samples), 1)


def kernel_changes(current: TestRecord, baseline: TestRecord) -> pd.DataFrame:
    """Findings that need no statistics (:data:`CHANGE_COLUMNS`), for ops in both records.

    ``baseline``/``current`` hold, by kind: launches per iteration
    (added/removed/count_changed), FLOPs per call (flops_changed), or the
    op's TC use (tc_lost/tc_gained, True/False).
    """
    rows: list[pd.DataFrame] = []
    ob = baseline.ops.drop_duplicates("op_id").set_index("op_id")
    oc = current.ops.drop_duplicates("op_id").set_index("op_id")
    names = oc["op_name"].combine_first(ob["op_name"]) if len(ob) or len(oc) else pd.Series()
    shared = ob.index.intersection(oc.index)

    tb, tcur = _uses_tc(baseline), _uses_tc(current)
    both_known = tb.index.intersection(tcur.index).intersection(shared)
    tb, tcur = tb.reindex(both_known), tcur.reindex(both_known)
    known = (tb.notna() & tcur.notna()).to_numpy(bool)
    for kind, mask, side in (
        ("tc_lost", known & (tb.fillna(False) & ~tcur.fillna(True)).to_numpy(bool), baseline),
        ("tc_gained", known & (~tb.fillna(True) & tcur.fillna(False)).to_numpy(bool), current),
    ):
        ids = both_known[mask]
        if len(ids):
            rows.append(
                pd.DataFrame(
                    {
                        "kind": kind,
                        "op_name": names.reindex(ids).to_numpy(object),
                        "kernel_name": _tc_kernels(side).reindex(ids).to_numpy(object),
                        "baseline": tb[ids].astype(bool).to_numpy(object),
                        "current": tcur[ids].astype(bool).to_numpy(object),
                    }
                )
            )

    kb, kc = baseline.kernels, current.kernels
    key = ["op_id", "kernel_name"]
    per_b = kb.groupby(key, sort=False)["calls"].sum() / _iterations(baseline)
    per_c = kc.groupby(key, sort=False)["calls"].sum() / _iterations(current)
    for kind, present, absent, values in (
        ("added", per_c, per_b, "current"),
        ("removed", per_b, per_c, "baseline"),
    ):
        only = present.index.difference(absent.index)
        only = only[only.get_level_values(0).isin(shared)] if len(only) else only
        if len(only):
            v = present.reindex(only).to_numpy(np.float64)
            frame = pd.DataFrame(
                {
                    "kind": kind,
                    "op_name": names.reindex(only.get_level_values(0)).to_numpy(object),
                    "kernel_name": only.get_level_values(1).to_numpy(object),
                    "baseline": v if values == "baseline" else np.nan,
                    "current": v if values == "current" else np.nan,
                }
            )
            rows.append(frame.sort_values(["op_name", "kernel_name"]))

    lb = per_b.groupby(level=0).sum().reindex(shared).fillna(0.0)
    lc = per_c.groupby(level=0).sum().reindex(shared).fillna(0.0)
    moved = shared[((lc - lb).abs() >= COUNT_CHANGE).to_numpy(bool)]
    rows.append(_op_change("count_changed", moved, names, lb, lc))

    fb = _per_call(ob, "flops").reindex(shared)
    fc = _per_call(oc, "flops").reindex(shared)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = ((fc - fb).abs() / fb.abs().where(fb != 0, 1.0)).to_numpy(np.float64)
    differ = shared[np.nan_to_num(rel, nan=0.0) > 1e-9]
    op_figures = {
        str(n): (float(b), float(c))
        for n, b, c in zip(names.reindex(differ), fb[differ], fc[differ], strict=True)
    }
    by_site, judged = per_site_flops(current.meta, baseline.meta, op_figures)
    rows.append(
        pd.DataFrame(
            [
                {"kind": "flops_changed", "op_name": name, "kernel_name": None, **figures}
                for name, figures in by_site
            ],
            columns=list(CHANGE_COLUMNS),
        )
    )
    rest = differ[~names.reindex(differ).isin(judged)]
    rows.append(_op_change("flops_changed", rest, names, fb, fc))

    rows = [r for r in rows if len(r)]
    if not rows:
        return _empty(CHANGE_COLUMNS)
    out = pd.concat([r.astype(object) for r in rows], ignore_index=True)
    return out.reindex(columns=list(CHANGE_COLUMNS))


def _per_call(ops: pd.DataFrame, column: str) -> pd.Series:
    if column not in ops or "calls" not in ops:
        return pd.Series(np.nan, index=ops.index)
    v = pd.to_numeric(ops[column], errors="coerce").astype(np.float64)
    calls = pd.to_numeric(ops["calls"], errors="coerce").astype(np.float64)
    return v / calls.where(calls > 0)


# ---------------------------------------------------------------------------- helpers


def _empty(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def _json_value(v: Any) -> Any:
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, float | np.floating):
        f = float(v)
        return f if math.isfinite(f) else None
    return v


def _records(frame: pd.DataFrame, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    frame = frame.reindex(columns=list(columns))
    return [
        {c: _json_value(v) for c, v in zip(columns, row, strict=True)}
        for row in frame.astype(object).itertuples(index=False, name=None)
    ]
