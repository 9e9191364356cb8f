"""Hostile captures, fixed at the root: real fixtures damaged the way the fuzzer
(``benchmarks/fuzz.py``) found them, each checked against raw SQL or a JSON walk."""

from __future__ import annotations

import collections
import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import FIXTURES, NO_FIXTURES, load_fuzzer

from perfguard.analysis import analyze
from perfguard.analysis.intervals import covered_within
from perfguard.errors import TraceError
from perfguard.report.writer import write_reports
from perfguard.trace import load_trace
from perfguard.trace.model import Trace
from perfguard.trace.nsys import UNKNOWN_KERNEL

pytestmark = pytest.mark.skipif(FIXTURES is None, reason=NO_FIXTURES)

TORCHRUN = "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite"
CLOVERLEAF = "nsys/nsys2024.5.1_cloverleaf_no-nvtx-rows_a100x4.sqlite"
TORCHREC = "kineto/v100_torchrec_train_rank1_2022.pt.trace.json.gz"
RESNET = "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz"


def _copy(tmp_path: Path, rel: str) -> Path:
    assert FIXTURES is not None
    dst = tmp_path / Path(rel).name
    shutil.copyfile(FIXTURES / rel, dst)
    dst.chmod(0o644)
    return dst


def _sql(path: Path, *statements: str) -> None:
    db = sqlite3.connect(path)
    with db:
        for s in statements:
            db.execute(s)
    db.close()


def _one(path: Path, query: str) -> object:
    db = sqlite3.connect(path)
    try:
        return db.execute(query).fetchone()[0]
    finally:
        db.close()


def _all_numbers_sane(out: Path) -> None:
    """No negative time, no utilization over 100 %, nothing non-finite in any report."""
    assert load_fuzzer().check_reports(out) == []


# ------------------------------------------------------------------ unclosed NVTX ranges


def test_many_unclosed_ranges_close_at_the_end_without_nesting(tmp_path: Path) -> None:
    """19k+ pushes never popped on one thread: before, they nested 20k deep and every
    op name below repeated the chain (83 s, 9.7 GB, 5.6 GB of reports)."""
    path = _copy(tmp_path, TORCHRUN)
    gtid = _one(path, "SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1")
    t0 = _one(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?,?,?,?,?)",
            [(t0 + 1000 * i, None, 59, f"open {i}", gtid) for i in range(20000)],
        )
    db.close()
    last = max(
        _one(path, f"SELECT max(end) FROM {t}")
        for t in (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMSET",
            "NVTX_EVENTS",
        )
    )

    trace = load_trace(path)
    opened = trace.ranges[trace.ranges["name"].str.startswith("open ", na=False)]
    assert len(opened) == 20000
    assert (opened["end"] == last).all()  # closed at the capture's last timestamp
    # the outermost stays an op (it owns what ran directly in it); the rest cannot nest
    assert (opened["kind"] == "op").sum() == 1
    assert opened.loc[opened["start"].idxmin(), "kind"] == "op"
    assert int(trace.ranges["depth"].max()) < 50
    assert any("20,000 NVTX ranges were never closed" in n for n in trace.notes)

    analysis = analyze(trace)
    assert int(analysis.instances["op_name"].str.len().max()) < 2000
    assert any("never closed" in n for n in analysis.notes)
    out = tmp_path / "out"
    write_reports(analysis, out, formats=["csv"])
    assert sum(p.stat().st_size for p in out.iterdir()) < 50 * 2**20
    _all_numbers_sane(out)


def test_one_unclosed_outer_range_still_owns_its_kernels(tmp_path: Path) -> None:
    """A capture that stops inside ``train``: the range runs to the end and stays an op."""
    path = _copy(tmp_path, TORCHRUN)
    gtid = _one(path, "SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1")
    t0 = _one(path, "SELECT min(start) FROM NVTX_EVENTS") - 10
    _sql(
        path,
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) "
        f"VALUES ({t0}, NULL, 59, 'train', {gtid})",
    )
    before = analyze(load_trace(FIXTURES / TORCHRUN))  # type: ignore[operator]
    after = analyze(load_trace(path))
    train = after.instances[after.instances["name"] == "train"]
    assert len(train) == 1
    # every kernel that had an owner keeps it (under train now), and the orphans launched
    # on train's thread are train's
    assert (after.activities["range_id"] >= 0).sum() >= (before.activities["range_id"] >= 0).sum()


def test_ranges_nested_thousands_deep_cost_linear_text(tmp_path: Path) -> None:
    """Fuzz case 9874: every other range moved to start at 2^31 ns encloses the rest,
    nesting 9k deep. Before, every op name repeated the whole chain and the group
    roll-up walked it for every kernel (30+ CPU s, 3.7 GB from a 2.6 MB file)."""
    from perfguard.analysis.groups import aggregate_groups
    from perfguard.analysis.ops import MAX_OP_PATH_DEPTH, PATH_CUT

    path = _copy(tmp_path, TORCHRUN)
    _sql(path, "UPDATE NVTX_EVENTS SET start = 2147483648 WHERE rowid % 2 = 0")
    trace = load_trace(path)
    r = trace.ranges
    assert int(r["depth"].max()) > 50 * MAX_OP_PATH_DEPTH  # the damage really nests

    analysis = analyze(trace)
    deep = int((r["depth"] >= MAX_OP_PATH_DEPTH).sum())
    assert any(n.startswith(f"{deep} ranges are nested") for n in analysis.notes)
    names = analysis.instances["op_name"].dropna()
    # a path holds at most MAX_OP_PATH_DEPTH levels, the cut and the range's own name
    assert int(names.str.count("/").max()) <= MAX_OP_PATH_DEPTH + 1
    assert names.str.contains(f"/{PATH_CUT}/", regex=False).sum() > 0
    # every kernel still has one owner: GPU time is conserved over the instances
    owned = analysis.activities["range_id"] >= 0
    dur = (analysis.activities["end"] - analysis.activities["start"])[owned].sum()
    assert int(analysis.instances["gpu_time"].sum()) >= int(dur)

    groups = aggregate_groups(trace, analysis.activities, analysis.instances)
    # only ranges above the cut are groups ...
    shallow = set(r.loc[r["depth"] < MAX_OP_PATH_DEPTH, "range_id"])
    assert len(groups) > 0
    # ... and the outermost one holds everything nested inside it, by interval containment
    # on its thread (an independent walk: no parent pointers)
    top = r[(r["depth"] == 0) & (r["kind"] == "op")]
    outer = top.loc[(top["end"] - top["start"]).idxmax()]
    assert outer["range_id"] in shallow
    acts = analysis.activities[owned]
    owner = r.set_index("range_id").loc[acts["range_id"]]
    inside = (
        (owner["start"].to_numpy() >= outer["start"])
        & (owner["end"].to_numpy() <= outer["end"])
        & (owner["tid"].to_numpy() == outer["tid"])
        & (owner["pid"].to_numpy() == outer["pid"])
    )
    expected = int((acts["end"] - acts["start"]).to_numpy()[inside].sum())
    name = analysis.instances.loc[analysis.instances["instance"] == outer["range_id"], "op_name"]
    row = groups[groups["op_name"] == name.iloc[0]]
    assert int(row["gpu_time_total"].sum()) == expected > 0

    out = tmp_path / "out"
    write_reports(analysis, out, reports=["detail", "group_node"], formats=["csv"])
    assert sum(p.stat().st_size for p in out.iterdir()) < 20 * 2**20
    _all_numbers_sane(out)


# ------------------------------------------------------------------ inverted and huge times


def test_kernels_ending_before_they_start_are_clamped_and_counted(tmp_path: Path) -> None:
    path = _copy(tmp_path, CLOVERLEAF)
    _sql(path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1000 WHERE rowid % 3 = 0")
    bad = _one(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end < start")
    # the kernel time a reader must report: every kernel, the inverted ones as zero
    expected = _one(path, "SELECT sum(max(end - start, 0)) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    trace = load_trace(path)
    assert f"{bad:,} kernels ended before they started: clamped to zero duration" in trace.notes
    assert int((trace.kernels["end"] - trace.kernels["start"]).sum()) == expected
    analysis = analyze(trace)
    assert int(analysis.summary.kernel_time) == expected
    assert (analysis.ops["gpu_time_min"] >= 0).all()
    out = tmp_path / "out"
    write_reports(analysis, out, formats=["csv", "json"])
    _all_numbers_sane(out)


def test_negative_kineto_durations_are_clamped_by_the_analysis(tmp_path: Path) -> None:
    """Whatever the reader left, the analysis never sums a negative duration."""
    assert FIXTURES is not None
    doc = json.loads(gzip.decompress((FIXTURES / RESNET).read_bytes()))
    flipped = 0
    for e in doc["traceEvents"][::7]:
        if isinstance(e.get("dur"), (int, float)) and e["dur"] > 0:
            e["dur"] = -e["dur"]
            flipped += 1
    path = tmp_path / "neg.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    analysis = analyze(load_trace(path))
    assert any("ended before they started" in n for n in analysis.notes)
    for table in ("ranges", "kernels", "api_calls", "memops"):
        t = getattr(analysis.trace, table)
        assert (t["end"] >= t["start"]).all(), table
    assert (analysis.instances[["cpu_time", "gpu_time", "gpu_idle"]] >= 0).all().all()
    out = tmp_path / "out"
    write_reports(analysis, out, formats=["csv", "json"])
    _all_numbers_sane(out)


def test_thousands_of_nan_durations_are_repaired_in_one_pass(tmp_path: Path) -> None:
    """Fuzz cases 88, 5008, 5009 (``dur = NaN`` on every 7th event of the big Kineto
    fixtures) ran past 30 CPU s: each NaN cost one decode of the whole 16 MB piece.
    Now every NaN of a piece is found up front: the piece decodes at most twice."""
    from perfguard.trace import kineto_repair
    from perfguard.trace.kineto_stream import _typed

    assert FIXTURES is not None
    doc = json.loads(gzip.decompress((FIXTURES / RESNET).read_bytes()))
    spoiled = {}
    for i, e in enumerate(doc["traceEvents"]):
        if i % 7 == 0 and isinstance(e.get("dur"), (int, float)) and e.get("ph") == "X":
            e["dur"] = float("nan")
            spoiled[(e["name"], e["ts"])] = True
    assert len(spoiled) > 1000
    text = json.dumps(doc, indent=1).encode()  # Python writes NaN, as old torch writers did
    assert text.count(b"NaN") == len(spoiled)
    array = text[text.index(b"[", text.index(b'"traceEvents"')) : text.rindex(b"]") + 1]
    calls = []

    def decode(piece: bytes):
        calls.append(len(piece))
        return _typed(piece)

    fixes: collections.Counter[str] = collections.Counter()
    events, _ = kineto_repair.repair_piece(array, decode, fixes)
    assert len(calls) <= 2 and fixes["nan"] == len(spoiled)
    assert len(events) == len(doc["traceEvents"])

    path = tmp_path / "nan.json.gz"
    path.write_bytes(gzip.compress(text))
    trace = load_trace(path)
    assert any("NaN/Infinity" in n for n in trace.notes)
    out = tmp_path / "out"
    write_reports(analyze(trace), out, formats=["csv", "json"])
    _all_numbers_sane(out)


@pytest.mark.parametrize("value", [2**62, 2**63 - 1, -(2**63)])
def test_timestamps_beyond_int64_arithmetic_are_rejected(tmp_path: Path, value: int) -> None:
    path = _copy(tmp_path, CLOVERLEAF)
    _sql(path, f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = {value} WHERE rowid = 7")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert "out of range" in str(err.value) or "span" in str(err.value)


def test_a_span_of_centuries_is_rejected(tmp_path: Path) -> None:
    path = _copy(tmp_path, CLOVERLEAF)
    _sql(path, f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET end = {2**61} WHERE rowid = 3")
    with pytest.raises(TraceError, match="timestamps span"):
        load_trace(path)


# ------------------------------------------------------------------ string ids and names


def test_a_string_id_of_2_31_costs_nothing(tmp_path: Path) -> None:
    """A table sized by the largest id would be 17 GB; names still resolve."""
    path = _copy(tmp_path, CLOVERLEAF)
    good = load_trace(path).kernels["name"]
    _sql(
        path,
        f"INSERT INTO StringIds (id, value) VALUES ({2**31}, 'huge id')",
        f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = {2**31} WHERE rowid = 1",
    )
    trace = load_trace(path)
    assert trace.kernels["name"].iloc[0] == "huge id"
    assert trace.kernels["name"].iloc[1:].tolist() == good.iloc[1:].tolist()


def test_empty_string_table_without_memcpy(tmp_path: Path) -> None:
    """Was IndexError in the op naming: kernels whose names are all unknown."""
    path = _copy(tmp_path, CLOVERLEAF)
    _sql(path, "DELETE FROM StringIds", "DROP TABLE CUPTI_ACTIVITY_KIND_MEMCPY")
    n = _one(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    trace = load_trace(path)
    assert (trace.kernels["name"] == UNKNOWN_KERNEL).sum() == n
    analysis = analyze(trace)
    assert int(analysis.summary.kernels) == n
    write_reports(analysis, tmp_path / "out", formats=["csv", "json"])


@pytest.mark.parametrize(
    "value",
    ["12345", "4.5", "X'ffff'", "CAST(X'eda080' AS TEXT)", "CAST(X'c3' AS TEXT)"],
    ids=["integer", "real", "blob", "lone-surrogate-cesu", "cut-utf8"],
)
def test_names_that_are_not_text(tmp_path: Path, value: str) -> None:
    path = _copy(tmp_path, TORCHRUN)
    _sql(path, f"UPDATE NVTX_EVENTS SET text = {value} WHERE rowid % 5 = 0 AND text IS NOT NULL")
    trace = load_trace(path)
    names = trace.ranges["name"].dropna()
    assert names.map(lambda v: isinstance(v, str)).all()
    analysis = analyze(trace)
    out = tmp_path / "out"
    write_reports(analysis, out, formats=["csv", "json", "html"])
    for p in out.iterdir():
        p.read_text(encoding="utf-8")  # valid UTF-8 throughout


def test_a_gpu_name_that_is_a_blob(tmp_path: Path) -> None:
    """Found by the fuzzer (case 5150): pandas decoded the blob as UTF-8 and raised."""
    path = _copy(tmp_path, "nsys/nsys2021.2.1_gpu-db-query_no-nvtx_quadro-rtx6000.sqlite")
    _sql(path, "UPDATE TARGET_INFO_GPU SET name = X'ffff'")
    analysis = analyze(load_trace(path))
    assert set(analysis.trace.devices["name"]) == {"\ufffd\ufffd"}
    write_reports(analysis, tmp_path / "out", formats=["csv", "json"])


def test_lone_surrogates_and_numbers_as_op_names() -> None:
    """A reader may hand over any name: ``op_id`` and the report writer must cope."""
    ranges = pd.DataFrame(
        {
            "name": ["step\ud800", 42, "a\udfffb"],
            "start": np.array([0, 10, 20], dtype=np.int64),
            "end": np.array([100, 15, 30], dtype=np.int64),
            "kind": ["op", "op", "op"],
            "bprop": [False, False, False],
            "pid": 1,
            "tid": 1,
        }
    )
    from perfguard.trace.ranges import finalize_ranges

    trace = Trace(ranges=finalize_ranges(ranges), meta={"path": "synthetic"})
    analysis = analyze(trace)
    assert {"step\ud800", "step\ud800/42", "step\ud800/a\udfffb"} <= set(analysis.ops["op_name"])
    assert analysis.ops["op_id"].str.fullmatch("[0-9a-f]{16}").all()


def test_report_writer_survives_lone_surrogates(tmp_path: Path) -> None:
    ranges = pd.DataFrame(
        {
            "name": ["bad\ud800name"],
            "start": np.array([0], dtype=np.int64),
            "end": np.array([10], dtype=np.int64),
            "kind": ["op"],
            "bprop": [False],
            "pid": 1,
            "tid": 1,
        }
    )
    from perfguard.trace.ranges import finalize_ranges

    analysis = analyze(Trace(ranges=finalize_ranges(ranges), meta={"path": "synthetic"}))
    written = write_reports(analysis, tmp_path, formats=["csv", "json", "html"])
    detail = (tmp_path / "dlprof_detail.csv").read_text(encoding="utf-8")
    assert "bad\\ud800name" in detail
    assert len(written) == 9


# ------------------------------------------------------------------ GPU utilization


def _json_walk_utilization(path: Path) -> dict[str, float]:
    """Independent of perfguard: per ProfilerStep, the union of every GPU interval
    (kernel, memcpy, memset) clipped to the step, over the step's duration."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"]
    gpu = sorted(
        (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000))
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    merged: list[list[int]] = []
    for s, e in gpu:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out = {}
    for step in events:
        if str(step.get("name", "")).startswith("ProfilerStep#"):
            lo, hi = round(step["ts"] * 1000), round((step["ts"] + step["dur"]) * 1000)
            busy = sum(max(0, min(e, hi) - max(s, lo)) for s, e in merged)
            out[step["name"]] = 100.0 * busy / (hi - lo)
    return out


def test_per_iteration_utilization_of_torchrec_matches_a_json_walk() -> None:
    """Was 150.8 %, 101.6 %, 73.5 %, 143.5 %, 113.2 %, 73.4 %: busy time of the work each
    step *launched* (which the GPU, running ~50 ms behind the CPU, finished in the next
    step) over the step's own duration."""
    assert FIXTURES is not None
    analysis = analyze(load_trace(FIXTURES / TORCHREC))
    it = analysis.iterations
    assert (it["gpu_utilization"] <= 100.0).all()
    walk = _json_walk_utilization(FIXTURES / TORCHREC)
    got = {
        f"ProfilerStep#{i}": u for i, u in zip(it["iteration"], it["gpu_utilization"], strict=True)
    }
    assert got.keys() == walk.keys()
    for name, value in walk.items():
        assert got[name] == pytest.approx(value, abs=1e-9), name
    # restricted to three steps: the same figures, and the run's utilization too
    part = analyze(analysis.trace, iter_start=1010, iter_stop=1012)
    assert part.iterations["gpu_utilization"].tolist() == pytest.approx(
        [walk[f"ProfilerStep#{i}"] for i in (1010, 1011, 1012)]
    )
    assert 0 < float(part.summary.gpu_utilization) <= 100


def test_covered_within_by_hand() -> None:
    # intervals [0,10) [5,15) [20,30) [40,41): union [0,15) [20,30) [40,41)
    s = np.array([5, 0, 20, 40])
    e = np.array([15, 10, 30, 41])
    lo = np.array([0, 12, -5, 25, 31, 0, 40])
    hi = np.array([100, 22, 0, 45, 39, 15, 40])
    assert covered_within(s, e, lo, hi).tolist() == [26, 5, 0, 6, 0, 15, 0]


@pytest.mark.parametrize(
    "shapes, dtypes",
    [("123", '["float"]'), ("[[2, 3], [3, 4]]", "7"), ('[[2, "x"], [3, 4]]', '["float", "float"]')],
)
def test_gemm_dims_of_damaged_shapes_are_unknown(shapes: str, dtypes: str) -> None:
    """Fuzz case 389: Kineto ``Input Dims`` = 123 made the tensor-shape detector raise."""
    from perfguard.analysis.expert import _gemm_dims

    assert _gemm_dims(shapes, dtypes) is None
    assert _gemm_dims("[[2, 8], [8, 4]]", '["float", "float"]') == ([2, 8, 4], 4)
