"""Multi-rank runs: per-rank files read in worker processes, the rank report, the straggler.

Checked on the real 8-rank DLRM set: the directory read in parallel equals
the sequential read, every figure of the rank report equals the single
analysis of that rank's file, the compute time equals HTA's temporal
breakdown (an independent tool), and the straggler is one HTA named.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
import time
from pathlib import Path

import pandas as pd
import pytest

import perfguard
from perfguard.analysis.ranks import rank_table, straggler
from perfguard.commands.progress import Progress
from perfguard.errors import TraceError
from perfguard.report.html import render_analysis_html
from perfguard.trace import load_trace
from perfguard.trace.kineto import read_kineto_dir
from perfguard.trace.model import SCHEMA

DLRM = "kineto/v100_dlrm_8rank_nccl_shapes"


@pytest.fixture(scope="module")
def dlrm_dir(fixture_file) -> Path:
    return fixture_file(DLRM)


@pytest.fixture(scope="module")
def dlrm(dlrm_dir: Path) -> perfguard.Analysis:
    return perfguard.analyze(load_trace(dlrm_dir, jobs=2))


def test_parallel_read_equals_sequential(dlrm_dir: Path) -> None:
    """Two worker processes give the same Trace as the reader's own sequential merge."""
    seen: list[tuple[int, int, int]] = []
    parallel = load_trace(dlrm_dir, jobs=2, on_rank=lambda *a: seen.append(a))
    sequential = read_kineto_dir(dlrm_dir)
    for table in SCHEMA:
        pd.testing.assert_frame_equal(getattr(parallel, table), getattr(sequential, table))
    assert parallel.meta == sequential.meta
    assert [s[:2] for s in seen] == [(i, 8) for i in range(1, 9)]
    events = sum(len(getattr(parallel, t)) for t in ("ranges", "api_calls", "kernels", "memops"))
    assert seen[-1][2] == events


def test_rank_report_equals_single_rank_analyses(dlrm: perfguard.Analysis, dlrm_dir: Path) -> None:
    table = rank_table(dlrm).set_index("rank")
    assert list(table.index) == list(range(8))
    for f in sorted(dlrm_dir.glob("rank-*.pt.trace.json.gz")):
        single = perfguard.analyze(load_trace(f))
        r = int(f.name.split("-")[1].split(".")[0])
        row = table.loc[r]
        s = single.summary
        acts = single.activities
        kernel = acts["activity"] == "kernel"
        dur = acts["end"] - acts["start"]
        nccl = kernel & acts["name"].str.startswith("ncclKernel_")  # the set's only NCCL names
        assert row["kernel_time"] == s.kernel_time
        assert row["memop_time"] == s.memop_time
        assert row["gpu_busy"] == s.gpu_busy
        assert row["wall_time"] == s.wall_time
        assert row["gpus"] == s.gpus_used == 1
        assert row["comm_time"] == int(dur[nccl].sum()) > 0
        assert row["compute_time"] == int(dur[kernel & ~nccl].sum())
        assert row["iteration_time_avg"] == s.iteration_time_avg
        assert row["idle_time"] == row["wall_time"] - row["gpu_busy"] >= 0
        assert 0 <= row["idle_pct"] <= 100
    # the per-rank totals add up to the run's
    assert table["kernel_time"].sum() == dlrm.summary.kernel_time
    assert table["gpu_busy"].sum() == dlrm.summary.gpu_busy
    assert table["wall_time"].max() == dlrm.summary.wall_time


def test_compute_time_matches_hta(dlrm: perfguard.Analysis, fixtures_dir: Path) -> None:
    """HTA 0.5.0's temporal breakdown of the same files: compute (non-NCCL kernel) time, µs."""
    ref = fixtures_dir / "kineto/hta_reference/v100_dlrm_8rank__temporal_breakdown.csv"
    with open(ref) as fh:
        hta = {int(r["rank"]): float(r["compute_time(us)"]) for r in csv.DictReader(fh)}
    table = rank_table(dlrm).set_index("rank")
    assert {r: table.at[r, "compute_time"] / 1000 for r in table.index} == hta


def test_straggler_is_one_hta_names(dlrm: perfguard.Analysis) -> None:
    """HTA's get_potential_stragglers returned ranks [2, 7] on this set (MANIFEST.md)."""
    table = rank_table(dlrm)
    found = straggler(table)
    assert found is not None and found.by == "comm_time"
    assert found.rank in (2, 7) and found.rank == int(table.loc[table["straggler"], "rank"].iloc[0])
    comm = table.set_index("rank")["comm_time"]
    assert found.rank == comm.idxmin()
    assert found.imbalance_pct == pytest.approx(100 * (comm.max() - comm.min()) / comm.max())
    assert (table["comm_wait"] >= 0).all() and table.set_index("rank").at[
        found.rank, "comm_wait"
    ] == 0


def test_single_rank_has_no_straggler(fixture_file) -> None:
    a = perfguard.analyze(
        load_trace(fixture_file("kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"))
    )
    table = rank_table(a)
    assert len(table) == 1 and straggler(table) is None and not table["straggler"].any()
    # one rank's figures come from the summary and the kernel report: check them on the events
    acts = a.activities
    kernel = acts["activity"] == "kernel"
    dur = acts["end"] - acts["start"]
    nccl = kernel & acts["name"].str.startswith("ncclKernel_")
    row = table.iloc[0]
    assert row["comm_time"] == int(dur[nccl].sum()) > 0
    assert row["compute_time"] == int(dur[kernel & ~nccl].sum()) > 0
    assert row["memop_time"] == int(dur[~kernel].sum()) > 0
    assert row["gpu_time"] == int(dur.sum())
    assert row["iterations"] == len(a.iterations) == 3
    assert 'id="ranks"' not in render_analysis_html(a)


def test_page_shows_ranks_and_straggler(dlrm: perfguard.Analysis) -> None:
    html = render_analysis_html(dlrm)
    assert 'id="ranks"' in html and "Straggler: rank 7" in html
    assert html.count('<tr><td class="n" data-v=') >= 8


def test_directory_of_nsys_exports(tmp_path: Path, fixture_file) -> None:
    """Per-rank nsys exports: ranks from the file names, each rank as its own analysis."""
    files = {
        3: fixture_file("nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite"),
        1: fixture_file("nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite"),
    }
    for rank, src in files.items():
        shutil.copy(src, tmp_path / f"run.rank{rank}.sqlite")
    (tmp_path / "notes.txt").write_text("not a capture")
    merged = perfguard.analyze(load_trace(tmp_path, jobs=2))
    table = rank_table(merged).set_index("rank")
    assert list(table.index) == [1, 3]
    for rank, src in files.items():
        s = perfguard.analyze(load_trace(src)).summary
        assert table.at[rank, "kernel_time"] == s.kernel_time
        assert table.at[rank, "gpu_busy"] == s.gpu_busy
        assert table.at[rank, "wall_time"] == s.wall_time
    assert merged.summary.kernels == sum(
        perfguard.analyze(load_trace(src)).summary.kernels for src in files.values()
    )
    found = straggler(table.reset_index())
    assert found is not None and found.by == "gpu_busy"  # no NCCL kernels to wait in
    assert found.rank == int(table["gpu_busy"].idxmax())


def test_bad_directories(tmp_path: Path, fixture_file) -> None:
    with pytest.raises(TraceError, match="holds no .json, .json.gz or .sqlite"):
        load_trace(tmp_path)
    src = fixture_file("nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite")
    shutil.copy(src, tmp_path / "a_rank0.sqlite")
    shutil.copy(src, tmp_path / "b_rank-0.sqlite")
    with pytest.raises(TraceError, match="rank 0 appears twice"):
        load_trace(tmp_path, jobs=2)
    (tmp_path / "b_rank-0.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x00" * 10)
    with pytest.raises(TraceError, match="b_rank-0.sqlite: truncated SQLite file"):
        load_trace(tmp_path, jobs=2)


def test_cli_prints_straggler_and_writes_rank_report(
    dlrm_dir: Path, tmp_path: Path, capsys
) -> None:
    from perfguard.cli import main

    rc = main(
        [
            "analyze",
            "-d",
            str(dlrm_dir),
            "--output-path",
            str(tmp_path),
            "-q",
            "-j",
            "2",
            "--reports",
            "summary,rank",
            "--formats",
            "csv",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0 and "straggler: rank 7" in out.out and out.err == ""
    with open(tmp_path / "dlprof_rank.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["Straggler"] for r in rows] == ["False"] * 7 + ["True"]
    assert sum(int(r["Kernel Time (ns)"]) for r in rows) == 57407000


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_and_clears() -> None:
    stream = _Tty()
    with Progress(stream, delay=0.0, interval=0.01) as p:
        p.phase("reading", "x.sqlite")
        p.events(1234567, "3/8 ranks")
        # the drawing thread runs every 10 ms; 30 s is only a hang guard for a loaded box
        deadline = time.monotonic() + 30
        while "1,234,567 events read" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    text = stream.getvalue()
    assert "perfguard: reading, 3/8 ranks, 1,234,567 events read" in text
    assert text.endswith("\r")  # cleared: the summary on stdout starts on a clean line
    last = text.rstrip("\r").split("\r")[-1]
    assert last.strip() == ""


def test_progress_silent_when_not_a_tty_or_quiet() -> None:
    for stream, quiet in ((io.StringIO(), False), (_Tty(), True)):
        with Progress(stream, quiet=quiet, delay=0.0, interval=0.01) as p:
            p.phase("analysing")
            time.sleep(0.05)
        assert stream.getvalue() == ""


def test_progress_waits_before_drawing() -> None:
    stream = _Tty()
    with Progress(stream, delay=5.0, interval=0.01) as p:
        p.phase("analysing")
        time.sleep(0.05)
    assert stream.getvalue() == ""


def test_rank_table_empty_trace() -> None:
    a = perfguard.analyze(perfguard.Trace())
    table = rank_table(a)
    assert table.empty and list(table.columns) == list(perfguard.analysis.ranks.COLUMNS)


def test_events_in_an_nsys_export(nsys_file: Path) -> None:
    """The progress line's event count of an export, against a count of the rows."""
    from perfguard.trace.loader import events_in

    conn = sqlite3.connect(f"file:{nsys_file}?mode=ro", uri=True)
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    tables = [f"CUPTI_ACTIVITY_KIND_{t}" for t in ("KERNEL", "RUNTIME", "MEMCPY", "MEMSET")]
    rows = sum(
        conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in [*tables, "NVTX_EVENTS"]
        if t in have
    )
    conn.close()
    assert events_in(nsys_file) == rows > 0
    assert events_in(nsys_file.parent) is None
    assert events_in(nsys_file.parent.parent / "MANIFEST.md") is None


# --- each rank analysed in its own worker (analyze --per-rank) ----------------------


@pytest.fixture(scope="module")
def dlrm_per_rank(dlrm_dir: Path):
    from perfguard.report.rank_workers import AnalysisOptions, analyze_ranks

    options = AnalysisOptions(reports=("summary", "detail", "iteration", "kernel", "rank"))
    return analyze_ranks(dlrm_dir, options, jobs=2)


def test_per_rank_workers_equal_single_rank_analyses(dlrm_per_rank, dlrm_dir: Path) -> None:
    """Each worker's tables are the single analysis of its file, and the rank report's
    totals are the sums of the single-rank analyses, exactly."""
    from perfguard.report.dlprof import TABLES

    run = dlrm_per_rank
    assert sorted(r.rank for r in run.ranks) == list(range(8))
    table = run.table.set_index("rank")
    totals = dict.fromkeys(("kernel", "memop", "busy", "comm", "kernels"), 0)
    for f in sorted(dlrm_dir.glob("rank-*.pt.trace.json.gz")):
        single = perfguard.analyze(load_trace(f))
        r = int(f.name.split("-")[1].split(".")[0])
        mine = next(x for x in run.ranks if x.rank == r)
        assert mine.file == f and mine.peak_rss > 0
        for name in ("detail", "kernel"):
            pd.testing.assert_frame_equal(mine.tables[name], TABLES[name](single))
        got = run.report("kernel")
        pd.testing.assert_frame_equal(
            got[got["Rank"] == r].drop(columns="Rank").reset_index(drop=True),
            TABLES["kernel"](single),
        )
        s = single.summary
        acts = single.activities
        kernel = acts["activity"] == "kernel"
        nccl = kernel & acts["name"].str.startswith("ncclKernel_")
        comm = int((acts["end"] - acts["start"])[nccl].sum())
        assert table.at[r, "kernel_time"] == s.kernel_time
        assert table.at[r, "comm_time"] == comm
        totals["kernel"] += s.kernel_time
        totals["memop"] += s.memop_time
        totals["busy"] += s.gpu_busy
        totals["comm"] += comm
        totals["kernels"] += s.kernels
    assert table["kernel_time"].sum() == totals["kernel"]
    assert table["memop_time"].sum() == totals["memop"]
    assert table["gpu_busy"].sum() == totals["busy"]
    assert table["comm_time"].sum() == totals["comm"]
    summary = run.report("summary").set_index("Metric")
    assert summary.loc["Kernels"].sum() == totals["kernels"]
    assert list(summary.columns) == [f"Rank {r}" for r in range(8)]


def test_per_rank_report_equals_merged_run(dlrm_per_rank, dlrm: perfguard.Analysis) -> None:
    """The rank report of ranks analysed apart equals the merged run's, straggler included."""
    pd.testing.assert_frame_equal(dlrm_per_rank.table, rank_table(dlrm))
    assert dlrm_per_rank.straggler == straggler(rank_table(dlrm))
    merged = dlrm.kernels["gpu_time_total"].sum()
    assert dlrm_per_rank.report("kernel")["Total GPU Time (ns)"].sum() == merged


def test_per_rank_in_process_equals_workers(dlrm_per_rank, dlrm_dir: Path) -> None:
    from perfguard.report.rank_workers import AnalysisOptions, analyze_ranks

    options = AnalysisOptions(reports=("iteration", "kernel"))
    serial = analyze_ranks(dlrm_dir, options, jobs=1)
    pd.testing.assert_frame_equal(serial.table, dlrm_per_rank.table)
    for name in options.reports:
        pd.testing.assert_frame_equal(serial.report(name), dlrm_per_rank.report(name))


def test_worker_count_bounded_by_memory(tmp_path: Path, monkeypatch) -> None:
    from perfguard.trace import loader

    files = []
    for k in range(4):
        f = tmp_path / f"rank{k}.sqlite"
        f.write_bytes(b"\0" * 2**20)
        files.append(f)
    monkeypatch.setattr(loader, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(loader.os, "cpu_count", lambda: 16)
    need = loader.rank_memory(files[0])
    assert need == 200 * 2**20 + 6 * 2**20
    monkeypatch.setattr(loader, "available_memory", lambda: int(2.6 * need / 0.8))
    assert loader.worker_count(files, None) == 2  # memory for two ranks at once
    monkeypatch.setattr(loader, "available_memory", lambda: need // 10)
    assert loader.worker_count(files, None) == 1  # never none
    monkeypatch.setattr(loader, "available_memory", lambda: None)
    assert loader.worker_count(files, None) == 4  # ranks < cores
    assert loader.worker_count(files, 3) == 3  # --jobs is the user's word
    assert loader.available_memory() is None or loader.available_memory() > 0


def test_per_rank_nsys_directory_and_bad_rank(tmp_path: Path, fixture_file) -> None:
    from perfguard.report.rank_workers import AnalysisOptions, analyze_ranks

    src = fixture_file("nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite")
    shutil.copy(src, tmp_path / "run.rank3.sqlite")
    shutil.copy(
        fixture_file("nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite"),
        tmp_path / "run.rank1.sqlite",
    )
    run = analyze_ranks(tmp_path, AnalysisOptions(reports=("summary",)), jobs=2)
    merged = rank_table(perfguard.analyze(load_trace(tmp_path, jobs=2)))
    pd.testing.assert_frame_equal(run.table, merged)
    (tmp_path / "run.rank2.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x00" * 10)
    with pytest.raises(TraceError, match="run.rank2.sqlite: truncated SQLite file"):
        analyze_ranks(tmp_path, jobs=2)
    with pytest.raises(TraceError, match="directory of per-rank captures"):
        analyze_ranks(src)


def test_cli_per_rank(dlrm_dir: Path, tmp_path: Path, capsys) -> None:
    from perfguard.cli import main

    rc = main(
        [
            "analyze",
            "-d",
            str(dlrm_dir),
            "--per-rank",
            "--output-path",
            str(tmp_path),
            "-q",
            "-j",
            "2",
            "--reports",
            "summary,kernel,rank",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0 and "straggler: rank 7" in out.out and out.err == ""
    assert "not html" in out.out and not (tmp_path / "dlprof_report.html").exists()
    with open(tmp_path / "dlprof_rank.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sum(int(r["Kernel Time (ns)"]) for r in rows) == 57407000  # as the merged run
    kernels = pd.read_csv(tmp_path / "dlprof_kernel.csv")
    assert kernels["Total GPU Time (ns)"].sum() == 57407000
    assert set(kernels["Rank"]) == set(range(8))
    assert len(json.loads((tmp_path / "dlprof_summary.json").read_text())) > 10
