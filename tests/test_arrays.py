"""The fast numpy/pandas helpers give exactly what the library calls they replace give."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from perfguard.analysis.intervals import segment_figures, sort_by_group_then, union_length
from perfguard.analysis.iterations import _span_per_rank
from perfguard.analysis.ops import instance_rows
from perfguard.arrays import (
    Groups,
    _object_ids,
    factorize,
    first_rows,
    first_valid,
    levels,
    per_distinct,
    unique_first,
    unique_sorted,
)
from perfguard.trace.nesting import Nesting, range_tree
from perfguard.trace.nsys import _OP_ID_SUFFIX, _strip_op_ids


@pytest.mark.parametrize("n", [0, 1, 2, 7, 5000])
def test_unique_helpers_match_numpy(n):
    rng = np.random.default_rng(n)
    values = rng.integers(-50, 50, n)
    assert np.array_equal(unique_sorted(values), np.unique(values))
    uniq, first = unique_first(values)
    want_u, want_first = np.unique(values, return_index=True)
    assert np.array_equal(uniq, want_u) and np.array_equal(first, want_first)


def test_factorize_matches_pandas_with_repeats_nas_and_equal_distinct_objects():
    rng = random.Random(0)
    pool = ["aten::mm", "aten::add", "", None, float("nan"), "é" * 3, "sm90_xmma"]
    for n in (0, 3, 4095, 4096, 9000):
        values = [rng.choice(pool) for _ in range(n)]
        # equal strings that are not the same object must still share a code
        values = [
            "".join(list(v)) if isinstance(v, str) and rng.random() < 0.3 else v for v in values
        ]
        arr = np.array(values, dtype=object)
        for sentinel in (True, False):
            want_codes, want_uniques = pd.factorize(arr, use_na_sentinel=sentinel)
            codes, uniques = factorize(arr, use_na_sentinel=sentinel)
            assert np.array_equal(codes, want_codes)
            assert [None if pd.isna(u) else u for u in uniques] == [
                None if pd.isna(u) else u for u in want_uniques
            ]


def test_factorize_of_coded_text_is_pandas_factorize_of_its_values():
    """Coded text (a categorical) is factorized from its codes, renumbered in order of
    first appearance: the same codes and uniques as the text itself gives."""
    rng = np.random.default_rng(3)
    words = np.array(["b", "a", "zz", "", "é"], dtype=object)
    for n in (0, 1, 7, 500):
        values = words[rng.integers(0, len(words), n)]
        values[rng.random(n) < 0.2] = None
        # unused categories, in an order that is neither lexical nor of appearance
        categories = list(rng.permutation(["a", "b", "zz", "", "é", "unused"]))
        coded = pd.Series(pd.Categorical(values, categories=categories))
        for sentinel in (True, False):
            want_codes, want_uniques = pd.factorize(values, use_na_sentinel=sentinel)
            for given in (coded, coded.array):
                codes, uniques = factorize(given, use_na_sentinel=sentinel)
                assert codes.dtype == np.int64 and np.array_equal(codes, want_codes)
                assert [None if pd.isna(u) else u for u in uniques] == [
                    None if pd.isna(u) else u for u in want_uniques
                ]


def test_strip_op_ids_matches_the_regex_on_every_name():
    rng = random.Random(1)
    parts = [
        "aten::add",
        ", op_id = ",
        "12",
        "\n",
        "",
        "é",
        "x",
        ", op_id = 5",
        "seq = 3",
        "9",
        ",",
        " op_id = 1",
        "日本",
        "\x01",
    ]
    for _ in range(5000):
        names = [
            "".join(rng.choice(parts) for _ in range(rng.randint(0, 5)))
            for _ in range(rng.randint(1, 6))
        ]
        got = _strip_op_ids("\0".join(names)).split("\0")
        assert got == [_OP_ID_SUFFIX.sub("", name, count=1) for name in names]


def _random_ranges(rng: np.random.Generator, max_n: int, low_group: int = 0):
    """``(start, end, group)`` of up to ``max_n`` ranges with many ties and nestings."""
    n = int(rng.integers(0, max_n))
    start = rng.integers(0, 50, n)
    return start, start + rng.integers(0, 20, n), rng.integers(low_group, 3, n)


def test_sort_by_group_then_is_lexsort_and_nesting_order_is_lexsort():
    rng = np.random.default_rng(2)
    for _ in range(200):
        start, end, group = _random_ranges(rng, 300, low_group=-3)
        n = len(start)
        assert np.array_equal(sort_by_group_then(group, start), np.lexsort((start, group)))
        nest = Nesting(start, end, group - group.min() if n else group)
        want = np.lexsort((-end, start, group))
        assert np.array_equal(nest.order, want)


def test_nesting_order_of_ranges_listed_by_start_is_lexsort():
    """Exports list ranges by start: the order then comes from one radix sort of the
    thread codes, checked; ties (a parent and child starting together) in either
    order, and equal ranges, must give lexsort's order too."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        start, end, group = _random_ranges(rng, 300)
        by_start = np.argsort(start, kind="stable")
        start, end, group = start[by_start], end[by_start], group[by_start]
        if rng.random() < 0.5:  # longest first among equal starts, as a parent comes first
            order = np.lexsort((-end, start))
            start, end, group = start[order], end[order], group[order]
        nest = Nesting(start, end, group)
        assert np.array_equal(nest.order, np.lexsort((-end, start, group)))


def _push_pop_ranges(rng: np.random.Generator, n_threads: int = 3):
    """Ranges of a random push/pop walk per thread (laminar, as NVTX push/pop and
    framework ops are), with ties: zero-length ranges, a child starting or ending
    with its parent, siblings touching."""
    start, end, group = [], [], []
    for g in range(n_threads):
        t, stack = 0, []
        for _ in range(int(rng.integers(0, 60))):
            t += int(rng.integers(0, 3))  # 0: the same instant as the last event
            if stack and rng.random() < 0.45:
                start.append(stack.pop())
                end.append(t)
                group.append(g)
            else:
                stack.append(t)
        while stack:
            start.append(stack.pop())
            end.append(t)
            group.append(g)
    order = np.random.default_rng(int(rng.integers(1 << 30))).permutation(len(start))
    return (
        np.asarray(start, dtype=np.int64)[order],
        np.asarray(end, dtype=np.int64)[order],
        np.asarray(group, dtype=np.int64)[order],
    )


def test_range_tree_is_the_definition_by_brute_force():
    """Depth: the ranges of the thread sorted before one (start, then longest first)
    that are still open at its start (end > start, so a zero-length range is never
    open). Parent: the innermost of those, the last one sorted before it."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        start, end, group = _push_pop_ranges(rng)
        depth, parent = range_tree(start, end, group)
        order = np.lexsort((-end, start, group))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        for i in range(len(start)):
            before = (group == group[i]) & (rank < rank[i]) & (end > start[i])
            assert depth[i] == before.sum()
            open_rows = np.flatnonzero(before)
            want = open_rows[np.argmax(rank[open_rows])] if len(open_rows) else -1
            assert parent[i] == want
        nest = Nesting(start, end, group)
        assert np.array_equal(nest.unsorted_depth(), depth)
        assert np.array_equal(nest.unsorted_parent(), parent)


def test_levels_are_the_rows_at_each_depth():
    rng = np.random.default_rng(13)
    for n in (0, 1, 7, 300):
        for low in (0, -2):  # below 0: a range that ends before it starts
            depth = rng.integers(low, 6, n)
            got = levels(depth)
            top = int(depth.max()) if n else -1
            assert len(got) == max(top + 1, 0)
            for d, rows in enumerate(got):
                assert np.array_equal(rows, np.flatnonzero(depth == d))


def test_union_length_by_hand():
    # [0,10) and [5,12) overlap -> 12; [20,25) apart -> 5; group 7: [3,4) -> 1
    got = union_length(np.array([0, 5, 20, 3]), np.array([10, 12, 25, 4]), np.array([1, 1, 1, 7]))
    assert got.to_dict() == {1: 17, 7: 1}


def test_segment_figures_are_their_definition_by_brute_force():
    # pairs put activities in groups (one activity in several groups, unsorted input);
    # every figure against a walk over each group's intervals
    rng = np.random.default_rng(11)
    for trial in range(300):
        n_act, n_pairs = int(rng.integers(1, 30)), int(rng.integers(1, 60))
        start = rng.integers(10**12, 10**12 + 200, n_act)
        end = start + rng.integers(0, 60, n_act)
        kernel = rng.random(n_act) < 0.6
        group = rng.integers(0, 8, n_pairs) * (1 + trial % 3)
        at = rng.integers(0, n_act, n_pairs)
        groups, fig = segment_figures(group, at, start, end, kernel)
        assert groups.tolist() == sorted(set(group.tolist()))
        for i, g in enumerate(groups):
            rows = at[group == g]
            covered = set()
            for r in rows:
                covered |= set(range(int(start[r]), int(end[r])))
            assert fig["busy"][i] == len(covered)
            assert fig["time"][i] == int((end[rows] - start[rows]).sum())
            assert fig["count"][i] == len(rows)
            assert fig["kernels"][i] == int(kernel[rows].sum())
            assert fig["span"][i] == int(end[rows].max() - start[rows].min())


@pytest.mark.parametrize("ranks", [[0], [3, 1, 3, 0]])
def test_span_per_rank_is_the_groupby(ranks):
    n = 40
    rng = np.random.default_rng(len(ranks))
    start = rng.integers(0, 1000, n)
    table = pd.DataFrame(
        {
            "rank": np.resize(np.array(ranks), n),
            "start": start,
            "end": pd.array(start + rng.integers(0, 50, n), dtype="Int64"),
        }
    )
    table.loc[[2, 7], "end"] = pd.NA  # an unclosed range: skipped, as the groupby skips it
    want = table.groupby("rank").agg(t0=("start", "min"), t1=("end", "max"))
    pd.testing.assert_frame_equal(_span_per_rank(table), want)


def test_instance_rows_finds_ranges_and_unassociated_ids():
    instance = np.array([4, 0, 9, -1, -2, 2])
    ids = np.array([9, -2, 3, -5, 0, 2, 100, -1])
    assert instance_rows(instance, ids).tolist() == [2, 4, -1, -1, 1, 5, -1, 3]


def test_group_codes_number_key_tuples_in_sorted_order():
    from perfguard.trace.nesting import group_codes

    rng = np.random.default_rng(3)
    for trial in range(200):
        n1, n2 = rng.integers(0, 40, 2)

        def frame(n, trial=trial):
            low = -2 if trial % 5 == 0 else 0  # negative ids take the general path
            return pd.DataFrame(
                {
                    "rank": rng.integers(0, 3, n),
                    "pid": rng.integers(0, 2 ** int(rng.integers(1, 24)), n),
                    "tid": rng.integers(low, 2 ** int(rng.integers(1, 24)), n),
                }
            )

        a, b = frame(n1), frame(n2)
        both = pd.concat([a, b], ignore_index=True)
        if both.empty:
            continue
        want = both.groupby(list(both.columns), sort=True).ngroup().to_numpy()
        assert np.array_equal(np.concatenate(group_codes(a, b)), want)


def test_nesting_from_a_finalized_tree_equals_nesting_built_from_times():
    rng = np.random.default_rng(5)
    for _ in range(300):
        start, end, group = _random_ranges(rng, 200)
        built = Nesting(start, end, group)
        reused = Nesting.from_tree(
            start, end, group, built.unsorted_depth(), built.unsorted_parent()
        )
        for attr in ("order", "start", "end", "group", "key", "depth", "parent"):
            assert np.array_equal(getattr(built, attr), getattr(reused, attr)), attr
        t, g = rng.integers(0, 90, 50), rng.integers(-1, 4, 50)
        assert np.array_equal(built.innermost_enclosing(g, t), reused.innermost_enclosing(g, t))


def test_first_valid_is_groupby_first() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 5, 300, 5000):
        codes, _ = pd.factorize(rng.integers(0, 12, n))
        rows = first_rows(codes)
        na = rng.random(n) < 0.4
        text = np.array([f"k{v}" for v in rng.integers(0, 5, n)], dtype=object)
        columns = {
            "object": pd.Series(np.where(na, None, text), dtype=object),
            "str": pd.Series(np.where(na, None, text), dtype="str"),
            "Int64": pd.Series(pd.arrays.IntegerArray(rng.integers(0, 9, n), na)),
            "boolean": pd.Series(pd.arrays.BooleanArray(rng.random(n) < 0.5, na)),
            "float": pd.Series(np.where(na, np.nan, rng.random(n))),
            "int": pd.Series(rng.integers(0, 9, n)),
        }
        for name, values in columns.items():
            want = values.groupby(codes, sort=True).first()
            got = first_valid(values, codes, rows)
            assert got.dtype == want.dtype, name
            pd.testing.assert_series_equal(got, want.reset_index(drop=True), check_names=False)
            # rows coded -1 (in no group) change nothing
            outside = codes.copy()
            outside[rng.random(n) < 0.3] = -1
            outside[rows] = codes[rows]
            want = values[outside >= 0].groupby(outside[outside >= 0], sort=True).first()
            got = first_valid(values, outside, rows)
            pd.testing.assert_series_equal(got, want.reset_index(drop=True), check_names=False)


@pytest.mark.parametrize("n_groups", [1, 7, 70_000])
def test_groups_reduce_as_pandas_groupby(n_groups: int) -> None:
    rng = np.random.default_rng(n_groups)
    codes, _ = pd.factorize(rng.integers(0, n_groups, 200_000))
    values = rng.integers(-(10**12), 10**12, len(codes))
    flags = rng.random(len(codes)) < 0.01
    g = pd.Series(values).groupby(codes, sort=True)
    groups = Groups(codes)
    assert np.array_equal(groups.size, g.size().to_numpy())
    assert np.array_equal(groups.sum(values), g.sum().to_numpy())
    assert np.array_equal(groups.min(values), g.min().to_numpy())
    assert np.array_equal(groups.max(values), g.max().to_numpy())
    assert np.array_equal(groups.mean(values), g.mean().to_numpy())
    want_any = pd.Series(flags).groupby(codes, sort=True).any().to_numpy()
    assert np.array_equal(groups.any(flags), want_any)


def test_groups_refuse_codes_with_gaps() -> None:
    with pytest.raises(ValueError, match="0..k-1"):
        Groups(np.array([0, 2, 2]))


def test_per_distinct_is_the_rule_applied_to_every_value() -> None:
    rng = np.random.default_rng(11)
    pool = np.array(["aten::mm", "MmBackward0", None, "é::x", "ProfilerStep#7"], dtype=object)
    values = pd.Series(pool[rng.integers(0, len(pool), 6000)], dtype=object)

    def rule(u: pd.Series) -> pd.Series:
        return u.fillna("").str.len().astype("Int64")

    got = per_distinct(values, rule)
    pd.testing.assert_series_equal(got, rule(values))


def test_object_ids_are_the_ids_of_the_elements():
    names = ["aten::mm", "aten::add", None, 3.5, "é"]
    arr = np.array(
        [names[i % 5] for i in range(5000)] + ["x" * i for i in range(100)], dtype=object
    )
    for a in (arr, arr[::3], arr[:0]):
        assert _object_ids(a).tolist() == [id(x) for x in a]


def test_first_rows_are_the_first_occurrences_of_factorized_codes():
    rng = np.random.default_rng(6)
    for n in (0, 1, 50, 3000):
        values = rng.integers(0, 20, n)
        codes, _ = pd.factorize(values)
        _, want = np.unique(codes, return_index=True)
        assert np.array_equal(first_rows(codes), want)


def test_stable_order_is_a_stable_argsort():
    """Small-span integers take a radix sort; anything else the stable argsort."""
    from perfguard.arrays import stable_order

    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 400))
        lo = int(rng.integers(-(2**40), 2**40))
        span = int(rng.choice([1, 3, 2**16 - 1, 2**16, 2**20]))
        values = rng.integers(lo, lo + span, n, endpoint=True)
        assert np.array_equal(stable_order(values), np.argsort(values, kind="stable"))
    floats = rng.random(50)
    assert np.array_equal(stable_order(floats), np.argsort(floats, kind="stable"))
