"""Capture backends, run for real.

* nsys: against a fake ``nsys`` executable written here. It records its argv,
  runs the real child command, and writes what nsys would (a report and a
  copy of a real SQLite fixture as the export), so the argv contract, the
  output discovery, failures and timeouts are exercised end to end.
* torch: the PyTorch profiler on the CPU, in a subprocess via the runner and
  in-process via ``profile_torch``; the traces go through ``load_trace`` and
  ``analyze``.
* auto: the selection rules, with the GPU and torch probes stubbed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import perfguard
from perfguard.capture import (
    CaptureError,
    NsysBackend,
    TorchBackend,
    profile_command,
    profile_torch,
    select_backend,
    torch_profiler,
)
from perfguard.capture import select as capture_select
from perfguard.capture.base import RunOptions
from perfguard.capture.nsys import nsys_export_argv, nsys_profile_argv
from perfguard.capture.torch_profiler import WHOLE_RUN, python_target
from perfguard.capture.torch_runner import run_target

sys.path.insert(0, str(Path(__file__).parent))
from nsys_options import DOCUMENTED, Undocumented, read_argv  # noqa: E402

FIXTURE = "nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite"
HELLO = [sys.executable, "-c", "print('hi')"]
# a guard against a hung run, not a time the run must beat: a training script under the
# profiler took over 120 s with the 2 cores at a load of 13 (issue 45's runs beside a spinner)
RUN_TIMEOUT_S = 600

# The fake nsys: constants are prepended by ``write_fake_nsys``.
FAKE_NSYS_BODY = r"""
import json, os, shutil, subprocess, sys, time

args = sys.argv[1:]
with open(LOG, "a") as f:
    env = os.environ.get("NSYS_NVTX_PROFILER_REGISTER_ONLY")
    f.write(json.dumps({"argv": sys.argv, "register_only": env}) + "\n")


def value(flag):
    return args[args.index(flag) + 1]


if args[0] == "export":
    shutil.copyfile(FIXTURE, value("-o"))
    sys.exit(0)
assert args[0] == "profile", args
if MODE == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(LOG + ".pid", "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
i = 1
while i < len(args):  # the program starts at the first argument that is no option
    if args[i] in ("-t", "-s", "-o", "-y", "-d"):
        i += 2
    elif args[i].startswith("-"):
        i += 1
    else:
        break
rc = subprocess.call(args[i:])
out = value("-o")
if MODE != "no-report":
    open(out + (".qdrep" if MODE == "qdrep" else ".nsys-rep"), "wb").close()
if "--export=sqlite" in args and MODE != "no-export":
    shutil.copyfile(FIXTURE, out + ".sqlite")
print("Generated:", out + ".nsys-rep", file=sys.stderr)  # nsys chatter after the program
sys.exit(rc)
"""


def write_fake_nsys(folder: Path, fixture: Path, mode: str = "nsys-rep") -> tuple[Path, Path]:
    """An executable ``folder/nsys`` and the JSON-lines file its invocations go to."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "nsys-calls.jsonl"
    head = f"#!{sys.executable}\nLOG = {str(log)!r}\nFIXTURE = {str(fixture)!r}\nMODE = {mode!r}\n"
    exe = folder / "nsys"
    exe.write_text(head + FAKE_NSYS_BODY)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe, log


def calls(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def fixture_sqlite(fixture_file) -> Path:
    return fixture_file(FIXTURE)


@pytest.fixture
def fake_nsys(tmp_path: Path, fixture_sqlite: Path):
    """``fake_nsys(mode)`` → (path of the executable, its call log)."""

    def make(mode: str = "nsys-rep") -> tuple[Path, Path]:
        return write_fake_nsys(tmp_path / f"bin-{mode}", fixture_sqlite, mode)

    return make


@pytest.fixture
def no_nsys_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("PERFGUARD_NSYS", raising=False)


def contract(nsys: Path, outbase: Path, *options: str, command=HELLO, inline=True) -> list[str]:
    head = [str(nsys), "profile", "-t", "cuda,nvtx", "-s", "none", "-o", str(outbase)]
    head += ["--force-overwrite=true"] + (["--export=sqlite"] if inline else [])
    return [*head, *options, *command]


# ---------------------------------------------------------------------------- nsys


def test_nsys_default_capture_runs_the_contract_and_loads(
    fake_nsys, tmp_path: Path, fixture_sqlite: Path, cached_trace
) -> None:
    exe, log = fake_nsys()
    out = tmp_path / "out"
    result = profile_command(HELLO, backend="nsys", output_dir=out, nsys=str(exe), timeout=60)

    expected = contract(exe, out / "capture")
    assert result.argv == expected
    [call] = calls(log)
    assert call["argv"][1:] == expected[1:]
    assert call["register_only"] is None  # only set for an NVTX capture range
    assert result.path == out / "capture.sqlite"
    assert result.report == out / "capture.nsys-rep"
    assert (result.backend, result.returncode, result.command) == ("nsys", 0, HELLO)
    assert result.wall_time_s > 0
    assert "requested" in result.why

    got, want = perfguard.load_trace(result.path), cached_trace(fixture_sqlite)
    assert len(want.kernels) > 0
    assert len(got.kernels) == len(want.kernels)
    assert set(got.kernels["name"]) == set(want.kernels["name"])


@pytest.mark.parametrize(
    ("kwargs", "options", "register_only"),
    [
        ({"delay": 5, "duration": 20.0}, ["-y", "5", "-d", "20"], None),
        (
            {"capture_range": "cudaProfilerApi"},
            ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"],
            None,
        ),
        (
            {"capture_range": "nvtx:train_step"},
            ["--capture-range=nvtx", "--nvtx-capture=train_step", "--capture-range-end=stop"],
            "0",
        ),
        (
            {"delay": 0, "capture_range": "nvtx:step@*"},
            ["-y", "0", "--capture-range=nvtx", "--nvtx-capture=step@*"]
            + ["--capture-range-end=stop"],
            "0",
        ),
    ],
    ids=["delay-duration", "cudaProfilerApi", "nvtx", "delay-nvtx-domain"],
)
def test_nsys_argv_contract(fake_nsys, tmp_path: Path, kwargs, options, register_only) -> None:
    exe, log = fake_nsys()
    result = NsysBackend(str(exe)).capture(HELLO, output_dir=tmp_path / "o", name="run", **kwargs)
    expected = contract(exe, tmp_path / "o" / "run", *options)
    assert result.argv == expected
    [call] = calls(log)
    assert call["argv"][1:] == expected[1:]
    assert call["register_only"] == register_only
    assert result.path == tmp_path / "o" / "run.sqlite" and result.path.is_file()


ARGV_CASES = [
    {},
    {"delay": 0, "duration": 20.0},
    {"capture_range": "cudaProfilerApi"},
    {"capture_range": "nvtx:train_step"},
    {"delay": 3, "capture_range": "nvtx:step@*"},
]


@pytest.mark.parametrize("release", sorted(DOCUMENTED))
def test_nsys_argv_is_what_each_release_documents(tmp_path: Path, release: str) -> None:
    """Every argv the backend builds, read by nsys's documented syntax against the options
    and values the release's User Guide lists (tests/nsys_options.py, with its sources),
    not against this file's own copy of the argv."""
    nsys, out = "/opt/nsys/bin/nsys", tmp_path / "run"
    for kwargs in ARGV_CASES:
        for mode in ("inline", "separate"):
            argv = nsys_profile_argv(nsys, HELLO, out, export_mode=mode, **kwargs)  # type: ignore[arg-type]
            read = read_argv(argv, release)
            assert read.command == "profile" and read.rest == HELLO, (kwargs, argv)
            assert read.options["output"] == str(out)
            assert read.options["trace"] == "cuda,nvtx" and read.options["sample"] == "none"
            assert read.options.get("export") == ("sqlite" if mode == "inline" else None)
            if "capture_range" in kwargs:
                assert read.options["capture-range-end"] == "stop"
    export = read_argv(nsys_export_argv(nsys, out.with_suffix(".nsys-rep"), out), release)
    assert (export.options["type"], export.options["output"]) == ("sqlite", str(out))
    assert export.rest == [str(out.with_suffix(".nsys-rep"))]


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--force-overwrite", "true"], "takes '=VALUE'"),  # a long option's value, spaced
        (["--stop-on-range-end=true"], "no option --stop-on-range-end"),  # before 2021
        (["-s", "cpu"], "does not take 'cpu'"),
        (["-t", "cuda,nvtx,gpu"], "does not take 'gpu'"),
        (["--capture-range=cudaProfilerApi", "-c", "nvtx"], "given twice"),
    ],
)
def test_the_documented_options_refuse_what_no_release_documents(argv, why) -> None:
    """The check can fail: spellings and values outside every release's table."""
    for release in DOCUMENTED:
        with pytest.raises(Undocumented, match=why):
            read_argv(["nsys", "profile", *argv, *HELLO], release)


def test_nsys_old_version_writes_qdrep(fake_nsys, tmp_path: Path) -> None:
    exe, _ = fake_nsys("qdrep")
    result = NsysBackend(str(exe)).capture(HELLO, output_dir=tmp_path)
    assert result.report == tmp_path / "capture.qdrep"
    assert len(perfguard.load_trace(result.path).kernels) > 0


@pytest.mark.parametrize("mode", ["nsys-rep", "qdrep"])
def test_nsys_separate_export(fake_nsys, tmp_path: Path, mode: str) -> None:
    exe, log = fake_nsys(mode)
    backend = NsysBackend(str(exe), export_mode="separate")
    result = backend.capture(HELLO, output_dir=tmp_path)

    profile, export = calls(log)
    assert profile["argv"][1:] == contract(exe, tmp_path / "capture", inline=False)[1:]
    report = tmp_path / f"capture.{mode}"
    sqlite = tmp_path / "capture.sqlite"
    assert export["argv"][1:] == ["export", "--type=sqlite", "-o", str(sqlite), str(report)]
    assert (result.path, result.report) == (sqlite, report)
    assert len(perfguard.load_trace(result.path).kernels) > 0


def test_nsys_found_via_env_var(
    fake_nsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_nsys_anywhere
) -> None:
    exe, log = fake_nsys()
    monkeypatch.setenv("PERFGUARD_NSYS", str(exe))
    result = profile_command(HELLO, backend="nsys", output_dir=tmp_path / "o")
    assert result.argv[0] == str(exe.resolve())
    assert len(calls(log)) == 1


def test_nsys_found_on_path(fake_nsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe, log = fake_nsys()
    monkeypatch.delenv("PERFGUARD_NSYS", raising=False)
    monkeypatch.setenv("PATH", str(exe.parent))
    result = profile_command(HELLO, backend="nsys", output_dir=tmp_path / "o")
    assert result.argv[0] == str(exe)
    assert len(calls(log)) == 1


def test_nsys_missing_is_one_line_naming_the_fix(tmp_path: Path, no_nsys_anywhere) -> None:
    with pytest.raises(CaptureError) as err:
        profile_command(HELLO, backend="nsys", output_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert "nsys" in message and "Nsight Systems" in message
    assert "--nsys" in message and "PERFGUARD_NSYS" in message
    assert isinstance(err.value, perfguard.PerfguardError)


def test_nsys_env_var_naming_nothing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERFGUARD_NSYS", str(tmp_path / "no-such-nsys"))
    with pytest.raises(CaptureError, match="PERFGUARD_NSYS"):
        profile_command(HELLO, backend="nsys", output_dir=tmp_path)


def test_nsys_failing_command_reports_status_and_last_line(fake_nsys, tmp_path: Path) -> None:
    exe, _ = fake_nsys()
    failing = [
        sys.executable,
        "-c",
        "import sys; print('boom: bad input', file=sys.stderr); sys.exit(3)",
    ]
    with pytest.raises(CaptureError) as err:
        NsysBackend(str(exe)).capture(failing, output_dir=tmp_path)
    message = str(err.value)
    assert "exit status 3" in message
    assert "boom: bad input" in message  # the program's line, not nsys's "Generated:" chatter
    assert "\n" not in message
    assert err.value.result is not None and err.value.result.returncode == 3


def test_nsys_hang_is_stopped_with_its_children(fake_nsys, tmp_path: Path) -> None:
    exe, log = fake_nsys("hang")
    started = time.monotonic()
    with pytest.raises(CaptureError) as err:
        NsysBackend(str(exe)).capture(HELLO, output_dir=tmp_path, timeout=2)
    elapsed = time.monotonic() - started
    assert elapsed < 60, elapsed  # a hang guard: the fake never exits on its own
    message = str(err.value)
    assert "within 2 s" in message and "\n" not in message
    assert f"{exe} profile -t cuda,nvtx" in message and "print(" in message
    pid = int(Path(str(log) + ".pid").read_text())
    assert _gone_soon(pid), f"grandchild {pid} survived the timeout"


def _gone_soon(pid: int, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # killed but not yet reaped by init: a zombie is gone too
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


def test_nsys_without_export_names_the_expected_file(fake_nsys, tmp_path: Path) -> None:
    exe, _ = fake_nsys("no-export")
    stale = tmp_path / "capture.sqlite"
    stale.write_text("an export from an earlier run must not pass for this one")
    with pytest.raises(CaptureError) as err:
        NsysBackend(str(exe)).capture(HELLO, output_dir=tmp_path)
    assert str(stale) in str(err.value)
    assert "no SQLite export" in str(err.value)


def test_nsys_separate_export_without_report(fake_nsys, tmp_path: Path) -> None:
    exe, log = fake_nsys("no-report")
    with pytest.raises(CaptureError, match=r"no report: expected .*capture\.nsys-rep"):
        NsysBackend(str(exe), export_mode="separate").capture(HELLO, output_dir=tmp_path)
    assert len(calls(log)) == 1  # no export attempted


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capture_range": "nvtx"}, "nvtx:NAME"),
        ({"capture_range": "hotkey"}, "not understood"),
        ({"delay": 1.5}, "whole number"),
        ({"duration": 0}, "whole number of seconds > 0"),
        ({"export_mode": "later"}, "export_mode"),
    ],
)
def test_nsys_bad_options_fail_before_running(fake_nsys, tmp_path: Path, kwargs, match) -> None:
    exe, log = fake_nsys()
    with pytest.raises(CaptureError, match=match):
        profile_command(HELLO, backend="nsys", output_dir=tmp_path, nsys=str(exe), **kwargs)
    assert calls(log) == []


def test_command_must_be_a_list(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="never run through a shell"):
        profile_command("python train.py", output_dir=tmp_path)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- torch

MLP_SCRIPT = """
import json, os, sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
for step in range(3):
    with torch.profiler.record_function("perfguard.iteration"):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    if step == int(os.environ.get("FAIL_AT_STEP", "-1")):
        raise RuntimeError("diverged at step %d" % step)
with open(sys.argv[1], "w") as f:
    json.dump({"argv": sys.argv, "name": __name__,
               "capture": os.environ.get("PERFGUARD_CAPTURE")}, f)
"""


def test_torch_runner_profiles_a_training_script(tmp_path: Path) -> None:
    """The whole run (``iterations=WHOLE_RUN``); the default window: test_profile_window."""
    script = tmp_path / "train.py"
    script.write_text(MLP_SCRIPT)
    seen = tmp_path / "seen.json"
    result = profile_command(
        [sys.executable, str(script), str(seen), "--extra"],
        backend="torch",
        output_dir=tmp_path / "out",
        timeout=RUN_TIMEOUT_S,
        options=RunOptions(iterations=WHOLE_RUN),
    )

    assert (result.backend, result.returncode) == ("torch", 0)
    assert result.path == tmp_path / "out" / "capture.pt.trace.json.gz"
    assert result.argv[:3] == [sys.executable, "-m", "perfguard.capture.torch_runner"]
    assert json.loads(seen.read_text()) == {
        "argv": [str(script), str(seen), "--extra"],
        "name": "__main__",
        "capture": "torch",
    }

    trace = perfguard.load_trace(result.path)
    analysis = perfguard.analyze(trace)
    ops = analysis.ops
    fprop = set(ops.loc[ops["direction"] == "fprop", "op_type"])
    assert {"linear", "addmm", "relu"} <= fprop
    bprop = ops[ops["direction"] == "bprop"]
    assert bprop["op_name"].str.contains("AddmmBackward0").any()
    assert bprop["op_name"].str.contains("ReluBackward0").any()
    assert {"mm", "threshold_backward"} <= set(bprop["op_type"])

    addmm = trace.ranges[trace.ranges["name"] == "aten::addmm"]
    assert len(addmm) == 6  # 2 layers x 3 steps
    assert addmm["input_shapes"].notna().all()
    assert json.loads(addmm["input_shapes"].iloc[0])[1] == [16, 32]

    assert list(analysis.iterations["iteration"]) == [0, 1, 2]


def test_failing_script_still_leaves_its_trace_auto_cpu(
    fake_nsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also auto selection for real: nsys on PATH but no GPU → torch on the CPU."""
    exe, log = fake_nsys()
    monkeypatch.setenv("PATH", str(exe.parent))
    monkeypatch.delenv("PERFGUARD_NSYS", raising=False)
    monkeypatch.setattr(capture_select, "gpu_present", lambda: (False, "no GPU (test)"))
    script = tmp_path / "train.py"
    script.write_text(MLP_SCRIPT)
    env = {**os.environ, "FAIL_AT_STEP": "1"}

    with pytest.raises(CaptureError) as err:
        profile_command(
            [sys.executable, str(script), str(tmp_path / "seen.json")],
            output_dir=tmp_path,
            timeout=RUN_TIMEOUT_S,
            env=env,
            options=RunOptions(iterations=WHOLE_RUN),
        )
    message = str(err.value)
    assert "exit status 1" in message and "\n" not in message
    assert "RuntimeError: diverged at step 1" in message
    result = err.value.result
    assert result is not None and result.returncode == 1 and result.path.is_file()
    assert result.backend == "torch"
    assert "nsys found" in result.why and "torch on the CPU" in result.why
    assert "no GPU (test)" in result.why
    assert calls(log) == []  # nsys was not used

    trace = perfguard.load_trace(result.path)
    assert (trace.ranges["name"] == "perfguard.iteration").sum() == 2
    assert (trace.ranges["name"] == "aten::relu").sum() == 2


def test_profile_torch_in_process(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    out = tmp_path / "inproc" / "t.pt.trace.json"
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with profile_torch(out, device="cpu") as handle:
        for _ in range(2):
            with torch.profiler.record_function("perfguard.iteration"):
                model(torch.randn(4, 8)).sum().backward()
    assert handle.device == "cpu" and handle.path == out.resolve()
    trace = perfguard.load_trace(out)
    assert {"aten::linear", "aten::relu"} <= set(trace.ranges["name"])
    assert len(perfguard.analyze(trace).iterations) == 2

    failed = tmp_path / "failed.pt.trace.json.gz"
    with pytest.raises(ZeroDivisionError), profile_torch(failed):
        model(torch.randn(2, 8))
        _ = 1 / 0
    assert "aten::linear" in set(perfguard.load_trace(failed).ranges["name"])


def test_profile_torch_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(CaptureError, match="torch.cuda.is_available"):
        with profile_torch(tmp_path / "t.json", device="cuda"):
            pass


@pytest.mark.parametrize(
    ("command", "target"),
    [
        (["python", "train.py", "-x"], ["train.py", "-x"]),
        (["python3.11", "-m", "pkg.mod", "a"], ["-m", "pkg.mod", "a"]),
        ([sys.executable, "-c", "print(1)"], ["-c", "print(1)"]),
        (["./bench.py", "--n", "3"], ["./bench.py", "--n", "3"]),
    ],
)
def test_python_target_accepts_python_commands(command, target) -> None:
    assert python_target(command) == target


@pytest.mark.parametrize(
    ("command", "match"),
    [
        (["./train_binary", "--n", "3"], "Python programs only.*nsys"),
        (["bash", "-c", "python x.py"], "Python programs only"),
        (["python", "-u", "x.py"], "interpreter options"),
        (["python"], "interpreter"),
    ],
)
def test_python_target_refuses_other_commands(command, match) -> None:
    with pytest.raises(CaptureError, match=match):
        python_target(command)


def test_torch_backend_refuses_nsys_only_options(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="delay and capture range need the nsys backend"):
        TorchBackend().capture(
            ["python", "x.py"], output_dir=tmp_path, delay=2, capture_range="cudaProfilerApi"
        )


def test_run_target_restores_argv_and_propagates_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner's program execution, without the profiler (fast, in-process)."""
    pkg = tmp_path / "pgtarget"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text(
        "import sys\nSEEN = list(sys.argv)\nprint('argv', sys.argv[1:], __name__)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    (tmp_path / "boom.py").write_text("raise ValueError('bad config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list(sys.argv)

    assert run_target(["-m", "pgtarget.job", "7"]) == 7
    assert run_target(["-m", "pgtarget.job", "0"]) == 0
    assert run_target([str(tmp_path / "boom.py")]) == 1
    assert run_target(["-c", "import sys; sys.exit('fatal: no data')"]) == 1
    assert run_target(["-c", "import sys; assert sys.argv == ['-c', 'a']", "a"]) == 0
    assert sys.argv == before

    err = capsys.readouterr()
    assert "argv ['7'] __main__" in err.out
    assert "ValueError: bad config" in err.err and "fatal: no data" in err.err


# ---------------------------------------------------------------------------- auto


def test_auto_prefers_nsys_with_a_gpu(fake_nsys, monkeypatch: pytest.MonkeyPatch) -> None:
    exe, _ = fake_nsys()
    monkeypatch.setenv("PATH", str(exe.parent))
    monkeypatch.delenv("PERFGUARD_NSYS", raising=False)
    monkeypatch.setattr(capture_select, "gpu_present", lambda: (True, "a GPU (test)"))
    backend = select_backend("auto")
    assert isinstance(backend, NsysBackend)
    assert "nsys found" in backend.why and "a GPU (test)" in backend.why


def test_auto_without_gpu_picks_torch_on_cpu(fake_nsys, monkeypatch: pytest.MonkeyPatch) -> None:
    exe, _ = fake_nsys()
    monkeypatch.setenv("PATH", str(exe.parent))
    monkeypatch.delenv("PERFGUARD_NSYS", raising=False)
    monkeypatch.setattr(capture_select, "gpu_present", lambda: (False, "no GPU (test)"))
    backend = select_backend("auto")
    assert isinstance(backend, TorchBackend) and backend.device == "cpu"
    assert "torch on the CPU" in backend.why and "no GPU (test)" in backend.why


def test_auto_with_nothing_available_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_nsys_anywhere
) -> None:
    monkeypatch.setattr(
        torch_profiler, "torch_available", lambda: (False, "PyTorch is not installed (test)")
    )
    with pytest.raises(CaptureError) as err:
        profile_command(HELLO, output_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert "Nsight Systems" in message and "perfguard[torch]" in message
    with pytest.raises(CaptureError, match="not installed"):
        select_backend("torch")


def test_unknown_backend(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="unknown capture backend 'perf'"):
        profile_command(HELLO, backend="perf", output_dir=tmp_path)


def test_capture_package_does_not_import_torch_or_analysis() -> None:
    """The layer rule, and that perfguard works without torch: checked in a fresh interpreter."""
    import subprocess

    code = textwrap.dedent(
        """
        import sys
        import perfguard.capture.select, perfguard.capture.torch_profiler
        import perfguard.capture.nsys, perfguard.capture.process
        assert "torch" not in sys.modules, "torch imported eagerly"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    for module in ("base", "nsys", "process", "select", "torch_profiler", "torch_runner"):
        source = (Path(perfguard.__file__).parent / "capture" / f"{module}.py").read_text()
        assert "perfguard.analysis" not in source and "perfguard.report" not in source, module


# ---------------------------------------------------------------------------- perfguard profile


def _perfguard(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfguard", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_cli_profile_torch_captures_then_analyses(tmp_path: Path) -> None:
    """The whole run with torch's stacks, as before the window (test_profile_window)."""
    script = tmp_path / "train.py"
    script.write_text(MLP_SCRIPT)
    out = tmp_path / "out"
    run = _perfguard(
        "profile",
        "--backend",
        "torch",
        "--iterations",
        "all",
        "--with-stack",
        "--output-path",
        str(out),
        "--reports",
        "detail",
        "--formats",
        "csv",
        "--",
        sys.executable,
        str(script),
        str(tmp_path / "seen.json"),
    )
    assert run.returncode == 0, run.stderr
    assert f"capture: {out / 'capture.pt.trace.json.gz'} (torch: the whole run, " in run.stdout
    assert "Iterations                       3" in run.stdout
    # the sidecar: names and call sites from the profiler's in-memory results
    assert sorted(p.name for p in out.iterdir()) == [
        "capture.pt.trace.json.gz",
        "capture.pt.trace.json.gz.perfguard",
        "dlprof_detail.csv",
    ]
    detail = (out / "dlprof_detail.csv").read_text()
    assert "Call Site" in detail.splitlines()[0] and "train.py:" in detail
    # re-analysis of the kept capture with another iteration range needs no new capture
    again = _perfguard(
        "analyze",
        "-d",
        str(out / "capture.pt.trace.json.gz"),
        "--iter-start",
        "1",
        "--output-path",
        str(tmp_path / "again"),
        "--reports",
        "summary",
    )
    assert again.returncode == 0, again.stderr
    assert "Iteration Range                  1-2" in again.stdout


def test_cli_profile_nsys_through_fake_executable(fake_nsys, tmp_path: Path) -> None:
    nsys, log = fake_nsys()
    out = tmp_path / "out"
    run = _perfguard(
        "profile",
        "--backend",
        "nsys",
        "--nsys",
        str(nsys),
        "--capture-range",
        "nvtx:train",
        "--delay",
        "2",
        "--output-path",
        str(out),
        "--reports",
        "summary",
        "--",
        *HELLO,
    )
    assert run.returncode == 0, run.stderr
    (call,) = calls(log)
    options = [
        "-y",
        "2",
        "--capture-range=nvtx",
        "--nvtx-capture=train",
        "--capture-range-end=stop",
    ]
    assert call["argv"] == contract(nsys, out / "capture", *options)
    assert "Capture Format                   nsys-sqlite" in run.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "torch", "--"], "no command to profile"),
        (["--backend", "nsys", "--nsys", "/nonexistent/nsys", "--", "true"], "nsys"),
        (["--backend", "nsys", "--capture-range", "bogus", "--", "true"], "capture"),
    ],
)
def test_cli_profile_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    run = _perfguard("profile", "--output-path", str(tmp_path / "o"), *args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert len(run.stderr.strip().splitlines()) == 1 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
