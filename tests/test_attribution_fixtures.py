"""Attribution and GPU totals on every real fixture, against an independent computation.

The expected side never calls perfguard: for nsys exports it is plain SQL over
the export (the join of ``shared/reference/nsys_schema.md`` §6, made to pick
the innermost range with a window function); for Kineto traces it is a walk
over the JSON events with sorted lists and ``bisect`` per thread. The rule:

* a GPU activity (kernel, memcpy, memset) belongs to the CUDA API call with the
  same correlation id in the same process (nsys: runtime/driver rows,
  ``eventClass`` 0/1; Kineto: ``cuda_runtime``/``cuda_driver``, legacy
  ``Runtime``, joined on ``args.correlation``);
* then to the innermost op range on that call's thread whose ``[start, end]``
  holds the call's start (latest start; ties go to the shorter range). Op
  ranges are NVTX push/pop and start/end ranges not ended on another thread,
  or Kineto ``cpu_op``/``user_annotation`` (legacy ``Operator``); iteration
  markers (``ProfilerStep#N``, ``perfguard.iteration``) are not ops;
* anything else is unassociated.

HTA 0.5.0 tables (``kineto/hta_reference``) cross-check the Kineto times: HTA
rounds float-µs events inward (``ceil(ts)``, ``floor(ts + dur)``), which is
reproduced here from perfguard's integer nanoseconds.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import json
import math
import re
import sqlite3
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import FIXTURES, NO_FIXTURES

from perfguard.analysis import analyze
from perfguard.trace import load_trace

if FIXTURES is None:  # pragma: no cover - depends on the checkout
    pytest.skip(NO_FIXTURES, allow_module_level=True)
NSYS_DIR = FIXTURES / "nsys"
KINETO_DIR = FIXTURES / "kineto"
HTA_DIR = KINETO_DIR / "hta_reference"

NSYS_FILES = [
    "nsys2021.2.1_gpu-db-query_no-nvtx_quadro-rtx6000.sqlite",
    "nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite",
    "nsys2024.5.1_cloverleaf_no-nvtx-rows_a100x4.sqlite",
    "nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite",
    "nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite",
]
TORCHRUN = NSYS_FILES[-1]
KINETO_FILES = [
    "a100_2rank_nccl_train_rank0.pt.trace.json.gz",
    "a100_alexnet_tiny_cudasync.pt.trace.json.gz",
    "h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
    "v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz",
    "v100_torchrec_train_rank1_2022.pt.trace.json.gz",
    "v100_dlrm_8rank_nccl_shapes",  # a directory of 8 per-rank files
]
A100 = KINETO_FILES[0]
DLRM = KINETO_FILES[-1]


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"fixture {path} missing")
    return path


def _short(name: str) -> str:
    return name.split("_")[0] + "_" + name.split("_")[1]


# --------------------------------------------------------------------------- perfguard side


@cache
def _analysis(path: str, iter_start: int | None = None, iter_stop: int | None = None):
    return analyze(load_trace(path), iter_start=iter_start, iter_stop=iter_stop)


def _ours(a, with_name: bool):
    """perfguard's owner of every activity, keyed like the expected side.

    Returns a Counter of ``(activity key, owner key)``; the owner key is
    ``(rank, pid, tid, start, end[, name])`` of the owning range, or None.
    """
    r = a.trace.ranges
    cols = [r["rank"], r["pid"], r["tid"], r["start"], r["end"]] + (
        [r["name"]] if with_name else []
    )
    key_of = {
        int(i): tuple(x if isinstance(x, str) else int(x) for x in row)
        for i, *row in zip(r["range_id"], *cols, strict=True)
    }
    acts = a.activities
    out = Counter()
    for kind, rank, corr, s, e, rid in zip(
        acts["activity"],
        acts["rank"],
        acts["correlation_id"],
        acts["start"],
        acts["end"],
        acts["range_id"],
        strict=True,
    ):
        owner = key_of[int(rid)] if rid >= 0 else None
        out[(kind, int(rank), int(corr), int(s), int(e)), owner] += 1
    return out


def _instance_totals(a, with_name: bool):
    """GPU time / kernel count / memop count per range instance, keyed by range."""
    inst = a.instances[a.instances["instance"] >= 0]
    names = a.trace.ranges.set_index("range_id")["name"]
    out: dict = defaultdict(lambda: [0, 0, 0])
    for i, rank, pid, tid, s, e, g, k, m in zip(
        inst["instance"],
        inst["rank"],
        inst["pid"],
        inst["tid"],
        inst["start"],
        inst["end"],
        inst["gpu_time"],
        inst["kernel_count"],
        inst["memop_count"],
        strict=True,
    ):
        key = (int(rank), int(pid), int(tid), int(s), int(e))
        if with_name:
            key += (names[i],)
        t = out[key]
        t[0] += int(g)
        t[1] += int(k)
        t[2] += int(m)
    return {k: tuple(v) for k, v in out.items()}


# --------------------------------------------------------------------------- nsys, by SQL

NSYS_COPY_KIND = {1: "Memcpy HtoD", 2: "Memcpy DtoH", 8: "Memcpy DtoD"}  # kinds in the fixtures
_STEP = re.compile(r"^ProfilerStep#\d+$")


def _is_marker(name) -> int:
    base = (name or "").split(",")[0].strip()
    return int(bool(_STEP.match(base)) or base == "perfguard.iteration")


def _tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _cols(conn, table) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info('{table}')")}


class NsysExpected:
    """The independent answer for one nsys export."""

    def __init__(self, path: Path) -> None:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.create_function("is_marker", 1, _is_marker, deterministic=True)
        self.conn = conn
        tables = _tables(conn)
        parts = []
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
            parts.append(
                "SELECT 'kernel' AS kind, k.rowid AS arow, k.start, k.end,"
                " (k.globalPid >> 24) & 0xFFFFFF AS pid, k.correlationId AS corr,"
                " s.value AS label FROM CUPTI_ACTIVITY_KIND_KERNEL k"
                " LEFT JOIN StringIds s ON s.id = k.shortName"
            )
        if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
            parts.append(
                "SELECT 'memcpy', rowid, start, end, (globalPid >> 24) & 0xFFFFFF,"
                " correlationId, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY"
            )
        if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
            parts.append(
                "SELECT 'memset', rowid, start, end, (globalPid >> 24) & 0xFFFFFF,"
                " correlationId, NULL FROM CUPTI_ACTIVITY_KIND_MEMSET"
            )
        api_where = (
            "WHERE eventClass IN (0, 1)"
            if "eventClass" in _cols(conn, "CUPTI_ACTIVITY_KIND_RUNTIME")
            else ""
        )
        if "NVTX_EVENTS" in tables:
            end_tid = "endGlobalTid" if "endGlobalTid" in _cols(conn, "NVTX_EVENTS") else "NULL"
            rng = (
                "SELECT n.globalTid AS gtid, n.start AS s, coalesce(n.end, 1 << 62) AS e,"
                " coalesce(n.text, si.value) AS name"
                " FROM NVTX_EVENTS n LEFT JOIN StringIds si ON si.id = n.textId"
                " WHERE n.eventType IN (59, 60, 70, 71)"
                f" AND ({end_tid} IS NULL OR {end_tid} = n.globalTid)"
                " AND NOT is_marker(coalesce(n.text, si.value))"
            )
        else:
            rng = "SELECT 0 AS gtid, 0 AS s, 0 AS e, '' AS name WHERE 0"
        self.range_sql = rng
        sql = f"""
        WITH act AS ({" UNION ALL ".join(parts)}),
        api AS (
            SELECT globalTid AS gtid, (globalTid >> 24) & 0xFFFFFF AS pid,
                   correlationId AS corr, start AS t
            FROM CUPTI_ACTIVITY_KIND_RUNTIME {api_where}
        ),
        launched AS (
            SELECT act.*, api.gtid AS lgtid, api.t AS lt
            FROM act LEFT JOIN api ON api.corr = act.corr AND api.pid = act.pid
        ),
        rng AS MATERIALIZED ({rng}),
        cand AS (
            SELECT l.kind, l.arow, r.gtid AS rgtid, r.s AS rs, r.e AS re, r.name AS rname,
                   ROW_NUMBER() OVER (PARTITION BY l.kind, l.arow
                                      ORDER BY r.s DESC, r.e ASC) AS rn
            FROM launched l
            LEFT JOIN rng r ON r.gtid = l.lgtid AND r.s <= l.lt AND l.lt <= r.e
        )
        SELECT l.kind, l.arow, l.start, l.end, l.pid, l.corr, l.label, l.lgtid, l.lt,
               c.rgtid, c.rs, c.re, c.rname
        FROM launched l JOIN cand c ON c.kind = l.kind AND c.arow = l.arow AND c.rn = 1
        """
        self.rows = conn.execute(sql).fetchall()
        # every activity appears exactly once: the API join is one-to-one per process
        n_act = conn.execute(f"SELECT count(*) FROM ({' UNION ALL '.join(parts)})").fetchone()[0]
        assert len(self.rows) == n_act

    @staticmethod
    def _split(gtid: int) -> tuple[int, int]:
        return (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF

    def owners(self) -> Counter:
        out = Counter()
        for kind, _, s, e, _pid, corr, _, _, _, rgtid, rs, re_, _ in self.rows:
            owner = None
            if rgtid is not None:
                owner = (0, *self._split(rgtid), rs, re_)
            out[("kernel" if kind == "kernel" else "memop", 0, corr, s, e), owner] += 1
        return out

    def owner_names(self) -> dict:
        """Owner range key -> raw NVTX text (with any ``seq``/``op_id`` suffix)."""
        return {(0, *self._split(r[9]), r[10], r[11]): r[12] for r in self.rows if r[9] is not None}

    def launches(self) -> Counter:
        out = Counter()
        for kind, _, s, e, _pid, corr, _, lgtid, lt, *_ in self.rows:
            launch = None if lgtid is None else (self._split(lgtid)[1], lt)
            out[("kernel" if kind == "kernel" else "memop", corr, s, e), launch] += 1
        return out

    def instance_totals(self) -> dict:
        """Every op range (also those without GPU work) -> (gpu ns, kernels, memops)."""
        out = {}
        for gtid, s, e, _ in self.conn.execute(self.range_sql):
            out[(0, *self._split(gtid), s, e)] = [0, 0, 0]
        for kind, _, s, e, _, _, _, _, _, rgtid, rs, re_, _ in self.rows:
            if rgtid is None:
                continue
            t = out[(0, *self._split(rgtid), rs, re_)]
            t[0] += e - s
            t[1 if kind == "kernel" else 2] += 1
        return {k: tuple(v) for k, v in out.items()}

    def unassociated(self) -> Counter:
        """Expected ``unassociated_*`` op name of every orphan activity."""
        out = Counter()
        for kind, _, _, _, _, _, label, _, _, rgtid, *_ in self.rows:
            if rgtid is not None:
                continue
            if kind == "kernel":
                out["unassociated_" + label] += 1
            elif kind == "memcpy":
                out["unassociated_" + NSYS_COPY_KIND[int(label)]] += 1
            else:
                out["unassociated_Memset"] += 1
        return out

    def durations(self) -> tuple[int, int]:
        kern = sum(r[3] - r[2] for r in self.rows if r[0] == "kernel")
        mem = sum(r[3] - r[2] for r in self.rows if r[0] != "kernel")
        return kern, mem


@cache
def _nsys_expected(name: str) -> NsysExpected:
    return NsysExpected(_need(NSYS_DIR / name))


@pytest.fixture(params=NSYS_FILES, ids=_short, scope="module")
def nsys_case(request):
    path = _need(NSYS_DIR / request.param)
    return _nsys_expected(request.param), _analysis(str(path))


def test_nsys_every_activity_has_the_independently_computed_owner(nsys_case):
    exp, a = nsys_case
    expected, got = exp.owners(), _ours(a, with_name=False)
    assert sum(expected.values()) == len(a.activities)
    missing = expected - got
    extra = got - expected
    assert not missing and not extra, (
        f"{sum(missing.values())} activities differ, e.g. expected {list(missing)[:3]}, "
        f"got {list(extra)[:3]}"
    )


def test_nsys_owner_names_are_the_nvtx_text_without_framework_suffixes(nsys_case):
    exp, a = nsys_case
    r = a.trace.ranges
    ours = {
        (int(k), int(p), int(t), int(s), int(e)): n
        for k, p, t, s, e, n in zip(
            r["rank"], r["pid"], r["tid"], r["start"], r["end"], r["name"], strict=True
        )
    }
    for key, raw in exp.owner_names().items():
        name = ours[key]
        assert raw == name or raw.startswith(name + ","), (raw, name)
        assert name.strip() and ", seq =" not in name and "op_id =" not in name


def test_nsys_launching_call_is_joined_on_pid_and_correlation(nsys_case):
    exp, a = nsys_case
    acts = a.activities
    got = Counter()
    for kind, corr, s, e, tid, t in zip(
        acts["activity"],
        acts["correlation_id"],
        acts["start"],
        acts["end"],
        acts["launch_tid"],
        acts["launch_start"],
        strict=True,
    ):
        launch = None if pd.isna(t) else (int(tid), int(t))
        got[(kind, int(corr), int(s), int(e)), launch] += 1
    assert got == exp.launches()


def test_nsys_per_instance_gpu_totals(nsys_case):
    exp, a = nsys_case
    expected = exp.instance_totals()
    got = _instance_totals(a, with_name=False)
    assert set(got) == set(expected)
    diff = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
    assert not diff, f"{len(diff)} instances differ, e.g. {list(diff.items())[:3]}"


def test_nsys_totals_and_unassociated(nsys_case):
    exp, a = nsys_case
    kern, mem = exp.durations()
    assert int(a.kernels["gpu_time_total"].sum()) == kern
    assert int(a.kernels["calls"].sum()) == sum(1 for r in exp.rows if r[0] == "kernel")
    assert int(a.ops["gpu_time_total"].sum()) == kern + mem
    assert int(a.instances["gpu_time"].sum()) == kern + mem
    un = exp.unassociated()
    assert int((a.activities["range_id"] < 0).sum()) == sum(un.values())
    assert int(a.summary.unassociated_activities) == sum(un.values())
    orphan = a.activities[a.activities["range_id"] < 0]
    assert Counter(orphan["op_name"]) == un
    # unassociated work is an op: its calls add up to the orphans of that name
    by_op = a.ops.set_index("op_name")["calls"]
    for name, n in un.items():
        assert int(by_op[name]) == n


def test_nsys_fixture_facts_from_manifest():
    """The counts MANIFEST.md states hold for the independent computation (sanity of the SQL)."""
    exp = _nsys_expected(TORCHRUN)
    kernels = [r for r in exp.rows if r[0] == "kernel"]
    assert len(kernels) == 4010
    assert sum(1 for r in kernels if r[7] is not None) == 3986
    nvfuser = _nsys_expected(NSYS_FILES[3])
    assert sum(1 for r in nvfuser.rows if r[0] == "kernel" and r[9] is not None) == 2


def test_torchrun_join_needs_the_pid():
    """264 correlation ids repeat across the two processes: a correlation-only join is wrong."""
    exp = _nsys_expected(TORCHRUN)
    a = _analysis(str(NSYS_DIR / TORCHRUN))
    conn = exp.conn
    naive = conn.execute(
        """SELECT k.rowid, r.globalTid, r.start
           FROM CUPTI_ACTIVITY_KIND_KERNEL k
           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
             ON r.correlationId = k.correlationId AND r.eventClass IN (0, 1)"""
    ).fetchall()
    aware = conn.execute(
        """SELECT k.rowid, r.globalTid, r.start
           FROM CUPTI_ACTIVITY_KIND_KERNEL k
           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
             ON r.correlationId = k.correlationId AND r.eventClass IN (0, 1)
            AND (r.globalTid >> 24) & 0xFFFFFF = (k.globalPid >> 24) & 0xFFFFFF"""
    ).fetchall()
    assert (len(naive), len(aware)) == (4280, 3986)  # MANIFEST.md
    # kernels the naive join credits to a call of the *other* process
    wrong = {rowid for rowid, _, _ in naive} - {rowid for rowid, _, _ in aware}
    wrong |= {rowid for rowid, n in Counter(r for r, _, _ in naive).items() if n > 1}
    assert len(wrong) > 200

    kernels = conn.execute(
        "SELECT rowid, start, end, correlationId, (globalPid >> 24) & 0xFFFFFF"
        " FROM CUPTI_ACTIVITY_KIND_KERNEL"
    ).fetchall()
    key_of = {rowid: (corr, s, e, pid) for rowid, s, e, corr, pid in kernels}
    launch_aware = {key_of[rowid]: (g & 0xFFFFFF, t) for rowid, g, t in aware}
    k = a.activities[a.activities["activity"] == "kernel"]
    ours = {}
    cols = [k[c] for c in ("correlation_id", "start", "end", "pid", "launch_tid", "launch_start")]
    for corr, s, e, pid, tid, t in zip(*cols, strict=True):
        ours[(int(corr), int(s), int(e), int(pid))] = None if pd.isna(t) else (int(tid), int(t))
    checked = differs = 0
    for rowid in wrong:
        key = key_of[rowid]
        naive_launches = {(g & 0xFFFFFF, t) for r, g, t in naive if r == rowid}
        assert ours[key] == launch_aware.get(key)
        checked += 1
        differs += ours[key] is None or naive_launches != {ours[key]}
    assert checked == len(wrong) and differs == len(wrong)
    # and the owners computed with the pid-aware join are the ones perfguard reports
    assert _ours(a, with_name=False) == exp.owners()


# --------------------------------------------------------------------------- Kineto, by JSON walk

RANGE_CATS = {"cpu_op", "user_annotation", "Operator", "User annotation"}
API_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
KERNEL_CATS = {"kernel", "Kernel"}
MEMOP_CATS = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
_INT = re.compile(r"-?\d+")


def _ns(v) -> int:
    """Kineto µs (int, or float with ns decimals) -> int ns."""
    if isinstance(v, int):
        return v * 1000
    whole = math.floor(v)
    return int(whole) * 1000 + round((v - whole) * 1000)


def _int(v) -> int:
    return v if isinstance(v, int) else int(_INT.search(str(v)).group())


class KinetoExpected:
    """The independent answer for one Kineto file or a directory of rank files."""

    def __init__(self, path: Path) -> None:
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        self.owner = Counter()  # (activity key, owner key) -> n
        self.totals: dict = {}  # range key -> [gpu ns, kernels, memops]
        self.orphans: list = []  # (kind, raw name) of unassociated activities
        #: activity key -> (graph id, range around the launch) of work a cudaGraphLaunch replayed
        self.replayed: dict = {}
        self.kernel_ns = self.memop_ns = self.n_kernels = 0
        self.activities: list = []  # (rank, kind, corr, start, end, owner)
        for f in files:
            with gzip.open(f, "rt") if f.name.endswith(".gz") else open(f) as fh:
                data = json.load(fh)
            rank = (data.get("distributedInfo") or {}).get("rank", 0)
            self._one(data, int(rank))

    def _one(self, data, rank: int) -> None:
        threads = defaultdict(list)  # (pid, tid) -> [(start, -end, end, name)]
        launch = {}
        gpu = []
        for ev in data["traceEvents"]:
            if ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            if cat in RANGE_CATS:
                name = ev.get("name")
                if _STEP.match(name or "") or name == "perfguard.iteration":
                    continue
                s = _ns(ev["ts"])
                e = s + _ns(ev.get("dur", 0))
                key = (rank, _int(ev["pid"]), _int(ev["tid"]), s, e, name)
                threads[key[1], key[2]].append(key)
                self.totals[key] = [0, 0, 0]
            elif cat in API_CATS:
                corr = (ev.get("args") or {}).get("correlation")
                if corr is not None:
                    assert corr not in launch, f"correlation {corr} launched twice"
                    launch[corr] = (_int(ev["pid"]), _int(ev["tid"]), _ns(ev["ts"]), ev.get("name"))
            elif cat in KERNEL_CATS or cat in MEMOP_CATS:
                gpu.append(ev)
        index = {}
        for thread, keys in threads.items():
            keys.sort(key=lambda k: (k[3], -k[4]))  # start asc, end desc
            starts = [k[3] for k in keys]
            reach = list(np.maximum.accumulate([k[4] for k in keys]))
            index[thread] = (keys, starts, reach)
        for ev in gpu:
            corr = (ev.get("args") or {}).get("correlation")
            s = _ns(ev["ts"])
            e = s + _ns(ev.get("dur", 0))
            kind = "kernel" if ev["cat"] in KERNEL_CATS else "memop"
            owner = None
            if corr in launch:
                pid, tid, t, api = launch[corr]
                if api in ("cudaGraphLaunch", "cuGraphLaunch"):  # replayed: not the range's
                    graph = (ev.get("args") or {}).get("graph id")
                    around = self._innermost(index.get((pid, tid)), t)
                    self.replayed[(kind, rank, corr, s, e)] = graph, around
                else:
                    owner = self._innermost(index.get((pid, tid)), t)
            self.owner[(kind, rank, corr, s, e), owner] += 1
            self.activities.append((rank, kind, corr, s, e, owner))
            if owner is None:
                self.orphans.append(((kind, rank, corr, s, e), ev["name"]))
            else:
                tot = self.totals[owner]
                tot[0] += e - s
                tot[1 if kind == "kernel" else 2] += 1
            if kind == "kernel":
                self.kernel_ns += e - s
                self.n_kernels += 1
            else:
                self.memop_ns += e - s

    @staticmethod
    def _innermost(index, t):
        """Latest-starting range with start <= t <= end (ties: shortest), by a backward scan."""
        if index is None:
            return None
        keys, starts, reach = index
        j = bisect.bisect_right(starts, t) - 1
        while j >= 0 and reach[j] >= t:  # nothing at or before j reaches t otherwise
            if keys[j][4] >= t:
                return keys[j]
            j -= 1
        return None


@cache
def _kineto_expected(name: str) -> KinetoExpected:
    return KinetoExpected(_need(KINETO_DIR / name))


@pytest.fixture(params=KINETO_FILES, ids=lambda n: n.split(".")[0], scope="module")
def kineto_case(request):
    path = _need(KINETO_DIR / request.param)
    return _kineto_expected(request.param), _analysis(str(path))


def test_kineto_every_activity_has_the_independently_computed_owner(kineto_case):
    exp, a = kineto_case
    got = _ours(a, with_name=True)
    assert sum(exp.owner.values()) == len(a.activities)
    missing, extra = exp.owner - got, got - exp.owner
    assert not missing and not extra, (
        f"{sum(missing.values())} activities differ, e.g. expected {list(missing)[:3]}, "
        f"got {list(extra)[:3]}"
    )


def test_kineto_per_instance_gpu_totals(kineto_case):
    exp, a = kineto_case
    got = _instance_totals(a, with_name=True)
    expected = {k: tuple(v) for k, v in exp.totals.items()}
    assert set(got) == set(expected)
    diff = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
    assert not diff, f"{len(diff)} instances differ, e.g. {list(diff.items())[:3]}"


def test_kineto_totals_and_unassociated(kineto_case):
    exp, a = kineto_case
    assert int(a.kernels["gpu_time_total"].sum()) == exp.kernel_ns
    assert int(a.kernels["calls"].sum()) == exp.n_kernels
    assert int(a.ops["gpu_time_total"].sum()) == exp.kernel_ns + exp.memop_ns
    n_orphans = len(exp.orphans)
    assert int((a.activities["range_id"] < 0).sum()) == n_orphans
    assert int(a.summary.unassociated_activities) == n_orphans
    orphan = a.activities[a.activities["range_id"] < 0]
    got = Counter()
    for kind, rank, corr, s, e, op_name in zip(
        orphan["activity"],
        orphan["rank"],
        orphan["correlation_id"],
        orphan["start"],
        orphan["end"],
        orphan["op_name"],
        strict=True,
    ):
        got[(kind, int(rank), int(corr), int(s), int(e)), op_name] += 1
    raw_of = dict(exp.orphans)
    assert Counter(k for k, _ in got.elements()) == Counter(k for k, _ in exp.orphans)
    for key, op_name in got:
        raw = raw_of[key]
        if key in exp.replayed:  # named under the range around its launch, if any
            graph, around = exp.replayed[key]
            label = f"graph_replay_{'unknown' if graph is None else graph}"
            under, _, own = op_name.rpartition("/")
            assert own == label and (under.rpartition("/")[2] if under else None) == (
                around and around[5]
            ), op_name
            continue
        assert op_name.startswith("unassociated_")
        label = op_name[len("unassociated_") :]
        assert label
        if key[0] == "kernel":
            assert label in raw  # the kernel's short name
        else:
            assert raw.startswith(label)  # "Memcpy HtoD (Pageable -> Device)" -> "Memcpy HtoD"


def test_kineto_fixture_facts():
    """Facts of the data the comparisons rely on (so they cannot pass vacuously)."""
    torchrec = _kineto_expected(KINETO_FILES[4])
    assert len(torchrec.orphans) >= 600  # 614 GPU events whose launch is not in the trace
    a100 = _kineto_expected(A100)
    assert sum(1 for *_, o in a100.activities if o is not None) == len(a100.activities)
    dlrm = _kineto_expected(DLRM)
    assert {r for r, *_ in dlrm.activities} == set(range(8))


# --------------------------------------------------------------------------- HTA cross-checks


def _hta_us(start_ns: int, end_ns: int) -> tuple[int, int]:
    """HTA 0.5.0's inward rounding of a float-µs event: ceil(ts), floor(ts + dur)."""
    return -(-start_ns // 1000), end_ns // 1000


def _union(intervals) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def _read_csv(name: str) -> list[dict]:
    path = _need(HTA_DIR / name)
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def a100_window():
    """perfguard on the A100 trace, restricted to ProfilerStep#4..#5 (what HTA analysed)."""
    return _analysis(str(_need(KINETO_DIR / A100)), 4, 5)


def test_hta_launch_stats_match_every_kernel_duration(a100_window):
    rows = _read_csv("a100_2rank_nccl_train_rank0__cuda_kernel_launch_stats.csv")
    hta = {int(r["correlation"]): float(r["gpu_duration"]) for r in rows}
    acts = a100_window.activities
    assert set(acts["correlation_id"].astype(int)) == set(hta)  # same GPU work selected
    per_corr = defaultdict(int)
    ns_total = 0
    for corr, s, e in zip(acts["correlation_id"], acts["start"], acts["end"], strict=True):
        lo, hi = _hta_us(int(s), int(e))
        per_corr[int(corr)] += hi - lo
        ns_total += int(e) - int(s)
    assert per_corr == {c: int(d) for c, d in hta.items()}
    # totals agree within HTA's rounding: at most 2 µs per event, inward
    hta_ns = 1000 * sum(hta.values())
    assert 0 <= ns_total - hta_ns <= 2000 * len(acts)
    assert int(a100_window.ops["gpu_time_total"].sum()) == ns_total
    kern = acts[acts["activity"] == "kernel"]
    assert int(a100_window.kernels["gpu_time_total"].sum()) == int(
        (kern["end"] - kern["start"]).sum()
    )


def test_hta_temporal_and_kernel_type_breakdown_a100(a100_window):
    acts = a100_window.activities
    iv = [_hta_us(int(s), int(e)) for s, e in zip(acts["start"], acts["end"], strict=True)]
    busy = _union(iv)
    span = max(e for _, e in iv) - min(s for s, _ in iv)
    (tb,) = _read_csv("a100_2rank_nccl_train_rank0__temporal_breakdown.csv")
    assert span == float(tb["kernel_time(us)"])
    assert busy == float(tb["compute_time(us)"]) + float(tb["non_compute_time(us)"])
    assert span - busy == float(tb["idle_time(us)"])
    by_type = _read_csv("a100_2rank_nccl_train_rank0__gpu_kernel_breakdown_by_type.csv")
    assert busy == sum(float(r["sum"]) for r in by_type)


def test_hta_window_is_profiler_steps_4_and_5(a100_window):
    assert list(a100_window.window["iteration"]) == [4, 5]
    assert list(a100_window.iterations["iteration"]) == [4, 5]
    full = _analysis(str(KINETO_DIR / A100))
    assert list(full.iterations["iteration"]) == [4, 5, 6]
    assert len(a100_window.activities) == 2516 < len(full.activities) == 3774  # kineto_and_hta.md


def test_hta_temporal_breakdown_dlrm_8_ranks():
    a = _analysis(str(_need(KINETO_DIR / DLRM)))
    rows = {int(r["rank"]): r for r in _read_csv("v100_dlrm_8rank__temporal_breakdown.csv")}
    acts = a.activities
    assert sorted(acts["rank"].unique()) == sorted(rows)
    for rank, g in acts.groupby("rank"):
        iv = [_hta_us(int(s), int(e)) for s, e in zip(g["start"], g["end"], strict=True)]
        busy = _union(iv)
        span = max(e for _, e in iv) - min(s for s, _ in iv)
        r = rows[int(rank)]
        assert span == float(r["kernel_time(us)"]), rank
        assert busy == float(r["compute_time(us)"]) + float(r["non_compute_time(us)"]), rank
        assert span - busy == float(r["idle_time(us)"]), rank


def test_summary_busy_time_is_the_flattened_union_in_ns():
    """The run summary's busy figures against a union computed from the raw JSON."""
    exp = _kineto_expected(DLRM)
    a = _analysis(str(KINETO_DIR / DLRM))
    per_rank = defaultdict(list)
    kern_rank = defaultdict(list)
    for rank, kind, _, s, e, _ in exp.activities:
        per_rank[rank].append((s, e))
        if kind == "kernel":
            kern_rank[rank].append((s, e))
    # one GPU per rank in this set
    assert int(a.summary.gpu_busy) == sum(_union(v) for v in per_rank.values())
    assert int(a.summary.kernel_busy) == sum(_union(v) for v in kern_rank.values())
    assert int(a.summary.kernel_time) == exp.kernel_ns
    assert int(a.summary.memop_time) == exp.memop_ns
