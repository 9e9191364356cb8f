"""``perfguard analyze`` end to end: real subprocesses on real captures.

Each command line runs once per session (``cli``), then several tests read
what it printed and wrote. Expected figures come from the library in-process
(the terminal summary), from DLProf's column lists (the headers), and from
walking the capture itself with gzip+json or sqlite3 (kernel GPU time).
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

import perfguard
from perfguard.cli import build_parser
from perfguard.report.dlprof import (
    DETAIL_COLUMNS,
    GROUP_COLUMNS,
    ITERATION_COLUMNS,
    KERNEL_COLUMNS,
    OP_TYPE_COLUMNS,
    RANK_COLUMNS,
    SUMMARY_ROWS,
    TENSOR_COLUMNS,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "captures" / "a100_alexnet_tiny_cudasync.pt.trace.json.gz"
SAXPY = "nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite"
A100_STEPS = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"  # ProfilerStep#4..6
ALL_REPORTS = (
    "summary",
    "detail",
    "iteration",
    "kernel",
    "tensor",
    "op_type",
    "group_node",
    "expert_systems",
    "rank",
)
TIMEOUT = 180

HEADERS = {
    "summary": ["Metric", "Value"],
    "detail": list(DETAIL_COLUMNS.values()),
    "iteration": list(ITERATION_COLUMNS.values()),
    "kernel": list(KERNEL_COLUMNS.values()),
    "tensor": list(TENSOR_COLUMNS.values()),
    "op_type": list(OP_TYPE_COLUMNS.values()),
    "group_node": list(GROUP_COLUMNS.values()),
    "expert_systems": ["Check", "Severity", "Problem", "Evidence", "Recommendation"],
    "rank": list(RANK_COLUMNS.values()),
}


def console_script() -> Path:
    """The ``perfguard`` script pip installed next to this interpreter."""
    return Path(sys.executable).parent / ("perfguard.exe" if os.name == "nt" else "perfguard")


class Run:
    """One finished ``perfguard`` command and its output folder."""

    def __init__(self, proc: subprocess.CompletedProcess, out: Path) -> None:
        self.proc, self.out = proc, out
        self.stdout, self.stderr, self.returncode = proc.stdout, proc.stderr, proc.returncode

    def files(self) -> list[str]:
        return sorted(p.name for p in self.out.iterdir()) if self.out.exists() else []

    def csv_rows(self, base: str, report: str) -> list[list[str]]:
        with open(self.out / f"{base}_{report}.csv", newline="", encoding="utf-8") as fh:
            return list(csv.reader(fh))

    def json(self, base: str, report: str):
        return json.loads((self.out / f"{base}_{report}.json").read_text(encoding="utf-8"))

    def summary_figures(self) -> dict[str, str]:
        """``  Key    value`` lines of the terminal summary."""
        block = self.stdout.split("\n\n", 1)[0].splitlines()
        assert block[0] == "perfguard summary", self.stdout
        return dict(re.match(r"  (\S.*?)\s{2,}(\S.*)$", line).groups() for line in block[1:])


@pytest.fixture(scope="session")
def cli(tmp_path_factory: pytest.TempPathFactory):
    """``cli(*args, script=False)``: run ``perfguard`` once per argument list; args may use
    ``{out}`` for a fresh output folder."""
    cache: dict[tuple, Run] = {}

    def run(*args: str | Path, script: bool = False) -> Run:
        key = (script, *map(str, args))
        if key not in cache:
            out = tmp_path_factory.mktemp("cli") / "reports"
            argv = [str(a).replace("{out}", str(out)) for a in args]
            cmd = [str(console_script())] if script else [sys.executable, "-m", "perfguard"]
            proc = subprocess.run(
                cmd + argv, capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO
            )
            cache[key] = Run(proc, out)
        return cache[key]

    return run


def _num(v: object) -> object:
    """A CSV cell or JSON value, normalised so both formats compare: None, float or text."""
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        return str(v)
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(v)
    return None if math.isnan(f) else f


def assert_same_rows(csv_rows: list[list[str]], records: list[dict]) -> None:
    header, body = csv_rows[0], csv_rows[1:]
    assert len(body) == len(records)
    for i, (row, rec) in enumerate(zip(body, records, strict=True)):
        assert list(rec) == header, f"row {i}: JSON keys differ from the CSV header"
        for col, a in zip(header, row, strict=True):
            x, y = _num(a), _num(rec[col])
            if isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9), (i, col, a, rec[col])
            else:
                assert x == y, (i, col, a, rec[col])


@functools.lru_cache(maxsize=4)
def kineto_events(path: Path) -> list[dict]:
    """The trace's events with µs numbers read exactly (``4458676639291.351`` as a Decimal:
    a float would lose the last ns of an epoch timestamp). Cached: do not mutate."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh, parse_float=Decimal)["traceEvents"]


def ns(us: int | Decimal) -> int:
    exact = Decimal(us) * 1000
    assert exact == exact.to_integral_value(), f"{us} µs is not a whole number of ns"
    return int(exact)


def kineto_kernel_durations_ns(path: Path) -> list[int]:
    """Every kernel's duration, walking the trace JSON directly (``dur`` is in µs)."""
    events = kineto_events(path)
    return [ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


# ------------------------------------------------------------- the shipped example capture


@pytest.fixture(scope="module")
def example_run(cli) -> Run:
    return cli("analyze", "--database", EXAMPLE, "--output-path", "{out}")


@pytest.fixture(scope="module")
def example_analysis():
    return perfguard.analyze(perfguard.load_trace(EXAMPLE))


def test_example_succeeds_quietly(example_run: Run) -> None:
    assert example_run.returncode == 0, example_run.stderr
    assert example_run.stderr == ""


def test_example_writes_every_report_and_nothing_else(example_run: Run) -> None:
    expected = [f"dlprof_{r}.{f}" for r in ALL_REPORTS for f in ("csv", "json")]
    expected.append("dlprof_report.html")
    assert example_run.files() == sorted(expected)
    listed = example_run.stdout.split("Reports written:\n", 1)[1].split()
    assert listed == [str(example_run.out / name) for name in expected]


def test_example_terminal_summary_matches_the_library(example_run: Run, example_analysis) -> None:
    s = example_analysis.summary
    shown = example_run.summary_figures()
    assert shown["Capture Format"] == s.capture_format == "kineto-json modern"
    assert int(shown["Kernels"]) == int(s.kernels) == 79
    assert int(shown["Unique Ops"]) == int(s.unique_ops)
    assert float(shown["Total Kernel Time (ms)"].replace(",", "")) == pytest.approx(
        s.kernel_time / 1e6, abs=5e-4
    )
    assert float(shown["Wall Clock Time (ms)"].replace(",", "")) == pytest.approx(
        s.wall_time / 1e6, abs=5e-4
    )
    assert float(shown["GPU Utilization (%)"]) == pytest.approx(s.gpu_utilization, abs=5e-3)
    tc = s.tc_utilization
    assert float(shown["Tensor Core Utilization (%)"]) == pytest.approx(tc, abs=5e-3)
    top = example_analysis.ops.iloc[0]
    table = example_run.stdout.split("ops by GPU time\n", 1)[1].splitlines()
    assert table[1].split()[-4:-2] == [str(top["calls"]), f"{top['gpu_time_total'] / 1e6:,.3f}"]


@pytest.mark.parametrize("report", ALL_REPORTS)
def test_example_csv_header_is_dlprofs(example_run: Run, report: str) -> None:
    assert example_run.csv_rows("dlprof", report)[0] == HEADERS[report]


def test_dlprof_header_prefixes() -> None:
    """DLProf's own column order, spelled out (not read back from dlprof.py)."""
    assert HEADERS["detail"][:9] == [
        "Op ID",
        "Op Name",
        "Direction",
        "Op Type",
        "No. Calls",
        "TC Eligibility",
        "Using TC",
        "Total CPU Time (ns)",
        "Avg. CPU Time (ns)",
    ]
    assert HEADERS["kernel"][:5] == ["Kernel Name", "Op ID", "Op Name", "Direction", "Uses TC"]
    assert "No. Calls" in HEADERS["kernel"]


@pytest.mark.parametrize("report", ["detail", "iteration", "kernel"])
def test_example_csv_and_json_hold_the_same_rows(example_run: Run, report: str) -> None:
    rows = example_run.csv_rows("dlprof", report)
    assert_same_rows(rows, example_run.json("dlprof", report))
    if report != "iteration":  # the example has no ProfilerStep ranges
        assert len(rows) > 1


def test_example_summary_csv_and_json_agree(example_run: Run, example_analysis) -> None:
    rows = example_run.csv_rows("dlprof", "summary")[1:]
    values = example_run.json("dlprof", "summary")
    assert [r[0] for r in rows] == list(values) == list(SUMMARY_ROWS.values())
    for metric, text in rows:
        x, y = _num(text), _num(values[metric])
        if isinstance(x, float) and isinstance(y, float):
            assert math.isclose(x, y, rel_tol=1e-9), metric
        else:
            assert x == y, metric


def test_example_kernel_gpu_time_is_every_kernel(example_run: Run) -> None:
    durations = kineto_kernel_durations_ns(EXAMPLE)
    rows = example_run.csv_rows("dlprof", "kernel")
    col = rows[0].index
    assert sum(int(r[col("No. Calls")]) for r in rows[1:]) == len(durations) == 79
    assert sum(int(r[col("Total GPU Time (ns)")]) for r in rows[1:]) == sum(durations)


def test_dlprof_spellings_and_console_script_give_identical_reports(cli, example_run: Run) -> None:
    alias = cli(
        "analyze",
        "--database",
        EXAMPLE,
        "--output_path",
        "{out}",
        "--file_prefix",
        "alexnet",
        script=True,
    )
    assert alias.returncode == 0, alias.stderr
    assert alias.files() == sorted(
        [f"alexnet_{r}.{f}" for r in ALL_REPORTS for f in ("csv", "json")] + ["alexnet_report.html"]
    )
    for name in example_run.files():
        ours = (alias.out / name.replace("dlprof_", "alexnet_", 1)).read_bytes()
        assert ours == (example_run.out / name).read_bytes(), name


# ------------------------------------------------------------------------- an nsys export


@pytest.fixture(scope="module")
def saxpy(fixture_file) -> Path:
    return fixture_file(SAXPY)


@pytest.fixture(scope="module")
def saxpy_run(cli, saxpy: Path) -> Run:
    return cli(
        "analyze",
        "--database",
        saxpy,
        "--output-path",
        "{out}",
        "--reports",
        "detail,kernel",
        "--formats",
        "csv",
        "--base-name",
        "saxpy",
    )


def test_nsys_run_writes_only_the_requested_reports(saxpy_run: Run) -> None:
    assert saxpy_run.returncode == 0, saxpy_run.stderr
    assert saxpy_run.stderr == ""
    assert saxpy_run.files() == ["saxpy_detail.csv", "saxpy_kernel.csv"]


def test_nsys_terminal_summary_matches_the_library(saxpy_run: Run, saxpy: Path, cached_trace):
    s = perfguard.analyze(cached_trace(saxpy)).summary
    shown = saxpy_run.summary_figures()
    assert shown["Capture Format"] == s.capture_format
    assert shown["Capture Format"].startswith("nsys-sqlite 2022.2.1")
    assert int(shown["Kernels"]) == int(s.kernels) == 5
    assert shown["GPU Names"] == s.gpu_names == "NVIDIA A100-SXM4-40GB"
    assert float(shown["Total Memory Op Time (ms)"].replace(",", "")) == pytest.approx(
        s.memop_time / 1e6, abs=5e-4
    )


def test_nsys_headers_and_kernel_time(saxpy_run: Run, saxpy: Path) -> None:
    detail = saxpy_run.csv_rows("saxpy", "detail")
    assert detail[0] == HEADERS["detail"] and len(detail) > 1
    rows = saxpy_run.csv_rows("saxpy", "kernel")
    assert rows[0] == HEADERS["kernel"]
    con = sqlite3.connect(f"file:{saxpy}?mode=ro", uri=True)
    count, total = con.execute(
        'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL'
    ).fetchone()
    con.close()
    col = rows[0].index
    assert sum(int(r[col("No. Calls")]) for r in rows[1:]) == count == 5
    assert sum(int(r[col("Total GPU Time (ns)")]) for r in rows[1:]) == total


# ------------------------------------------------- iterations on a ProfilerStep capture


@pytest.fixture(scope="module")
def steps(fixture_file) -> Path:
    return fixture_file(A100_STEPS)


@pytest.fixture(scope="module")
def steps_events(steps: Path) -> dict[str, dict]:
    events = kineto_events(steps)
    return {e["name"]: e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}


@pytest.fixture(scope="module")
def window_run(cli, steps: Path) -> Run:
    return cli(
        "analyze",
        "--database",
        steps,
        "--output-path",
        "{out}",
        "--iter-start",
        "5",
        "--iter-stop",
        "6",
        "--reports",
        "iteration,kernel",
        "--base-name",
        "steps",
    )


def test_iteration_window_restricts_the_iteration_report(window_run: Run, steps_events) -> None:
    assert window_run.returncode == 0, window_run.stderr
    assert sorted(steps_events) == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    assert window_run.files() == sorted(
        [f"steps_{r}.{f}" for r in ("iteration", "kernel") for f in ("csv", "json")]
        + ["steps_report.html"]
    )
    rows = window_run.csv_rows("steps", "iteration")
    assert rows[0] == HEADERS["iteration"]
    col = rows[0].index
    assert [int(r[col("Iteration")]) for r in rows[1:]] == [5, 6]
    for r in rows[1:]:
        step = steps_events[f"ProfilerStep#{r[col('Iteration')]}"]
        assert int(r[col("Start Time (ns)")]) == ns(step["ts"])
        assert int(r[col("Duration (ns)")]) == ns(step["dur"])
    assert_same_rows(rows, window_run.json("steps", "iteration"))
    assert window_run.summary_figures()["Iteration Range"] == "5-6"


def test_iteration_window_restricts_the_kernel_report(
    window_run: Run, steps: Path, cached_trace
) -> None:
    rows = window_run.csv_rows("steps", "kernel")
    col = rows[0].index
    calls = sum(int(r[col("No. Calls")]) for r in rows[1:])
    gpu = sum(int(r[col("Total GPU Time (ns)")]) for r in rows[1:])
    windowed = perfguard.analyze(cached_trace(steps), iter_start=5, iter_stop=6).kernels
    assert calls == int(windowed["calls"].sum())
    assert gpu == int(windowed["gpu_time_total"].sum())
    everything = kineto_kernel_durations_ns(steps)
    assert 0 < calls < len(everything) and 0 < gpu < sum(everything)
    assert_same_rows(rows, window_run.json("steps", "kernel"))


def test_iteration_window_with_dlprof_spellings(cli, window_run: Run, steps: Path) -> None:
    alias = cli(
        "analyze",
        "--database",
        steps,
        "--output_path",
        "{out}",
        "--iter_start",
        "5",
        "--iter_stop",
        "6",
        "--reports",
        "iteration,kernel",
        "--file_prefix",
        "steps",
    )
    assert alias.returncode == 0, alias.stderr
    assert alias.files() == window_run.files()
    for name in window_run.files():
        assert (alias.out / name).read_bytes() == (window_run.out / name).read_bytes(), name


def test_float_microsecond_kernel_times_sum_exactly(cli, steps: Path) -> None:
    """``dur`` here is float µs with ns decimals (41.407): no ns may be lost or gained."""
    assert any(isinstance(e.get("dur"), Decimal) for e in kineto_events(steps))
    run = cli(
        "analyze",
        "--database",
        steps,
        "--output-path",
        "{out}",
        "--reports",
        "kernel",
        "--formats",
        "csv",
    )
    assert run.returncode == 0, run.stderr
    assert run.files() == ["dlprof_kernel.csv"]
    durations = kineto_kernel_durations_ns(steps)
    rows = run.csv_rows("dlprof", "kernel")
    col = rows[0].index
    assert sum(int(r[col("No. Calls")]) for r in rows[1:]) == len(durations) == 2700
    assert sum(int(r[col("Total GPU Time (ns)")]) for r in rows[1:]) == sum(durations)


# ------------------------------------------------------------------ options, help, script


def test_every_dlprof_spelling_parses_like_ours() -> None:
    common = ["analyze", "--database", "run.sqlite", "--reports", "detail", "--formats", "csv"]
    ours = build_parser().parse_args(
        common
        + [
            "--key-node",
            "train_step",
            "--iter-start",
            "3",
            "--iter-stop",
            "9",
            "--output-path",
            "out",
            "--base-name",
            "resnet",
        ]
    )
    for spelling in (
        [
            "--key_node",
            "train_step",
            "--iter_start",
            "3",
            "--iter_stop",
            "9",
            "--output_path",
            "out",
            "--file_prefix",
            "resnet",
        ],
        [
            "--key_node",
            "train_step",
            "--iter_start",
            "3",
            "--iter_stop",
            "9",
            "--output_path",
            "out",
            "--base_name",
            "resnet",
        ],
    ):
        assert vars(build_parser().parse_args(common + spelling)) == vars(ours)
    assert (ours.key_node, ours.iter_start, ours.iter_stop) == ("train_step", 3, 9)
    assert (ours.output_path, ours.base_name, ours.force) == ("out", "resnet", False)
    assert (ours.reports, ours.formats) == (["detail"], ["csv"])


def test_defaults_are_all_reports_both_formats_dlprof_prefix() -> None:
    args = build_parser().parse_args(["analyze", "--database", "x"])
    assert args.reports == list(ALL_REPORTS) and args.formats == ["csv", "json", "html"]
    assert (args.base_name, args.output_path, args.force) == ("dlprof", ".", False)
    assert build_parser().parse_args(["analyze", "-d", "x", "--reports", "all"]).reports == list(
        ALL_REPORTS
    )


def test_module_help(cli) -> None:
    run = cli("--help")
    assert run.returncode == 0, run.stderr
    assert "analyze" in run.stdout and run.stderr == ""


def test_console_script_exists_and_shows_analyze_help(cli) -> None:
    assert console_script().is_file(), f"no console script at {console_script()}"
    assert shutil.which(str(console_script())), "console script is not executable"
    run = cli("analyze", "--help", script=True)
    assert run.returncode == 0, run.stderr
    options = [
        "--database",
        "--key-node",
        "--iter-start",
        "--iter-stop",
        "--reports",
        "--formats",
        "--output-path",
        "--base-name",
        "--force",
        "--file_prefix",
    ]
    for option in options:
        assert option in run.stdout, option


def test_console_script_version(cli) -> None:
    run = cli("--version", script=True)
    assert run.returncode == 0
    assert run.stdout.strip() == f"perfguard {perfguard.__version__}"
