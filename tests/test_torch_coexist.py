"""`perfguard profile` around programs that run their own torch.profiler or torch.compile.

Real torch (CPU build), real subprocesses through the torch runner: before
the fix, a program's own ``torch.profiler.profile`` took Kineto's one
session away from perfguard's and the process died with SIGSEGV.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

import perfguard
from perfguard.capture import profile_command
from perfguard.capture.torch_profiler import TorchBackend

pytest.importorskip("torch")

#: a training loop that profiles itself, exports its own trace and reads its own table
OWN_PROFILER = """
import json, sys
import torch
from torch.profiler import ProfilerActivity, profile, record_function

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
x = torch.randn(8, 16)
model(x).sum().backward()  # before the program's profiler: perfguard's sees this
with {opener} as prof:
    for _ in range(3):
        with record_function("perfguard.iteration"):
            model(x).sum().backward()
rows = len(prof.key_averages())
prof.export_chrome_trace(sys.argv[1])
json.dump({{"rows": rows}}, open(sys.argv[2], "w"))
"""

PROFILE_API = "profile(activities=[ProfilerActivity.CPU], record_shapes=True)"
LEGACY_API = "torch.autograd.profiler.profile(record_shapes=True)"


@pytest.mark.parametrize("opener", [PROFILE_API, LEGACY_API], ids=["torch.profiler", "autograd"])
def test_program_with_its_own_profiler(tmp_path: Path, opener: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(OWN_PROFILER.format(opener=opener))
    own, seen = tmp_path / "own.json", tmp_path / "seen.json"
    out = tmp_path / "out"
    result = profile_command(
        [sys.executable, str(script), str(own), str(seen)],
        backend="torch",
        output_dir=out,
        timeout=300,
    )

    assert result.returncode == 0  # was -11 (SIGSEGV)
    assert "stepped aside" in result.log
    # the program's own profiler worked as it does alone: its table and its own export
    assert json.loads(seen.read_text())["rows"] > 5
    own_events = json.loads(own.read_text())["traceEvents"]
    # the capture is the program's session: the same events as the program's own export
    with gzip.open(result.path) as fh:
        captured = json.load(fh)["traceEvents"]
    assert len(captured) == len(own_events)
    analysis = perfguard.analyze(perfguard.load_trace(result.path))
    assert list(analysis.iterations["iteration"]) == [0, 1, 2]
    assert {"aten::linear", "aten::relu"} <= set(analysis.trace.ranges["name"])
    # nothing of the hand-over is left beside the capture: not even the sidecar perfguard
    # wrote when it stepped aside (it described its own session, not the program's, which
    # recorded no stacks and no name torch's writer loses: so no sidecar at all)
    assert sorted(p.name for p in out.iterdir()) == ["capture.pt.trace.json.gz"]


SCHEDULED = """
import sys
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

traces = []
model = torch.nn.Linear(16, 16)
x = torch.randn(8, 16)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2,
             repeat=2), on_trace_ready=lambda p: traces.append(len(p.events()))) as prof:
    for _ in range(8):
        with record_function("perfguard.iteration"):
            model(x).sum().backward()
        prof.step()
assert len(traces) == 2 and all(traces), traces
"""


def test_program_with_a_scheduled_profiler(tmp_path: Path) -> None:
    """Several profiler cycles (a schedule): the program sees every cycle, the capture
    is the last one (2 active steps)."""
    script = tmp_path / "sched.py"
    script.write_text(SCHEDULED)
    result = profile_command(
        [sys.executable, str(script)], backend="torch", output_dir=tmp_path, timeout=300
    )
    assert result.returncode == 0
    names = perfguard.load_trace(result.path).ranges["name"]
    assert set(names[names.str.startswith("ProfilerStep")]) == {"ProfilerStep#6", "ProfilerStep#7"}
    assert (names == "perfguard.iteration").sum() == 2


COMPILED = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
# aot_eager: dynamo and AOTAutograd traced for real, without a C++ toolchain for inductor
step = torch.compile(lambda x: model(x).sum(), backend="aot_eager")
x = torch.randn(8, 16)
for _ in range(6):
    with torch.profiler.record_function("perfguard.iteration"):
        step(x).backward()
"""


def test_program_using_torch_compile(tmp_path: Path) -> None:
    """Without Python stacks: with them, torch records every Python call of the compiler
    (585 MB of JSON for this script) and writes docstring lines unescaped in their
    names (``"name": "...(0):         \"\"\""``), which the Kineto reader rejects.
    The default window: steps 2-4 of 6, the compile in the warm-up."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    result = TorchBackend(with_stack=False).capture(
        [sys.executable, str(script)], output_dir=tmp_path, timeout=300
    )
    assert result.returncode == 0
    analysis = perfguard.analyze(perfguard.load_trace(result.path))
    assert list(analysis.iterations["iteration"]) == [0, 1, 2]
    names = set(analysis.trace.ranges["name"])
    assert "aten::addmm" in names or "aten::mm" in names
