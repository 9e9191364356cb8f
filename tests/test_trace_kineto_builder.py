"""The Kineto reader's one table builder: the streaming reader (typed structs) and the plain
``json`` fallback (any JSON values) go through the same field table, so a file gives the same
tables, columns and types whichever way it was decoded."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kineto_builder import KinetoBuilder

from perfguard.trace import kineto
from perfguard.trace.kineto_stream import ARG_KEYS, Fallback

A100 = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"
LEGACY_2021 = "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz"
TABLES = ("ranges", "api_calls", "kernels", "memops", "threads")


def _plain_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the streaming reader decline, as it does for a field of an unexpected type."""

    def decline(*args: object, **kwargs: object) -> None:
        raise Fallback

    monkeypatch.setattr(kineto, "stream_events", decline)
    monkeypatch.setattr(kineto, "split_worthwhile", lambda path: False)


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    streamed = kineto.read_kineto(path)
    with monkeypatch.context() as m:
        _plain_only(m)
        plain = kineto.read_kineto(path)
    return streamed, plain


def _same_tables(a: object, b: object) -> None:
    for table in TABLES:
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), obj=table)


def test_the_field_table_reads_every_args_field() -> None:
    """Every ``Args`` field is read by the one builder: the event's own columns take the
    correlation, device and stream; :data:`kineto._ARG_COLUMNS` every other field."""
    own = {"correlation", "device", "stream"}
    table = {field for _, _, field, _ in kineto._ARG_COLUMNS}
    assert table | own == set(ARG_KEYS)
    assert {kind for *_, kind in kineto._ARG_COLUMNS} == {"int", "xyz", "json", "site"}


def _synthetic(tmp_path: Path) -> Path:
    b = KinetoBuilder()
    b.device("NVIDIA A100-SXM4-40GB", 8, 0)
    b.op("ProfilerStep#1", 0.0, 100.0, cat="user_annotation")
    b.op(
        "aten::addmm",
        1.0,
        20.0,
        args={
            "Input Dims": [[8, 4], [4, 2], []],
            "Input type": ["float", "float", ""],
            "Sequence number": 7,
            "Call stack": "train.py(12): step\ntorch/nn/x.py(3): f",
        },
    )
    b.launch((2.0, 3.0), (10.0, 5.0), kernel="void gemm<float>(float*)")
    b.launch((6.0, 1.0), (16.0, 2.0), kernel="Memcpy HtoD (Pageable -> Device)", cat="gpu_memcpy")
    b.op("aten::relu", 30.0, 5.0)
    b.launch((31.0, 1.0), (40.0, 1.0), kernel="relu_kernel", stream=9)
    return b.write(tmp_path / "t.json")


def test_both_readers_build_the_same_tables_from_a_hand_written_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    streamed, plain = _both(_synthetic(tmp_path), monkeypatch)
    _same_tables(streamed, plain)
    k = streamed.kernels.sort_values("start")
    assert list(k["grid_x"]) == [1, 1] and list(k["block_x"]) == [128, 128]
    assert str(k["registers"].dtype) == "Int64" and k["registers"].isna().all()
    assert list(k["stream_id"]) == [7, 9]
    assert list(streamed.memops["bytes"]) == [4096]
    op = streamed.ranges.set_index("name").loc["aten::addmm"]
    assert (op["input_shapes"], op["dtypes"], op["seq"]) == (
        "[[8,4],[4,2],[]]",
        '["float","float",""]',
        7,
    )
    assert op["call_site"] == "train.py:12"


@pytest.mark.parametrize("name", [A100, LEGACY_2021])
def test_both_readers_build_the_same_tables_from_real_traces(
    name: str, fixture_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    streamed, plain = _both(fixture_file(name), monkeypatch)
    _same_tables(streamed, plain)
