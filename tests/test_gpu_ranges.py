"""``--gpu-ranges-only``: only the NVTX ranges that enclose GPU work are read.

Checked on real nsys exports: the kept ranges are those an independent SQL
query finds (a launching call on the range's thread inside it), the tree of
the kept ranges is the one built from them afresh, and every kernel keeps
its owner, so the kernel report is unchanged.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import perfguard
from perfguard.report.dlprof import TABLES
from perfguard.trace import load_trace
from perfguard.trace.gpu_ranges import RangeFilter
from perfguard.trace.ranges import finalize_ranges

TORCHRUN = "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite"
CAPTURES = [
    TORCHRUN,
    "nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite",
    "nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite",
]

#: push/pop and start/end ranges that have a launching call (one whose correlation id is
#: a kernel's, memcpy's or memset's in the same process) on their thread, inside them
_ENCLOSING_SQL = """
WITH launches AS (
  SELECT r.globalTid AS gtid, r.start AS t FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
  WHERE EXISTS (SELECT 1 FROM {acts} AS a WHERE a.correlationId = r.correlationId
                AND (a.globalPid >> 24) = (r.globalTid >> 24)))
SELECT count(*) FROM NVTX_EVENTS AS n WHERE n.eventType IN (59, 60)
  AND EXISTS (SELECT 1 FROM launches AS l WHERE l.gtid = n.globalTid
              AND n.start <= l.t AND l.t <= n.end)
"""


def _enclosing_count(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    acts = [
        t
        for t in (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMSET",
        )
        if t in tables
    ]
    union = (
        "(" + " UNION ALL ".join(f"SELECT correlationId, globalPid FROM {t}" for t in acts) + ")"
    )
    (n,) = conn.execute(_ENCLOSING_SQL.format(acts=union)).fetchone()
    conn.close()
    return int(n)


@pytest.mark.parametrize("capture", CAPTURES)
def test_kept_ranges_enclose_gpu_work(capture: str, fixture_file) -> None:
    path = fixture_file(capture)
    full = load_trace(path)
    kept = load_trace(path, range_filter=RangeFilter())
    assert (full.ranges["kind"] == "op").all()  # these captures: every range an op
    assert len(kept.ranges) == _enclosing_count(path) < len(full.ranges)
    # the kept tree is the tree of the kept ranges built afresh
    fresh = finalize_ranges(kept.ranges.drop(columns=["range_id", "depth", "parent_id"]))
    for col in ("range_id", "depth", "parent_id", "direction"):
        np.testing.assert_array_equal(kept.ranges[col].to_numpy(), fresh[col].to_numpy())
    # every kernel keeps its owner: the kernel report and the GPU time per op are unchanged
    a, b = perfguard.analyze(full), perfguard.analyze(kept)
    pd.testing.assert_frame_equal(TABLES["kernel"](a), TABLES["kernel"](b))
    gpu_a = a.ops[a.ops["gpu_time_total"] > 0].reset_index(drop=True)
    gpu_b = b.ops[b.ops["gpu_time_total"] > 0].reset_index(drop=True)
    cols = ["op_id", "op_name", "direction", "gpu_time_total", "kernel_count"]
    pd.testing.assert_frame_equal(gpu_a[cols], gpu_b[cols])
    # an op's calls that launched nothing are gone: its calls can only fall
    assert (gpu_b["calls"] <= gpu_a["calls"]).all()
    assert a.summary.kernel_time == b.summary.kernel_time
    # what changes: ops that launch nothing leave the detail report
    assert len(b.ops) < len(a.ops)


def test_named_ranges_are_kept(fixture_file) -> None:
    """A range asked for by name (the key node) stays though it launches nothing."""
    path = fixture_file(TORCHRUN)
    full = load_trace(path)
    kept = load_trace(path, range_filter=RangeFilter())
    cpu_only = sorted(set(full.ranges["name"]) - set(kept.ranges["name"]))
    name = cpu_only[0]
    named = load_trace(path, range_filter=RangeFilter(keep_names=(name,)))
    want = int((full.ranges["name"] == name).sum())
    assert want > 0 and int((named.ranges["name"] == name).sum()) == want
    assert len(named.ranges) >= len(kept.ranges) + want


def test_cli_gpu_ranges_only(fixture_file, tmp_path: Path, capsys) -> None:
    from perfguard.cli import main

    path = fixture_file(TORCHRUN)
    for flag, out in (([], "all"), (["--gpu-ranges-only"], "gpu")):
        rc = main(
            [
                "analyze",
                "-d",
                str(path),
                "--output-path",
                str(tmp_path / out),
                "-q",
                "--reports",
                "kernel,detail",
                "--formats",
                "csv",
                *flag,
            ]
        )
        assert rc == 0
    capsys.readouterr()
    kernel = [(tmp_path / d / "dlprof_kernel.csv").read_text() for d in ("all", "gpu")]
    detail = [pd.read_csv(tmp_path / d / "dlprof_detail.csv") for d in ("all", "gpu")]
    assert kernel[0] == kernel[1]
    assert len(detail[1]) < len(detail[0])
    assert detail[1]["Total GPU Time (ns)"].sum() == detail[0]["Total GPU Time (ns)"].sum()


@pytest.mark.parametrize("dlprof", [False, True], ids=["pyprof", "dlprof"])
def test_pyprof_markers_filtered_after_folding(dlprof: bool, fixture_file, tmp_path) -> None:
    """With PyProf/DLProf markers the filter runs after the wrappers are folded in, so
    bprop ops keep the names their fprop ops give them."""
    import pyprof_capture as capture
    from nsys_builder import TEMPLATE

    path = capture.build(fixture_file(TEMPLATE), tmp_path / "c.sqlite", dlprof=dlprof)
    full = load_trace(path)
    kept = load_trace(path, range_filter=RangeFilter())
    a, b = perfguard.analyze(full), perfguard.analyze(kept)
    pd.testing.assert_frame_equal(TABLES["kernel"](a), TABLES["kernel"](b))
    assert len(kept.ranges) <= len(full.ranges)
    assert set(b.ops["op_name"]) <= set(a.ops["op_name"])
