"""Bad input: one typed error naming the file, and ``perfguard analyze`` exits 2 with one line.

Every input is built here from scratch or from a real capture (copied, then
cut or damaged; the fixtures themselves are never touched). Each one is
checked twice: the library (:func:`perfguard.load_trace` raises
:class:`perfguard.TraceError` whose one-line message names the file and the
problem) and the command, run as a real subprocess (exit status 2, exactly
one line on stderr naming the file, no traceback, nothing on stdout, no
report written).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import perfguard
from perfguard import AnalysisError, TraceError, load_trace
from perfguard.report.dlprof import ALL_REPORTS

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "captures" / "a100_alexnet_tiny_cudasync.pt.trace.json.gz"
SAXPY = "nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite"
A100_STEPS = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"  # ProfilerStep#4..6
TIMEOUT = 120


# As root a chmod 000 file still reads: CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH let root
# past the mode bits (and CI runs as root). A child that drops those two capabilities
# stays uid 0, so it still reads the venv and the clone wherever they are, but the kernel
# refuses it a file whose mode grants its owner nothing, as it refuses anyone else.
# capget/capset through ctypes: no setpriv or capsh needed. Exits 3 if the drop failed.
DROP_DAC = """
import ctypes, sys
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint32) for f in ("effective", "permitted", "inheritable")]
libc = ctypes.CDLL(None, use_errno=True)
header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
keep = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # all but CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
if libc.capget(ctypes.byref(header), data) != 0:
    sys.exit(3)
for f in ("effective", "permitted", "inheritable"):
    setattr(data[0], f, getattr(data[0], f) & keep)
if libc.capset(ctypes.byref(header), data) != 0:
    sys.exit(3)
"""
UNREADABLE = "unreadable file"


def preamble(name: str) -> str:
    """The code a child runs first: as root, the unreadable file's case drops the two
    capabilities; every other case, and any other user, needs nothing."""
    return DROP_DAC if name == UNREADABLE and os.geteuid() == 0 else "import sys\n"


def python_for(name: str) -> list[str]:
    """``python`` for ``python -m perfguard``, in the child of :func:`preamble`."""
    code = preamble(name)
    if code == "import sys\n":
        return [sys.executable]
    # sys.argv is ["-c", "-m", MODULE, ARGS...]: run MODULE as -m would, with ARGS
    run = (
        "import runpy\nmodule = sys.argv[2]\ndel sys.argv[1:3]\n"
        "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
    )
    return [sys.executable, "-c", code + run]


def run_cli(
    *args: str | Path, env: dict[str, str] | None = None, python: list[str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*(python or [sys.executable]), "-m", "perfguard", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def one_line(stderr: str) -> str:
    """The single non-empty stderr line, with no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{stderr}"
    assert lines[0].strip(), "the error line is blank"
    return lines[0]


# --------------------------------------------------------------------------- the bad files

SQLITE_MAGIC = b"SQLite format 3\x00"


def _copy_writable(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)  # contents only: the fixtures are read-only
    os.chmod(dst, 0o644)
    return dst


def _foreign_sqlite(p: Path) -> None:
    con = sqlite3.connect(p)
    con.executescript(
        "CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT);"
        "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INTEGER, total REAL);"
        "INSERT INTO customers VALUES (1, 'ada'), (2, 'grace');"
        "INSERT INTO orders VALUES (1, 1, 9.5), (2, 2, 12.0);"
    )
    con.commit()
    con.close()


def _empty_sqlite(p: Path) -> None:
    con = sqlite3.connect(p)
    con.execute("PRAGMA user_version = 7")  # forces a header page to be written, no tables
    con.commit()
    con.close()


def _corrupt_kernel_table(src: Path, dst: Path) -> None:
    """Overwrite the middle of CUPTI_ACTIVITY_KIND_KERNEL's root page with garbage."""
    con = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    root = con.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'"
    ).fetchone()[0]
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    data = bytearray(src.read_bytes())
    start = (root - 1) * page_size
    data[start + 100 : start + page_size - 100] = b"\xa5" * (page_size - 200)
    dst.write_bytes(bytes(data))


def _kineto_events(*events: dict) -> str:
    return json.dumps({"schemaVersion": 1, "traceEvents": list(events)})


KERNEL = {
    "ph": "X",
    "cat": "kernel",
    "name": "k",
    "pid": 0,
    "tid": 7,
    "ts": 10,
    "dur": 5,
    "args": {"correlation": 1, "device": 0, "stream": 7},
}
LAUNCH = {
    "ph": "X",
    "cat": "cuda_runtime",
    "name": "cudaLaunchKernel",
    "pid": 1,
    "tid": 1,
    "ts": 5,
    "dur": 2,
    "args": {"correlation": 1},
}


def _make_inputs(root: Path, fixtures: Path | None) -> dict[str, tuple[Path, Path | None]]:
    """name -> (the path to pass, the path the message must name; None = the same)."""
    out: dict[str, tuple[Path, Path | None]] = {}

    def add(name: str, path: Path, named: Path | None = None) -> Path:
        out[name] = (path, named)
        return path

    add("missing file", root / "no_such_capture.sqlite")
    add("empty file", root / "empty.json").write_bytes(b"")
    add("empty .sqlite file", root / "empty.sqlite").write_bytes(b"")
    add("text file", root / "notes.txt").write_text("step time went up again\nsee ticket\n")
    add("PNG image", root / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    add("ELF binary", root / "a.out").write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 500)
    _foreign_sqlite(add("foreign SQLite database", root / "shop.sqlite"))
    _empty_sqlite(add("empty SQLite database", root / "nothing.sqlite"))

    example = EXAMPLE.read_bytes()
    # cut before the first event: a capture cut later keeps its complete events
    # (tests/test_trace_kineto_repair.py)
    add("gzip cut in its header", root / "cut.pt.trace.json.gz").write_bytes(example[:300])
    add("gzip of non-JSON", root / "words.json.gz").write_bytes(
        gzip.compress(b"this is plain text, not a trace\n" * 50)
    )
    text = gzip.decompress(example)
    cut = text.index(b'"traceEvents"') + 100
    add("JSON cut in its first event", root / "cut.pt.trace.json").write_bytes(text[:cut])
    add("JSON object, not a trace", root / "config.json").write_text('{"a": 1}')
    add("JSON array, not a trace", root / "list.json").write_text("[1, 2]")
    add("traceEvents not a list", root / "te_string.json").write_text('{"traceEvents": "x"}')
    add("traceEvents empty", root / "te_empty.json").write_text('{"traceEvents": []}')
    add("traceEvents of numbers", root / "te_numbers.json").write_text('{"traceEvents": [1, 2]}')
    add("unknown categories only", root / "browser.json").write_text(
        _kineto_events(
            {"ph": "X", "cat": "blink", "name": "Layout", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
            {"ph": "X", "cat": "v8", "name": "GC", "pid": 1, "tid": 1, "ts": 4, "dur": 1},
        )
    )
    add("kernel with a text timestamp", root / "bad_ts.json").write_text(
        _kineto_events(dict(KERNEL, ts="soon"), LAUNCH)
    )
    add("rank that is not a number", root / "bad_rank.json").write_text(
        json.dumps({"traceEvents": [KERNEL, LAUNCH], "distributedInfo": {"rank": "zero"}})
    )
    add("nsys report (.nsys-rep)", root / "profile.nsys-rep").write_bytes(b"\x00NSYS" * 40)
    add("nsys report (.qdrep)", root / "old_profile.qdrep").write_bytes(b"\x00QDREP" * 40)

    (root / "empty_dir").mkdir()
    add("empty directory", root / "empty_dir")
    no_traces = root / "no_traces_dir"
    no_traces.mkdir()
    (no_traces / "README.txt").write_text("results\n")
    (no_traces / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    add("directory without trace files", no_traces)
    junk = root / "junk_json_dir"
    junk.mkdir()
    shutil.copyfile(EXAMPLE, junk / "good_rank0.pt.trace.json.gz")
    (junk / "settings.json").write_text('{"lr": 0.1}')
    add("directory with a non-trace .json", junk, junk / "settings.json")
    dup = root / "dup_rank_dir"
    dup.mkdir()
    shutil.copyfile(EXAMPLE, dup / "a_rank0.pt.trace.json.gz")
    shutil.copyfile(EXAMPLE, dup / "b_rank0.pt.trace.json.gz")
    add("directory with a duplicate rank", dup, dup / "b_rank0.pt.trace.json.gz")

    locked = root / "locked.pt.trace.json.gz"
    shutil.copyfile(EXAMPLE, locked)
    locked.chmod(0)
    add(UNREADABLE, locked)

    if fixtures is not None and (fixtures / SAXPY).exists():
        nsys = (fixtures / SAXPY).read_bytes()
        add("nsys export cut in half", root / "half.sqlite").write_bytes(nsys[: len(nsys) // 2])
        add("nsys export, first 4096 bytes", root / "head.sqlite").write_bytes(nsys[:4096])
        _corrupt_kernel_table(
            fixtures / SAXPY, add("nsys kernel table corrupt", root / "bad.sqlite")
        )
        bad_values = _copy_writable(fixtures / SAXPY, root / "text_in_int_column.sqlite")
        con = sqlite3.connect(bad_values)
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'yesterday'")
        con.commit()
        con.close()
        add("nsys kernel start is text", bad_values)
    return out


#: case -> what the problem statement must say (regex, case-insensitive)
PROBLEMS: dict[str, str] = {
    "missing file": r"no such file",
    "empty file": r"empty",
    "empty .sqlite file": r"empty",
    "text file": r"not an nsys SQLite export or a PyTorch profiler",
    "PNG image": r"not an nsys SQLite export or a PyTorch profiler",
    "ELF binary": r"not an nsys SQLite export or a PyTorch profiler",
    "foreign SQLite database": r"not an nsys export",
    "empty SQLite database": r"not an nsys export",
    "gzip cut in its header": r"truncated or corrupt gzip",
    "gzip of non-JSON": r"not valid JSON",
    "JSON cut in its first event": r"truncated or corrupt before its first complete event",
    "JSON object, not a trace": r"not a Kineto/Chrome trace",
    "JSON array, not a trace": r"not a Kineto/Chrome trace",
    "traceEvents not a list": r"not a Kineto/Chrome trace",
    "traceEvents empty": r"no events",
    "traceEvents of numbers": r"traceEvents\[0\] is not an event object",
    "unknown categories only": r"no PyTorch profiler events .*blink, v8",
    "kernel with a text timestamp": r"event 0 \(kernel 'k'\) has ts 'soon', not a time",
    "rank that is not a number": r"rank is not an integer",
    "nsys report (.nsys-rep)": r"nsys export --type sqlite",
    "nsys report (.qdrep)": r"nsys export --type sqlite",
    "empty directory": r"no \.json, \.json\.gz or \.sqlite capture files",
    "directory without trace files": r"no \.json, \.json\.gz or \.sqlite capture files",
    "directory with a non-trace .json": r"not a Kineto/Chrome trace",
    "directory with a duplicate rank": r"rank 0 appears twice",
    "unreadable file": r"cannot read file .*permission denied",
    "nsys export cut in half": r"truncated SQLite file",
    "nsys export, first 4096 bytes": r"truncated SQLite file",
    "nsys kernel table corrupt": r"damaged|malformed|corrupt",
    "nsys kernel start is text": r"malformed nsys export",
}
NEEDS_FIXTURES = {k for k in PROBLEMS if k.startswith("nsys ") and "report" not in k}


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    from conftest import FIXTURES

    made = _make_inputs(tmp_path_factory.mktemp("bad_inputs"), FIXTURES)
    return {name: (path, named or path) for name, (path, named) in made.items()}


@pytest.fixture(params=sorted(PROBLEMS))
def bad(request: pytest.FixtureRequest, bad_inputs) -> tuple[str, Path, Path]:
    name = request.param
    if name not in bad_inputs:
        assert name in NEEDS_FIXTURES
        from conftest import NO_FIXTURES

        pytest.skip(NO_FIXTURES)
    path, named = bad_inputs[name]
    return name, path, named


LOAD_IN_CHILD = """
import json, perfguard
try:
    perfguard.load_trace(sys.argv[1])
except perfguard.TraceError as err:
    print(json.dumps([type(err) is perfguard.TraceError, str(err), err.path, err.problem]))
"""


def trace_error(name: str, path: Path) -> tuple[bool, str, str, str]:
    """``load_trace(path)``'s error: (exactly a TraceError, message, path, problem); the
    unreadable file's as root in a child that cannot read past a file's mode."""
    if preamble(name) == "import sys\n":
        with pytest.raises(TraceError) as info:
            load_trace(path)
        err = info.value
        return type(err) is perfguard.TraceError, str(err), err.path, err.problem
    code = preamble(name) + LOAD_IN_CHILD
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )
    assert done.returncode == 0 and done.stdout, (done.returncode, done.stderr)
    exact, message, err_path, problem = json.loads(done.stdout)
    return exact, message, err_path, problem


def test_library_raises_one_trace_error(bad: tuple[str, Path, Path]) -> None:
    name, path, named = bad
    exact, message, err_path, problem = trace_error(name, path)
    assert exact
    assert "\n" not in message and "\r" not in message
    assert message == f"{err_path}: {problem}"
    assert err_path == str(named), f"{name}: names {err_path}, expected {named}"
    assert re.search(PROBLEMS[name], problem, re.I), f"{name}: {message}"


PROBE = """
for p in sys.argv[1:]:
    try:
        open(p, "rb").close()
        print(p, "read")
    except PermissionError:
        print(p, "refused")
"""


def test_unreadable_file_is_unreadable_in_its_child(bad_inputs) -> None:
    """The case is real: the process that reads it is refused the file (as root, the
    child without the two capabilities), and a copy it may read loads."""
    path, _ = bad_inputs[UNREADABLE]
    readable = path.with_name("readable.pt.trace.json.gz")
    shutil.copyfile(EXAMPLE, readable)
    done = subprocess.run(
        [sys.executable, "-c", preamble(UNREADABLE) + PROBE, str(path), str(readable)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(path), "refused", str(readable), "read"]


def test_cli_exits_2_with_one_line(bad: tuple[str, Path, Path], tmp_path: Path) -> None:
    name, path, named = bad
    out = tmp_path / "reports"
    r = run_cli("analyze", "--database", path, "--output-path", out, python=python_for(name))
    assert r.returncode == 2, f"{name}: exit {r.returncode}\n{r.stderr}"
    line = one_line(r.stderr)
    assert line.startswith("perfguard: error: ")
    assert str(named) in line
    assert re.search(PROBLEMS[name], line, re.I), line
    assert r.stdout == ""
    assert not out.exists(), "a failed run must not create the output directory"


def test_trace_error_message_is_one_line_whatever_the_problem() -> None:
    err = TraceError("/data/run 1.sqlite", "first line\nsecond\tline  ")
    assert str(err) == "/data/run 1.sqlite: first line second line"
    assert isinstance(err, perfguard.PerfguardError)


def test_fixtures_are_not_modified_by_building_the_inputs(bad_inputs, fixtures_dir: Path) -> None:
    """The damaged copies are copies: the capture they came from still reads."""
    trace = load_trace(fixtures_dir / SAXPY)
    assert len(trace.kernels) == 5  # MANIFEST: kernels per deviceId [[0, 5]]


# --------------------------------------------------------------------- bad analysis options


@pytest.fixture(scope="module")
def example_trace():
    return load_trace(EXAMPLE)


def test_library_iteration_range_that_selects_nothing(fixture_file, cached_trace) -> None:
    trace = cached_trace(fixture_file(A100_STEPS))
    with pytest.raises(AnalysisError, match=r"1000\.\.6 is empty.*iterations 4\.\.6"):
        perfguard.analyze(trace, iter_start=1000)


def test_library_unknown_key_node(example_trace) -> None:
    with pytest.raises(AnalysisError, match="no_such_range"):
        perfguard.analyze(example_trace, key_node="no_such_range")


def test_cli_iteration_range_that_selects_nothing(fixture_file, tmp_path: Path) -> None:
    src = fixture_file(A100_STEPS)
    out = tmp_path / "out"
    r = run_cli("analyze", "--database", src, "--output-path", out, "--iter-start", "1000")
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert str(src) in line and re.search(r"iteration range 1000\.\.6 is empty", line), line
    assert r.stdout == "" and not out.exists()


def test_cli_iteration_range_on_a_trace_without_iterations(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_cli("analyze", "--database", EXAMPLE, "--output-path", out, "--iter-start", "1000")
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert str(EXAMPLE) in line and "--key-node" in line
    assert r.stdout == "" and not out.exists()


def test_cli_unknown_key_node(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_cli(
        "analyze", "--database", EXAMPLE, "--output-path", out, "--key-node", "no_such_range"
    )
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert str(EXAMPLE) in line and "'no_such_range' not found" in line
    assert r.stdout == "" and not out.exists()


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--reports", "bogus", r"--reports: unknown value\(s\) bogus; choose from summary, detail"),
        ("--formats", "xml", r"--formats: unknown value\(s\) xml; choose from csv, json"),
        ("--iter-start", "-1", r"--iter-start.*must be >= 0"),
        ("--iter-stop", "two", r"--iter-stop.*expected an integer"),
        ("--base-name", "sub/dir", r"--base-name.*plain file name"),
    ],
)
def test_cli_usage_errors_are_one_clean_line(
    option: str, value: str, expected: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = run_cli("analyze", "--database", EXAMPLE, "--output-path", out, option, value)
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert line.startswith("perfguard analyze: error: ") and line.endswith("(see --help)")
    assert re.search(expected, line), line
    assert r.stdout == "" and not out.exists()


def test_cli_without_a_command_is_a_usage_error() -> None:
    r = run_cli()
    assert r.returncode == 2
    assert "required" in one_line(r.stderr)


# ------------------------------------------------------------------------ the output side


def test_cli_output_path_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "results"
    target.write_text("keep me\n")
    r = run_cli("analyze", "--database", EXAMPLE, "--output-path", target)
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert str(target) in line and "not a directory" in line
    assert target.read_text() == "keep me\n"
    assert r.stdout == ""


@pytest.fixture(scope="module")
def existing_report_runs(tmp_path_factory: pytest.TempPathFactory):
    """One output folder holding a precious dlprof_kernel.csv: a run without, then with --force."""
    out = tmp_path_factory.mktemp("existing")
    precious = out / "dlprof_kernel.csv"
    precious.write_text("my hand-edited spreadsheet\n")
    refused = run_cli("analyze", "--database", EXAMPLE, "--output-path", out)
    after_refusal = sorted(p.name for p in out.iterdir())
    kept = precious.read_text()
    forced = run_cli("analyze", "--database", EXAMPLE, "--output-path", out, "--force")
    return out, refused, after_refusal, kept, forced


def test_cli_existing_report_is_refused_and_kept(existing_report_runs) -> None:
    out, refused, after_refusal, kept, _ = existing_report_runs
    assert refused.returncode == 2, refused.stderr
    line = one_line(refused.stderr)
    assert str(out / "dlprof_kernel.csv") in line and "--force" in line
    assert kept == "my hand-edited spreadsheet\n"
    assert after_refusal == ["dlprof_kernel.csv"], "nothing else may be written when refusing"
    assert refused.stdout == ""


def test_cli_existing_report_is_replaced_with_force(existing_report_runs) -> None:
    out, _, _, _, forced = existing_report_runs
    assert forced.returncode == 0, forced.stderr
    assert forced.stderr == ""
    header = (out / "dlprof_kernel.csv").read_text().splitlines()[0]
    assert header.startswith("Kernel Name,Op ID,Op Name,Direction,Uses TC")
    names = sorted(p.name for p in out.iterdir())
    expected = [f"dlprof_{r}.{f}" for r in ALL_REPORTS for f in ("csv", "json")]
    assert names == sorted([*expected, "dlprof_report.html"])


# ----------------------------------------------------------------------- internal failures

_BREAK_ANALYZE = (
    "import sys, perfguard.analysis as a, perfguard.cli as cli\n"
    "def broken(*args, **kwargs):\n"
    "    raise RuntimeError('simulated bug\\nwith a second line')\n"
    "a.analyze = broken\n"
    "sys.exit(cli.main(sys.argv[1:]))\n"
)


def _run_broken(tmp_path: Path, debug: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PERFGUARD_DEBUG"}
    if debug:
        env["PERFGUARD_DEBUG"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-c",
            _BREAK_ANALYZE,
            "analyze",
            "--database",
            str(EXAMPLE),
            "--output-path",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
        env=env,
    )


def test_internal_error_is_exit_3_and_one_line(tmp_path: Path) -> None:
    r = _run_broken(tmp_path, debug=False)
    assert r.returncode == 3, r.stderr
    line = one_line(r.stderr)
    assert "internal error: RuntimeError: simulated bug with a second line" in line
    assert "PERFGUARD_DEBUG=1" in line
    assert not (tmp_path / "out").exists()


def test_internal_error_shows_the_traceback_with_perfguard_debug(tmp_path: Path) -> None:
    r = _run_broken(tmp_path, debug=True)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "RuntimeError: simulated bug" in r.stderr


def test_cli_out_of_memory_is_one_line_naming_the_file(fixture_file) -> None:
    """A capture too big for the machine: a real parse under an address-space cap just
    above what the interpreter already uses."""
    trace = fixture_file("kineto/v100_torchrec_train_rank1_2022.pt.trace.json.gz")
    code = (
        "import resource, sys\n"
        "import perfguard.cli as c, perfguard.trace, perfguard.analysis\n"
        "vm = [l for l in open('/proc/self/status') if l.startswith('VmSize')][0]\n"
        "cap = int(vm.split()[1]) * 1024 + (40 << 20)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n"
        "sys.exit(c.main(['analyze', '-d', sys.argv[1], '--reports', 'summary',\n"
        "                 '--formats', 'csv', '--output-path', sys.argv[2]]))\n"
    )
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(
            [sys.executable, "-c", code, str(trace), out],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"perfguard: error: {trace}: not enough memory to read this capture (")


@pytest.mark.parametrize("per_rank", [False, True])
def test_a_rank_in_a_file_name_past_32_bits_is_a_one_line_error(
    tmp_path: Path, per_rank: bool
) -> None:
    """The model keeps ranks in 32 bits: a directory whose file name says
    ``rank99999999999`` is refused naming that file, in the merged read and in a
    per-rank worker alike (not an internal error)."""
    doc = json.loads(gzip.decompress(EXAMPLE.read_bytes()))
    doc.pop("distributedInfo", None)  # the rank then comes from the file name
    shutil.copy(EXAMPLE, tmp_path / "rank0.pt.trace.json.gz")
    odd = tmp_path / "rank99999999999.pt.trace.json"
    odd.write_text(json.dumps(doc))
    out = tmp_path / "out"
    result = run_cli("analyze", "-d", tmp_path, "--output-path", out, *(["--per-rank"] * per_rank))
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        f"perfguard: error: {odd}: rank 99999999999 is past 32 bits: "
        "no process has that place in a job"
    )
