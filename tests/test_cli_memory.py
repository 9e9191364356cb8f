"""The command's process-wide settings (perfguard.memory, and exiting without
interpreter teardown): the command line takes them, a library caller of ``main([...])``
does not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from numpy._core import multiarray

from perfguard import memory
from perfguard.cli import build_parser, main
from perfguard.report.dlprof import ALL_REPORTS

EXAMPLE = (
    Path(__file__).resolve().parents[1]
    / "examples/captures/a100_alexnet_tiny_cudasync.pt.trace.json.gz"
)


@pytest.fixture
def huge_pages_on() -> Iterator[None]:
    """numpy's huge-page advice on for the test, the process's setting restored after."""
    before = multiarray._set_madvise_hugepage(True)
    yield
    multiarray._set_madvise_hugepage(before)


def test_the_command_stops_numpy_asking_for_huge_pages(huge_pages_on: None) -> None:
    memory._no_huge_pages()
    assert multiarray._set_madvise_hugepage(True) is False  # it was off


def test_main_called_with_arguments_leaves_the_process_alone(
    huge_pages_on: None, tmp_path: Path
) -> None:
    assert (
        main(
            [
                "analyze",
                "--database",
                str(EXAMPLE),
                "--output-path",
                str(tmp_path),
                "--formats",
                "csv",
            ]
        )
        == 0
    )
    assert multiarray._set_madvise_hugepage(True) is True  # still on


def test_exit_without_teardown_flushes_what_was_printed() -> None:
    """``analyze``/``profile`` end the program with os._exit (no teardown of a large
    analysis): buffered output must still arrive, and the exit code must carry."""
    code = (
        "import sys; from perfguard.cli import _exit_now; "
        "print('report line'); print('note', file=sys.stderr, end=''); _exit_now(7)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (7, "report line\n", "note")


def test_the_analyze_command_exits_through_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfguard",
            "analyze",
            "--database",
            str(EXAMPLE),
            "--output-path",
            str(tmp_path),
            "--formats",
            "csv",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    last = f"dlprof_{ALL_REPORTS[-1]}.csv"
    assert proc.stdout.rstrip().endswith(last)  # the last line arrived
    assert build_parser().parse_args(["analyze", "--database", "x"]).skip_teardown


def test_a_reader_that_closes_the_pipe_early_is_not_an_internal_error(tmp_path: Path) -> None:
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perfguard",
            "analyze",
            "--database",
            str(EXAMPLE),
            "--output-path",
            str(tmp_path),
            "--formats",
            "csv",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # as `| head -0` does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141
    assert err == ""


def _free_and_release(keep_mib: int, drop_mib: int) -> tuple[int, int, bool]:
    """In a fresh process with the command's heap settings: hold ``keep_mib``, free
    ``drop_mib`` under a live block, call ``release_free_pages``; (RSS MiB before, after,
    whether the libc reports its free heap)."""
    code = (
        "import numpy as np\n"
        "from perfguard import memory\n"
        "assert memory.reuse_freed_memory()\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20\n"
        f"keep = [np.ones(1 << 17) for _ in range({keep_mib})]\n"
        f"pieces = [np.ones(1 << 17) for _ in range({drop_mib})]  # what the reader drops\n"
        "top = np.ones(1 << 10)  # a live block above them: nothing to trim at the top\n"
        "del pieces\n"
        "before = rss()\n"
        "memory.release_free_pages()\n"
        "print(before, rss(), memory._free_heap() is not None)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after, known = proc.stdout.split()
    return int(before), int(after), known == "True"


def test_freed_memory_kept_in_the_heap_is_given_back_between_read_and_analysis() -> None:
    """With the command's settings freed blocks stay resident; ``release_free_pages``
    returns their pages (what the reader's dropped pieces cost at 1M kernels)."""
    before, after, _ = _free_and_release(keep_mib=320, drop_mib=320)
    assert before - after > 250  # MiB given back, out of 320 freed
    assert after > 300  # what is still alive stays


def test_a_little_freed_memory_stays_for_reuse() -> None:
    """Below TRIM_MIN_FREE the pages stay: giving them back would cost page faults when
    the analysis reuses them (0.06 s at 50k kernels) for no memory that matters."""
    before, after, known = _free_and_release(keep_mib=0, drop_mib=64)
    if not known:
        pytest.skip("this libc does not report its free heap (mallinfo2: glibc 2.33+)")
    assert before - after < 8  # MiB: nothing given back
