"""Op instances with nothing but CPU time, folded out of the instance table.

At ``emit_nvtx`` density three in four op ranges launch no GPU work and carry
no shapes, dtypes, FLOPs or Tensor Core eligibility: a row of the instance
table (32 columns) would hold only what the range itself says. Such
instances are kept as a few arrays (:class:`CpuOnly`) beside the table of the
others, so the analysis's memory follows GPU work, not ranges; the per-op,
per-op-type, per-iteration and group figures are formed from both
(:func:`merge_codes`, :meth:`CpuOnly.by`), and the whole table is built again
only when a consumer asks for every instance
(:attr:`perfguard.analysis.Analysis.instances`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfguard.analysis.tensor_cores import op_tc_eligible
from perfguard.arrays import Groups, factorize, first_rows, narrow, text_dtype, unique_first


@dataclass(frozen=True)
class CpuOnly:
    """The folded instances, one entry per op range, in instance-table order.

    ``range_row``: the range's row of ``trace.ranges``; ``order``: its position
    in the whole instance table (op ranges in range order, then unassociated
    work), and ``kept_order`` the position of each row of the kept table, so the
    two interleave as the whole table would; ``iteration`` is -1 outside every
    iteration. ``names`` is the op name of each op-name code (``op_key // 2``);
    ``ranges`` is the trace's ranges table, where the rest of an entry is read.
    """

    range_row: np.ndarray
    order: np.ndarray
    op_key: np.ndarray
    rank: np.ndarray
    iteration: np.ndarray
    cpu_time: np.ndarray
    cpu_overhead: np.ndarray
    kept_order: np.ndarray
    names: np.ndarray
    ranges: pd.DataFrame

    def __len__(self) -> int:
        return len(self.op_key)

    def within(self, fold: np.ndarray, kept: np.ndarray) -> CpuOnly:
        """Only the folded entries where ``fold`` and the kept rows where ``kept`` hold
        (the iterations ``--iter-start/--iter-stop`` select)."""
        fields = {
            name: getattr(self, name)[fold]
            for name in (
                "range_row",
                "order",
                "op_key",
                "rank",
                "iteration",
                "cpu_time",
                "cpu_overhead",
            )
        }
        return dataclasses.replace(self, **fields, kept_order=self.kept_order[kept])

    def by(self, codes: np.ndarray) -> FoldedStats:
        """Per group of ``codes`` (``0..k-1``, aligned with the entries, every code
        present): calls, the first entry's position, and the CPU figures."""
        g = Groups(codes)
        return FoldedStats(
            # int64: compared with int64 positions (an int32 would wrap a sentinel)
            first=self.order[g.order[g.heads]].astype(np.int64),
            first_row=self.range_row[g.order[g.heads]].astype(np.int64),
            calls=g.size,
            cpu_time=(g.sum(self.cpu_time), g.min(self.cpu_time), g.max(self.cpu_time)),
            cpu_overhead=(
                g.sum(self.cpu_overhead),
                g.min(self.cpu_overhead),
                g.max(self.cpu_overhead),
            ),
        )

    def op_text(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Op name and direction (object arrays) of each op key: the inverse of
        :meth:`perfguard.analysis.ops.OpCodes.op_key` (name code x 2, +1 for bprop)."""
        key = np.asarray(key, dtype=np.int64)
        direction = np.where(key % 2 == 1, "bprop", "fprop").astype(object)
        return np.asarray(self.names, dtype=object)[key // 2], direction

    def column(self, name: str) -> np.ndarray:
        """The ranges' column ``name`` (object values), indexed by range row."""
        return self.ranges[name].to_numpy(dtype=object)

    def calls_per_iteration(self) -> pd.Series:
        """Folded instances per ``(rank, iteration)`` inside an iteration."""
        inside = self.iteration >= 0
        frame = pd.DataFrame(
            {
                "rank": self.rank[inside].astype(np.int64),
                "iteration": self.iteration[inside].astype(np.int64),
            },
            copy=False,
        )
        return frame.groupby(["rank", "iteration"]).size()


@dataclass(frozen=True)
class FoldedStats:
    """:meth:`CpuOnly.by`: per group, its first entry's position in the whole table and
    range row, the number of calls, and ``(sum, min, max)`` of each CPU figure."""

    first: np.ndarray
    first_row: np.ndarray
    calls: np.ndarray
    cpu_time: tuple[np.ndarray, np.ndarray, np.ndarray]
    cpu_overhead: tuple[np.ndarray, np.ndarray, np.ndarray]


def merge_codes(
    kept_key: np.ndarray, kept_pos: np.ndarray, fold_key: np.ndarray, fold_pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Codes over the kept rows and the folded entries together, numbered as a
    ``pd.factorize`` of the whole table would number them (by first appearance in
    table order, ``*_pos``): ``(kc, kept_codes, fc, fold_codes, n)``. ``kc`` numbers
    each kept row's key as first seen among the kept rows, and ``kept_codes[c]`` is
    the whole table's code of the key coded ``c`` (``fc``, ``fold_codes`` likewise);
    ``n`` is the number of codes. Each part's codes are what ``pd.factorize`` of its
    whole-table codes would give, without forming those (millions of entries).

    Both parts are in table order, so each part's first row of a key is where the
    key first appears in it; only the few distinct keys are compared.
    """
    kc, ku = _codes(kept_key)
    fc, fu = _codes(fold_key)
    firsts = np.concatenate([kept_pos[first_rows(kc)], fold_pos[first_rows(fc)]])
    both, which = pd.factorize(
        np.concatenate([np.asarray(ku), np.asarray(fu)]), use_na_sentinel=False
    )
    first = np.full(len(which), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, both, firsts.astype(np.int64))
    code = np.empty(len(which), dtype=np.int64)
    code[np.argsort(first, kind="stable")] = np.arange(len(which), dtype=np.int64)
    return kc, code[both[: len(ku)]], fc, code[both[len(ku) :]], len(which)


def _codes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of one part's keys, a missing key a group too; text keys by
    :func:`perfguard.arrays.factorize` (millions of repeats of a few op types)."""
    if np.asarray(key).dtype == object:
        codes, uniques = factorize(key, use_na_sentinel=False)
    else:
        codes, uniques = pd.factorize(key, use_na_sentinel=False)
    return narrow(codes), uniques


def needs_row(
    ranges: pd.DataFrame,
    op_rows: np.ndarray,
    owned: np.ndarray,
    by_range: pd.DataFrame | None,
) -> np.ndarray:
    """Which op ranges (``op_rows`` of ``ranges``) keep a row of the instance table:
    those that own GPU work (``owned``, a mask over ``op_rows``) or carry anything a
    row holds beyond the range itself (shapes, dtypes, a FLOP figure, Tensor Core
    eligibility by name). The others are folded (:class:`CpuOnly`)."""
    keep = owned.copy()
    for col in ("input_shapes", "dtypes"):
        keep |= ranges[col].notna().to_numpy(bool)[op_rows]
    # a missing name is not eligible: no fill needed (a copy and a scan of millions)
    keep |= op_tc_eligible(pd.Series(ranges["name"].array.take(op_rows))).to_numpy(bool)
    if by_range is not None:
        keep |= by_range.notna().any(axis=1).to_numpy(bool)[op_rows]
    return keep


def missing_as_first(
    gpu: pd.DataFrame,
    part: Parts,
    kept_first: np.ndarray,
    folded: FoldedStats,
    cpu_only: CpuOnly,
) -> None:
    """``data_type`` and ``input_shapes`` of a group with no value are its first
    instance's missing value (None or NaN, as its column holds it): where that
    instance is a folded one, its range's own (in place). A folded instance has
    neither, so ``data_type`` (``compute_dtype`` filled from ``dtypes``) is its
    ``dtypes``."""
    never = np.iinfo(np.int64).max
    first_k = part.kept_int(kept_first, never)
    first_f = part.fold_int(folded.first, never)
    for col, source in (("data_type", "dtypes"), ("input_shapes", "input_shapes")):
        if col not in gpu:
            continue
        values = gpu[col]
        take = np.flatnonzero(values.isna().to_numpy(bool) & (first_f < first_k))
        if not len(take):
            continue
        rows = folded.first_row[part.at_fold[take]]
        column = values.to_numpy(dtype=object).copy()
        column[take] = cpu_only.column(source)[rows]
        gpu[col] = pd.Series(column, dtype=values.dtype)


def merged_figures(
    out: pd.DataFrame, kept: pd.DataFrame, folded: FoldedStats, part: Parts, metrics: list[str]
) -> None:
    """Add ``calls``, ``kernel_count`` and each metric's total/avg/min/max of the kept
    groups and the folded ones together to ``out`` (in place). A folded instance
    ran no GPU work: zero GPU time, GPU idle and kernels."""
    out["calls"] = part.kept_int(kept["calls"]) + part.fold_int(folded.calls)
    out["kernel_count"] = part.kept_int(kept["kernel_count"])
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    zero = np.zeros(len(folded.calls), dtype=np.int64)
    for m in metrics:
        f_sum, f_min, f_max = getattr(folded, m) if hasattr(folded, m) else (zero, zero, zero)
        total = part.kept_int(kept[f"{m}_total"]) + part.fold_int(f_sum)
        out[f"{m}_total"] = total
        out[f"{m}_avg"] = total / out["calls"].to_numpy(np.int64)
        out[f"{m}_min"] = np.minimum(
            part.kept_int(kept[f"{m}_min"], big), part.fold_int(f_min, big)
        )
        out[f"{m}_max"] = np.maximum(
            part.kept_int(kept[f"{m}_max"], small), part.fold_int(f_max, small)
        )


def typed_like(values: np.ndarray, column: pd.Series) -> pd.Series:
    """``values`` typed as ``column`` is; typed by their content when ``column`` is
    empty (its type then says nothing), as the whole table's column would be.
    Coded text gives plain text (an aggregate's column, :func:`plain_text`)."""
    if len(column) and isinstance(column.dtype, pd.CategoricalDtype):
        return pd.Series(values, dtype=text_dtype(column.dtype))
    return pd.Series(values, dtype=column.dtype if len(column) else None)


@dataclass(frozen=True)
class Parts:
    """Where each of ``n`` merged groups is in the kept rows' groups and in the
    folded entries' groups (-1: not there), to lay the two side by side."""

    n: int
    kept_codes: np.ndarray
    fold_codes: np.ndarray
    at_kept: np.ndarray
    at_fold: np.ndarray

    @classmethod
    def of(cls, n: int, kept_codes: np.ndarray, fold_codes: np.ndarray) -> Parts:
        at_kept = np.full(n, -1, dtype=np.int64)
        at_kept[kept_codes] = np.arange(len(kept_codes))
        at_fold = np.full(n, -1, dtype=np.int64)
        at_fold[fold_codes] = np.arange(len(fold_codes))
        return cls(n, kept_codes, fold_codes, at_kept, at_fold)

    def kept_int(self, values: np.ndarray | pd.Series, fill: int = 0) -> np.ndarray:
        """A kept group's integer figure per merged group, ``fill`` where it has none."""
        return _lay(self.at_kept, np.asarray(values, dtype=np.int64), fill)

    def fold_int(self, values: np.ndarray | pd.Series, fill: int = 0) -> np.ndarray:
        """A folded group's integer figure per merged group, ``fill`` where it has none."""
        return _lay(self.at_fold, np.asarray(values, dtype=np.int64), fill)

    def kept_only(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame``'s rows per merged group (one per kept group); a group with no
        kept row gets what a group of folded instances alone has: False, 0, NA."""
        idx = self.at_kept
        out: dict[Hashable, Any] = {}
        for col in frame.columns:
            values = frame[col]
            plain = isinstance(values.dtype, np.dtype)  # numpy, not nullable
            if plain and values.dtype == bool:
                out[col] = _lay(idx, values.to_numpy(), False)
            elif plain and values.dtype.kind in "iu":
                out[col] = self.kept_int(values)
            elif plain and values.dtype == object:  # an op's first value, None where it has none
                column = np.full(len(idx), None, dtype=object)
                column[idx >= 0] = values.to_numpy()[idx[idx >= 0]]
                out[col] = pd.Series(column, dtype=object)
            else:  # nullable and floating columns: NA / NaN
                out[col] = values.array.take(idx, allow_fill=True)
        return pd.DataFrame(out, copy=False)


def _lay(at: np.ndarray, values: np.ndarray, fill: Any) -> np.ndarray:
    """``values[at]``, ``fill`` where ``at`` is -1 (a group missing from that part)."""
    if not len(values):  # every group is missing from that part
        return np.full(len(at), fill, dtype=values.dtype)
    return np.where(at >= 0, values[np.clip(at, 0, None)], fill)


def first_valid_of_both(
    kept_values: np.ndarray,
    kc: np.ndarray,
    fold_values: np.ndarray,
    fc: np.ndarray,
    cpu_only: CpuOnly,
    part: Parts,
) -> pd.Series:
    """Each merged group's first non-NA value in table order, over the kept rows'
    ``kept_values`` (codes ``kc``) and the folded entries' values (``fc``; entry
    ``j``'s value is ``fold_values[cpu_only.range_row[j]]``).

    Codes number groups as first seen, so each group's first entry is found in
    one pass; only groups whose first entry is NA are searched further.
    """
    n = part.n
    pos = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    value = np.full(n, None, dtype=object)
    sides = (
        (kept_values, None, kc, cpu_only.kept_order, part.kept_codes),
        (fold_values, cpu_only.range_row, fc, cpu_only.order, part.fold_codes),
    )
    for values, through, codes, order, merged in sides:
        codes = np.asarray(codes)

        def at(rows: np.ndarray, values: np.ndarray = values, through: object = through) -> Any:
            return values[rows if through is None else through[rows]]  # type: ignore[index]

        rows = first_rows(codes)  # each group's first entry
        missing = np.flatnonzero(pd.isna(at(rows)))
        if len(missing):  # the first non-NA entry of those groups, if any
            search = np.flatnonzero(np.isin(codes, missing))
            search = search[pd.notna(at(search))]
            found, first = unique_first(codes[search])
            rows = rows.copy()
            rows[found] = search[first]
            rows = np.delete(rows, np.setdiff1d(missing, found))
            groups = np.delete(np.arange(len(merged)), np.setdiff1d(missing, found))
        else:
            groups = np.arange(len(merged))
        target = np.asarray(merged)[groups]
        better = order[rows].astype(np.int64) < pos[target]
        pos[target[better]] = order[rows][better]
        value[target[better]] = at(rows)[better]
    return pd.Series(value)  # typed as the whole table's column is: text when any value is
