"""The Trace model's column types: coded text and 32-bit ids.

Text columns of the event tables are categoricals whose categories sort as
text does, ids and ranks are int32; the helpers that build and combine them
are checked here against pandas' own conversions, and on real captures the
tables as the readers and the analysis leave them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kineto_builder import KinetoBuilder

import perfguard
from perfguard.arrays import plain_text
from perfguard.trace.model import (
    INDEX,
    SCHEMA,
    categorical,
    coded_text,
    concat_tables,
    conform,
    fill_text,
    with_category,
)


def _texts(seed: int, n: int = 5000) -> np.ndarray:
    """Repeated names, some equal strings as distinct objects, some missing."""
    rng = np.random.default_rng(seed)
    words = ["aten::mm", "aten::add", 'say "hi"', "<b>&amp;", "ünïcode", "", "Z", "a"]
    picks = rng.integers(0, len(words) + 1, n)
    out = np.empty(n, dtype=object)
    for i, k in enumerate(picks):
        # a fresh object for half of the repeats: grouping by identity must not split them
        out[i] = None if k == len(words) else (words[k] if i % 2 else "".join(words[k]))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_coded_text_is_what_astype_category_gives(seed: int) -> None:
    values = _texts(seed)
    got = coded_text(values)
    want = pd.Categorical(values)
    assert list(got.categories) == sorted(set(v for v in values if v is not None))
    assert list(got.categories) == list(want.categories)
    assert (got.codes == want.codes).all()


def test_categorical_merges_equal_uniques_and_keeps_missing() -> None:
    got = categorical(np.array([0, 1, 2, -1, 3, 1]), ["b", "a", "b", None])
    assert got.tolist()[:3] == ["b", "a", "b"]
    assert pd.isna(got[3]) and pd.isna(got[4])
    assert list(got.categories) == ["a", "b"]


def test_text_mixed_with_numbers_is_coded_as_pandas_codes_it() -> None:
    values = np.array(["x", 3, None, "x", 2.5], dtype=object)
    got = coded_text(values)
    assert [v if not pd.isna(v) else None for v in got.tolist()] == ["x", 3, None, "x", 2.5]


def test_concat_tables_unites_categories_without_objects() -> None:
    a = pd.DataFrame(
        {"name": coded_text(np.array(["k2", "k1", None], dtype=object)), "v": [1, 2, 3]}
    )
    b = pd.DataFrame({"name": coded_text(np.array(["m", "k1"], dtype=object)), "v": [4, 5]})
    out = concat_tables([a, b])
    assert isinstance(out["name"].dtype, pd.CategoricalDtype)
    assert list(out["name"].cat.categories) == ["k1", "k2", "m"]
    want = pd.concat([a.astype({"name": object}), b.astype({"name": object})], ignore_index=True)
    assert out["name"].astype(object).tolist()[:2] == want["name"].tolist()[:2]
    assert out["name"].astype(object).tolist()[3:] == want["name"].tolist()[3:]
    assert pd.isna(out["name"][2])
    assert out["v"].tolist() == [1, 2, 3, 4, 5]


def test_with_category_lets_fillna_and_where_work_as_on_text() -> None:
    s = pd.Series(coded_text(np.array(["b", None, "a"], dtype=object)))
    filled = with_category(s, "").fillna("")
    assert filled.tolist() == ["b", "", "a"]
    assert list(filled.cat.categories) == ["", "a", "b"]  # still lexical
    assert with_category(s, "a") is s  # a category it has: nothing to do
    masked = with_category(s, "-").where(np.array([True, True, False]), "-")
    assert masked.iloc[0] == "b" and pd.isna(masked.iloc[1]) and masked.iloc[2] == "-"
    plain = pd.Series(["x", None], dtype=object)
    assert with_category(plain, "") is plain


@pytest.mark.parametrize("coded", [(True, True), (True, False), (False, True), (False, False)])
def test_fill_text_is_fillna_coded_or_not(coded: tuple[bool, bool]) -> None:
    a_values, b_values = _texts(1, 400), _texts(2, 400)
    a, b = (
        pd.Series(coded_text(v)) if c else pd.Series(v, dtype=object)
        for v, c in zip((a_values, b_values), coded, strict=True)
    )
    got = fill_text(a, b)
    want = pd.Series(a_values, dtype=object).fillna(pd.Series(b_values, dtype=object))
    assert (
        got.astype(object).where(got.notna(), None).tolist()
        == want.where(want.notna(), None).tolist()
    )
    assert isinstance(got.dtype, pd.CategoricalDtype) == any(coded)


def test_plain_text_is_the_type_text_built_from_objects_has() -> None:
    text = pd.Series(coded_text(np.array(["b", None, "a"], dtype=object)))
    assert plain_text(text).dtype == pd.Series(np.array(["b", None, "a"], dtype=object)).dtype
    assert plain_text(text).tolist()[::2] == ["b", "a"]
    none = pd.Series(coded_text(np.array([None, None], dtype=object)))
    assert plain_text(none).dtype == object


def test_conform_narrows_ids_and_never_wraps_one_around() -> None:
    df = pd.DataFrame(
        {
            "range_id": [0, 1],
            "start": [0, 1],
            "end": [5, 2],
            "depth": [0, 1],
            "parent_id": [-1, 0],
            "rank": [0, 3],
            "name": ["a", "b"],
        }
    )
    out = conform("ranges", df)
    for col in ("range_id", "depth", "parent_id", "rank"):
        assert out[col].dtype == INDEX and out[col].tolist() == df[col].tolist()
    assert isinstance(out["name"].dtype, pd.CategoricalDtype)
    with pytest.raises(OverflowError, match=r"ranges\.parent_id holds 4294967296"):
        conform("ranges", df.assign(parent_id=[-1, 2**32]))


def test_a_rank_past_32_bits_is_a_one_line_error_naming_the_file(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.op("aten::mm", 0, 10)
    b.launch((1, 2), (5, 3))
    path = b.write(tmp_path / "odd_rank.json")
    data = json.loads(path.read_text())
    data["distributedInfo"] = {"rank": 2**40}
    path.write_text(json.dumps(data))
    with pytest.raises(perfguard.TraceError) as err:
        perfguard.load_trace(path)
    msg = str(err.value)
    assert msg.startswith(str(path)) and "1099511627776" in msg and "\n" not in msg


def test_a_capture_stated_device_id_past_32_bits_is_still_analysed(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.op("aten::mm", 0, 10)
    b.launch((1, 2), (5, 3))
    b.events[-1]["args"]["device"] = 2**40
    b.events[-1]["args"]["grid"] = [2**33, 1, 1]
    a = perfguard.analyze(perfguard.load_trace(b.write(tmp_path / "odd_device.json")))
    assert a.kernels["grid_x"].tolist() == [2**33]
    assert a.activities["device_id"].tolist() == [2**40]
    assert a.ops["op_name"].tolist() == ["aten::mm"]


def test_real_captures_have_the_models_types(fixture_file, cached_trace) -> None:
    """The tables as a reader and the analysis leave them: the Trace's and the
    per-event Analysis tables' text coded and ids int32, the aggregates' text plain."""
    for rel in (
        "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite",
        "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
    ):
        trace = cached_trace(fixture_file(rel))
        for table, cols in SCHEMA.items():
            df = getattr(trace, table)
            # the one-row-per-device/thread tables keep text as it comes (object or str)
            got = ["object" if str(df[c].dtype) == "str" else str(df[c].dtype) for c in cols]
            assert got == [str(t) for t in cols.values()], table
        a = perfguard.analyze(trace)
        for df, coded, ids in (
            (
                a.activities,
                ["name", "short_name", "op_name", "op_id", "direction"],
                ["kernel_row", "range_id", "instance", "instance_row", "op_key"],
            ),
            (
                a.kept_instances,
                ["op_name", "name", "op_type", "op_id", "input_shapes"],
                ["instance", "op_key", "kernel_count", "memop_count"],
            ),
        ):
            for c in coded:
                assert isinstance(df[c].dtype, pd.CategoricalDtype), c
            for c in ids:
                assert df[c].dtype == np.int32, c
        for df in (a.ops, a.kernels):
            assert not any(isinstance(t, pd.CategoricalDtype) for t in df.dtypes)
        # a coded column reads as its text: the op names of the ops table are the instances'
        names = set(a.kept_instances["op_name"].astype(object).dropna())
        assert set(a.ops["op_name"]) >= names
        assert json.dumps(a.ops["op_name"].tolist())  # plain Python strings
