"""The torch capture's window: a few iterations found by their key node, not the whole run.

Real torch (CPU), real programs: ``perfguard profile`` in a subprocess for what the
command prints and writes, the window in process (:func:`window_capture`) for
each way an iteration is found and each way a program can end. What the capture
holds is counted with perfguard's own reader; the Python-call events (which the
reader drops) in the raw JSON.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perfguard
from perfguard.capture.base import RunOptions
from perfguard.errors import CaptureError

torch = pytest.importorskip("torch")

from perfguard.capture.torch_window import (  # noqa: E402
    AFTER_LAST_STEP,
    WindowSpec,
    window_capture,
)

#: a small conv net trained with SGD for argv[1] steps; nothing marks iterations
TRAIN = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(4 * 6 * 6, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 3, (4,))
for _ in range(int(sys.argv[1])):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""

#: no optimizer, no iteration range: no key node
INFER = """
import torch
model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU())
with torch.no_grad():
    for _ in range(5):
        model(torch.randn(4, 1, 8, 8))
"""

OPT_STEP = "Optimizer.step#SGD.step"


def _perfguard(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(perfguard.__file__).parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "perfguard", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _profile(
    tmp_path: Path, script: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    path = tmp_path / "train.py"
    path.write_text(script)
    out = tmp_path / "out"
    run = _perfguard(
        "profile",
        "--backend",
        "torch",
        *args,
        "--output-path",
        str(out),
        "--reports",
        "summary",
        "--formats",
        "csv",
        "--",
        sys.executable,
        str(path),
        "8",
    )
    assert run.returncode == 0, run.stderr
    return run, out / "capture.pt.trace.json.gz"


def _names(trace_path: Path) -> list[str]:
    return list(perfguard.load_trace(trace_path).ranges["name"].astype(str))


def _steps(names: list[str]) -> list[str]:
    return sorted(n for n in names if n.startswith("ProfilerStep#"))


def _categories(trace_path: Path) -> set[str]:
    """The raw JSON's event categories (the reader keeps no ``python_function``)."""
    with gzip.open(trace_path, "rt") as f:
        return {e.get("cat") for e in json.load(f)["traceEvents"]}


def test_profile_records_a_window_of_optimizer_steps_without_stacks(tmp_path: Path) -> None:
    run, trace = _profile(tmp_path, TRAIN)
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("capture: "))
    assert line.startswith(f"capture: {trace} (torch: 3 iterations after 2 warm-up, ")
    assert line.endswith(" MB)")
    names = _names(trace)
    # steps 2, 3, 4 of the program's 8 (0-based): each ended by SGD's step, nothing else
    assert _steps(names) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert names.count(OPT_STEP) == 3
    assert names.count("aten::conv2d") == 3
    assert AFTER_LAST_STEP not in names
    assert "python_function" not in _categories(trace)
    summary = (tmp_path / "out" / "dlprof_summary.csv").read_text()
    assert "Iterations,3" in summary and "Iteration Range,2-4" in summary


def test_profile_gives_each_op_its_exact_line_without_stacks(tmp_path: Path) -> None:
    """The window's iterations run under the call-site mode: each op reads the statement
    that called it (the backward its forward's), the markers are gone from the capture,
    and no Python tracer ran."""
    _, trace = _profile(tmp_path, TRAIN)
    loaded = perfguard.load_trace(trace)
    assert not loaded.ranges["name"].astype(str).str.startswith("perfguard.site#").any()
    ops = perfguard.analyze(loaded).ops.set_index("op_name")["call_site"].astype(str)
    lines = TRAIN.splitlines()
    loss = next(i for i, t in enumerate(lines, 1) if "cross_entropy(model(x), y)" in t)
    step = next(i for i, t in enumerate(lines, 1) if t.strip() == "opt.step()")
    # the script lies outside the working directory: its path is absolute
    assert ops["aten::conv2d"].endswith(f"/train.py:{loss} in <module>"), ops["aten::conv2d"]
    backward = "autograd::engine::evaluate_function: ConvolutionBackward0"
    assert ops[backward].endswith(f"/train.py:{loss} in <module>")
    assert ops[OPT_STEP].endswith(f"/train.py:{step} in <module>")
    assert "python_function" not in _categories(trace)


def test_profile_window_options_and_stacks(tmp_path: Path) -> None:
    run, trace = _profile(tmp_path, TRAIN, "--warmup", "3", "--iterations", "2", "--with-stack")
    assert "(torch: 2 iterations after 3 warm-up, " in run.stdout
    names = _names(trace)
    assert _steps(names) == ["ProfilerStep#3", "ProfilerStep#4"]
    assert names.count(OPT_STEP) == 2
    assert "python_function" in _categories(trace)  # torch's own stacks, asked for


def test_profile_without_a_key_node_says_what_it_captured(tmp_path: Path) -> None:
    run, trace = _profile(tmp_path, INFER)
    assert "(torch: no key node: the whole run (" in run.stdout
    assert "without Python stacks" in run.stdout
    note = [ln for ln in run.stderr.splitlines() if ln.startswith("perfguard: note: no key node")]
    assert len(note) == 1 and "--key-node" in note[0], run.stderr
    names = _names(trace)
    assert names.count("aten::conv2d") == 5 and not _steps(names)


def test_window_options_need_the_torch_backend(tmp_path: Path) -> None:
    from perfguard.capture.xspace_runner import XSpaceBackend

    backend = XSpaceBackend("jax", why="test")
    with pytest.raises(CaptureError, match="^warmup and iterations need the torch backend"):
        backend.capture(
            ["python", "x.py"], output_dir=tmp_path, options=RunOptions(warmup=1, iterations=2)
        )


# --- in process: each key node, each ending ---------------------------------------------


def _window(tmp_path: Path, spec: WindowSpec, body: Callable[[], None]) -> tuple[list[str], Any]:
    out = tmp_path / "w.pt.trace.json.gz"
    with window_capture(torch, out, "cpu", spec) as window:
        body()
    return _names(out), window.report


def _train(steps: int, *, ranges: str | None = None) -> Callable[[], None]:
    def run() -> None:
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            with torch.profiler.record_function(ranges or "data"):
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()

    return run


def test_window_follows_the_programs_own_iteration_ranges(tmp_path: Path) -> None:
    names, report = _window(tmp_path, WindowSpec(), _train(7, ranges="perfguard.iteration"))
    assert names.count("perfguard.iteration") == 3 and not _steps(names)
    assert names.count(OPT_STEP) == 3
    assert report.kind == "window" and report.key_node == "perfguard.iteration ranges"
    iterations = perfguard.analyze(perfguard.load_trace(tmp_path / "w.pt.trace.json.gz"))
    assert len(iterations.iterations) == 3


def test_window_follows_a_named_key_node(tmp_path: Path) -> None:
    names, report = _window(tmp_path, WindowSpec(1, 2, key_node="data"), _train(6))
    assert _steps(names) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert names.count("data") == 2
    assert report.detail == "2 iterations after 1 warm-up"


def test_program_ending_inside_the_window(tmp_path: Path) -> None:
    names, report = _window(tmp_path, WindowSpec(), _train(3))
    # step 2 whole; after the third step the program ended: not an iteration
    assert _steps(names) == ["ProfilerStep#2"] and names.count(AFTER_LAST_STEP) == 1
    assert report.kind == "short" and report.iterations == 1
    assert "the program ended after 3 iterations" in report.note


def test_program_ending_in_the_warm_up_keeps_the_whole_run(tmp_path: Path) -> None:
    names, report = _window(tmp_path, WindowSpec(), _train(1))
    assert report.kind == "fallback" and names.count(OPT_STEP) == 1
    assert report.detail.startswith("the program ended after 1 iteration: the whole run (")
    assert "lower --warmup" in report.note


def test_fallback_is_bounded_in_time(tmp_path: Path) -> None:
    """No key node: the capture stops after ``--fallback-seconds`` (the runner's timer on
    its main thread) while the program goes on."""
    script = tmp_path / "loop.py"
    count = tmp_path / "count.txt"
    script.write_text(
        "import sys, time, torch\n"
        "n, t0 = 0, time.monotonic()\n"
        "while time.monotonic() - t0 < 2.0 or n < 50:\n"
        "    torch.relu(torch.randn(4)); n += 1\n"
        "for _ in range(1000):\n"  # after the bound, however long stopping took
        "    torch.relu(torch.randn(4)); n += 1\n"
        "open(sys.argv[1], 'w').write(str(n))\n"
    )
    out, report = tmp_path / "t.pt.trace.json.gz", tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(Path(perfguard.__file__).parents[1])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfguard.capture.torch_runner",
            "--output",
            str(out),
            "--device",
            "cpu",
            "--fallback-seconds",
            "0.5",
            "--report",
            str(report),
            "--",
            str(script),
            str(count),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(report.read_text())
    assert doc["kind"] == "fallback" and doc["detail"].startswith("no key node: its first ")
    relus = _names(out).count("aten::relu")
    assert 0 < relus <= int(count.read_text()) - 1000


def _nested_loop(steps: int, shape: str) -> Callable[[], None]:
    """``step``: a range around each whole step (the optimizer's step inside it);
    ``loop``: one range around the whole loop, another around each batch."""
    rf = torch.profiler.record_function

    def run() -> None:
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with rf("train") if shape == "loop" else contextlib.nullcontext():
            for _ in range(steps):
                with rf("train_step") if shape == "step" else contextlib.nullcontext():
                    with rf("batch"):
                        x = torch.randn(4, 8)
                    opt.zero_grad()
                    model(x).sum().backward()
                    opt.step()
                    with rf("log"):
                        torch.zeros(1)

    return run


@pytest.mark.parametrize("shape", ["step", "loop"])
def test_steps_nest_with_the_programs_ranges(tmp_path: Path, shape: str) -> None:
    """Each step opens and closes where the program's ranges allow (torch crashed, later,
    on a range closed out of order): never partly over one of the program's ranges."""
    _window(tmp_path, WindowSpec(), _nested_loop(8, shape))
    gc.collect()  # the profiler's records of a range closed out of order crash here
    r = perfguard.load_trace(tmp_path / "w.pt.trace.json.gz").ranges
    names = r["name"].astype(str)
    steps = r[names.str.startswith("ProfilerStep#")]
    assert sorted(steps["name"].astype(str)) == [
        "ProfilerStep#2",
        "ProfilerStep#3",
        "ProfilerStep#4",
    ]
    others = r[~names.str.startswith("ProfilerStep#")]
    for s0, s1 in zip(steps["start"], steps["end"], strict=True):
        inside = (others["start"] >= s0) & (others["end"] <= s1)
        apart = (others["end"] <= s0) | (others["start"] >= s1)
        around = (others["start"] <= s0) & (others["end"] >= s1)
        assert (inside | apart | around).all(), others[~(inside | apart | around)]
        if shape == "step":  # the step is the program's train_step, whole
            assert (others.loc[inside, "name"].astype(str) == "train_step").sum() == 1
    assert names.eq(OPT_STEP).sum() == 3


SPLIT_CHILD = """
import gc, sys, tempfile
from pathlib import Path
sys.path.insert(0, {tests!r})
import test_profile_window as t
from perfguard.capture.torch_window import WindowSpec

for k in range(20):  # the provisional session cut at a different point in each
    with tempfile.TemporaryDirectory() as d:
        spec = WindowSpec(fallback_s=0.005 * (k + 1))
        names, report = t._window(Path(d), spec, t._nested_loop(3 + k % 2, "loop"))
        gc.collect()
        assert t._steps(names)[-1] == "ProfilerStep#" + str(2 + k % 2), names
print("done")
"""


def test_a_range_open_across_a_session_switch_crashes_nothing(tmp_path: Path) -> None:
    """A program range begun under one session and ended while another recorded made torch
    write through freed memory: a segfault in a later collection, in 15 of 24 processes of
    four windows each (the loop inside its ``train`` range ending inside the window, the
    provisional session cut after 5-80 ms or 10 s). The window now ends such ranges before
    a switch and begins them again after it; 20 windows in one child exit cleanly."""
    script = tmp_path / "child.py"
    script.write_text(SPLIT_CHILD.format(tests=str(Path(__file__).resolve().parent)))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-3000:]


def test_a_loop_ending_inside_the_window_ends_the_step(tmp_path: Path) -> None:
    """The step open when the loop's range closes is closed first, and is no iteration."""
    names, report = _window(tmp_path, WindowSpec(), _nested_loop(4, "loop"))
    gc.collect()
    assert _steps(names) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert names.count(AFTER_LAST_STEP) == 1
    assert (report.kind, report.iterations) == ("short", 2)
