"""A whole store as a few numpy-backed tables, read with one query per table.

``perfguard publish`` draws every test on every machine, so it cannot afford
what ``perfguard history`` does per test (a query per table per test, a
record object per run): at 1,000 commits x 200 tests x 3 machines that is
600,000 records. Here each table is read once, its numeric columns streamed
straight into numpy arrays (``np.fromiter`` over the cursor, no DataFrame of
Python objects per sample), and every per-run figure is a vectorised group-by:

* ``levels``: per test record, the value of each round (the fastest
  iteration for wall/CPU time, the median for GPU time:
  :func:`~perfguard.baseline.record.round_statistic`, over the rows
  :func:`~perfguard.baseline.record.timing_mask` selects) and the run's
  level, the median of its rounds: the same reduction as
  :func:`perfguard.compare.history.run_levels`, without a query per test;
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
from perfguard.baseline.record import INSTRUCTION_COUNTERS, METRICS, round_statistic

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
    #: test_id, run_id, nodeid, metric, level (ns), n_rounds
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


def machine_key(fp: dict[str, Any]) -> tuple[str, str]:
    """(key, label) of the machine a run's fingerprint describes: what must match for two
    runs' timings to be compared (GPU model and count, backend, CPU model without a GPU,
    and the test processes measuring at once), as ``Fingerprint.incompatibility`` and
    ``timing_incompatibility`` decide."""
    gpu, count = str(fp.get("gpu_name") or ""), int(fp.get("gpu_count") or 0)
    backend, cpu = str(fp.get("backend") or "?"), "" if gpu else str(fp.get("cpu") or "")
    workers = int(fp.get("workers") or 1)
    key = json.dumps([gpu, count, backend, cpu, workers])
    what = (f"{count}x {gpu}" if count > 1 else gpu) if gpu else f"CPU {cpu}".strip()
    label = f"{what} [{backend}]" + (f", {workers} workers" if workers > 1 else "")
    return key, label


def _stream(cursor: Iterable[tuple[Any, ...]], width: int) -> np.ndarray:
    """Numeric rows of ``cursor`` as an (n, width) float64 array, read in C (``fromiter``
    over the chained rows: no Python object kept per row). The query coalesces NULLs to
    :data:`MISSING`."""
    flat = np.fromiter(itertools.chain.from_iterable(cursor), dtype=np.float64)
    return flat.reshape(-1, width)


def _query(store: Store, sql: str, params: tuple[Any, ...] = ()) -> Any:
    return store.db.execute(sql, params)


def _runs(store: Store) -> pd.DataFrame:
    with store.db.guard():
        rows = _query(store, 'SELECT run_id, "commit", dirty, time, host, fingerprint FROM runs')
        frame = pd.DataFrame.from_records(
            rows.fetchall(), columns=["run_id", "commit", "dirty", "time", "host", "fp"]
        )
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
    """(unique keys, median of ``values`` per key), vectorised: one lexsort, no loop."""
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
    store: Store, tests: pd.DataFrame, where: Where
) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    """Each record's rounds, level (module docstring) and profiled iterations, from one scan
    of ``samples`` (its key packed into one number in SQL: a third fewer values to move).
    ``tests``: every record the ``where`` clause selects, sorted by test_id."""
    with store.db.guard():
        cur = _query(store, f"SELECT (test_id * {MAX_ROUNDS} + round) * 2 + profiled, "
                            f"coalesce(gpu_time_ns, {MISSING}), coalesce(wall_time_ns, "
                            f"{MISSING}), coalesce(cpu_time_ns, {MISSING}) FROM samples "
                            f"WHERE {where[0]}", where[1])  # fmt: skip
        s = _stream(cur, 4)
    packed = s[:, 0].astype(np.int64)
    key, profiled = packed // 2, (packed % 2) == 1
    test_id = key // MAX_ROUNDS
    pos = np.searchsorted(tests["test_id"].to_numpy(), test_id)
    pos = np.minimum(pos, max(len(tests) - 1, 0))
    metric = tests["metric_code"].to_numpy()[pos] if len(tests) else pos
    value = s[np.arange(len(s)), 1 + metric]
    iters = pd.Series(np.bincount(pos[profiled], minlength=len(tests)),
                      index=tests["test_id"].to_numpy())  # fmt: skip
    # timing_mask: GPU time on profiled rows; wall/CPU time on the unprofiled rows of a
    # record that has them (timing rounds with the profiler off), else on every row
    has_timed = np.bincount(pos[~profiled], minlength=len(tests)) > 0
    gpu = metric == METRIC_CODES["gpu_time"]
    keep = np.where(gpu, profiled, np.where(has_timed[pos], ~profiled, True)) & (value >= 0)
    key, value, gpu = key[keep], value[keep], gpu[keep]
    if len(key) and np.any(key[1:] < key[:-1]):  # stored in order already, as a rule
        order = np.argsort(key, kind="stable")
        key, value, gpu = key[order], value[order], gpu[order]
    starts = _starts(key)
    per_round = np.minimum.reduceat(value, starts) if len(key) else value
    # GPU time: a round's median, not its fastest iteration (record.ROUND_STATISTIC)
    median_metrics = [METRIC_CODES[m] for m in METRICS if round_statistic(m) != "min"]
    assert median_metrics == [METRIC_CODES["gpu_time"]]
    if gpu.any():
        k, med = _group_median(key[gpu], value[gpu])
        at = np.searchsorted(key[starts], k)
        per_round[at] = med
    rk = key[starts]
    rounds = pd.DataFrame({"test_id": rk // MAX_ROUNDS, "round": rk % MAX_ROUNDS,
                           "value": per_round})  # fmt: skip
    ids, level = _group_median(rounds["test_id"].to_numpy(), rounds["value"].to_numpy())
    levels = pd.DataFrame({"test_id": ids, "level": level}).set_index("test_id")
    levels["n_rounds"] = np.diff(np.r_[_starts(rounds["test_id"].to_numpy()), len(rounds)])
    return rounds, levels, iters


def _counters(store: Store, where: Where) -> pd.DataFrame:
    """Per record and counter: the sum over ops, and over the ops stable in that run."""
    codes = " ".join(f"WHEN '{name}' THEN {i}" for i, name in enumerate(COUNTER_NAMES))
    with store.db.guard():
        cur = _query(store, f"SELECT test_id * 64 + CASE counter {codes} ELSE 63 END, "
                            "coalesce(value, 0), coalesce(stable, 0) FROM counters "
                            f"WHERE {where[0]}", where[1])  # fmt: skip
        c = _stream(cur, 3)
    key = c[:, 0].astype(np.int64)
    keys, inverse = np.unique(key, return_inverse=True)
    value = np.bincount(inverse, weights=c[:, 1])
    stable = np.bincount(inverse, weights=c[:, 1] * (c[:, 2] != 0))
    known = keys % 64 < len(COUNTER_NAMES)
    keys, value, stable = keys[known], value[known], stable[known]
    return pd.DataFrame({
        "test_id": keys // 64,
        "counter": pd.Categorical.from_codes(keys % 64, pd.Index(COUNTER_NAMES)),
        "value": value, "stable_value": stable,
    })  # fmt: skip


#: separates the text columns the ops query joins into one (a control character no op
#: name holds: the store's names are printable)
SEP = "\x1f"


def _ops(store: Store, where: Where) -> pd.DataFrame:
    """Per record and op: its totals (divided per iteration by :func:`_per_iteration`).
    One scan; the three texts are joined into one string a row in SQL and factorised
    (a few hundred distinct ones in a million rows)."""
    with store.db.guard():
        cur = _query(store, "SELECT test_id, coalesce(gpu_time_total, 0), "
                            "coalesce(cpu_time_total, 0), coalesce(calls, 0), "
                            f"coalesce(kernel_count, 0), coalesce(flops, {MISSING}), "
                            f"coalesce(bytes, {MISSING}), coalesce(using_tc, 0), "
                            "op_id || ? || op_name || ? || coalesce(dtypes, '') FROM ops "
                            f"WHERE {where[0]}", (SEP, SEP, *where[1]))  # fmt: skip
        rows = cur.fetchall()
    columns = list(zip(*rows, strict=True)) if rows else [()] * 9
    codes, texts = pd.factorize(pd.Series(columns[8], dtype=object))
    parts = [str(t).split(SEP) for t in texts]
    out: dict[str, Any] = {"test_id": np.array(columns[0], dtype=np.int64)}
    for i, name in enumerate(("gpu", "cpu", "calls", "kernels", "flops", "bytes", "using_tc")):
        out[name] = np.array(columns[1 + i], dtype=np.float64)
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
    time = np.where(gpu, ops["gpu"], ops["cpu"]).astype(np.float64)
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
#: the test ids a span reader reads (every record table has an index on test_id)
IN_SPAN = "test_id >= ? AND test_id < ?"
#: below this share of the store's records, the records wanted are read by id (an index
#: lookup each) rather than by scanning ranges of ids (which reads the records between)
BY_ID_SHARE = 0.25
#: ids per query of a read by id (one parameter: a JSON array in SQLite, an array in
#: PostgreSQL)
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
            cur = _query(store, "SELECT test_id, run_id, nodeid, metric FROM tests "
                                "ORDER BY test_id")  # fmt: skip
            tests = pd.DataFrame.from_records(
                cur.fetchall(), columns=["test_id", "run_id", "nodeid", "metric"]
            )
        acceptances = store.acceptances()
        name = store.name
    tests["test_id"] = tests["test_id"].astype(np.int64)
    tests["run_id"] = tests["run_id"].astype(np.int64)
    tests["metric_code"] = tests["metric"].map(METRIC_CODES).fillna(0).astype(np.int64)
    return StoreIndex(runs, tests, acceptances, name)


def _read(task: tuple[str, Any]) -> tuple[pd.DataFrame, ...]:
    """One worker's share, reduced: the records with ids in a span (``("span", (lo, hi))``)
    or in a list (``("ids", sorted array)``)."""
    from perfguard.baseline.store import open_store

    kind, what = task
    tests: pd.DataFrame = _READ["tests"]
    all_ids = tests["test_id"].to_numpy()
    with open_store(_READ["location"], create=False) as store, store.db.read():
        if kind == "span":
            where: Where = (IN_SPAN, tuple(what))
            a, b = np.searchsorted(all_ids, what)
            mine = tests.iloc[a:b]
        else:
            where = (store.db.ids_in("test_id"), (store.db.ids_param(what),))
            mine = tests.iloc[np.searchsorted(all_ids, what)]
        rounds, levels, iters = _levels(store, mine, where)
        counters = _counters(store, where)
        ops = _ops(store, where)
    return rounds, levels, iters.to_frame("iters"), counters, ops


def _spans(ids: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """``parts`` ranges of test ids with about as many records each."""
    if not len(ids):
        return []
    cuts = np.unique(ids[np.linspace(0, len(ids), parts + 1).astype(int)[:-1]])
    edges = [*map(int, cuts), int(ids[-1]) + 1]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _tasks(all_ids: np.ndarray, ids: np.ndarray, jobs: int) -> list[tuple[str, Any]]:
    """How to read the records ``ids`` (sorted) of a store whose records are ``all_ids``:
    ranges of ids scanned when they are most of the store, else lists of ids, split among
    ``jobs`` readers when there are enough of them."""
    parts = max(1, jobs) if len(ids) > PARALLEL_RECORDS else 1
    if len(ids) >= BY_ID_SHARE * len(all_ids):
        a, b = np.searchsorted(all_ids, [ids[0], ids[-1] + 1]) if len(ids) else (0, 0)
        return [("span", span) for span in _spans(all_ids[a:b], parts)]
    parts = max(parts, -(-len(ids) // IDS_PER_QUERY))
    return [("ids", chunk) for chunk in np.array_split(ids, parts) if len(chunk)]


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
    spends its time on). The tables hold the records ``ids`` (a scan of a range may read
    the records between too; they are left out). A record without a sample has no level
    (NaN)."""
    all_ids = index.tests["test_id"].to_numpy()
    want = all_ids if ids is None else np.unique(np.asarray(ids, dtype=np.int64))
    tasks = _tasks(all_ids, want, jobs)
    tests = index.tests if ids is None else index.tests[np.isin(all_ids, want)]
    tests = tests.reset_index(drop=True)
    _READ.update(location=location, tests=index.tests)
    try:
        if len(tasks) > 1:
            with multiprocessing.get_context("fork").Pool(min(len(tasks), max(1, jobs))) as pool:
                parts = pool.map(_read, tasks, chunksize=1)
        else:
            parts = [_read(task) for task in tasks]
    finally:
        _READ.clear()
    if not parts:  # a store without records
        parts = [_empty()]
    rounds, levels, iters, counters, ops = (pd.concat([p[k] for p in parts]) for k in range(5))
    if ids is not None and any(kind == "span" for kind, _ in tasks):
        rounds, counters, ops = (f[f["test_id"].isin(want)] for f in (rounds, counters, ops))
    rounds, counters = rounds.reset_index(drop=True), counters.reset_index(drop=True)
    tests["level"] = tests["test_id"].map(levels["level"]).astype(np.float64)
    tests["n_rounds"] = tests["test_id"].map(levels["n_rounds"]).fillna(0).astype(np.int64)
    ops = _per_iteration(ops.reset_index(drop=True), tests, iters["iters"])
    tests["nodeid"] = tests["nodeid"].astype("category")
    return StoreTables(index.runs, tests.drop(columns="metric_code"), rounds, counters, ops,
                       index.acceptances)  # fmt: skip


def load_tables(location: str | os.PathLike[str], *, jobs: int = 1) -> StoreTables:
    """The whole store's runs, acceptances and records (:func:`load_index`, then
    :func:`load_records` of every record)."""
    return load_records(location, load_index(location), jobs=jobs)


def _empty() -> tuple[pd.DataFrame, ...]:
    """The reduced tables of a store without records."""
    rounds = pd.DataFrame({"test_id": np.array([], np.int64), "round": np.array([], np.int64),
                           "value": np.array([], np.float64)})  # fmt: skip
    levels = pd.DataFrame({"level": [], "n_rounds": []}, index=pd.Index([], name="test_id"))
    iters = pd.DataFrame({"iters": []})
    counters = pd.DataFrame({"test_id": np.array([], np.int64),
                             "counter": pd.Categorical([], pd.Index(COUNTER_NAMES)), "value": [],
                             "stable_value": []})  # fmt: skip
    names = ("test_id", "gpu", "cpu", "calls", "kernels", "flops", "bytes", "using_tc",
             "op_id", "op_name", "dtypes")  # fmt: skip
    ops = pd.DataFrame({c: [] for c in names})
    return rounds, levels, iters, counters, ops
