"""Torch's own Kineto JSON bugs are read, not rejected (real CPU torch profiler captures).

torch 2.13 writes a ``record_function`` name as it is: a ``"`` in it makes
the file invalid JSON, a backslash becomes ``/`` and a name with non-ASCII
or control characters becomes ``unknown``. The raw bytes are checked here,
so a torch that changes its writer fails these tests instead of passing
them by accident.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from perfguard.errors import TraceError
from perfguard.trace import kineto_stream
from perfguard.trace.kineto import read_kineto

torch = pytest.importorskip("torch")

NAMES = ['attn"q<k>&v', "naïve→∑", "C:\\path", 'say "hi", "there"', "tab\there", "plain"]


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real CPU profiler capture with awkward record_function names."""
    from torch.profiler import ProfilerActivity, profile, record_function

    path = tmp_path_factory.mktemp("torch_names") / "names.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for name in NAMES:
            with record_function(name):
                torch.ones(3) + 1
    prof.export_chrome_trace(str(path))
    return path


def test_torch_writes_invalid_json(capture: Path) -> None:
    raw = capture.read_bytes()
    assert b'"name": "attn"q<k>&v",' in raw  # the quote is not escaped
    assert b'"name": "C:/path",' in raw  # the backslash is written as '/'
    assert b'"naive' not in raw and "naïve".encode() not in raw  # written as "unknown"
    with pytest.raises(ValueError):
        json.loads(raw)


def test_names_with_quotes_are_recovered_exactly(capture: Path) -> None:
    trace = read_kineto(capture)
    names = set(trace.ranges.loc[trace.ranges["category"] == "user_annotation", "name"])
    assert {'attn"q<k>&v', 'say "hi", "there"', "C:/path", "plain", "unknown"} <= names
    # each annotation encloses its aten::ones, as in the capture
    ones = trace.ranges[trace.ranges["name"] == "aten::ones"]
    assert len(ones) == len(NAMES)
    assert any("unescaped double quote" in n for n in trace.notes)
    assert any("named 'unknown'" in n for n in trace.notes)


def test_repaired_trace_matches_a_hand_escaped_copy(capture: Path, tmp_path: Path) -> None:
    """Independent check: escape the quotes by hand (torch writes one key per line)."""
    raw = capture.read_text()

    def escape(m: re.Match[str]) -> str:
        return m.group(1) + json.dumps(m.group(2)) + m.group(3)

    fixed = re.sub(r'^(\s*"name": )"(.*)"(,?)$', escape, raw, flags=re.M)
    json.loads(fixed)  # now valid
    (tmp_path / "fixed.json").write_text(fixed)
    a, b = read_kineto(capture), read_kineto(tmp_path / "fixed.json")
    pd.testing.assert_frame_equal(a.ranges, b.ranges)
    assert b.notes == [
        "2 op(s) are named 'unknown': torch writes that in place of a "
        "record_function name with non-ASCII or control characters, whose real "
        "name is not in the file"
    ]


def _event_ends(text: str) -> list[tuple[int, dict]]:
    """(byte offset just after the event, event) for every event of a valid trace."""
    dec = json.JSONDecoder()
    i = text.index("[", text.index('"traceEvents"')) + 1
    out = []
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "]":
            return out
        ev, i = dec.raw_decode(text, i)
        out.append((len(text[:i].encode()), ev))


@pytest.fixture(scope="module")
def valid_capture(capture: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The capture with its one torch bug fixed by hand, for cutting at known offsets."""
    raw = capture.read_text()
    fixed = re.sub(
        r'^(\s*"name": )"(.*)"(,?)$',
        lambda m: m.group(1) + json.dumps(m.group(2)) + m.group(3),
        raw,
        flags=re.M,
    )
    path = tmp_path_factory.mktemp("valid") / "valid.pt.trace.json"
    path.write_text(fixed)
    return path


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.77, 0.9, 0.999])
def test_truncated_capture_keeps_every_complete_event(
    valid_capture: Path, tmp_path: Path, fraction: float
) -> None:
    raw = valid_capture.read_bytes()
    cut = int(len(raw) * fraction)
    path = tmp_path / "cut.json"
    path.write_bytes(raw[:cut])
    ends = _event_ends(raw.decode())
    complete = [e for end, e in ends if end <= cut]
    expected = [
        e["name"]
        for e in complete
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
    ]
    trace = read_kineto(path)
    assert sorted(trace.ranges["name"]) == sorted(expected)
    assert any(f"ends inside its event list at byte {cut:,}" in n for n in trace.notes)


def test_truncated_gzip_capture_is_salvaged(valid_capture: Path, tmp_path: Path) -> None:
    full = read_kineto(valid_capture)
    packed = gzip.compress(valid_capture.read_bytes())
    path = tmp_path / "cut.pt.trace.json.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])
    trace = read_kineto(path)
    assert 0 < len(trace.ranges) < len(full.ranges)
    got = trace.ranges[["name", "start", "end"]]
    want = full.ranges[["name", "start", "end"]].iloc[: len(got)]
    pd.testing.assert_frame_equal(  # coded names: each trace's categories those it holds
        got.reset_index(drop=True), want.reset_index(drop=True), check_categorical=False
    )
    assert any("gzip file is truncated" in n for n in trace.notes)


def test_damage_far_before_the_cut_is_salvaged_in_few_decodes(
    valid_capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte mangled early in a file that is also cut short (what a flipped gzip byte
    leaves, fuzz case 8015): the events before the damage are read, and the salvage
    does not try every event end from the last one (each try was a full repair
    attempt: over 30 CPU s on a 10 MB piece)."""
    raw = valid_capture.read_bytes()
    ends = _event_ends(raw.decode())
    bad = ends[len(ends) // 5][0] + 3  # just inside the event after the fifth one
    mangled = raw[:bad] + b"\x00\x07{{" + raw[bad + 4 : int(len(raw) * 0.9)]
    path = tmp_path / "mangled.json"
    path.write_bytes(mangled)
    repairs = []
    real = kineto_stream.repair_piece
    monkeypatch.setattr(
        kineto_stream, "repair_piece", lambda *a, **k: repairs.append(1) or real(*a, **k)
    )
    trace = read_kineto(path)
    expected = [
        e["name"]
        for end, e in ends
        if end <= bad and e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
    ]
    assert sorted(trace.ranges["name"]) == sorted(expected)
    assert len(repairs) <= kineto_stream._MAX_SALVAGE_DECODES + 2
    assert any("ends inside its event list" in n for n in trace.notes)


def test_cut_inside_a_broken_name_still_salvages(capture: Path, tmp_path: Path) -> None:
    raw = capture.read_bytes()
    cut = raw.index(b'say "h') + 5  # inside a name with unescaped quotes
    (tmp_path / "cut.json").write_bytes(raw[:cut])
    trace = read_kineto(tmp_path / "cut.json")
    assert any("ends inside its event list" in n for n in trace.notes)


def _write_events(path: Path, body: str) -> Path:
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + body + '\n], "traceName": "t"}')
    return path


def _op(name_json: str, extra: str = "") -> str:
    return (
        '  {"ph": "X", "cat": "cpu_op", "name": ' + name_json + ', "pid": 1, "tid": 1,'
        ' "ts": 10.5, "dur": 2' + extra + "}"
    )


def test_other_writer_bugs_are_repaired_with_notes(tmp_path: Path) -> None:
    body = ",\n".join(
        [
            # unescaped backslashes (one that starts a valid escape, like \t, cannot be told apart)
            _op('"C:\\Users\\me"'),
            _op('"x"', ', "args": {"Sequence number": NaN}'),  # NaN is not JSON
            _op('"lone \\ud800 surrogate"'),
            _op('"fine"'),
        ]
    )
    trace = read_kineto(_write_events(tmp_path / "bugs.json", body))
    assert list(trace.ranges["name"]) == ["C:\\Users\\me", "x", "lone \ufffd surrogate", "fine"]
    assert trace.ranges["seq"].isna().all()
    text = " ".join(trace.notes)
    assert "backslash" in text and "NaN/Infinity" in text and "surrogate" in text


def test_non_text_names_are_read_as_text(tmp_path: Path) -> None:
    trace = read_kineto(_write_events(tmp_path / "n.json", _op("123") + ",\n" + _op('"a"')))
    assert list(trace.ranges["name"]) == ["123", "a"]
    assert any("not text" in n for n in trace.notes)


def test_garbage_that_no_repair_explains_is_one_trace_error(tmp_path: Path) -> None:
    path = _write_events(tmp_path / "bad.json", _op('"a"') + ",\n  {{{ garbage ]]\n," + _op('"b"'))
    with pytest.raises(TraceError) as info:
        read_kineto(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_valid_fixtures_never_reach_the_repair(monkeypatch, fixture_file) -> None:
    def fail(*_a, **_k):
        raise AssertionError("the repair ran on a valid trace")

    monkeypatch.setattr(kineto_stream, "repair_piece", fail)
    trace = read_kineto(fixture_file("kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"))
    assert trace.notes == [] and len(trace.kernels) == 2700


def test_small_pieces_give_the_same_tables(monkeypatch, fixture_file, tmp_path: Path) -> None:
    """Cutting the array at many places (and at '},{' inside a name) changes nothing."""
    src = fixture_file("kineto/a100_alexnet_tiny_cudasync.pt.trace.json.gz")
    text = gzip.decompress(src.read_bytes()).decode()
    text = text.replace('"name": "aten::empty"', '"name": "aten::empty\\"}, {\\""', 1)
    path = tmp_path / "t.json"
    path.write_text(text)
    whole = read_kineto(path)
    monkeypatch.setattr(kineto_stream, "PIECE_BYTES", 2048)
    pieces = read_kineto(path)
    for table in ("ranges", "api_calls", "kernels", "memops", "threads"):
        pd.testing.assert_frame_equal(getattr(whole, table), getattr(pieces, table))
    assert 'aten::empty"}, {"' in set(pieces.ranges["name"])
