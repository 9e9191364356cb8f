"""A store as a few numpy-backed tables: its index, then the records asked for, in bulk.

``perfguard publish`` draws every test on every machine, so it cannot afford
what ``perfguard history`` does per test (a query per table per test, a
record object per run): at 1,000 commits x 200 tests x 3 machines that is
600,000 records. :func:`load_index` reads what says which pages changed (runs,
every record's id, run, test and metric, acceptances: no sample);
:func:`load_records` reads the records of the pages to rebuild by id, one
query per table and metric (only that metric's time column; flags packed into
the key in SQL: the driver's cost grows with the values a row holds), numeric
columns streamed straight into numpy arrays (``np.fromiter`` over the cursor,
no DataFrame of Python objects per sample), and every per-run figure is a
vectorised group-by:

* ``levels``: per test record, the value of each round (the fastest
  iteration for wall/CPU time, the median for GPU time:
  :func:`~perfguard.baseline.record.round_statistic`, over the rows
  :func:`~perfguard.baseline.record.timing_mask` selects) and the run's
  level, the geometric mean of its rounds: the same reduction as
  :func:`perfguard.baseline.record.run_levels_of`, without a query per test;
* ``counters``: per test record, each counter summed over its ops, and the
  sum over the ops stable in that run (what a counter step compares);
* ``ops``: per test record and op, its time per profiled iteration (GPU time
  for a GPU-time test, else CPU time), calls, kernels, FLOPs, bytes, Tensor
  Core use and dtypes, from the ``ops`` table (``op_samples`` is per
  iteration and ten times larger: the per-op trend does not need it).

"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfguard.analysis.counters import COUNTERS
from perfguard.baseline.record import (
    INSTRUCTION_COUNTERS,
    MACHINE_EVIDENCE,
    METRICS,
    group_levels,
    round_statistic,
)
from perfguard.environment import machine_key
from perfguard.forking import can_fork

if TYPE_CHECKING:
    from perfguard.baseline.store import Store

__all__ = [
    "COUNTER_NAMES",
    "StoreIndex",
    "StoreTables",
    "load_index",
    "load_records",
    "load_tables",
    "machine_key",
]

#: the gate counters a publish charts, in this order (codes 0..n-1 in the counters query)
COUNTER_NAMES: tuple[str, ...] = (*COUNTERS, "peak_memory", *INSTRUCTION_COUNTERS)
#: metric -> code in the levels table
METRIC_CODES = {name: i for i, name in enumerate(METRICS)}
#: a missing number in a streamed column (every stored time and count is >= 0)
MISSING = -1


@dataclass
class StoreTables:
    """The store as publish reads it (module docstring). Frames keyed by ``test_id``."""

    #: run_id, commit, dirty, time, machine (key), machine_label, host
    runs: pd.DataFrame
    #: test_id, run_id, nodeid, metric, level (ns), n_rounds, and what the session saw of
    #: the machine (speed_ns, wait, load: MACHINE_EVIDENCE)
    tests: pd.DataFrame
    #: test_id, round, value (ns): one row per judged round
    rounds: pd.DataFrame
    #: test_id, counter, value, stable_value
    counters: pd.DataFrame
    #: test_id, op_id, op_name, time_ns (per iteration), calls, kernels, flops, bytes,
    #: using_tc, dtypes
    ops: pd.DataFrame
    #: acceptance_id, nodeid, commit, reason, time, author
    acceptances: pd.DataFrame


def _stream(cursor: Iterable[tuple[Any, ...]], width: int) -> np.ndarray:
    """Numeric rows of ``cursor`` as an (n, width) float64 array, read in C (``fromiter``
    over the chained rows: no Python object kept per row). The query coalesces NULLs to
    :data:`MISSING`."""
    flat = np.fromiter(itertools.chain.from_iterable(cursor), dtype=np.float64)
    return flat.reshape(-1, width)


def _query(store: Store, sql: str, params: tuple[Any, ...] = ()) -> Any:
    return store.db.execute(sql, params)


def _possible(store: Store, column: str, values: np.ndarray, signed: bool = False) -> None:
    """Numbers read back as a store holds them: finite and, unless ``signed``, a time or
    count never below zero (:data:`MISSING` stands for NULL); else the store is damaged,
    said as the store's own readers say it (``frames.impossible``)."""
    if not np.isfinite(values).all():
        raise store.db.damaged(f"{column} holds a value that is not a finite number")
    negative = (values < 0) & (values != MISSING)
    if not signed and negative.any():
        raise store.db.damaged(f"{column} holds a negative value ({values[negative][0]:.0f})")


def _runs(store: Store) -> pd.DataFrame:
    with store.db.guard():
        rows = _query(store, 'SELECT run_id, "commit", dirty, time, host, fingerprint FROM runs')
        frame = pd.DataFrame.from_records(
            rows.fetchall(), columns=["run_id", "commit", "dirty", "time", "host", "fp"]
        )
    with store.db.decoding("runs.fingerprint"):
        keys = [machine_key(json.loads(fp)) for fp in frame["fp"]]
    frame["machine"] = [k for k, _ in keys]
    frame["machine_label"] = [label for _, label in keys]
    frame["run_id"] = frame["run_id"].astype(np.int64)
    frame["dirty"] = frame["dirty"].astype(bool)
    return frame.drop(columns="fp")


def _starts(keys: np.ndarray) -> np.ndarray:
    """Where each run of equal values of sorted ``keys`` starts."""
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else keys[:0]


def _group_median(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys, median of ``values`` per key), vectorised: one lexsort, no loop; with
    ``keys`` sorted and every group of one size (rounds of as many iterations, records of
    as many rounds: the rule), a sort of each row of a (groups x size) table instead."""
    starts = _starts(keys)
    counts = np.diff(np.r_[starts, len(keys)])
    if len(keys) and np.all(keys[1:] >= keys[:-1]) and np.all(counts == counts[0]):
        table = np.sort(values.reshape(-1, counts[0]), axis=1)
        return keys[starts], (table[:, (counts[0] - 1) // 2] + table[:, counts[0] // 2]) / 2
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order]
    starts = _starts(k)
    counts = np.diff(np.r_[starts, len(k)])
    lo = starts + (counts - 1) // 2
    hi = starts + counts // 2
    return k[starts], (v[lo] + v[hi]) / 2


#: a WHERE clause on test_id and its parameters
Where = tuple[str, tuple[Any, ...]]
#: rounds per record the packed sample key leaves room for
MAX_ROUNDS = 4096


def _levels(
    store: Store, tests: pd.DataFrame, where: Where, code: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    """Each record's rounds, level (module docstring) and profiled iterations, from one scan
    of ``samples``. ``tests``: every record the ``where`` clause selects, sorted by test_id,
    all of metric ``code``: only that metric's column is read, and the key is packed into
    one number in SQL (the driver's cost grows with the values a row holds)."""
    column = list(METRICS.values())[code]
    with store.db.guard(), store.db.decoding("table samples"):
        cur = _query(
            store,
            f"SELECT (test_id * {MAX_ROUNDS} + round) * 2 + profiled, "
            f"coalesce({column}, {MISSING}) FROM samples WHERE {where[0]}",
            where[1],
        )
        s = _stream(cur, 2)
    _possible(store, f"samples.{column}", s[:, 1])
    packed = s[:, 0].astype(np.int64)
    key, profiled = packed // 2, (packed % 2) == 1
    pos = np.searchsorted(tests["test_id"].to_numpy(), key // MAX_ROUNDS)
    pos = np.minimum(pos, max(len(tests) - 1, 0))
    value = s[:, 1]
    iters = pd.Series(
        np.bincount(pos[profiled], minlength=len(tests)), index=tests["test_id"].to_numpy()
    )
    # timing_mask: GPU time on profiled rows; wall/CPU time on the unprofiled rows of a
    # record that has them (timing rounds with the profiler off), else on every row
    gpu = code == METRIC_CODES["gpu_time"]
    if gpu:
        keep = profiled & (value >= 0)
    else:
        has_timed = np.bincount(pos[~profiled], minlength=len(tests)) > 0
        keep = np.where(has_timed[pos], ~profiled, True) & (value >= 0)
    key, value = key[keep], value[keep]
    if len(key) and np.any(key[1:] < key[:-1]):  # stored in order already, as a rule
        order = np.argsort(key, kind="stable")
        key, value = key[order], value[order]
    starts = _starts(key)
    # GPU time: a round's median, not its fastest iteration (record.ROUND_STATISTIC)
    median_metrics = [METRIC_CODES[m] for m in METRICS if round_statistic(m) != "min"]
    assert median_metrics == [METRIC_CODES["gpu_time"]]
    if gpu:
        per_round = _group_median(key, value)[1]
    else:
        per_round = np.minimum.reduceat(value, starts) if len(key) else value
    rk = key[starts]
    rounds = pd.DataFrame(
        {"test_id": rk // MAX_ROUNDS, "round": rk % MAX_ROUNDS, "value": per_round}
    )
    ids, level, _ = group_levels(rounds["test_id"].to_numpy(), rounds["value"].to_numpy())
    levels = pd.DataFrame({"test_id": ids, "level": level}).set_index("test_id")
    levels["n_rounds"] = np.diff(np.r_[_starts(rounds["test_id"].to_numpy()), len(rounds)])
    return rounds, levels, iters


def _evidence(store: Store, where: Where) -> pd.DataFrame:
    """Per test record (index test_id), what its session saw of the machine
    (:data:`~perfguard.baseline.record.MACHINE_EVIDENCE`), from ``meta`` in SQL; NaN where
    a record did not keep it."""
    db = store.db
    figures = ", ".join(
        f"coalesce({db.json_number('meta', k)}, {MISSING})" for k in MACHINE_EVIDENCE
    )
    with db.guard():
        cur = _query(store, f"SELECT test_id, {figures} FROM tests WHERE {where[0]}", where[1])
        table = _stream(cur, 1 + len(MACHINE_EVIDENCE))
    values = np.where(table[:, 1:] == MISSING, np.nan, table[:, 1:])
    return pd.DataFrame(
        values,
        columns=list(MACHINE_EVIDENCE),
        index=pd.Index(table[:, 0].astype(np.int64), name="test_id"),
    )


def _counters(store: Store, where: Where) -> pd.DataFrame:
    """Per record and counter: the sum over ops, and over the ops stable in that run."""
    codes = " ".join(f"WHEN '{name}' THEN {i}" for i, name in enumerate(COUNTER_NAMES))
    with store.db.guard():
        cur = _query(
            store,
            f"SELECT (test_id * 64 + CASE counter {codes} ELSE 63 END) * 2 "
            "+ CASE WHEN coalesce(stable, 0) != 0 THEN 1 ELSE 0 END, "
            "coalesce(value, 0) FROM counters "
            f"WHERE {where[0]}",
            where[1],
        )
        with store.db.decoding("table counters"):
            c = _stream(cur, 2)
    _possible(store, "counters.value", c[:, 1], signed=True)
    packed = c[:, 0].astype(np.int64)
    keys, inverse = np.unique(packed // 2, return_inverse=True)
    value = np.bincount(inverse, weights=c[:, 1])
    stable = np.bincount(inverse, weights=c[:, 1] * (packed % 2))
    known = keys % 64 < len(COUNTER_NAMES)
    keys, value, stable = keys[known], value[known], stable[known]
    return pd.DataFrame(
        {
            "test_id": keys // 64,
            "counter": pd.Categorical.from_codes(keys % 64, pd.Index(COUNTER_NAMES)),
            "value": value,
            "stable_value": stable,
        }
    )


#: separates the text columns the ops query joins into one (a control character no op
#: name holds: the store's names are printable)
SEP = "\x1f"


def _ops(store: Store, where: Where, time_column: str) -> pd.DataFrame:
    """Per record and op: its totals (divided per iteration by :func:`_per_iteration`),
    ``time_column`` as its time. One scan; the three texts are joined into one string a
    row in SQL and factorised (a few hundred distinct ones in a million rows)."""
    with store.db.guard():
        cur = _query(
            store,
            "SELECT test_id * 2 + CASE WHEN coalesce(using_tc, 0) != 0 "
            "THEN 1 ELSE 0 END, "
            f"coalesce({time_column}, 0), coalesce(calls, 0), "
            f"coalesce(kernel_count, 0), coalesce(flops, {MISSING}), "
            f"coalesce(bytes, {MISSING}), "
            "op_id || ? || op_name || ? || coalesce(dtypes, '') FROM ops "
            f"WHERE {where[0]}",
            (SEP, SEP, *where[1]),
        )
        rows = cur.fetchall()
    columns = list(zip(*rows, strict=True)) if rows else [()] * 7
    codes, texts = pd.factorize(pd.Series(columns[6], dtype=object))
    parts = [str(t).split(SEP) for t in texts]
    with store.db.decoding("table ops"):
        packed = np.array(columns[0], dtype=np.int64)
        out: dict[str, Any] = {"test_id": packed // 2, "using_tc": packed % 2}
        for i, name in enumerate(("time", "calls", "kernels", "flops", "bytes")):
            out[name] = np.array(columns[1 + i], dtype=np.float64)
            _possible(store, f"ops.{name}", out[name])
    for i, name in enumerate(("op_id", "op_name", "dtypes")):
        out[name] = pd.Categorical([p[i] for p in parts])[codes]
    return pd.DataFrame(out)


def _per_iteration(ops: pd.DataFrame, tests: pd.DataFrame, iters: pd.Series) -> pd.DataFrame:
    """The ops' figures per iteration. Counts (calls, kernels, FLOPs, bytes): the totals
    over the profiled iterations divided by them. Time: the op's share of the profiled
    time (GPU time of every op for a GPU-time test, else CPU time of the outermost ops,
    which hold the nested ones) times the run's level, so one slow profiled round on a busy
    machine moves no op (on a CPU runner a profiled round's ops are not the timing's
    rounds, and an op's mean over it follows the machine's load)."""
    test_id = ops["test_id"]
    by_test = tests.set_index("test_id")
    gpu = test_id.map(by_test["metric"]).eq("gpu_time").to_numpy()
    per = test_id.map(iters).fillna(1).clip(lower=1).to_numpy(np.float64)
    time = ops["time"].to_numpy(np.float64)  # GPU time for a GPU-time test, else CPU time
    outer = ~ops["op_name"].astype(str).str.contains("/", regex=False).to_numpy()
    whole = pd.Series(np.where(gpu | outer, time, 0.0)).groupby(test_id.to_numpy()).transform("sum")
    level = test_id.map(by_test["level"]).to_numpy(np.float64)
    share = np.divide(time, whole.to_numpy(), out=np.full(len(time), np.nan), where=whole > 0)
    out = ops[["test_id", "op_id", "op_name", "dtypes"]].copy()
    out["time_ns"] = np.where(np.isfinite(share * level), share * level, time / per)
    for name in ("calls", "kernels", "flops", "bytes"):
        values = ops[name].to_numpy(np.float64)
        out[name] = np.where(values < 0, np.nan, values) / per
    out["using_tc"] = ops["using_tc"].to_numpy() > 0
    return out


#: records from which reading in parallel pays for the forks
PARALLEL_RECORDS = 20_000
#: ids per query (one parameter: a JSON array in SQLite, an array in PostgreSQL)
IDS_PER_QUERY = 50_000
# what a forked reader needs: set by load_records before the pool starts
_READ: dict[str, Any] = {}


@dataclass
class StoreIndex:
    """What a publish reads of every record: small, and enough to say which pages changed
    (the record tables are read after, for the series whose pages are rebuilt only)."""

    #: run_id, commit, dirty, time, host, machine (key), machine_label
    runs: pd.DataFrame
    #: test_id, run_id, nodeid, metric, metric_code; sorted by test_id
    tests: pd.DataFrame
    #: acceptance_id, nodeid, commit, reason, time, author
    acceptances: pd.DataFrame
    #: the store's name (its path, or its URL without the password)
    name: str


def load_index(location: str | os.PathLike[str]) -> StoreIndex:
    """The store's runs, records (ids, runs, tests, metrics: no sample) and acceptances,
    from one snapshot."""
    from perfguard.baseline.store import open_store

    with open_store(location, create=False) as store, store.db.read():
        runs = _runs(store)
        with store.db.guard():
            cur = _query(
                store, "SELECT test_id, run_id, nodeid, metric FROM tests ORDER BY test_id"
            )
            tests = pd.DataFrame.from_records(
                cur.fetchall(), columns=["test_id", "run_id", "nodeid", "metric"]
            )
        acceptances = store.accepted.table()
        name = store.name
        unknown = ~tests["metric"].isin(list(METRIC_CODES))
        if unknown.any():  # never drawn as another metric's record
            metric = tests["metric"][unknown].iloc[0]
            raise store.db.damaged(f"tests.metric: unknown metric {metric!r}")
    tests["test_id"] = tests["test_id"].astype(np.int64)
    tests["run_id"] = tests["run_id"].astype(np.int64)
    tests["metric_code"] = tests["metric"].map(METRIC_CODES).fillna(0).astype(np.int64)
    return StoreIndex(runs, tests, acceptances, name)


def _read(ids: np.ndarray) -> tuple[pd.DataFrame, ...]:
    """The records ``ids`` (sorted), reduced. Read by id (an index lookup each, about what a
    scan costs per record, and a share of the series is spread over the whole store), one
    query per table and metric (a query reads that metric's time column only)."""
    from perfguard.baseline.store import open_store

    tests: pd.DataFrame = _READ["tests"]
    mine = tests.iloc[np.searchsorted(tests["test_id"].to_numpy(), ids)]
    with open_store(_READ["location"], create=False) as store, store.db.read():
        db = store.db

        def where(some: pd.Series) -> Where:
            return db.ids_in("test_id"), (db.ids_param(some.tolist()),)

        codes = mine["metric_code"].to_numpy()
        levels = []
        for code in np.unique(codes):
            group = mine[codes == code]
            levels.append(_levels(store, group, where(group["test_id"]), int(code)))
        counters = _counters(store, where(mine["test_id"]))
        evidence = _evidence(store, where(mine["test_id"]))
        gpu = mine["metric"].eq("gpu_time").to_numpy()
        ops = [
            _ops(store, where(mine["test_id"][gpu == on]), column)
            for on, column in ((True, "gpu_time_total"), (False, "cpu_time_total"))
            if (gpu == on).any()
        ]
    rounds = pd.concat([part[0] for part in levels])
    level = pd.concat([part[1] for part in levels])
    iters = pd.concat([part[2] for part in levels])
    level = level.join(evidence)
    return rounds, level, iters.to_frame("iters"), counters, pd.concat(ops, ignore_index=True)


def load_records(
    location: str | os.PathLike[str],
    index: StoreIndex,
    ids: np.ndarray | None = None,
    *,
    jobs: int = 1,
) -> StoreTables:
    """The index's tables with the records ``ids`` (default: all) read and reduced: levels,
    rounds, counters, ops. Read by ``jobs`` forked processes when there are many records
    (the Python driver's cost per row, not the database, is what a read of millions of rows
    spends its time on). A record without a sample has no level (NaN)."""
    all_ids = index.tests["test_id"].to_numpy()
    want = all_ids if ids is None else np.unique(np.asarray(ids, dtype=np.int64))
    parts_wanted = max(
        max(1, jobs) if len(want) > PARALLEL_RECORDS else 1, -(-len(want) // IDS_PER_QUERY)
    )
    chunks = [chunk for chunk in np.array_split(want, parts_wanted) if len(chunk)]
    tests = index.tests if ids is None else index.tests[np.isin(all_ids, want)]
    tests = tests.reset_index(drop=True)
    _READ.update(location=location, tests=index.tests)
    try:
        if len(chunks) > 1 and jobs > 1 and can_fork():
            with multiprocessing.get_context("fork").Pool(min(len(chunks), jobs)) as pool:
                parts = pool.map(_read, chunks, chunksize=1)
        else:
            parts = [_read(chunk) for chunk in chunks]
    finally:
        _READ.clear()
    if not parts:  # a store without records
        parts = [_empty()]
    rounds, levels, iters, counters, ops = (pd.concat([p[k] for p in parts]) for k in range(5))
    rounds, counters = rounds.reset_index(drop=True), counters.reset_index(drop=True)
    tests["level"] = tests["test_id"].map(levels["level"]).astype(np.float64)
    tests["n_rounds"] = tests["test_id"].map(levels["n_rounds"]).fillna(0).astype(np.int64)
    for k in MACHINE_EVIDENCE:
        tests[k] = tests["test_id"].map(levels[k]).astype(np.float64)
    ops = _per_iteration(ops.reset_index(drop=True), tests, iters["iters"])
    tests["nodeid"] = tests["nodeid"].astype("category")
    return StoreTables(
        index.runs, tests.drop(columns="metric_code"), rounds, counters, ops, index.acceptances
    )


def load_tables(location: str | os.PathLike[str], *, jobs: int = 1) -> StoreTables:
    """The whole store's runs, acceptances and records (:func:`load_index`, then
    :func:`load_records` of every record)."""
    return load_records(location, load_index(location), jobs=jobs)


def _empty() -> tuple[pd.DataFrame, ...]:
    """The reduced tables of a store without records."""
    rounds = pd.DataFrame(
        {
            "test_id": np.array([], np.int64),
            "round": np.array([], np.int64),
            "value": np.array([], np.float64),
        }
    )
    levels = pd.DataFrame(
        {c: [] for c in ("level", "n_rounds", *MACHINE_EVIDENCE)},
        index=pd.Index([], name="test_id"),
    )
    iters = pd.DataFrame({"iters": []})
    counters = pd.DataFrame(
        {
            "test_id": np.array([], np.int64),
            "counter": pd.Categorical([], pd.Index(COUNTER_NAMES)),
            "value": [],
            "stable_value": [],
        }
    )
    names = (
        "test_id",
        "using_tc",
        "time",
        "calls",
        "kernels",
        "flops",
        "bytes",
        "op_id",
        "op_name",
        "dtypes",
    )
    ops = pd.DataFrame({c: [] for c in names})
    return rounds, levels, iters, counters, ops
