"""What perfguard keeps of one benchmark test, and of the run it belongs to.

These records are the contract between the layers below the store (the
analysis makes them), the store (persists them), ``perfguard.compare``
(compares two of them) and the reports. They hold pandas DataFrames with
fixed columns so a notebook can read them as easily as the code does.

The *primary metric* of a test is per-iteration GPU time (sum of the
durations of the kernels and memops attributed to the iteration) when the
capture saw a GPU; a CPU-only capture has no GPU time, so its primary
metric is the iteration's wall time, or, when the marker asks for it, the
CPU time of the thread that ran the iteration (``cpu_time``: inflated
far less than wall time by other jobs on a shared CPU runner, blind to
time spent waiting; caches and clock speed still move it).
``TestRecord.metric`` says which one was used, and two records are only
compared on the same metric.
"""

from __future__ import annotations

import math
import platform
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfguard.analysis.call_sites import op_sites
from perfguard.analysis.counters import COMPILED_FORMATS, COMPILED_OPS, op_counters
from perfguard.analysis.instructions import FUNCTION_COLUMNS
from perfguard.environment import Environment

if TYPE_CHECKING:
    from perfguard.analysis import Analysis

#: columns of :attr:`TestRecord.samples`: one row per recorded iteration
#: (``cpu_time_ns``: the harness thread's CPU time, NA when not measured)
#: (``round``: which round of the test's loop the iteration belongs to, 0 for a
#: single-round run: rounds, not iterations, are the unit of replication)
#: (``profiled``: the capture was on; False for a timing round run with the profiler off,
#: whose iteration numbers follow the profiled ones and have no op samples)
SAMPLE_COLUMNS = ("iteration", "gpu_time_ns", "wall_time_ns", "cpu_time_ns", "round", "profiled")
#: columns of :attr:`TestRecord.op_samples`: one row per (op, iteration)
OP_SAMPLE_COLUMNS = ("op_id", "iteration", "calls", "gpu_time_ns", "cpu_time_ns")
#: columns of :attr:`TestRecord.ops`: one row per op (whole capture)
OP_COLUMNS = (
    "op_id",
    "op_name",
    "direction",
    "op_type",
    "calls",
    "kernel_count",
    "cpu_time_total",
    "gpu_time_total",
    "tc_eligible",
    "using_tc",
    "tc_utilization",
    "flops",
    "bytes",
    "flop_efficiency",
    "dtypes",
)
#: columns of :attr:`TestRecord.kernels`: one row per (kernel name, op)
KERNEL_COLUMNS = ("op_id", "op_name", "kernel_name", "calls", "gpu_time_total", "uses_tc")
#: columns of :attr:`TestRecord.counters`: one row per (op, deterministic counter), the
#: mean per recorded iteration (:mod:`perfguard.analysis.counters`); ``stable``: the
#: same value in every round, so the gates may compare it exactly (op_id "" is the
#: whole test, e.g. ``peak_memory``)
COUNTER_COLUMNS = ("op_id", "op_name", "counter", "value", "stable")
#: the whole-test counters of a loop measured under Callgrind (per iteration), gated like
#: the others (:mod:`perfguard.analysis.instructions`); ``functions`` holds their split
INSTRUCTION_COUNTERS = ("instructions", "est_cycles")

#: metric names a record's samples can carry
METRICS = {"gpu_time": "gpu_time_ns", "wall_time": "wall_time_ns", "cpu_time": "cpu_time_ns"}

#: how a round's iterations become the round's value, per metric (the one place).
#: Host timings (wall, thread CPU) take the fastest iteration: another process, an
#: interrupt or a page fault only ever *adds* time to a step, so the minimum is the
#: code's own cost with the least of the machine in it (``timeit``'s rule). Measured
#: on the 2-core CI VM (benchmarks/README.md, "round statistic"), the MLP step's value
#: per fresh process varied 1.1 % (min) against 2.6 % (median) idle, and 1.6 % against
#: 45 % with a spinning process per core. Work added to every step moves the minimum
#: as much as the median; work in a few steps only (a periodic flush) is the gates' and
#: the per-op table's to show. GPU kernel time is not stretched by the host's load,
#: and keeps the median.
#: what the session saw of the machine while it measured, kept in a record's ``meta``: the
#: reference workload's time (``speed_ns``, :mod:`perfguard.capture.speed`), the share of
#: round time the test's thread waited for a CPU (``wait``) and other processes' share of
#: the CPU (``load``); every later judgement of the record reads them (the live verdict did)
MACHINE_EVIDENCE = ("speed_ns", "wait", "load")
ROUND_STATISTIC = {"gpu_time": "median", "wall_time": "min", "cpu_time": "min"}


#: an A/B pair child's steps (:mod:`perfguard.plugin.interleave`: both trees stepping in
#: turn in one process) take their median: the two sides share every slow spell, so the
#: median's lower noise is no longer bought with the machine's state. Measured on the
#: 2-core VM (benchmarks/README.md, "A/B children"), two copies of a model stepping in
#: turn differed by 0.7-3.9 % (SD of the log ratio) by their medians, 1.8-7.9 % by their
#: fastest steps. Kept in the record's meta (``round_statistic``).
PAIR_STATISTIC = "median"


def round_statistic(metric: str, override: str | None = None) -> str:
    """``"min"`` or ``"median"``: how a round of ``metric`` is reduced (:data:`ROUND_STATISTIC`,
    unless a record says otherwise: ``override``, its ``meta["round_statistic"]``)."""
    if override in ("min", "median"):
        return override
    return ROUND_STATISTIC.get(metric, "median")


def round_value(values: np.ndarray, metric: str, statistic: str | None = None) -> float:
    """One round's value from its iterations' ``metric`` (ns), NaN when empty."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return float("nan")
    return float(v.min() if round_statistic(metric, statistic) == "min" else np.median(v))


def run_level(values: np.ndarray) -> float:
    """A run's level from its rounds' values: their geometric mean, the level a verdict
    compares (:mod:`perfguard.compare.timing` judges the mean of the rounds' logs), so a
    run is one number wherever it is printed. NaN without a positive value."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return math.nan
    return float(group_levels(np.zeros(len(v), dtype=np.int64), v)[1][0])


def run_levels_of(
    keys: pd.Series, rounds: pd.Series, values: pd.Series, metrics: pd.Series
) -> pd.DataFrame:
    """A stored run's level, the one figure every view prints for it (``history``, the
    reports' history tables and charts, the between-run noise, the verdict's levels): per
    key (a run or a test row), :func:`run_level` of its rounds, each round's value as
    :func:`round_value` reduces it. Columns ``level`` and ``size`` (rounds), indexed by
    key; rows whose value is NaN are left out. (Views once printed three figures for one
    run: the median of all samples, the median of the rounds, and the verdict's geometric
    mean: 25.5 ms, 23.8 ms and 23.9 ms.)"""
    frame = pd.DataFrame(
        {
            "key": keys.to_numpy(),
            "round": rounds.to_numpy(),
            "v": values.to_numpy(np.float64),
            "stat": metrics.map(round_statistic).to_numpy(),
        }
    ).dropna(subset=["v"])
    grouped = frame.groupby(["key", "round"])
    stats = grouped["v"].agg(["min", "median"])
    use_min = grouped["stat"].first() == "min"
    per_round = stats["min"].where(use_min, stats["median"])
    keys_of = per_round.index.get_level_values("key")
    uniq, level, size = group_levels(keys_of.to_numpy(), per_round.to_numpy(np.float64))
    return pd.DataFrame({"level": level, "size": size}, index=pd.Index(uniq, name="key"))


def group_levels(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique keys, :func:`run_level` of each key's ``values``, how many values), in one
    vectorised pass: every view's level of a run comes from here (the published site's
    bulk read too), so the same run prints the same number to the last bit."""
    ok = np.isfinite(values) & (values > 0)
    uniq, inverse = np.unique(keys, return_inverse=True)
    logs = np.log(np.where(ok, values, 1.0))
    n = np.bincount(inverse, weights=ok.astype(np.float64), minlength=len(uniq))
    total = np.bincount(inverse, weights=np.where(ok, logs, 0.0), minlength=len(uniq))
    size = np.bincount(inverse, minlength=len(uniq)).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        level = np.where(n > 0, np.exp(total / np.maximum(n, 1)), np.nan)
    # a run of one round is that round's value exactly (exp(log(x)) may differ in its last
    # bit, and a reader comparing the two would see two numbers)
    one = n == 1
    if one.any():
        only = np.full(len(uniq), -np.inf)
        np.maximum.at(only, inverse[ok], values[ok])  # the one valid value of such a key
        level = np.where(one, only, level)
    return uniq, level, size


def profiled_mask(samples: pd.DataFrame) -> np.ndarray:
    """Which sample rows were captured (older records, without the column: all)."""
    if "profiled" not in samples:
        return np.ones(len(samples), dtype=bool)
    return samples["profiled"].astype("boolean").fillna(True).to_numpy(dtype=bool)


def timing_mask(
    samples: pd.DataFrame, metric: str | pd.Series, by: str | None = None
) -> np.ndarray:
    """The sample rows a timing of ``metric`` is judged on.

    GPU time exists only in the capture: the profiled rows. Wall and CPU
    time come from the timing rounds run with the profiler off when the
    test had them (:mod:`perfguard.plugin.iterate`), else from every row.
    ``metric`` may be a per-row Series and ``by`` a column (``test_id``,
    ``run_id``) whose groups are separate records, for tables of many runs.
    """
    profiled = profiled_mask(samples)
    if by is None:
        has_timed = np.full(len(samples), not profiled.all())
    else:
        has_timed = (
            pd.Series(~profiled, index=samples.index).groupby(samples[by]).transform("any")
        ).to_numpy(dtype=bool)
    gpu = np.asarray(metric) == "gpu_time"  # a scalar for one metric, per row for a Series
    timing_rows = np.where(has_timed, ~profiled, True)
    return np.where(gpu, profiled, timing_rows)


#: the backend of runs imported from another tool's saved results (pytest-benchmark's
#: ``.benchmarks/``: :mod:`perfguard.baseline.import_benchmark`): history to read, measured
#: another way, so never a perfguard session's baseline
IMPORTED_BACKENDS = ("pytest-benchmark",)


@dataclass(frozen=True)
class Fingerprint:
    """The machine a run was measured on; results from different ones never compare."""

    gpu_name: str = ""  # "" on a CPU-only machine
    gpu_count: int = 0
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    perfguard: str = ""
    backend: str = ""  # "nsys" | "torch" | "cpu"
    host: str = field(default_factory=platform.node)
    python: str = field(default_factory=platform.python_version)
    cpu: str = field(default_factory=platform.processor)
    #: test processes measuring at once (pytest-xdist's -n; 1 when serial): four workers
    #: share the machine's cores, caches and memory bandwidth, a serial run does not
    workers: int = 1

    def incompatibility(self, other: Fingerprint) -> str | None:
        """Why results measured on ``other`` cannot be compared with these, or None.

        Same GPU model, same device count and same backend are required;
        versions and host are recorded for the reader but do not block.
        A CPU-only run is compared only with CPU-only runs on the same CPU
        model, since its figures are wall times of that CPU. The number of test
        processes measuring at once (``-n``) changes timing, not the counters the
        gates compare: :meth:`timing_incompatibility` says that one.
        """
        for name in ("gpu_name", "gpu_count", "backend"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                return f"{name} differs: {theirs!r} (baseline) vs {mine!r} (current)"
        if not self.gpu_name and self.cpu and other.cpu and self.cpu != other.cpu:
            return f"cpu differs: {other.cpu!r} (baseline) vs {self.cpu!r} (current)"
        return None

    def timing_incompatibility(self, other: Fingerprint) -> str | None:
        """Why timings measured on ``other`` cannot be compared with these (beyond
        :meth:`incompatibility`): another number of test processes measuring at once."""
        if self.workers != other.workers:
            return f"workers differs: {other.workers!r} (baseline) vs {self.workers!r} (current)"
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class RunInfo:
    """One session of measurements: which commit, which machine, when, and the environment
    it ran in (driver, clocks, library versions: :mod:`perfguard.environment`; empty for a
    run saved before perfguard recorded it)."""

    commit: str
    branch: str | None
    dirty: bool
    time: str  # ISO 8601, UTC
    fingerprint: Fingerprint
    environment: Environment = field(default_factory=Environment)
    #: the CI run whose jobs (a suite's shards) save into this one run (``--perfguard-run-group``);
    #: None: the session is a run of its own
    group: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe; ``environment`` and ``group`` only when known, so an older run's
        export is unchanged."""
        d = {k: v for k, v in asdict(self).items() if k not in ("environment", "group")}
        d["fingerprint"] = self.fingerprint.to_dict()
        if not self.environment.empty:
            d["environment"] = self.environment.to_dict()
        if self.group is not None:
            d["group"] = self.group
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunInfo:
        return cls(
            commit=data["commit"],
            branch=data.get("branch"),
            dirty=bool(data.get("dirty", False)),
            time=data["time"],
            fingerprint=Fingerprint.from_dict(data.get("fingerprint", {})),
            environment=Environment.from_dict(data.get("environment")),
            group=data.get("group"),
        )


@dataclass
class TestRecord:
    """One benchmark test's measurements in one run.

    ``samples`` (SAMPLE_COLUMNS), ``op_samples`` (OP_SAMPLE_COLUMNS), ``ops``
    (OP_COLUMNS), ``kernels`` (KERNEL_COLUMNS), ``counters``
    (COUNTER_COLUMNS) and ``functions`` (FUNCTION_COLUMNS: the host functions
    of a loop measured under Callgrind, empty otherwise) are DataFrames; ``meta``
    holds the marker's settings (iterations, warmup, tolerance, metrics),
    the capture path and any note (e.g. "test did not use the gpuprofile
    fixture: captured as one iteration").
    """

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    metric: str  # a key of METRICS
    samples: pd.DataFrame
    op_samples: pd.DataFrame
    ops: pd.DataFrame
    kernels: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    counters: pd.DataFrame = field(default_factory=lambda: empty_frame(COUNTER_COLUMNS))
    functions: pd.DataFrame = field(default_factory=lambda: empty_frame(FUNCTION_COLUMNS))

    def values(self, metric: str | None = None) -> np.ndarray:
        """Per-iteration values of ``metric`` (default: the primary one), in ns, as float64:
        the iterations it is judged on (:func:`timing_mask`)."""
        metric = metric or self.metric
        mask = timing_mask(self.samples, metric)
        return self.samples[METRICS[metric]].to_numpy(dtype=np.float64)[mask]

    @property
    def timed_apart(self) -> bool:
        """Its timing rounds ran with the profiler off (its per-op figures: one round)."""
        return not profiled_mask(self.samples).all()

    def rounds(self, metric: str | None = None) -> np.ndarray:
        """The round of each of :meth:`values`' iterations (0 everywhere for one round)."""
        mask = timing_mask(self.samples, metric or self.metric)
        if "round" not in self.samples:
            return np.zeros(int(mask.sum()), dtype=np.int64)
        return self.samples["round"].to_numpy(dtype=np.int64, na_value=0)[mask]

    def round_values(self, metric: str | None = None) -> np.ndarray:
        """One value per round of ``metric`` (ns), reduced by :func:`round_value`.

        Never the mean: one iteration held up by a page fault or a collector
        pause must not move the round.
        """
        metric = metric or self.metric
        values, rounds = self.values(metric), self.rounds(metric)
        if not len(values):
            return np.zeros(0)
        how = self.meta.get("round_statistic")
        return np.array([round_value(values[rounds == r], metric, how) for r in np.unique(rounds)])

    def op_values(self, op_id: str, metric: str | None = None) -> np.ndarray:
        """Per-iteration values of one op (GPU time, or CPU time for a wall/CPU-time record)."""
        col = "gpu_time_ns" if (metric or self.metric) == "gpu_time" else "cpu_time_ns"
        rows = self.op_samples[self.op_samples["op_id"] == op_id]
        return rows[col].to_numpy(dtype=np.float64)


def empty_frame(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})


def with_instructions(
    record: TestRecord,
    figures: dict[str, float],
    functions: pd.DataFrame,
    steps: int,
    layouts: list[float] | None = None,
) -> TestRecord:
    """``record`` with a Callgrind measurement of ``steps`` steps of its loop: the whole-test
    figures (:data:`INSTRUCTION_COUNTERS`, per iteration) as stable counters, replacing any it
    had, and the per-function table. One round is enough: the count does not vary by run.
    ``layouts``: the instructions per iteration in each heap layout counted (their spread is
    how far a code change's new layout alone can move the mean: the gate's floor)."""
    unknown = set(figures) - set(INSTRUCTION_COUNTERS)
    if unknown:
        raise ValueError(f"{record.nodeid}: not instruction counters: {sorted(unknown)}")
    kept = record.counters[~record.counters["counter"].isin(INSTRUCTION_COUNTERS)]
    rows = pd.DataFrame(
        {
            "op_id": "",
            "op_name": "",
            "counter": list(figures),
            "value": [float(v) for v in figures.values()],
            "stable": True,
        }
    )
    counters = pd.concat([kept, rows], ignore_index=True) if len(kept) else rows
    return replace(
        record,
        counters=counters[list(COUNTER_COLUMNS)],
        functions=functions.reindex(columns=list(FUNCTION_COLUMNS)).reset_index(drop=True),
        meta={
            **record.meta,
            "instructions_steps": int(steps),
            **({LAYOUTS_META: [float(v) for v in layouts]} if layouts else {}),
        },
    )


#: the record's meta key for its instructions per iteration in each heap layout counted
LAYOUTS_META = "instructions_layouts"


def instruction_layouts(record: TestRecord) -> list[float]:
    """The instructions per iteration of ``record`` in each heap layout counted (empty when
    not counted, or saved before perfguard kept them)."""
    values = record.meta.get(LAYOUTS_META) or []
    return [float(v) for v in values if isinstance(v, int | float)]


def instruction_counts(record: TestRecord) -> dict[str, float]:
    """The whole-test Callgrind figures of ``record`` (:data:`INSTRUCTION_COUNTERS` it has, per
    iteration); empty when its loop was not counted."""
    c = record.counters
    if c is None or c.empty:
        return {}
    rows = c[c["counter"].isin(INSTRUCTION_COUNTERS) & (c["op_id"] == "")]
    return {str(k): float(v) for k, v in rows.groupby("counter")["value"].sum().items()}


def _whole_steps(analysis: Analysis, it: pd.DataFrame) -> pd.DataFrame:
    """The iterations that are whole steps. DLProf's key-node rule (N key nodes, N+1
    intervals) makes the first interval everything up to the first key node's end and the
    last everything after the last one: each is part of a step (with the saxpy export, half
    the GPU time of the others), so judged per iteration they would make every counter read
    as varying between rounds, and nothing would be gated. Kept in the analysis (DLProf's
    table); left out of the record when the whole capture was analysed and a whole step lies
    between them. An explicit ``iter_start``/``iter_stop`` choice is the user's."""
    window = analysis.window
    if analysis.restricted or len(it) < 3 or window.empty:
        return it
    if not str(window["source"].iloc[0]).startswith("key node"):
        return it
    return it.iloc[1:-1]


def record_from_analysis(
    nodeid: str,
    analysis: Analysis,
    *,
    wall_times_ns: np.ndarray | None = None,
    cpu_times_ns: np.ndarray | None = None,
    metric: str | None = None,
    meta: dict[str, Any] | None = None,
    rounds: np.ndarray | None = None,
    extra_counters: dict[str, float] | None = None,
    profiled: np.ndarray | None = None,
) -> TestRecord:
    """A :class:`TestRecord` from a :class:`perfguard.analysis.Analysis` of one test.

    ``wall_times_ns`` are the harness's own per-iteration wall times (the
    ``gpuprofile`` fixture measures them around each recorded iteration,
    after synchronising the device); without them the iteration ranges'
    durations are used. ``cpu_times_ns`` (the same iterations' thread CPU
    time) fills ``cpu_time_ns``, else it is NA. ``metric`` defaults to ``gpu_time`` when the
    capture has GPU activity and ``wall_time`` otherwise. ``rounds`` gives
    each recorded iteration's round (all 0 when None); ``extra_counters`` are
    whole-test counters measured outside the trace (``peak_memory`` in bytes).
    ``profiled`` flags which of the harness's iterations ran under the
    capture; the others (timing rounds with the profiler off) become sample
    rows with no GPU time and no op samples, numbered after the profiled ones.
    """
    timed = None
    if profiled is not None and len(profiled) and not np.asarray(profiled, dtype=bool).all():
        flags = np.asarray(profiled, dtype=bool)
        timed = _timing_rows(flags, wall_times_ns, cpu_times_ns, rounds)
        wall_times_ns = None if wall_times_ns is None else np.asarray(wall_times_ns)[flags]
        cpu_times_ns = None if cpu_times_ns is None else np.asarray(cpu_times_ns)[flags]
        rounds = None if rounds is None else np.asarray(rounds)[flags]
    it = analysis.iterations
    it = it[it["rank"] == it["rank"].min()] if len(it) and "rank" in it else it
    it = _whole_steps(analysis, it)
    samples = pd.DataFrame(
        {
            "iteration": it["iteration"].to_numpy(dtype=np.int64),
            "gpu_time_ns": it["gpu_time"].to_numpy(dtype=np.int64),
            "wall_time_ns": it["duration"].to_numpy(dtype=np.int64),
        }
    )
    if wall_times_ns is not None and len(wall_times_ns) == len(samples):
        samples["wall_time_ns"] = np.asarray(wall_times_ns, dtype=np.int64)
    cpu = np.zeros(len(samples), dtype=np.int64)
    measured = cpu_times_ns is not None and len(cpu_times_ns) == len(samples)
    if measured:
        cpu = np.asarray(cpu_times_ns, dtype=np.int64)
    samples["cpu_time_ns"] = pd.arrays.IntegerArray(cpu, np.full(len(cpu), not measured))
    if rounds is not None and len(rounds) == len(samples):
        samples["round"] = np.asarray(rounds, dtype=np.int64)
    else:
        samples["round"] = np.zeros(len(samples), dtype=np.int64)
    samples["profiled"] = True
    if timed is not None:
        timed["iteration"] += int(samples["iteration"].max()) + 1 if len(samples) else 0
        samples = pd.concat([samples, timed], ignore_index=True)
    if metric is None:
        metric = "gpu_time" if len(analysis.activities) else "wall_time"

    inst = analysis.instances
    real = inst[inst["iteration"].notna()]
    g = real.groupby(["op_id", "iteration"], sort=False)
    op_samples = g.agg(
        calls=("instance", "size"), gpu_time_ns=("gpu_time", "sum"), cpu_time_ns=("cpu_time", "sum")
    ).reset_index()
    op_samples["iteration"] = op_samples["iteration"].astype(np.int64)
    op_samples = op_samples[list(OP_SAMPLE_COLUMNS)]

    ops = analysis.ops.rename(
        columns={"tc_utilization_pct": "tc_utilization", "flop_efficiency_pct": "flop_efficiency"}
    )
    if "data_type" in ops and "dtypes" not in ops:
        ops["dtypes"] = ops["data_type"]
    ops = ops.reindex(columns=list(OP_COLUMNS))
    k = analysis.kernels
    kernels = pd.DataFrame(
        {
            "op_id": k["op_id"],
            "op_name": k["op_name"],
            "kernel_name": k["name"],
            "calls": k["calls"],
            "gpu_time_total": k["gpu_time_total"],
            "uses_tc": k["uses_tc"] if "uses_tc" in k else pd.Series(pd.NA, index=k.index),
        }
    )
    counters = reduce_counters(op_counters_of(analysis), samples, extra_counters or {})
    meta = dict(meta or {})
    if analysis.trace.meta.get("format") in COMPILED_FORMATS:
        meta[COMPILED_OPS] = True  # its calls follow the compiler's rewrites (gates)
    sites = call_sites_of(analysis.ops)
    if sites:  # the user's line behind each op: explanations name it (kept with the run)
        meta["call_sites"] = sites
        meta.update(site_meta(analysis, int(samples["profiled"].sum()) or 1))
    return TestRecord(nodeid, metric, samples, op_samples, ops, kernels, meta, counters)


def call_sites_of(ops: pd.DataFrame) -> dict[str, str]:
    """Op name -> its call sites' text (:mod:`perfguard.analysis.call_sites`), for the
    ops that have one; the first direction's where an op runs both ways."""
    if "call_site" not in ops or ops.empty:
        return {}
    have = ops[ops["call_site"].notna()]
    pairs = zip(have["op_name"], have["call_site"], strict=True)
    return {str(n): str(s) for n, s in pairs if str(s)}


def site_meta(analysis: Any, iterations: int) -> dict[str, Any]:
    """The per-(op, call site) table a comparison places its culprits with
    (:mod:`perfguard.compare.sites`): ``op_sites``, columns of calls, GPU/CPU time, FLOPs
    and bytes (None: unknown) per iteration; and ``site_details``, each site's function,
    source text and stack (from the call-site pass, where it ran)."""
    table = op_sites(analysis.trace.ranges, analysis.kept_instances, analysis.cpu_only)
    out: dict[str, Any] = {}
    if len(table):
        out["op_sites"] = {
            "op": table["op_name"].astype(str).tolist(),
            "direction": table["direction"].astype(str).tolist(),
            "site": table["call_site"].astype(str).tolist(),
            "calls": (table["calls"].to_numpy(np.float64) / iterations).round(6).tolist(),
            "gpu_ns": (table["gpu_time"].to_numpy(np.float64) / iterations).round(1).tolist(),
            "cpu_ns": (table["cpu_time"].to_numpy(np.float64) / iterations).round(1).tolist(),
            # per site, so a change is compared where it happened, never averaged across sites
            **{
                c: [
                    None if np.isnan(v) else v
                    for v in (table[c].to_numpy(np.float64) / iterations).round(1).tolist()
                ]
                for c in ("flops", "bytes")
            },
        }
    runs = analysis.trace.meta.get("line_runs")
    if runs:  # lines of the user's code and how often each ran in one step
        out["line_runs"] = runs
    details = analysis.trace.meta.get("site_details")
    if details:
        used = set(out["op_sites"]["site"]) if out else set()
        out["site_details"] = {k: v for k, v in details.items() if k in used}
    return out


def record_from_timings(
    nodeid: str,
    *,
    wall_times_ns: np.ndarray,
    cpu_times_ns: np.ndarray | None,
    rounds: np.ndarray | None,
    metric: str,
    meta: dict[str, Any],
) -> TestRecord:
    """A record of timing rounds only (no profiled round: no ops, kernels or counters), as
    an A/B pair child after the first makes (:mod:`perfguard.plugin.interleave`): the
    first child's profiled round gave the test's ops and gates, which do not vary."""
    walls = np.asarray(wall_times_ns, dtype=np.int64)
    samples = _timing_rows(np.zeros(len(walls), dtype=bool), walls, cpu_times_ns, rounds)
    return TestRecord(
        nodeid=nodeid,
        metric=metric,
        samples=samples[list(SAMPLE_COLUMNS)],
        op_samples=empty_frame(OP_SAMPLE_COLUMNS),
        ops=empty_frame(OP_COLUMNS),
        kernels=empty_frame(KERNEL_COLUMNS),
        meta=meta,
    )


def _timing_rows(
    flags: np.ndarray,
    walls: np.ndarray | None,
    cpus: np.ndarray | None,
    rounds: np.ndarray | None,
) -> pd.DataFrame:
    """Sample rows of the timing rounds (``~flags``), iterations numbered from 0."""
    n = int((~flags).sum())
    if walls is None or len(walls) != len(flags):
        raise ValueError("timing rounds need the wall time of every recorded iteration")
    measured = cpus is not None and len(cpus) == len(flags)
    cpu = np.asarray(cpus, dtype=np.int64)[~flags] if measured else np.zeros(n, np.int64)
    return pd.DataFrame(
        {
            "iteration": np.arange(n, dtype=np.int64),
            "gpu_time_ns": np.zeros(n, dtype=np.int64),
            "wall_time_ns": np.asarray(walls, dtype=np.int64)[~flags],
            "cpu_time_ns": pd.arrays.IntegerArray(cpu, np.full(n, not measured)),
            "round": (
                np.asarray(rounds, dtype=np.int64)[~flags]
                if rounds is not None and len(rounds) == len(flags)
                else np.zeros(n, dtype=np.int64)
            ),
            "profiled": False,
        }
    )


def op_counters_of(analysis: Any) -> pd.DataFrame:
    return op_counters(analysis)


def reduce_counters(
    per_iteration: pd.DataFrame, samples: pd.DataFrame, extra: dict[str, float]
) -> pd.DataFrame:
    """:data:`COUNTER_COLUMNS` from the per-(op, iteration, counter) rows.

    ``value`` is the mean per profiled iteration (an iteration without the
    op counts 0); ``stable`` says every round had the same mean, so a
    difference from a baseline is the code's, not the run's (a counter that
    moves between rounds of one run, e.g. a data-dependent ``nonzero``, is
    reported but never gates). With one profiled round (the CPU's timing
    rounds run unprofiled) each iteration stands for a round: stable means
    the same value in every iteration.
    """
    samples = samples[profiled_mask(samples)]
    if samples["round"].nunique() == 1:
        samples = samples.assign(round=np.arange(len(samples), dtype=np.int64))
    n_iter = len(samples)
    rows = []
    if n_iter and len(per_iteration):
        round_of = pd.Series(samples["round"].to_numpy(np.int64), index=samples["iteration"])
        per_round = samples.groupby("round").size()
        df = per_iteration.assign(
            round=round_of.reindex(per_iteration["iteration"].to_numpy()).to_numpy()
        )
        df = df[df["round"].notna()]
        g = df.groupby(["op_id", "counter", "round"], sort=True)
        sums = g["value"].sum().unstack("round").reindex(columns=per_round.index, fill_value=0.0)
        sums = sums.fillna(0.0)
        means = sums.to_numpy() / per_round.to_numpy()[None, :]
        total = sums.to_numpy().sum(axis=1) / n_iter
        spread = means.max(axis=1) - means.min(axis=1)
        stable = spread <= 1e-9 * np.maximum(np.abs(means).max(axis=1), 1.0)
        names = df.groupby("op_id", sort=False)["op_name"].first()
        idx = sums.index
        rows.append(
            pd.DataFrame(
                {
                    "op_id": idx.get_level_values("op_id").astype(object),
                    "op_name": names.reindex(idx.get_level_values("op_id")).to_numpy(),
                    "counter": idx.get_level_values("counter").astype(object),
                    "value": total,
                    "stable": stable,
                }
            )
        )
    if extra:
        rows.append(
            pd.DataFrame(
                {
                    "op_id": "",
                    "op_name": "",
                    "counter": list(extra),
                    "value": [float(v) for v in extra.values()],
                    "stable": True,
                }
            )
        )
    if not rows:
        return empty_frame(COUNTER_COLUMNS)
    return pd.concat(rows, ignore_index=True)[list(COUNTER_COLUMNS)]


def merge_rounds(records: list[TestRecord]) -> TestRecord:
    """One record of several one-round records of the same test (A/B mode's children).

    Samples and per-op samples are concatenated, round ``k`` from the
    ``k``-th record, iterations renumbered to stay unique; per-op and
    per-kernel totals are summed; counters are the mean of the rounds', and
    ``stable`` only where every round had the same value (and was stable).
    """
    if not records:
        raise ValueError("merge_rounds needs at least one record")
    first = records[0]
    samples, op_samples = [], []
    offset = 0
    for k, r in enumerate(records):
        s = r.samples.copy()
        s["round"] = k
        shift = offset - (int(s["iteration"].min()) if len(s) else 0)
        s["iteration"] = s["iteration"].astype(np.int64) + shift
        o = r.op_samples.copy()
        if len(o):
            o["iteration"] = o["iteration"].astype(np.int64) + shift
        samples.append(s)
        op_samples.append(o)
        offset += max(len(s), 1)
    ops = pd.concat([r.ops for r in records], ignore_index=True)
    summed = ["calls", "kernel_count", "cpu_time_total", "gpu_time_total"]
    if len(ops):
        firsts = ops.drop_duplicates("op_id").set_index("op_id")
        totals = ops.groupby("op_id")[summed].sum(min_count=1)
        firsts[summed] = totals.reindex(firsts.index)
        ops = firsts.reset_index()[list(first.ops.columns)]
    kernels = pd.concat([r.kernels for r in records], ignore_index=True)
    if len(kernels):
        key = ["op_id", "kernel_name"]
        kfirst = kernels.drop_duplicates(key).set_index(key)
        ksum = kernels.groupby(key)[["calls", "gpu_time_total"]].sum(min_count=1)
        kfirst[["calls", "gpu_time_total"]] = ksum.reindex(kfirst.index)
        kernels = kfirst.reset_index()[list(first.kernels.columns)]
    counters = _merge_counters([r.counters for r in records])
    meta = dict(first.meta)
    for share in ("load", "wait"):
        seen = [float(v) for r in records if (v := r.meta.get(share)) is not None]
        meta[share] = float(np.mean(seen)) if seen else None
    speeds = [r.meta["speed_ns"] for r in records if r.meta.get("speed_ns")]
    meta["speed_ns"] = float(np.median(speeds)) if speeds else None
    meta["slow_rounds"] = int(sum(r.meta.get("slow_rounds") or 0 for r in records))
    meta["rounds"] = len(records)
    functions = next((r.functions for r in records if len(r.functions)), first.functions)
    return TestRecord(
        first.nodeid,
        first.metric,
        pd.concat(samples, ignore_index=True),
        pd.concat(op_samples, ignore_index=True),
        ops,
        kernels,
        meta,
        counters,
        functions,
    )


def _merge_counters(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return empty_frame(COUNTER_COLUMNS)
    n = len(frames)
    key = ["op_id", "counter"]
    wide = pd.concat([f.assign(_round=k) for k, f in enumerate(frames)], ignore_index=True)
    g = wide.groupby(key, sort=True)
    value = g["value"].sum() / n  # a round without the row counts 0
    present = g["_round"].nunique()
    lo, hi = g["value"].min(), g["value"].max()
    same = (hi - lo).abs() <= 1e-9 * hi.abs().clip(lower=1.0)
    stable = g["stable"].all().astype(bool) & (present == n) & same
    names = g["op_name"].first()
    out = pd.DataFrame(
        {
            "op_id": value.index.get_level_values("op_id"),
            "op_name": names.to_numpy(),
            "counter": value.index.get_level_values("counter"),
            "value": value.to_numpy(np.float64),
            "stable": stable.to_numpy(bool),
        }
    )
    return out[list(COUNTER_COLUMNS)]
