"""The Perfetto / Chrome-trace export: valid for Perfetto's JSON importer, totals as reported.

Perfetto's ``trace_processor`` could not be run here: the ``perfetto`` wheel
(0.59.1) ships no ``trace_processor_shell``, it downloads one at first use,
and this machine has no route to that host. So the file is checked against
the rules of the Chrome Trace Event Format that Perfetto's JSON importer
enforces (:func:`check_chrome_trace`: event kinds and fields, slices that
nest on each thread, matched flow and async pairs, named processes and
threads), reading times exactly (decimal text, no float), and its kernel
slices are summed per name and compared with the kernel report.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyprof_capture as capture
import pytest
from nsys_builder import TEMPLATE

import perfguard
from perfguard.report import perfetto
from perfguard.report.perfetto import _with_tracks, render_perfetto, write_perfetto

FIXTURES = [
    "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz",  # 2 streams, NCCL, memops, steps
    "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz",  # legacy schema, 8.8k kernels
    "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite",  # 2 ranks
    "nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite",
]


def _ns(value: Decimal) -> int:
    ns = value * 1000
    assert ns == ns.to_integral_value(), value  # whole nanoseconds, exactly
    return int(ns)


def check_chrome_trace(data: bytes) -> dict:
    """Raise AssertionError where Perfetto's JSON importer would reject or misplace an
    event; return the events grouped for the caller's own checks."""
    doc = json.loads(data, parse_float=Decimal)
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    slices = defaultdict(list)  # (pid, tid) -> [(start, end, event)]
    flows, asyncs = defaultdict(list), defaultdict(list)
    named_pids, named_threads, used_threads = set(), set(), set()
    for e in doc["traceEvents"]:
        ph = e["ph"]
        assert ph in {"X", "b", "e", "s", "f", "M"}, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if ph == "M":
            assert e["name"] in {"process_name", "thread_name", "process_sort_index"}, e
            assert isinstance(e["args"], dict)
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            elif e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], Decimal) and e["ts"] >= 0, e
        assert isinstance(e["name"], str) and isinstance(e["cat"], str), e
        used_threads.add((e["pid"], e["tid"]))
        start = _ns(e["ts"])
        if ph == "X":
            assert isinstance(e["dur"], Decimal) and e["dur"] >= 0, e
            assert isinstance(e["args"], dict), e
            slices[(e["pid"], e["tid"])].append((start, start + _ns(e["dur"]), e))
        elif ph in "be":
            asyncs[(e["cat"], e["id"])].append((ph, start))
        else:
            flows[e["id"]].append((ph, start, e))
    # slices on one thread nest (Perfetto drops a slice that ends inside its parent's end)
    for track, items in slices.items():
        items.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, e in items:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], (track, e["name"], start, end, stack[-1])
            stack.append(end)
    for key, pair in asyncs.items():
        assert sorted(p for p, _ in pair) == ["b", "e"] and dict(pair)["b"] <= dict(pair)["e"], key
    for ident, pair in flows.items():
        assert sorted(p for p, _, _ in pair) == ["f", "s"], ident
        f = next(e for p, _, e in pair if p == "f")
        assert f["bp"] == "e", f
    assert {pid for pid, _ in used_threads} <= named_pids
    assert used_threads <= named_threads
    return {"slices": slices, "flows": flows, "doc": doc}


def _kernel_totals(slices: dict) -> Counter:
    totals = Counter()
    for items in slices.values():
        for start, end, e in items:
            if e["cat"] == "kernel":
                totals[e["name"]] += end - start
    return totals


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: Path(f).name[:40])
def test_export_is_a_valid_trace_whose_kernel_totals_equal_the_kernel_report(
    fixture, fixture_file, cached_trace
) -> None:
    result = perfguard.analyze(cached_trace(fixture_file(fixture)))
    got = check_chrome_trace(render_perfetto(result))
    report = result.kernels.groupby("name")["gpu_time_total"].sum()
    totals = _kernel_totals(got["slices"])
    assert len(totals) == len(report) > 0
    assert {k: int(v) for k, v in report.items()} == dict(totals)
    # every kernel of an op has a flow from the launching thread, bound to it
    kernels = result.activities[result.activities["activity"] == "kernel"]
    owned = kernels["range_id"].ge(0) & kernels["launch_start"].notna()
    n_flows = sum(1 for pair in got["flows"].values() if pair[0][2]["cat"] == "launch")
    assert n_flows == int(
        (result.activities["range_id"].ge(0) & result.activities["launch_start"].notna()).sum()
    )
    assert n_flows >= int(owned.sum())


def test_flows_start_inside_the_op_and_end_on_its_kernel(fixture_file, tmp_path) -> None:
    path = capture.build(fixture_file(TEMPLATE), tmp_path / "pyprof.sqlite")
    result = perfguard.analyze(perfguard.load_trace(path))
    got = check_chrome_trace(render_perfetto(result))
    by_thread = got["slices"]
    bound = {}
    for pair in got["flows"].values():
        s = next(e for p, _, e in pair if p == "s")
        f = next(e for p, _, e in pair if p == "f")
        t_s, t_f = _ns(s["ts"]), _ns(f["ts"])
        op = [e for a, b, e in by_thread[(s["pid"], s["tid"])] if a <= t_s <= b]
        kernel = [e for a, _, e in by_thread[(f["pid"], f["tid"])] if a == t_f]
        assert len(kernel) == 1 and kernel[0]["cat"] == "kernel"
        bound[kernel[0]["name"]] = min(op, key=lambda e: e["dur"])["name"]  # innermost op
    conv = "sm90_xmma_fprop_implicit_gemm"
    (kernel,) = [k for k in bound if k.startswith(conv)]
    assert bound[kernel] == "torch.nn.functional.conv2d"
    assert bound["nvjet_hsh_64x8_64x16_4x1_v_bz_TNT"] == "torch.nn.functional.linear"
    assert len(bound) == 8  # every kernel of the step


def test_slices_carry_the_attribution(fixture_file, tmp_path) -> None:
    path = capture.build(fixture_file(TEMPLATE), tmp_path / "pyprof.sqlite")
    result = perfguard.analyze(perfguard.load_trace(path))
    got = check_chrome_trace(render_perfetto(result))
    events = [e for items in got["slices"].values() for _, _, e in items]
    conv_op = next(e for e in events if e["name"] == "torch.nn.functional.conv2d")
    assert conv_op["args"]["flops"] == 28_311_552
    assert conv_op["args"]["uses_tc"] is True and conv_op["args"]["tc_eligible"] is True
    assert conv_op["args"]["call_site"] == "/home/user/project/model.py:12"
    kernel = next(e for e in events if e["name"].startswith("sm90_xmma_fprop"))
    args = kernel["args"]
    assert args["op_name"] == "torch.nn.functional.conv2d" and args["op_flops"] == 28_311_552
    assert args["op_id"] == conv_op["args"]["op_id"] and args["uses_tc"] is True
    # the GPU process is named after the device, the host one after the process
    names = {
        e["pid"]: e["args"]["name"]
        for e in got["doc"]["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names[kernel["pid"]] == "GPU 0 (NVIDIA H200)"
    assert names[conv_op["pid"]] == f"pid {capture.MAIN}"


def test_iterations_are_a_track_of_their_own(fixture_file, cached_trace) -> None:
    trace = cached_trace(fixture_file(FIXTURES[0]))
    result = perfguard.analyze(trace)
    got = check_chrome_trace(render_perfetto(result))
    its = [
        e
        for items in got["slices"].values()
        for _, _, e in items
        if e["cat"] == "iteration" and e["name"].startswith("iteration ")
    ]
    assert [e["args"]["iteration"] for e in its] == list(result.window["iteration"])
    assert len({(e["pid"], e["tid"]) for e in its}) == 1
    durations = sorted(_ns(e["dur"]) for e in its)
    assert durations == sorted((result.window["end"] - result.window["start"]).tolist())


def test_cli_writes_the_export_with_the_other_formats(fixture_file, tmp_path) -> None:
    db = fixture_file(FIXTURES[0])
    cmd = [
        sys.executable,
        "-m",
        "perfguard",
        "analyze",
        "--database",
        str(db),
        "--formats",
        "csv,perfetto",
        "--reports",
        "kernel",
        "--output-path",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "dlprof_perfetto.json.gz"
    assert out.exists() and (tmp_path / "dlprof_kernel.csv").exists()
    check_chrome_trace(gzip.decompress(out.read_bytes()))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "dlprof_kernel.csv: report exists" in again.stderr


def test_write_perfetto_compresses_by_suffix(fixture_file, cached_trace, tmp_path) -> None:
    result = perfguard.analyze(cached_trace(fixture_file(FIXTURES[3])))
    plain = write_perfetto(result, tmp_path / "t.json").read_bytes()
    packed = write_perfetto(result, tmp_path / "t.json.gz").read_bytes()
    assert gzip.decompress(packed) == plain
    check_chrome_trace(plain)


@pytest.mark.parametrize("max_dur", [50, 400, 5_000])  # rare, frequent, chained overlaps
def test_overlapping_work_on_a_stream_gets_lanes_that_never_overlap(max_dur: int) -> None:
    rng = np.random.default_rng(max_dur)
    start = np.sort(rng.integers(0, 100_000, 3_000))
    acts = pd.DataFrame(
        {
            "rank": 0,
            "device_id": rng.integers(0, 2, 3_000),
            "stream_id": rng.integers(0, 3, 3_000),
            "start": start,
            "end": start + rng.integers(1, max_dur, 3_000),
        }
    )
    got = _with_tracks(acts)
    assert len(got) == len(acts)
    assert ((got["track"] % 1_000_000) == got["stream_id"]).all()  # lanes stay on their stream
    for _, lane in got.groupby(["device_id", "track"]):  # brute force: each lane is disjoint
        lane = lane.sort_values("start")
        ends = np.maximum.accumulate(lane["end"].to_numpy())
        assert (lane["start"].to_numpy()[1:] >= ends[:-1]).all()


def test_rendering_in_chunks_gives_the_same_file(fixture_file, cached_trace, monkeypatch) -> None:
    result = perfguard.analyze(cached_trace(fixture_file(FIXTURES[0])))
    whole = render_perfetto(result)
    monkeypatch.setattr(perfetto, "CHUNK_ROWS", 997)  # many chunks, none aligned to anything
    chunked = render_perfetto(result)
    # the same events (kernel and flow chunks interleave, so the order differs)
    assert sorted(chunked.split(b",\n")) == sorted(whole.split(b",\n"))
    check_chrome_trace(chunked)
