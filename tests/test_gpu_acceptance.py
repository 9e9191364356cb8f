"""The GPU acceptance run (``benchmarks/gpu_acceptance.py``) in its dry mode on the CPU.

The real run gets one try on a lent GPU, so every step is exercised here first: the
examples under ``pytest --perfguard`` (save, A/A, an injected change judged against the
saved commit), the model traces and ``perfguard analyze`` on them, ``torch.compile``
where a C++ compiler is installed, the noise table and the packing into what the
device sends back (at most 8 files of 16 MB, plain names).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from gpu_acceptance_run import load_script as _load
from gpu_acceptance_run import run_dry

pytest.importorskip("torch")

NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _run(out: Path, work: Path, *extra: str, timeout: float = 400) -> Any:
    return run_dry(out, work, "--suite", "examples", *extra, timeout=timeout)


@pytest.fixture(scope="module")
def dry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the sessions' baselines need commits")
    tmp = tmp_path_factory.mktemp("acceptance")
    # one injected change (the +5 % matmul: it also exercises the sizing from the traces
    # step); the dry default adds the .item() one, ~15 s more
    done = _run(tmp / "out", tmp / "work", "--changes", "work5")
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    return tmp / "out", summary, done.stdout + done.stderr + f"\nrc {done.returncode}"


def test_every_step_ran_or_says_why_not(dry: tuple[Path, dict[str, Any], str]) -> None:
    out, summary, log = dry
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == [
        "env",
        "save",
        "traces",
        "graph_capture",
        "aa1",
        "noise",
        "work5",
        "compile",
        "compile_ro",
        "ncu",
    ], log
    for s in steps.values():
        assert s["status"] in ("ok", "skipped"), (s, log[-3000:])
        assert s["status"] == "ok" or s["note"], s
    for name in ("env", "save", "traces", "aa1", "noise", "work5"):
        assert steps[name]["status"] == "ok", (steps[name], log[-3000:])
    has_cxx = shutil.which("c++") or shutil.which("g++")
    assert steps["compile"]["status"] == ("ok" if has_cxx else "skipped")
    assert "GPU" in steps["graph_capture"]["note"] and "GPU" in steps["ncu"]["note"]
    assert summary["finished"] and log.rstrip().endswith("rc 0")
    md = (out / "summary.md").read_text()
    for name in steps:
        assert f"| {name} |" in md


def test_aa_reads_no_regression_and_the_change_is_caught(
    dry: tuple[Path, dict[str, Any], str],
) -> None:
    _, summary, log = dry
    sessions = {s["name"]: s for s in summary["sessions"]}
    assert set(sessions) == {"save", "aa1", "work5"}
    for t in sessions["aa1"]["tests"]:
        assert t["outcome"] != "regressed", t
        assert t["outcome"] in ("unchanged", "noisy", "improved"), t
    (change,) = summary["changes"]
    assert change["change"] == "work5" and change["caught"], change
    # an extra matmul of ~5 % of the step: its FLOPs always count (against the step's); its
    # op calls only where the capture saw it take the tolerance's share of the step's time
    assert {"calls", "flops"} & set(change["gates_fired"]) and change["matmul_n"], change
    # the untouched test is judged too, and it is not a false alarm
    assert "regressed" not in change["others"].values(), change
    noise = summary["noise"]["tests"]
    assert set(noise) == {t["nodeid"] for t in sessions["save"]["tests"]}
    for row in noise.values():
        assert row["sessions"] == 2 and row["sd_over_mean_pct"] is not None
        assert row["assumed_prior_sd_pct"] == 3.0  # wall time on the CPU
    assert summary["noise"]["assumed"]["timing.PRIOR_RUN_SD"]["gpu_time"] == 0.01


def test_packed_files_fit_what_the_device_returns(dry: tuple[Path, dict[str, Any], str]) -> None:
    out, summary, _ = dry
    files = sorted(p for p in out.iterdir())
    assert [p.name for p in files] == [
        "artifacts.tar.gz",
        "fixtures.tar.gz",
        "log.txt",
        "summary.json",
        "summary.md",
    ]
    for p in files:
        assert p.is_file() and NAME.match(p.name) and p.stat().st_size <= 16 * 1024 * 1024
    with tarfile.open(out / "fixtures.tar.gz") as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("fixtures/manifest.json"))  # type: ignore[arg-type]
    assert "fixtures/eager.pt.trace.json.gz" in names and "fixtures/mm_sizes.json" in names
    eager = next(t for t in manifest["traces"] if t["name"] == "eager")
    assert eager["iterations"] == 3 and "perfguard.iteration" in eager["regions"]
    assert eager["analyze"]["rc"] == 0 and eager["input_shape"] == [8, 64, 256]
    with tarfile.open(out / "artifacts.tar.gz") as tar:
        names = tar.getnames()
    for session in ("save", "aa1", "work5"):
        assert f"artifacts/sessions/{session}/results.json" in names
    assert "artifacts/analyze/eager_kernel.csv" in names
    assert summary["packed"]["other_files_in_out"] == []


def test_a_short_deadline_skips_with_a_note(tmp_path: Path) -> None:
    done = _run(tmp_path / "out", tmp_path / "work", "--deadline", "1", timeout=120)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["save"]["status"] == "skipped" and "deadline" in steps["save"]["note"]
    assert all(s["status"] == "skipped" for n, s in steps.items() if n != "env"), steps
    assert done.returncode in (0, 1) and (tmp_path / "out" / "artifacts.tar.gz").is_file()


def test_packing_leaves_out_session_captures_first(tmp_path: Path) -> None:
    acc = _load()
    folder = tmp_path / "artifacts"
    big = {
        "sessions/aa1/captures/a.gz": 300_000,
        "sessions/save/captures/s.gz": 200_000,
        "sessions/aa1/results.json": 250_000,
        "small.txt": 100,
    }
    for rel, size in big.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(os.urandom(size))  # incompressible
    packed = acc.pack_folder(folder, tmp_path / "a.tar.gz", 500_000)
    assert len(packed["left_out_too_big"]) == 1
    assert packed["left_out_too_big"][0].startswith("sessions/aa1/captures/a.gz")
    packed = acc.pack_folder(folder, tmp_path / "a.tar.gz", 250_000)
    assert [x.split()[0] for x in packed["left_out_too_big"]] == [
        "sessions/aa1/captures/a.gz",
        "sessions/aa1/results.json",
    ]
    assert packed["bytes"] <= 250_000


def test_kernel_word_is_a_plain_identifier() -> None:
    acc = _load()
    name = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1>"
    assert acc.kernel_word(name) == "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1"
    assert acc.kernel_word("") == "gemm"


#: the ``ncu`` entry of the real run's summary.json (H200, 2026-11-26; argv and tail cut):
#: the attempt that read counters, then the untried fallback's arguments, which made
#: ``markdown`` crash at the end of the real run (``'list' object has no attribute 'get'``)
REAL_NCU: list[Any] = [
    {
        "argv": [
            "ncu",
            "--target-processes",
            "all",
            "--clock-control",
            "none",
            "--section",
            "SpeedOfLight",
            "--csv",
            "--kernel-name-base",
            "demangled",
            "--kernel-name",
            "regex:nvjet_sm90_tst_64x24_64x16_2x4_h_bz_bias_TNT",
            "--launch-count",
            "1",
        ],
        "rc": 0,
        "csv_rows": 12,
        "counters_read": True,
        "tail": '"0","1677","python3.12","127.0.0.1",'
        '"nvjet_sm90_tst_64x24_64x16_2x4_h_bz_bias_TNT"',
    },
    ["--launch-skip", "20", "--launch-count", "1"],
]


@pytest.mark.parametrize("ncu", [REAL_NCU, REAL_NCU[:1]], ids=["real-run", "fixed"])
def test_the_summary_renders_an_ncu_entry_as_the_real_run_wrote_it(
    dry: tuple[Path, dict[str, Any], str], ncu: list[Any]
) -> None:
    acc = _load()
    _, summary, _ = dry
    md = acc.markdown({**summary, "ncu": ncu})
    assert md.count("ncu: ") == 1
    assert "ncu: rc 0, 12 CSV rows, counters read: True" in md
