"""Folding CPU-only op instances changes no figure.

:func:`perfguard.analyze` keeps a row of the instance table only for op
instances with GPU work or a per-instance figure (shapes, dtypes, FLOPs,
Tensor Core eligibility) and folds the others into a few arrays
(:mod:`perfguard.analysis.cpu_only`); the reports are formed from both. Each
test compares them with the same aggregations over every instance's row
(``Analysis.instances``, built by the same steps on every op range), dtypes
included, on every shared capture and on restricted iteration windows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from kineto_builder import KinetoBuilder
from pandas.testing import assert_frame_equal

import perfguard
from perfguard.analysis.call_sites import with_call_sites
from perfguard.analysis.groups import aggregate_groups
from perfguard.analysis.ops import aggregate_op_types, aggregate_ops
from perfguard.report import ALL_REPORTS, write_reports


def _same_as_every_row(a: perfguard.Analysis) -> None:
    kept, fold = a.kept_instances, a.cpu_only
    assert fold is not None
    full = a.instances
    assert len(full) == len(kept) + len(fold)
    # the kept rows are the whole table's rows of those instances, value for value
    if len(kept):  # (an empty table's column types say nothing)
        sub = full[full["instance"].isin(kept["instance"])].reset_index(drop=True)
        # (coded text: the same values, each table's categories those it holds)
        assert_frame_equal(sub, kept, check_categorical=False)
    # call sites: from the kept rows and the fold, the same as from every row
    every = with_call_sites(aggregate_ops(full), a.trace.ranges, full, None)
    assert_frame_equal(every, a.ops)
    assert_frame_equal(aggregate_op_types(full), aggregate_op_types(kept, fold))
    assert_frame_equal(
        aggregate_groups(a.trace, a.activities, full),
        aggregate_groups(a.trace, a.activities, kept, fold),
    )
    ranged = full[full["instance"] >= 0]
    calls = ranged.dropna(subset=["iteration"]).groupby(["rank", "iteration"]).size()
    got = a.iterations.set_index(["rank", "iteration"])["op_calls"]
    want = calls.reindex(got.index, fill_value=0).astype(np.int64)
    assert got.to_numpy().tolist() == want.to_numpy().tolist()
    assert a.summary.op_instances == len(ranged)
    assert a.summary.unique_ops == ranged["op_key"].nunique()


def test_nsys_figures_are_those_of_every_row(nsys_file: Path, cached_trace) -> None:
    _same_as_every_row(perfguard.analyze(cached_trace(nsys_file)))


def test_kineto_figures_are_those_of_every_row(kineto_file: Path, cached_trace) -> None:
    _same_as_every_row(perfguard.analyze(cached_trace(kineto_file)))


def test_a_restricted_window_folds_only_its_iterations(fixture_file, cached_trace) -> None:
    trace = cached_trace(fixture_file("kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"))
    whole = perfguard.analyze(trace)
    assert len(whole.window) >= 3
    first = int(whole.window["iteration"].min())
    a = perfguard.analyze(trace, iter_start=first + 1, iter_stop=first + 1)
    assert a.cpu_only is not None and 0 < len(a.cpu_only) < len(whole.cpu_only)
    assert set(a.cpu_only.iteration.tolist()) == {first + 1}
    _same_as_every_row(a)


def test_emit_nvtx_ranges_without_gpu_work_are_folded_and_reports_never_need_every_row(
    fixture_file, cached_trace, tmp_path: Path
) -> None:
    """The torchrun export is emit_nvtx dense: most op ranges launch nothing. The
    reports (every table, the HTML page) are written from the kept rows and the
    fold alone: every instance's row is never built."""
    path = "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite"
    a = perfguard.analyze(cached_trace(fixture_file(path)))
    assert a.cpu_only is not None and len(a.cpu_only) > len(a.kept_instances)
    # a folded instance launched nothing and carries no shapes
    folded_ids = a.trace.ranges["range_id"].to_numpy()[a.cpu_only.range_row]
    assert not np.isin(folded_ids, a.activities["range_id"].to_numpy()).any()
    assert a.trace.ranges["input_shapes"].iloc[a.cpu_only.range_row].isna().all()
    write_reports(a, tmp_path, reports=ALL_REPORTS, formats=["csv", "json", "html"])
    assert "instances" not in vars(a)  # the cached property was never computed
    _same_as_every_row(a)


def test_an_op_type_missing_on_its_first_calls_is_taken_from_a_later_call(
    tmp_path: Path,
) -> None:
    """The first non-missing op type of an op wins, whichever of the kept and
    folded instances holds it: user annotations have none, an op named like one
    of them later does."""
    b = KinetoBuilder()
    b.op("ProfilerStep#0", 0, 100, cat="user_annotation")
    b.op("block", 5, 10, cat="user_annotation")  # CPU only: folded, no op type
    b.op("block", 20, 10, cat="user_annotation")
    b.op("aten::mm", 40, 20, args={"Input Dims": [[4, 4], [4, 4]], "Input type": ["float"] * 2})
    b.launch((42, 2), (50, 5), kernel="gemm")
    b.op("aten::relu", 70, 5)  # CPU only, folded
    b.launch((90, 1), (95, 2), kernel="stray")
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "t.json")))
    assert a.cpu_only is not None and len(a.cpu_only) >= 2
    _same_as_every_row(a)
    relu = a.ops.set_index("op_name").loc["aten::relu"]
    assert relu["calls"] == 1 and relu["gpu_time_total"] == 0 and relu["cpu_time_total"] == 5000


def test_a_capture_with_no_gpu_work_folds_every_op(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.op("ProfilerStep#0", 0, 100, cat="user_annotation")
    b.op("aten::add", 10, 20)
    b.op("aten::mul", 40, 5)
    b.op("ProfilerStep#1", 100, 100, cat="user_annotation")
    b.op("aten::add", 110, 30)
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "cpu.json")))
    assert a.kept_instances.empty and a.cpu_only is not None and len(a.cpu_only) == 3
    _same_as_every_row(a)
    add = a.ops.set_index("op_name").loc["aten::add"]
    assert (add["calls"], add["cpu_time_total"], add["cpu_time_min"]) == (2, 50_000, 20_000)
    assert a.iterations["op_calls"].tolist() == [2, 1]
    assert pd.isna(add["data_type"]) and not add["tc_eligible"]
