"""Timing rounds run with the profiler off on the CPU; one profiled round feeds ops and gates.

Real torch profiler, real sessions, a real store: the loop's protocol
(which steps are captured), the record's rows, and that the verdict's
timing uses only the unprofiled rounds while op samples and counters come
from the profiled one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from perfguard.analysis import analyze  # noqa: E402
from perfguard.baseline.record import profiled_mask, record_from_analysis, timing_mask  # noqa: E402
from perfguard.baseline.store import Store  # noqa: E402
from perfguard.capture import speed  # noqa: E402
from perfguard.capture.capturers import TorchCapturer  # noqa: E402
from perfguard.core import loop  # noqa: E402
from perfguard.plugin.iterate import GpuProfile  # noqa: E402
from perfguard.plugin.marker import ProfileSpec  # noqa: E402
from perfguard.trace import load_trace  # noqa: E402
from perfguard.trace.site_pass import sites_path  # noqa: E402


def _step(a: torch.Tensor) -> None:
    torch.relu(a @ a).sum()


def _run(profile: GpuProfile, a: torch.Tensor) -> list[int]:
    """The test's side of the loop: every step it was given, then the loop closed."""
    steps = []
    for step in profile.iterations():
        steps.append(step)
        _step(a)
    profile.close()
    return steps


@pytest.fixture
def steady_machine(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The reference workload always takes 1 ms (no round is re-run), or what the test
    appends to the returned list, in order."""
    script: list[int] = []
    monkeypatch.setattr(speed, "reference_ns", lambda: script.pop(0) if script else 1_000_000)
    monkeypatch.setattr(loop, "RETRY_PAUSE_S", 0.0)
    return script


def test_a_round_run_while_the_machine_was_slow_is_run_again(
    tmp_path: Path, steady_machine: list[int]
) -> None:
    """The reference workload (capture/speed.py) timed before and after each timing
    round: a round whose reference ran 30 % slow is dropped and run again, and the
    record keeps only the steps of the kept rounds."""
    spec = ProfileSpec(iterations=3, warmup=1, rounds=3)
    profile = GpuProfile(spec, TorchCapturer(tmp_path / "t.pt.trace.json", "cpu"))
    # best; round 0 before/after; round 1 before/after (slow: re-run); again; round 2
    steady_machine += [1_000_000, 1_000_000, 1_010_000, 1_000_000, 1_300_000]
    steps = _run(profile, torch.randn(16, 16))
    assert profile.slow_rounds == 1
    # warm-up, round 0, round 1 (dropped), round 1 again, round 2, the call-site pass's step
    # (numbered as the last warm-up's: it is recorded nowhere), the profiled round
    assert steps == [-1, 0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, -1, 9, 10, 11]
    assert profile.round_of == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert len(profile.wall_times_ns) == len(profile.cpu_times_ns) == 12
    assert profile.profiled == [False] * 9 + [True] * 3
    assert profile.speed_ns == [1_010_000, 1_000_000, 1_000_000]


def test_retries_stop_after_as_many_as_there_are_rounds(
    tmp_path: Path, steady_machine: list[int]
) -> None:
    spec = ProfileSpec(iterations=2, warmup=0, rounds=2)
    profile = GpuProfile(spec, TorchCapturer(tmp_path / "t.pt.trace.json", "cpu"))
    steady_machine += [1_000_000] + [2_000_000] * 40  # the machine stays slow
    _run(profile, torch.randn(4, 4))
    assert profile.slow_rounds == 2  # then the slow rounds are kept, and say so
    assert profile.round_of == [0, 0, 1, 1, 2, 2]
    assert profile.speed_ns == [2_000_000, 2_000_000]


def test_retries_stop_when_the_checks_budget_is_spent(
    tmp_path: Path, steady_machine: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-runs cost at most a share of the rounds' own time (or a floor): a small test on
    a slow machine spent 1.1-2.2 s in pauses and re-runs for 5 rounds of 10 ms. With the
    floor and share at zero, a slow round is kept at once, and says so nowhere but in
    its speed figure."""
    monkeypatch.setattr(loop, "CHECKS_FLOOR_S", 0.0)
    monkeypatch.setattr(loop, "CHECKS_SHARE", 0.0)
    spec = ProfileSpec(iterations=2, warmup=0, rounds=3)
    profile = GpuProfile(spec, TorchCapturer(tmp_path / "t.pt.trace.json", "cpu"))
    steady_machine += [1_000_000] + [2_000_000] * 40  # the machine stays slow
    _run(profile, torch.randn(4, 4))
    assert profile.slow_rounds == 0
    assert profile.round_of == [0, 0, 1, 1, 2, 2, 3, 3]
    # the floor lets a re-run through where the rounds are tiny
    monkeypatch.setattr(loop, "CHECKS_FLOOR_S", 10.0)
    again = GpuProfile(spec, TorchCapturer(tmp_path / "u.pt.trace.json", "cpu"))
    steady_machine[:] = [1_000_000] + [2_000_000] * 40
    _run(again, torch.randn(4, 4))
    assert again.slow_rounds == 2  # until the slow level is the typical one (the median)


def test_cpu_loop_times_rounds_unprofiled_then_profiles_one(
    tmp_path: Path, steady_machine: list[int]
) -> None:
    spec = ProfileSpec(iterations=4, warmup=1, rounds=3)
    path = tmp_path / "t.pt.trace.json"
    profile = GpuProfile(spec, TorchCapturer(path, "cpu"))
    steps = _run(profile, torch.randn(32, 32))
    # warm-up, 3 timing rounds, the call-site pass's step, 1 profiled round
    assert steps == [*range(-1, 12), -1, *range(12, 16)]
    assert profile.phase_s["sites"] > 0 and sites_path(path).is_file()
    assert profile.completed and profile.captured
    assert profile.round_of == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert profile.profiled == [False] * 12 + [True] * 4
    assert len(profile.wait_ns) in (0, 3)  # the profiled round's load does not count

    analysis = analyze(load_trace(path))
    assert len(analysis.iterations) == 4  # only the profiled round is in the capture
    rec = record_from_analysis(
        "t::x",
        analysis,
        wall_times_ns=np.asarray(profile.wall_times_ns),
        cpu_times_ns=np.asarray(profile.cpu_times_ns),
        rounds=np.asarray(profile.round_of),
        profiled=np.asarray(profile.profiled),
    )
    assert rec.metric == "wall_time"
    prof = profiled_mask(rec.samples)
    assert prof.sum() == 4 and (~prof).sum() == 12
    # wall time is judged on the three timing rounds, each its fastest iteration
    assert rec.rounds().tolist() == [0] * 4 + [1] * 4 + [2] * 4
    expected = [min(profile.wall_times_ns[4 * r : 4 * r + 4]) for r in range(3)]
    assert rec.round_values().tolist() == expected
    assert rec.round_values("cpu_time").tolist() == [
        min(profile.cpu_times_ns[4 * r : 4 * r + 4]) for r in range(3)
    ]
    # op samples only name captured iterations; counters come from them and are stable
    captured = set(rec.samples.loc[prof, "iteration"])
    assert set(rec.op_samples["iteration"]) <= captured
    c = rec.counters
    mm = c[(c["op_name"] == "aten::matmul") & (c["counter"] == "calls")]
    assert mm["value"].tolist() == [1.0] and mm["stable"].tolist() == [True]
    # GPU time would be judged on the profiled rows only
    assert timing_mask(rec.samples, "gpu_time").tolist() == prof.tolist()


def test_a_timing_only_loop_merges_with_the_first_pair_childs_profiled_one(
    tmp_path: Path, steady_machine: list[int]
) -> None:
    """A/B pair children after the first skip the profiled round: their records hold
    timing rows only, and merged after the first child's the test keeps that child's ops
    and counters, every child's timing rounds, and (as the record says) median steps."""
    from perfguard.baseline.record import merge_rounds, record_from_timings

    spec = ProfileSpec(iterations=4, warmup=1, rounds=3)
    a = torch.randn(32, 32)
    first = GpuProfile(spec, TorchCapturer(tmp_path / "first.pt.trace.json", "cpu"))
    _run(first, a)
    later = GpuProfile(spec, TorchCapturer(tmp_path / "later.pt.trace.json", "cpu"))
    later.timing_only = True
    steps = _run(later, a)
    assert steps == list(range(-1, 12))  # warm-up and 3 timing rounds: no profiled round
    assert later.completed and not later.captured
    assert not (tmp_path / "later.pt.trace.json").exists()

    full = record_from_analysis(
        "t::x",
        analyze(load_trace(tmp_path / "first.pt.trace.json")),
        wall_times_ns=np.asarray(first.wall_times_ns),
        rounds=np.asarray(first.round_of),
        profiled=np.asarray(first.profiled),
        meta={"round_statistic": "median"},
    )
    timing = record_from_timings(
        "t::x",
        wall_times_ns=np.asarray(later.wall_times_ns),
        cpu_times_ns=np.asarray(later.cpu_times_ns),
        rounds=np.asarray(later.round_of),
        metric="wall_time",
        meta={"round_statistic": "median"},
    )
    assert timing.ops.empty and timing.counters.empty and timing.timed_apart
    merged = merge_rounds([full, timing])
    # each child one round of the merged record, its value the median of its timed steps
    walls = [first.wall_times_ns[:12], later.wall_times_ns]
    assert merged.round_values().tolist() == [float(np.median(w)) for w in walls]
    # ops and counters are the profiled child's alone (not halved by the timing child)
    pd_testing = pytest.importorskip("pandas.testing")
    pd_testing.assert_frame_equal(
        merged.counters.reset_index(drop=True),
        full.counters.reset_index(drop=True),
        check_dtype=False,
    )
    assert merged.ops["calls"].tolist() == full.ops["calls"].tolist()


def test_a_baseline_timed_under_the_profiler_is_not_compared_on_cpu_time(tmp_path: Path) -> None:
    """A store saved before timing rounds ran unprofiled holds slower, noisier CPU timings:
    judging today's rounds against them would read ``improved``; the gates still run."""
    from perfguard.compare.judge import Against, JudgeSettings, judge
    from perfguard.compare.outcomes import Outcome

    spec = ProfileSpec(iterations=3, warmup=1, rounds=3)
    path = tmp_path / "t.pt.trace.json"
    profile = GpuProfile(spec, TorchCapturer(path, "cpu"))
    a = torch.randn(32, 32)
    for _ in profile.iterations():
        _step(a)
    analysis = analyze(load_trace(path))
    args = dict(
        wall_times_ns=np.asarray(profile.wall_times_ns), rounds=np.asarray(profile.round_of)
    )
    new = record_from_analysis("t::x", analysis, profiled=np.asarray(profile.profiled), **args)
    flags = np.asarray(profile.profiled)
    old = record_from_analysis(
        "t::x",
        analysis,
        wall_times_ns=np.asarray(profile.wall_times_ns)[flags],
        rounds=np.arange(int(flags.sum())),  # three one-iteration rounds, all profiled
    )
    assert new.timed_apart and not old.timed_apart
    verdict = judge(new, Against(records=[old], commit="c" * 40, run_found=True), JudgeSettings())
    assert verdict.timing.outcome is Outcome.NOT_JUDGED
    assert "timed its rounds under the profiler" in verdict.timing.message
    assert verdict.gates is not None and verdict.gates.outcome is Outcome.UNCHANGED


def test_a_loop_left_in_a_timing_round_captured_nothing(tmp_path: Path) -> None:
    spec = ProfileSpec(iterations=3, warmup=0, rounds=2)
    profile = GpuProfile(spec, TorchCapturer(tmp_path / "t.pt.trace.json", "cpu"))
    for step in profile.iterations():
        if step == 4:
            break
    profile.close()
    assert not profile.captured and not profile.completed
    assert not (tmp_path / "t.pt.trace.json").exists()


TEST = """
import pytest
import torch

torch.set_num_threads(1)
A = torch.randn(64, 64)


@pytest.mark.gpuprofile(iterations=5, warmup=1, rounds=4)
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.tanh(A @ A)
"""


def test_session_stores_timing_rounds_and_one_profiled_round(tmp_path: Path) -> None:
    for args in (
        ["init", "-q"],
        ["config", "user.email", "ci@example.com"],
        ["config", "user.name", "CI"],
    ):
        subprocess.run(["git", *args], cwd=tmp_path, check=True)
    (tmp_path / "test_step.py").write_text(TEST)
    (tmp_path / ".gitignore").write_text(".perfguard/\nbaselines/\n")
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run(["git", "commit", "-qm", "c0"], cwd=tmp_path, check=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--perfguard",
            "--perfguard-save",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with Store(tmp_path / "baselines" / "perfguard.db") as store:
        run_id = int(store.runs()["run_id"].iloc[-1])
        rec = store.load_test(run_id, "test_step.py::test_step")
        hist = store.history("test_step.py::test_step")
    assert rec is not None
    prof = profiled_mask(rec.samples)
    assert (~prof).sum() == 20 and prof.sum() == 5
    assert len(rec.round_values()) == 4
    assert "rounds with the profiler off" in (rec.meta.get("note") or "")
    # the stored history's level is the timing rounds' (the geometric mean of their values,
    # as `perfguard history` and the verdict reduce them), not the profiled round's
    want = float(np.exp(np.mean(np.log(rec.round_values()))))
    assert hist["median_ns"].tolist() == pytest.approx([want], rel=1e-12)
    assert hist["n"].tolist() == [20]
