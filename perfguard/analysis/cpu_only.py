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
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfguard.analysis.tensor_cores import op_tc_eligible
from perfguard.arrays import Groups, first_rows


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
            for name in ("range_row", "order", "op_key", "rank", "iteration", "cpu_time",
                         "cpu_overhead")
        }  # fmt: skip
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
                g.sum(self.cpu_overhead), g.min(self.cpu_overhead), g.max(self.cpu_overhead)
            ),
        )

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


def narrow(values: np.ndarray) -> np.ndarray:
    """Integers as int32 when every value fits: a folded entry costs 4 bytes a field."""
    values = np.asarray(values)
    if len(values) and values.min() >= -(2**31) and values.max() < 2**31:
        return values.astype(np.int32)
    return values.astype(np.int64)


def merge_codes(
    kept_key: np.ndarray, kept_pos: np.ndarray, fold_key: np.ndarray, fold_pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes over the kept rows and the folded entries together, numbered as a
    ``pd.factorize`` of the whole table would number them (by first appearance in
    table order, ``*_pos``): ``(kept codes, folded codes, number of codes)``.

    Both parts are in table order, so each part's first row of a key is where the
    key first appears in it; only the few distinct keys are compared.
    """
    kc, ku = pd.factorize(kept_key, use_na_sentinel=False)  # a missing key is a group too
    fc, fu = pd.factorize(fold_key, use_na_sentinel=False)
    firsts = np.concatenate([kept_pos[first_rows(kc)], fold_pos[first_rows(fc)]])
    both, which = pd.factorize(
        np.concatenate([np.asarray(ku), np.asarray(fu)]), use_na_sentinel=False
    )
    first = np.full(len(which), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, both, firsts.astype(np.int64))
    code = np.empty(len(which), dtype=np.int64)
    code[np.argsort(first, kind="stable")] = np.arange(len(which), dtype=np.int64)
    return code[both[: len(ku)]][kc], code[both[len(ku) :]][fc], len(which)


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
    names = pd.Series(ranges["name"].to_numpy(dtype=object)[op_rows], dtype=object)
    keep |= op_tc_eligible(names.fillna("")).to_numpy(bool)
    if by_range is not None:
        keep |= by_range.notna().any(axis=1).to_numpy(bool)[op_rows]
    return keep
