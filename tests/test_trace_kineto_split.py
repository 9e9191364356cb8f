"""Two processes read one large Kineto file exactly as one does (``kineto_split``).

Real fixtures, unpacked to plain JSON and cut into many small pieces so
that both halves hold many; each case compares every table, the notes and
the meta with the one-process reader's.
"""

from __future__ import annotations

import gzip
import sys
import threading
import types
from pathlib import Path

import pandas as pd
import pytest

from perfguard.forking import can_fork
from perfguard.trace import kineto, kineto_split, kineto_stream
from perfguard.trace.kineto import read_kineto
from perfguard.trace.model import Trace

NCCL = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"
KERNEL = '"cat": "kernel", "name": "'
TABLES = ("ranges", "api_calls", "kernels", "memops", "threads", "devices")


@pytest.fixture(autouse=True)
def _forkable() -> None:
    """These tests make perfguard fork; it never forks a process that imported JAX or
    TensorFlow (:mod:`perfguard.forking`), which an earlier in-process framework test of this
    worker may have done (the framework suite, beside the main one in a full venv)."""
    if not can_fork():
        pytest.skip("this process imported JAX or TensorFlow: perfguard never forks it")


@pytest.fixture
def plain(fixture_file, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real 2-rank NCCL trace as plain text, read in pieces of 64 KiB."""
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(gzip.decompress(fixture_file(NCCL).read_bytes()))
    monkeypatch.setattr(kineto_stream, "PIECE_BYTES", 64 << 10)
    return path


def _read(path: Path, monkeypatch: pytest.MonkeyPatch, split: bool) -> Trace:
    with monkeypatch.context() as m:
        m.setattr(kineto, "split_worthwhile", lambda _path: split)
        return read_kineto(path)


def _same(a: Trace, b: Trace) -> None:
    for table in TABLES:
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))
    assert a.notes == b.notes
    assert a.meta == b.meta


def _split_only(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fail the test if the split reader falls back to reading the rest itself."""
    calls: list[str] = []

    def refuse(*_args: object) -> None:
        calls.append("serial")
        raise AssertionError("the child's half was read again here")

    monkeypatch.setattr(kineto_split, "_serial_rest", refuse)
    return calls


def test_two_halves_equal_one_reader(plain: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _read(plain, monkeypatch, split=False)
    _split_only(monkeypatch)
    two = _read(plain, monkeypatch, split=True)
    _same(one, two)
    assert len(two.kernels) == 2700 and two.notes == []


def test_torch_bugs_in_the_second_half_are_repaired_there(
    plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unescaped quote (torch 2.13's record_function bug) past the middle: the child
    repairs it, and the notes count it once, as the one reader does."""
    text = plain.read_text()
    at = text.rindex(KERNEL) + len(KERNEL)  # the last kernel: in the second half
    assert at > len(text) * 0.6
    text = text[:at] + 'say "hi" ' + text[at:]
    plain.write_text(text)
    one = _read(plain, monkeypatch, split=False)
    _split_only(monkeypatch)
    two = _read(plain, monkeypatch, split=True)
    _same(one, two)
    assert any("unescaped double quote" in n for n in two.notes)
    assert any(n.startswith('say "hi" ') for n in two.kernels["name"])


def test_a_truncated_file_is_salvaged_by_the_child(
    plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = plain.read_bytes()
    plain.write_bytes(raw[: int(len(raw) * 0.9)])
    one = _read(plain, monkeypatch, split=False)
    _split_only(monkeypatch)
    two = _read(plain, monkeypatch, split=True)
    _same(one, two)
    assert any("ends inside its event list" in n for n in two.notes)


def test_a_split_inside_a_name_is_read_by_one_process(
    plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``},{`` inside a name looks like an event boundary: if the split lands there,
    neither half decodes, and this process reads on alone."""
    text = plain.read_text()
    at = text.index(KERNEL, len(text) // 2) + len(KERNEL)
    text = text[:at] + "x}, {y" + text[at:]
    plain.write_text(text)
    inner = len(text[: text.index("x}, {y")].encode()) + len("x}, ")
    monkeypatch.setattr(kineto_split, "_split_point", lambda _path, _after: inner)
    one = _read(plain, monkeypatch, split=False)
    two = _read(plain, monkeypatch, split=True)
    _same(one, two)
    assert any(n.startswith("x}, {y") for n in two.kernels["name"])


def test_a_failing_child_leaves_the_rest_to_this_process(
    plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(path, head, start, send, make_columns) -> None:  # noqa: ANN001 - the child's signature
        kineto_split._send(send, ("piece", {"ranges": [pd.DataFrame({"name": ["not used"]})]}))
        kineto_split._send(send, ("error", "MemoryError: killed"))
        send.close()

    monkeypatch.setattr(kineto_split, "_child", fail)
    one = _read(plain, monkeypatch, split=False)
    two = _read(plain, monkeypatch, split=True)
    _same(one, two)


def test_only_large_plain_files_are_split(plain: Path, tmp_path: Path) -> None:
    assert not kineto_split.split_worthwhile(plain)  # 10 MB: below SPLIT_BYTES
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kineto_split, "SPLIT_BYTES", 0)
        m.setattr(kineto_split, "_cpus", lambda: 2)
        assert not kineto_split.split_worthwhile(packed)  # a gzip stream has no middle
        m.setattr(kineto_split.threading, "enumerate", lambda: [threading.main_thread()])
        assert kineto_split.split_worthwhile(plain)
        for name, ok in (("perfguard-progress", True), ("Thread-7 (a user's)", False)):
            t = threading.Thread(target=lambda: None, name=name)
            m.setattr(kineto_split.threading, "enumerate", lambda t=t: [threading.main_thread(), t])
            assert kineto_split.split_worthwhile(plain) is ok  # forking a threaded process


def test_the_fork_waits_for_the_commands_background_import(
    plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI imports matplotlib on a thread while it reads; a fork taken while that
    thread holds a module's import lock would leave the child waiting on it."""
    release = threading.Event()
    done: list[str] = []

    def importing() -> None:
        release.wait(5)
        done.append("imported")

    t = threading.Thread(target=importing, name=kineto_split.IMPORT_THREAD)
    t.start()
    monkeypatch.setattr(kineto_split, "_split_point", lambda *_a: (done.append("split"), None)[1])
    threading.Timer(0.3, release.set).start()
    _read(plain, monkeypatch, split=True)
    t.join()
    assert done[:1] == ["imported"]  # the import finished before the split was planned


def test_a_process_with_a_threaded_runtime_reads_alone(
    plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big plain capture is read by two processes, except in one that imported JAX or
    TensorFlow (a fork copies one of their threads: JAX warns of a deadlock): the same
    trace, read here."""
    monkeypatch.setattr(kineto_split, "SPLIT_BYTES", 1 << 20)
    monkeypatch.setattr(kineto_split, "_cpus", lambda: 2)
    assert plain.stat().st_size >= kineto_split.SPLIT_BYTES
    assert kineto_split.split_worthwhile(plain)
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    assert not kineto_split.split_worthwhile(plain)
    _same(read_kineto(plain), _read(plain, monkeypatch, split=False))
