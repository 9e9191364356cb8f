"""The XSpace / XProf JSON reader against real TensorFlow, Keras and JAX CPU captures.

The captures in ``tests/data/xplane`` were made by ``make_fixtures.py`` there
(TensorFlow 2.21, Keras 3, JAX 0.10 on a CPU); these tests need neither
framework. The independent witness is a protobuf wire walk written here from
the public schema (tensorflow/tsl ``xplane.proto``), sharing no code with the
reader: per op, calls and total time must agree exactly. JAX wrote the same
run as XSpace and as Perfetto JSON: both readings must give the same ranges.
"""

from __future__ import annotations

import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfguard import TraceError, load_trace
from perfguard.analysis import analyze
from perfguard.trace.xevents import decode_events
from perfguard.trace.xplane import _kernel_details, read_xplane
from perfguard.trace.xspace_proto import message_class, xspace_class

DATA = Path(__file__).resolve().parent / "data" / "xplane"
TF_LOOP = DATA / "tf_custom_loop.xplane.pb"
JAX_JIT = DATA / "jax_jit_step.xplane.pb"
JAX_JSON = DATA / "jax_jit_step.perfetto_trace.json.gz"
KERAS_FIT = DATA / "keras_fit.xplane.pb"
ALL = [TF_LOOP, JAX_JIT, KERAS_FIT]


# --- an independent decoding: the protobuf wire format, by hand ------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, object]]:
    """(field number, value) pairs: ints for varints, bytes for length-delimited fields."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, value))
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _stats(items: list[tuple[int, object]], field: int, names: dict[int, str]) -> dict[str, object]:
    out = {}
    for number, raw in items:
        if number != field:
            continue
        s = dict(_fields(raw))
        if 7 in s:
            value: object = names[s[7]]
        elif 5 in s:
            value = s[5].decode()
        else:
            value = _signed(s.get(4, s.get(3, 0)))
        out[names[s[1]]] = value
    return out


def walk_host_ops(path: Path) -> dict[str, tuple[int, int]]:
    """Per op name on ``/host:CPU``: (calls, total ns), by the reader's documented rules."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for number, plane_raw in _fields(path.read_bytes()):
        if number != 1:
            continue
        plane = _fields(plane_raw)
        if dict(plane).get(2, b"").decode() != "/host:CPU":
            continue
        stat_names = {}
        for n, entry in plane:
            if n == 5:
                e = dict(_fields(entry))
                stat_names[e[1]] = dict(_fields(e[2])).get(2, b"").decode()
        emeta = {}
        for n, entry in plane:
            if n == 4:
                e = dict(_fields(entry))
                m = _fields(e[2])
                md = dict(m)
                emeta[e[1]] = (
                    md.get(2, b"").decode(),
                    md.get(4, b"").decode(),
                    _stats(m, 5, stat_names),
                )
        for n, line_raw in plane:
            if n != 3:
                continue
            line = _fields(line_raw)
            ts = _signed(dict(line).get(3, 0))
            for ln, ev_raw in line:
                if ln != 4:
                    continue
                ev = _fields(ev_raw)
                e = dict(ev)
                name, display, md_stats = emeta[e.get(1, 0)]
                st = {**md_stats, **_stats(ev, 4, stat_names)}
                off, dur = e.get(2, 0), e.get(3, 0)
                op = _op_name(name, display, st)
                if op is not None:
                    t = totals[op]
                    t[0] += 1
                    t[1] += (ts + (off + dur) // 1000) - (ts + off // 1000)
    return {k: (v[0], v[1]) for k, v in totals.items()}


def _op_name(name: str, display: str, st: dict[str, object]) -> str | None:
    if "step_num" in st:
        return f"ProfilerStep#{st['step_num']}"
    if st.get("hlo_op"):
        return f"{st['hlo_module']}::{st['hlo_op']}" if st.get("hlo_module") else str(st["hlo_op"])
    if "eager_op" in st and st.get("is_func") != 1:
        return str(st["eager_op"])
    if display and name.endswith(":" + display):
        return name[: -len(display) - 1]
    node, sep, kind = name.rpartition(":")  # TraceMe "node:Type" without a display name
    if sep and node and ":" not in node and " " not in name and kind.lstrip("_")[:1].isupper():
        return node
    if "tf_function_call" in st:
        return name
    return None


# --- the reader against it ------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_op_totals_equal_an_independent_wire_walk(path: Path) -> None:
    expected = walk_host_ops(path)
    r = read_xplane(path).ranges
    got = r.assign(ns=r["end"] - r["start"]).groupby("node_name")["ns"].agg(["size", "sum"])
    assert {k: (int(v["size"]), int(v["sum"])) for k, v in got.iterrows()} == expected
    # and through the analysis: every op instance once, with its CPU time (op names there
    # are hierarchical, ``MakeIterator/range``; ``name`` is the range's own: a TF op's identity,
    # so the nodes that differ only in uniquifying numbers add up, ``Mul`` and ``Mul_1``)
    inst = analyze(read_xplane(path)).instances
    got = inst.groupby("name")["cpu_time"].agg(["size", "sum"])
    identity = dict(zip(r["node_name"], r["name"].astype(object), strict=True))
    walked_ops: dict[str, tuple[int, int]] = {}
    for k, (size, ns) in expected.items():
        if not k.startswith("ProfilerStep#"):
            was = walked_ops.get(identity[k], (0, 0))
            walked_ops[identity[k]] = (was[0] + size, was[1] + ns)
    assert {k: (int(v["size"]), int(v["sum"])) for k, v in got.iterrows()} == walked_ops


def test_tf_custom_loop_ops_and_iterations() -> None:
    t = load_trace(TF_LOOP)
    assert t.meta["format"] == "xplane" and t.meta["hostnames"] == ["vm"]
    a = analyze(t)
    assert list(a.iterations["iteration"]) == [0, 1, 2]
    ops = a.ops.set_index("op_name")
    # the tf.function's graph: forward matmul/relu/sum, the gradient, the update
    assert ops.loc["MatMul", "op_type"] == "_MklMatMul"
    assert ops.loc["gradient_tape/MatMul/MatMul", "direction"] == "bprop"
    assert ops.loc["Relu", "direction"] == "fprop"
    assert ops.loc["step", "op_type"] == "tf.function"
    assert (ops["calls"] == 3).all()
    assert (a.iterations["op_calls"] == len(ops)).all()
    steps = t.ranges[t.ranges["kind"] == "iteration"]
    assert set(steps["domain"]) == {"train"}
    assert (t.ranges["end"] >= t.ranges["start"]).all()


def test_jax_jit_hlo_ops_per_step() -> None:
    t = load_trace(JAX_JIT)
    assert t.meta["jax_version"].startswith("0.10")
    a = analyze(t)
    assert list(a.iterations["iteration"]) == [0, 1, 2]
    ops = a.ops.set_index("op_name")
    assert "jit_step::dot" in ops.index and ops.loc["jit_step::dot", "op_type"] == "dot"
    assert set(ops["calls"]) == {3}
    # every HLO op instance lies in exactly one step
    assert a.instances["iteration"].notna().all()
    assert (a.iterations["op_calls"] == len(ops)).all()


def test_keras_fit_steps_from_the_callback() -> None:
    a = analyze(load_trace(KERAS_FIT))
    assert list(a.iterations["iteration"]) == list(range(8))  # 2 epochs x 4 batches
    ops = a.ops
    dense = ops[ops["op_name"].str.contains("sequential") & (ops["direction"] == "fprop")]
    assert not dense.empty and (ops["op_name"].str.contains("gradient_tape")).any()


def test_perfetto_json_reads_like_the_xplane() -> None:
    """One JAX run, written twice: the two readings agree on every range and time (only the
    XSpace holds the HLO, so only its fusions' types say what they hold)."""
    x, j = load_trace(JAX_JIT), load_trace(JAX_JSON)
    assert j.meta["format"] == "xprof-json"
    cols = ["name", "category", "kind", "op_type", "start", "end", "depth"]

    def rows(t):
        return t.ranges[cols].astype(str).sort_values(cols).reset_index(drop=True)

    held = x.ranges["op_type"].astype(str)
    assert set(held[held.str.contains("ynn")]) == {"ynn_fusion (dot)"}
    x.ranges["op_type"] = held.str.replace(r" \(.*\)$", "", regex=True)
    pd.testing.assert_frame_equal(rows(x), rows(j))
    assert len(x.ranges) == 15


def test_loader_finds_xplanes_in_a_logdir(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    shutil.copy(TF_LOOP, run / "vm.xplane.pb")
    old = tmp_path / "logs" / "plugins" / "profile" / "2025_01_01_00_00_00"
    old.mkdir()
    shutil.copy(JAX_JIT, old / "vm.xplane.pb")
    for where in (tmp_path / "logs", run, run / "vm.xplane.pb"):
        t = load_trace(where)
        assert "ProfilerStep#2" in set(t.ranges["name"]) and "MatMul" in set(t.ranges["name"])
    (run / "other.xplane.pb").write_bytes(JAX_JIT.read_bytes())  # two hosts: two ranks
    t = load_trace(run)
    assert sorted(t.meta["ranks"]) == [0, 1]
    assert Counter(t.ranges["rank"]) == {0: 15, 1: len(read_xplane(TF_LOOP).ranges)}


def test_analyze_cli_on_an_xplane(tmp_path: Path) -> None:
    from perfguard.cli import main

    rc = main(
        [
            "analyze",
            "--database",
            str(TF_LOOP),
            "--output-path",
            str(tmp_path),
            "--formats",
            "csv",
            "--reports",
            "detail,iteration",
        ]
    )
    assert rc == 0
    detail = pd.read_csv(tmp_path / "dlprof_detail.csv")
    assert set(detail["Op Name"]) >= {"MatMul", "Relu", "gradient_tape/MatMul/MatMul"}
    assert len(pd.read_csv(tmp_path / "dlprof_iteration.csv")) == 3


# --- GPU planes: a hand-built XSpace in the layout TensorFlow/XLA write -----------------------


def _gpu_space() -> bytes:
    """Thread 7 runs op ``MatMul:MatMul`` [1000, 5000) ns and launches two kernels from it
    (CUPTI correlation ids 11, 12) and a memcpy (13); one kernel (14) is launched outside
    any op. Stream 3 of GPU 0 runs them."""
    space = xspace_class()()
    host, cupti, gpu = space.planes.add(), space.planes.add(), space.planes.add()
    host.name, cupti.name, gpu.name = "/host:CPU", "/host:CUPTI", "/device:GPU:0"
    for plane, names in (
        (host, ["step_num"]),
        (cupti, ["correlation_id"]),
        (
            gpu,
            [
                "correlation_id",
                "kernel_details",
                "memcpy_details",
                "compute_cap_major",
                "compute_cap_minor",
                "core_count",
            ],
        ),
    ):
        for i, n in enumerate(names, start=1):
            entry = plane.stat_metadata.add(key=i)  # a map<int64, XStatMetadata> entry
            entry.value.id, entry.value.name = i, n

    def meta(plane, i, name, display=""):
        entry = plane.event_metadata.add(key=i)
        entry.value.id, entry.value.name, entry.value.display_name = i, name, display

    def event(line, md, start_ns, dur_ns, **stats):
        e = line.events.add(metadata_id=md, offset_ps=start_ns * 1000, duration_ps=dur_ns * 1000)
        plane_stats = {"correlation_id": 1, "kernel_details": 2, "memcpy_details": 3}
        for k, v in stats.items():
            s = e.stats.add(metadata_id=plane_stats[k] if k != "step_num" else 1)
            if isinstance(v, str):
                s.str_value = v
            else:
                s.int64_value = v

    meta(host, 1, "train")
    meta(host, 2, "MatMul:MatMul", "MatMul")
    line = host.lines.add(id=7, name="python", timestamp_ns=0)
    event(line, 1, 500, 9000, step_num=0)
    event(line, 2, 1000, 4000)
    meta(cupti, 1, "cuLaunchKernel")
    meta(cupti, 2, "cuMemcpyHtoDAsync")
    line = cupti.lines.add(id=7, name="7", timestamp_ns=0)
    for cid, at, md in ((11, 1500, 1), (12, 2500, 1), (13, 3500, 2), (14, 6000, 1)):
        event(line, md, at, 100, correlation_id=cid)
    meta(gpu, 1, "volta_sgemm_128x64_nn")
    meta(gpu, 2, "MemcpyH2D")
    stream = gpu.lines.add(id=3, name="Stream #3(Compute)", timestamp_ns=0)
    details = "regs:64 static_shared:512 dynamic_shared:1024 grid:4,2,1 block:128,1,1 occ_pct:50"
    event(stream, 1, 2000, 700, correlation_id=11, kernel_details=details)
    event(stream, 1, 3000, 300, correlation_id=12, kernel_details=details)
    memcpy = "kind_src:pageable num_bytes:4096"
    event(stream, 2, 4000, 200, correlation_id=13, memcpy_details=memcpy)
    event(stream, 1, 7000, 50, correlation_id=14, kernel_details=details)
    for i, v in ((4, 8), (5, 0), (6, 80)):
        gpu.stats.add(metadata_id=i, int64_value=v)
    return space.SerializeToString()


def test_gpu_kernels_attributed_by_correlation(tmp_path: Path) -> None:
    path = tmp_path / "gpu.xplane.pb"
    path.write_bytes(_gpu_space())
    t = load_trace(path)
    assert len(t.kernels) == 3 and len(t.memops) == 1 and len(t.api_calls) == 4
    k = t.kernels.iloc[0]
    assert (k["registers"], k["shared_mem"], k["grid_x"], k["grid_y"], k["block_x"]) == (
        64,
        1536,
        4,
        2,
        128,
    )
    assert t.memops["bytes"].tolist() == [4096] and t.memops["kind"].tolist() == ["MemcpyH2D"]
    assert t.devices.loc[0, "compute_capability"] == "8.0" and t.devices.loc[0, "sm_count"] == 80
    a = analyze(t)
    acts = a.activities
    owner = dict(zip(acts["correlation_id"], acts["op_name"], strict=True))
    assert owner[11] == owner[12] == owner[13] == "MatMul"
    assert owner[14].startswith("unassociated")
    ops = a.ops.set_index("op_name")
    # the GPU work it launched: two kernels and the memcpy
    assert ops.loc["MatMul", "gpu_time_total"] == 700 + 300 + 200


def test_kernel_details_columns() -> None:
    s = pd.Series(["regs:32 static_shared:0 dynamic_shared:48 grid:1,2,3 block:64,1,1", None])
    d = _kernel_details(s)
    assert d.loc[0, ["registers", "shared_mem", "grid_z", "block_x"]].tolist() == [32, 48, 3, 64]
    assert d.loc[1].isna().all()


# --- bad input --------------------------------------------------------------------------------


def test_bad_xplanes_are_one_line_errors(tmp_path: Path) -> None:
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(TF_LOOP.read_bytes()[: TF_LOOP.stat().st_size // 2])
    junk = tmp_path / "junk.xplane.pb"
    junk.write_bytes(b"\xff\xfe not a protobuf \x00" * 10)
    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(b"")
    other = tmp_path / "other.xplane.pb"
    other.write_bytes(b"\x12\x03abc")  # a valid protobuf, but no planes
    expected = {
        cut: "truncated or corrupt",
        junk: "truncated or corrupt",
        empty: "empty",
        other: "no planes",
    }
    for path, problem in expected.items():
        with pytest.raises(TraceError, match=problem) as err:
            load_trace(path)
        assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)
    logdir = tmp_path / "nothing"
    logdir.mkdir()
    with pytest.raises(TraceError):
        load_trace(logdir)


# --- the vectorised event decoder -------------------------------------------------------------


#: XStat value field -> its wire tag (field number << 3 | wire type), from xplane.proto
_WIRE_TAG = {
    "double_value": 0x11,
    "uint64_value": 0x18,
    "int64_value": 0x20,
    "str_value": 0x2A,
    "bytes_value": 0x32,
    "ref_value": 0x38,
}


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_vectorised_decoding_equals_protobuf_per_event(path: Path) -> None:
    """Every event's fields and stats, decoded by numpy, as protobuf decodes them one by one."""
    raw = xspace_class(raw_events=True)()
    raw.ParseFromString(path.read_bytes())
    xevent = message_class("XEvent")
    checked = 0
    for plane in raw.planes:
        blobs = [b for line in plane.lines for b in line.events]
        if not blobs:
            continue
        ev = decode_events(blobs)
        assert not ev.bad.any()
        by_event = defaultdict(list)
        for row in range(len(ev.stats.event)):
            s = ev.stats
            by_event[int(s.event[row])].append((int(s.metadata_id[row]), int(s.kind[row]), row))
        for i, blob in enumerate(blobs):
            e = xevent.FromString(blob)
            assert (ev.metadata_id[i], ev.offset_ps[i], ev.duration_ps[i]) == (
                e.metadata_id,
                e.offset_ps,
                e.duration_ps,
            )
            mine = by_event.get(i, [])
            assert [m for m, _, _ in mine] == [s.metadata_id for s in e.stats]
            for (_, kind, row), s in zip(mine, e.stats, strict=True):
                which = s.WhichOneof("value")
                assert kind == _WIRE_TAG[which]
                if which in ("str_value", "bytes_value"):
                    assert ev.text(np.array([row]))[0].encode() == (
                        getattr(s, which) if which == "bytes_value" else s.str_value.encode()
                    )
                elif which == "double_value":
                    assert np.int64(ev.stats.value[row]).view(np.float64) == s.double_value
                else:
                    assert int(ev.stats.value[row]) == _signed(getattr(s, which) % (1 << 64))
            checked += 1
    assert checked >= 80  # every event of the file (90 in the smallest)


def test_events_in_an_unusual_field_order_are_still_read(tmp_path: Path) -> None:
    """A writer may put fields in any order: such events go through protobuf instead."""
    space = xspace_class(raw_events=True)()
    plane = space.planes.add(name="/host:CPU")
    entry = plane.event_metadata.add(key=5)
    entry.value.id, entry.value.name = 5, "train"
    entry = plane.stat_metadata.add(key=9)
    entry.value.id, entry.value.name = 9, "step_num"
    line = plane.lines.add(id=1, name="python", timestamp_ns=100)
    # duration (3) = 2000 ps, then metadata (1) = 5, then a stat step_num = 4, offset (2) 7000 ps
    stat = bytes([0x08, 9, 0x20, 4])
    line.events.append(
        bytes([0x18, 0xD0, 0x0F, 0x08, 5, 0x22, len(stat)]) + stat + bytes([0x10, 0xD8, 0x36])
    )
    path = tmp_path / "odd.xplane.pb"
    path.write_bytes(space.SerializeToString())
    (row,) = read_xplane(path).ranges.itertuples()
    assert (row.name, row.start, row.end, row.kind) == ("ProfilerStep#4", 107, 109, "iteration")
