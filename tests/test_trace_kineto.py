"""The Kineto (PyTorch profiler) reader against plain JSON walks of the real traces.

Expected values come from walking ``traceEvents`` in the test with the JSON
numbers parsed as ``Decimal`` (so µs -> ns is exact arithmetic, not float
rounding), and from the tables Holistic Trace Analysis 0.5.0 computed on the
same files (``kineto/hta_reference``). No perfguard code computes an expected
value.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

KERNEL = {"kernel", "Kernel"}
API = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
MEMOP = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
RANGE = {"cpu_op", "user_annotation", "Operator", "User annotation"}
LEGACY = {"Operator", "Runtime", "Kernel", "Memcpy", "Memset"}
STEP = re.compile(r"^ProfilerStep#\d+$")

A100 = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"
H100 = "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz"
LEGACY_2021 = "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz"
ASYNC_2022 = "kineto/v100_torchrec_train_rank1_2022.pt.trace.json.gz"
DLRM_DIR = "kineto/v100_dlrm_8rank_nccl_shapes"
HTA = "kineto/hta_reference"


def ns(value) -> int:
    """µs (int, or a decimal with up to 3 places as written in the file) -> exact ns."""
    x = Decimal(value) * 1000
    assert x == x.to_integral_value(), f"{value} µs is not a whole number of ns"
    return int(x)


def number(value, default: int = -1) -> int:
    """An int, or the digits in a string tid such as ``"stream 7"``."""
    if value is None:
        return default
    if isinstance(value, int):
        return value
    m = re.search(r"-?\d+", str(value))
    return int(m.group()) if m else default


def walk(path: Path) -> dict:
    """Straightforward walk of one trace file: what each table must hold."""
    with gzip.open(path, "rb") as fh:
        data = json.load(fh, parse_float=Decimal)
    kernels, api, memops, ranges = [], [], [], []
    cats = set()
    for e in data["traceEvents"]:
        cats.add(e.get("cat"))
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat"), e.get("args") or {}
        if cat not in KERNEL | API | MEMOP | RANGE:
            continue
        start = ns(e["ts"])
        end = start + ns(e.get("dur", 0))
        if cat in API:
            api.append(
                (
                    start,
                    end,
                    number(e["pid"]),
                    number(e["tid"]),
                    args.get("correlation", -1),
                    e["name"],
                )
            )
        elif cat in RANGE:
            ranges.append(
                (
                    start,
                    end,
                    number(e["pid"]),
                    number(e["tid"]),
                    e["name"],
                    args.get("Sequence number"),
                )
            )
        else:
            row = {
                "start": start,
                "end": end,
                "correlation": args.get("correlation", -1),
                "device": args.get("device", number(e["pid"])),
                "stream": args.get("stream", number(e["tid"])),
                "name": e["name"],
                "args": args,
            }
            (kernels if cat in KERNEL else memops).append(row)
    launcher = {c: pid for _, _, pid, _, c, _ in api if c != -1}
    for row in kernels + memops:
        row["pid"] = launcher.get(row["correlation"], -1)
    return {
        "data_keys": {k: v for k, v in data.items() if k != "traceEvents"},
        "cats": cats,
        "kernels": kernels,
        "api": api,
        "memops": memops,
        "ranges": ranges,
    }


@pytest.fixture(scope="module")
def expected(kineto_file: Path) -> dict:
    return walk(kineto_file)


@pytest.fixture(scope="module")
def trace(kineto_file: Path, cached_trace):
    return cached_trace(kineto_file)


def _tuples(df: pd.DataFrame, cols: list[str]) -> list[tuple]:
    out = []
    for row in df[cols].itertuples(index=False, name=None):
        out.append(tuple(int(v) if isinstance(v, np.integer) else v for v in row))
    return sorted(out, key=repr)


# --------------------------------------------------------------------------- per file


def test_kernel_count_and_exact_total_ns(expected: dict, trace) -> None:
    k = expected["kernels"]
    assert len(trace.kernels) == len(k)
    total = sum(r["end"] - r["start"] for r in k)
    assert int((trace.kernels["end"] - trace.kernels["start"]).sum()) == total


def test_kernel_rows(expected: dict, trace) -> None:
    """Times, launching pid (from the runtime call with the same correlation), device, stream."""
    exp = sorted(
        (
            (r["start"], r["end"], r["pid"], r["device"], r["stream"], r["correlation"], r["name"])
            for r in expected["kernels"]
        ),
        key=repr,
    )
    cols = ["start", "end", "pid", "device_id", "stream_id", "correlation_id", "name"]
    assert _tuples(trace.kernels, cols) == exp


def test_kernel_launch_geometry(expected: dict, trace) -> None:
    exp = sorted(
        (
            (
                r["correlation"],
                *r["args"]["grid"],
                *r["args"]["block"],
                r["args"].get("registers per thread"),
                r["args"].get("shared memory"),
            )
            for r in expected["kernels"]
            if "grid" in r["args"]
        ),
        key=repr,
    )
    k = trace.kernels[trace.kernels["grid_x"].notna()]
    cols = [
        "correlation_id",
        "grid_x",
        "grid_y",
        "grid_z",
        "block_x",
        "block_y",
        "block_z",
        "registers",
        "shared_mem",
    ]
    assert _tuples(k.astype({c: "int64" for c in cols}), cols) == exp


def test_kernel_pid_is_the_launching_process(expected: dict, trace) -> None:
    k = trace.kernels
    launched = [r for r in expected["kernels"] if r["pid"] != -1]
    assert int((k["pid"] != -1).sum()) == len(launched)
    if launched:
        # GPU events carry the device as their pid: the reader must not keep that
        gpu_side = {r["device"] for r in launched}
        assert not set(k.loc[k["pid"] != -1, "pid"]) & gpu_side
        api_pids = {p for _, _, p, _, _, _ in expected["api"]}
        assert set(k.loc[k["pid"] != -1, "pid"]) <= api_pids


def test_api_calls(expected: dict, trace) -> None:
    cols = ["start", "end", "pid", "tid", "correlation_id", "name"]
    assert _tuples(trace.api_calls, cols) == sorted(expected["api"], key=repr)


def test_memops(expected: dict, trace) -> None:
    m = expected["memops"]
    kinds = Counter(r["name"].split(" (")[0] for r in m)
    assert Counter(trace.memops["kind"]) == kinds
    exp_bytes = Counter()
    for r in m:
        exp_bytes[r["name"].split(" (")[0]] += r["args"]["bytes"]
    got_bytes = {k: int(v) for k, v in trace.memops.groupby("kind")["bytes"].sum().items()}
    assert got_bytes == {k: v for k, v in exp_bytes.items()}
    exp = sorted(
        ((r["start"], r["end"], r["pid"], r["device"], r["stream"], r["correlation"]) for r in m),
        key=repr,
    )
    cols = ["start", "end", "pid", "device_id", "stream_id", "correlation_id"]
    assert _tuples(trace.memops, cols) == exp


def test_ranges(expected: dict, trace) -> None:
    """cpu_op + user_annotation events (legacy: Operator), with seq and iteration kind."""
    rows = expected["ranges"]
    r = trace.ranges
    assert len(r) == len(rows)
    assert _tuples(r, ["start", "end", "pid", "tid", "name"]) == sorted(
        (row[:5] for row in rows), key=repr
    )
    steps = {row[4] for row in rows if STEP.match(row[4])}
    assert set(r.loc[r["kind"] == "iteration", "name"]) == steps
    assert int((r["kind"] == "iteration").sum()) == sum(1 for row in rows if STEP.match(row[4]))
    assert set(r.loc[r["kind"] != "iteration", "kind"]) <= {"op"}
    with_seq = sorted(row[5] for row in rows if row[5] is not None)
    assert sorted(int(v) for v in r["seq"].dropna()) == with_seq


def test_meta_schema_generation(expected: dict, trace, kineto_file: Path) -> None:
    cats = expected["cats"]
    assert trace.meta["format"] == "kineto-json"
    if cats & LEGACY:
        assert trace.meta["version"] == "legacy-2021"
    elif "async_cpu_to_gpu" in cats:
        assert trace.meta["version"] == "2022"
    else:
        assert trace.meta["version"] == "modern"
    rank = (expected["data_keys"].get("distributedInfo") or {}).get("rank", 0)
    for table in ("ranges", "api_calls", "kernels", "memops"):
        assert set(getattr(trace, table)["rank"]) <= {rank}


def test_devices(expected: dict, trace) -> None:
    props = expected["data_keys"].get("deviceProperties") or []
    assert sorted(zip(trace.devices["device_id"], trace.devices["name"], strict=True)) == sorted(
        (p["id"], p["name"]) for p in props
    )


# --------------------------------------------------------------------------- schema generations


@pytest.mark.parametrize("name", [LEGACY_2021, ASYNC_2022])
def test_old_schemas_are_read(name: str, fixture_file, cached_trace) -> None:
    """The 2021 legacy and 2022 async_cpu_to_gpu traces give full tables, kernels attributed."""
    tr = cached_trace(fixture_file(name))
    assert len(tr.kernels) > 5000 and len(tr.api_calls) > 10000 and len(tr.ranges) > 20000
    # a kernel has a process exactly when its launching call is in the trace; the 2022
    # capture starts while kernels launched before the window are still running
    launched = tr.kernels["correlation_id"].isin(tr.api_calls["correlation_id"])
    assert launched.mean() > 0.9
    assert ((tr.kernels["pid"] > 0) == launched).all()
    # legacy string tids ("stream 7", "25738") are numbers in the model
    assert tr.kernels["stream_id"].dtype == np.int64 and (tr.kernels["stream_id"] > 0).all()
    # (the 2022 capture has real negative thread ids: kept as they are, never zeroed)
    assert tr.api_calls["tid"].dtype == np.int64 and (tr.api_calls["tid"] != 0).all()
    assert (tr.ranges["kind"] == "iteration").sum() >= 5


# --------------------------------------------------------------------------- µs -> ns by hand


@pytest.mark.parametrize(
    "name, correlation, start, end",
    [
        # "ts": 4458676983543.183, "dur": 41.407
        (A100, 57541, 4458676983543183, 4458676983543183 + 41407),
        # "ts": 4458676983841.259, "dur": 2.176
        (A100, 57551, 4458676983841259, 4458676983841259 + 2176),
        # "ts": 1419247333430.849, "dur": 3.136
        (H100, 8218, 1419247333430849, 1419247333430849 + 3136),
        # "ts": 1419247333471.713, "dur": 3.264
        (H100, 8237, 1419247333471713, 1419247333471713 + 3264),
    ],
)
def test_float_microseconds_to_exact_ns(name, correlation, start, end, fixture_file, cached_trace):
    k = cached_trace(fixture_file(name)).kernels
    row = k[k["correlation_id"] == correlation]
    assert len(row) == 1
    assert int(row["start"].iloc[0]) == start
    assert int(row["end"].iloc[0]) == end


# --------------------------------------------------------------------------- 8-rank directory


def test_rank_directory(fixture_file, cached_trace) -> None:
    d = fixture_file(DLRM_DIR)
    tr = cached_trace(d)
    files = sorted(d.glob("*.json.gz"))
    assert len(files) == 8
    per_rank = {}
    for f in files:
        with gzip.open(f, "rb") as fh:
            data = json.load(fh)
        rank = data["distributedInfo"]["rank"]
        per_rank[rank] = Counter(e.get("cat") for e in data["traceEvents"] if e.get("ph") == "X")
    assert sorted(per_rank) == list(range(8))
    for table in ("kernels", "api_calls", "memops", "ranges"):
        assert set(getattr(tr, table)["rank"]) == set(range(8)), table
    assert tr.meta["ranks"] == list(range(8))
    for rank, cats in per_rank.items():
        assert int((tr.kernels["rank"] == rank).sum()) == cats["kernel"], rank
        assert (
            int((tr.api_calls["rank"] == rank).sum()) == cats["cuda_runtime"] + cats["cuda_driver"]
        )
        assert int((tr.ranges["rank"] == rank).sum()) == cats["cpu_op"] + cats["user_annotation"]
        assert int((tr.memops["rank"] == rank).sum()) == cats["gpu_memcpy"] + cats["gpu_memset"]


def test_rank_directory_range_ids_stay_within_rank(fixture_file, cached_trace) -> None:
    r = cached_trace(fixture_file(DLRM_DIR)).ranges
    assert (r["range_id"].to_numpy() == np.arange(len(r))).all()
    c = r[r["parent_id"] >= 0]
    assert len(c) > 1000
    p = r.loc[c["parent_id"].to_numpy()]
    for col in ("rank", "pid", "tid"):
        assert (p[col].to_numpy() == c[col].to_numpy()).all(), col
    assert (p["start"].to_numpy() <= c["start"].to_numpy()).all()
    assert (p["end"].to_numpy() >= c["end"].to_numpy()).all()


# --------------------------------------------------------------------------- HTA cross-checks
# HTA works in whole µs: ts is rounded up and ts + dur down (ns-resolution
# traces), then events of the last ProfilerStep are dropped when there are at
# least two steps. The helpers below redo that from our ns tables.


def _us(df: pd.DataFrame) -> list[tuple[int, int]]:
    start = -(-df["start"].to_numpy() // 1000)  # ceil
    end = df["end"].to_numpy() // 1000  # floor
    return list(zip(start.tolist(), end.tolist(), strict=True))


def _merge(iv: list[tuple[int, int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length(iv) -> int:
    return sum(e - s for s, e in _merge(iv))


def _overlap(a, b) -> int:
    a, b = _merge(a), _merge(b)
    i = j = tot = 0
    while i < len(a) and j < len(b):
        tot += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def _is_comm(name: pd.Series) -> pd.Series:
    return name.str.contains("ncclKernel", regex=False)


@pytest.fixture(scope="module")
def a100_window(fixture_file, cached_trace):
    """GPU events HTA keeps: launched by a call that starts before the last ProfilerStep."""
    tr = cached_trace(fixture_file(A100))
    steps = tr.ranges[tr.ranges["name"].str.match(r"^ProfilerStep#\d+$")]
    assert sorted(steps["name"]) == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    last = -(-int(steps["start"].max()) // 1000)
    api = tr.api_calls[-(-tr.api_calls["start"] // 1000) < last]
    k = tr.kernels[tr.kernels["correlation_id"].isin(api["correlation_id"])]
    m = tr.memops[tr.memops["correlation_id"].isin(api["correlation_id"])]
    return tr, k, m


def test_hta_kernel_launch_stats(a100_window, fixture_file) -> None:
    """Per correlation id: GPU and CPU duration in whole µs, exactly as HTA got them."""
    tr, k, m = a100_window
    ref = pd.read_csv(
        fixture_file(f"{HTA}/a100_2rank_nccl_train_rank0__cuda_kernel_launch_stats.csv")
    )
    gpu = pd.concat([k, m])[["start", "end", "correlation_id"]]
    assert sorted(ref["correlation"]) == sorted(gpu["correlation_id"])
    gpu = gpu.set_index("correlation_id").loc[ref["correlation"]]
    g_us = np.array([e - s for s, e in _us(gpu)])
    assert (ref["gpu_duration"].to_numpy() == g_us).all()
    api = tr.api_calls.set_index("correlation_id").loc[ref["correlation"]]
    c_us = np.array([e - s for s, e in _us(api)])
    assert (ref["cpu_duration"].to_numpy() == c_us).all()
    # and the totals, for the record
    assert abs(ref["gpu_duration"].sum() - g_us.sum()) < 1


def test_hta_gpu_kernel_breakdown_by_type(a100_window, fixture_file) -> None:
    tr, k, m = a100_window
    ref = pd.read_csv(
        fixture_file(f"{HTA}/a100_2rank_nccl_train_rank0__gpu_kernel_breakdown_by_type.csv")
    )
    part = dict(zip(ref["kernel_type"], ref["sum"], strict=True))

    def involving(kind: str) -> int:
        return sum(v for key, v in part.items() if kind in key.split(" overlapping "))

    comm = _us(k[_is_comm(k["name"])])
    comp = _us(k[~_is_comm(k["name"])])
    mem = _us(m)
    assert _length(comp) == involving("COMPUTATION")
    assert _length(comm) == involving("COMMUNICATION")
    assert _length(mem) == involving("MEMORY")
    assert _length(comp + comm + mem) == sum(part.values())
    assert _overlap(comp, comm) == part["COMPUTATION overlapping COMMUNICATION"]


def test_hta_temporal_breakdown_a100(a100_window, fixture_file) -> None:
    tr, k, m = a100_window
    ref = pd.read_csv(fixture_file(f"{HTA}/a100_2rank_nccl_train_rank0__temporal_breakdown.csv"))
    row = ref.iloc[0]
    events = _us(k) + _us(m)
    span = max(e for _, e in events) - min(s for s, _ in events)
    busy = _length(events)
    compute = _length(_us(k[~_is_comm(k["name"])]))
    assert span == row["kernel_time(us)"]
    assert span - busy == row["idle_time(us)"]
    assert compute == row["compute_time(us)"]
    assert busy - compute == row["non_compute_time(us)"]


def test_hta_dlrm_per_rank_temporal_breakdown_and_overlap(fixture_file, cached_trace) -> None:
    """One ProfilerStep per rank, so HTA analysed everything: µs figures match per rank."""
    tr = cached_trace(fixture_file(DLRM_DIR))
    temporal = pd.read_csv(fixture_file(f"{HTA}/v100_dlrm_8rank__temporal_breakdown.csv"))
    overlap = pd.read_csv(fixture_file(f"{HTA}/v100_dlrm_8rank__comm_comp_overlap.csv"))
    assert sorted(temporal["rank"]) == list(range(8))
    for _, row in temporal.iterrows():
        rank = int(row["rank"])
        k = tr.kernels[tr.kernels["rank"] == rank]
        m = tr.memops[tr.memops["rank"] == rank]
        events = _us(k) + _us(m)
        span = max(e for _, e in events) - min(s for s, _ in events)
        busy = _length(events)
        comp, comm = _us(k[~_is_comm(k["name"])]), _us(k[_is_comm(k["name"])])
        assert span == row["kernel_time(us)"], rank
        assert span - busy == row["idle_time(us)"], rank
        assert _length(comp) == row["compute_time(us)"], rank
        assert busy - _length(comp) == row["non_compute_time(us)"], rank
        pct = overlap.loc[overlap["rank"] == rank, "comp_comm_overlap_pctg"].item()
        assert round(100 * _overlap(comm, comp) / _length(comm), 2) == pytest.approx(pct, abs=0.006)
