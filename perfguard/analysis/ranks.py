"""Per-rank figures of a multi-GPU run: where each rank's time went, and who is late.

As DLProf's multi-GPU view and HTA's temporal breakdown do, one row per
rank over the analysed window (every iteration of the window, or the
rank's whole capture):

* wall time: the rank's span (or its iterations' summed duration, when
  ``--iter-start/--iter-stop`` restrict the window), as the summary
  report takes it per rank;
* GPU time (kernels and memops, accumulated), split into communication
  (NCCL kernels: their name contains ``nccl``), compute (every other
  kernel, HTA's ``compute_time``) and memory operations;
* GPU busy (flattened per GPU, summed over the rank's GPUs) and idle:
  ``wall x GPUs - busy``.

**Straggler.** In a synchronous collective every rank waits in the NCCL
kernel until the last one arrives, so the rank the others wait for is the
one with the *least* communication time; each other rank's surplus over it
is time spent waiting (``comm_wait``). Without NCCL kernels there is
nothing to wait in, and the straggler is the rank with the most GPU busy
time. The imbalance is the spread of that figure over its maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd

from perfguard.analysis.iterations import rank_spans
from perfguard.analysis.metrics import gpu_idle, gpu_time, percent
from perfguard.analysis.summary import busy_by, rank_walls
from perfguard.arrays import factorize
from perfguard.trace.model import with_category

if TYPE_CHECKING:
    from perfguard.analysis import Analysis

#: kernels whose name contains this (any case) are communication (NCCL collectives)
COMM_MARKER = "nccl"

COLUMNS = [
    "rank",
    "gpus",
    "iterations",
    "iteration_time_avg",
    "wall_time",
    "gpu_time",
    "kernel_time",
    "comm_time",
    "compute_time",
    "memop_time",
    "gpu_busy",
    "idle_time",
    "idle_pct",
    "comm_wait",
    "straggler",
]


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for, and how uneven the ranks are."""

    rank: int
    #: the figure that names it: ``comm_time`` (least) or ``gpu_busy`` (most)
    by: str
    #: 100 x (max - min) / max of ``by`` over the ranks
    imbalance_pct: float

    def describe(self) -> str:
        """One line for a terminal or a page."""
        if self.by == "comm_time":
            why = "least time in NCCL kernels: the other ranks wait for it in the collectives"
        else:
            why = "most GPU busy time (no NCCL kernels to wait in)"
        return (
            f"straggler: rank {self.rank} ({why}); imbalance {self.imbalance_pct:.1f} % "
            f"of the largest rank's {'communication' if self.by == 'comm_time' else 'busy'} time"
        )


def rank_table(analysis: Analysis) -> pd.DataFrame:
    """One row per rank (columns :data:`COLUMNS`), sorted by rank: ``analysis.ranks``,
    computed once per analysis."""
    return analysis.ranks


def rank_figures(analysis: Analysis) -> pd.DataFrame:
    """The rank table of ``analysis`` (what :attr:`Analysis.ranks` keeps)."""
    acts, iterations = analysis.activities, analysis.iterations
    wall_by_rank = rank_walls(
        rank_spans(analysis.trace), analysis.window if analysis.restricted else None
    )
    ranks = np.union1d(wall_by_rank.index.to_numpy(np.int64), acts["rank"].to_numpy(np.int64))
    if not len(ranks):
        return pd.DataFrame(columns=COLUMNS)
    out = pd.DataFrame(index=pd.Index(ranks, name="rank"))
    if len(ranks) == 1:  # the summary's and the kernel report's figures: no pass over events
        s, k = analysis.summary, analysis.kernels
        comm_k = _is_comm(k["name"], np.ones(len(k), dtype=bool))
        kernel_t, memop_t = s.kernel_time, s.memop_time
        comm_t = int(k["gpu_time_total"].to_numpy(np.int64)[comm_k].sum())
        out["gpu_time"], out["kernel_time"] = kernel_t + memop_t, kernel_t
        out["comm_time"], out["compute_time"] = comm_t, kernel_t - comm_t
        out["memop_time"] = memop_t
        busy_rank = pd.Series([s.gpu_busy], index=ranks)
        gpus = pd.Series([s.gpus_used], index=ranks)
    else:
        rank = acts["rank"].to_numpy(np.int64)
        dur = gpu_time(acts).astype(np.int64, copy=False)
        kernel = (acts["activity"] == "kernel").to_numpy(bool)
        comm = kernel & _is_comm(acts["name"], kernel)

        def per_rank(mask: np.ndarray) -> pd.Series:
            return pd.Series(dur[mask]).groupby(rank[mask]).sum().reindex(ranks, fill_value=0)

        out["gpu_time"] = per_rank(np.ones(len(acts), dtype=bool))
        out["kernel_time"] = per_rank(kernel)
        out["comm_time"] = per_rank(comm)
        out["compute_time"] = per_rank(kernel & ~comm)
        out["memop_time"] = per_rank(~kernel)
        busy = busy_by(acts, ["rank", "device_id"])
        busy_rank = busy.groupby(level=0).sum() if len(busy) else pd.Series(dtype=np.int64)
        gpus = busy.groupby(level=0).size() if len(busy) else pd.Series(dtype=np.int64)
    out["gpus"] = gpus.reindex(ranks, fill_value=0).astype(np.int64)
    if len(iterations):
        it = iterations.groupby("rank")["duration"]
        out["iterations"] = it.size().reindex(ranks, fill_value=0)
        avg = it.mean().reindex(ranks)
    else:
        out["iterations"] = 0
        avg = pd.Series(np.nan, index=ranks)
    out["iteration_time_avg"] = avg.round().astype("Int64")
    out["wall_time"] = wall_by_rank.reindex(ranks, fill_value=0).astype(np.int64)
    out["gpu_busy"] = busy_rank.reindex(ranks, fill_value=0).astype(np.int64)
    capacity = out["wall_time"] * out["gpus"]
    out["idle_time"] = gpu_idle(capacity, out["gpu_busy"])
    out["idle_pct"] = percent(out["idle_time"], capacity).fillna(0.0)
    return combine_ranks(out.reset_index())


def combine_ranks(rows: pd.DataFrame) -> pd.DataFrame:
    """The rank table of per-rank rows (every column of :data:`COLUMNS` but ``comm_wait``
    and ``straggler``, which compare the ranks): sorted by rank, those two filled in.
    The rows of one run, or of its ranks analysed one by one."""
    out = rows.set_index("rank").sort_index()
    found = straggler(out)
    if found is not None and found.by == "comm_time":
        out["comm_wait"] = out["comm_time"] - out["comm_time"].min()
    else:
        out["comm_wait"] = 0
    out["straggler"] = out.index == (found.rank if found is not None else -1)
    return out.reset_index()[COLUMNS]


def _is_comm(names: pd.Series, kernel: np.ndarray) -> np.ndarray:
    """Whether each kernel is a NCCL kernel, tested once per distinct name."""
    codes, uniq = factorize(with_category(names, "").where(kernel, ""), use_na_sentinel=False)
    marked = pd.Series(uniq, dtype=object).str.contains(COMM_MARKER, case=False, regex=False)
    return marked.fillna(False).to_numpy(bool)[codes] if len(uniq) else np.zeros(0, bool)


def straggler(ranks: pd.DataFrame) -> Straggler | None:
    """The straggler of a rank table (see the module docstring); None for one rank."""
    if len(ranks) < 2:
        return None
    table = ranks.set_index("rank") if "rank" in ranks.columns else ranks
    if (table["comm_time"] > 0).all():
        by, values = "comm_time", table["comm_time"]
        rank = int(cast(int, values.idxmin()))
    else:
        by, values = "gpu_busy", table["gpu_busy"]
        rank = int(cast(int, values.idxmax()))
    top = float(values.max())
    spread = 100.0 * (top - float(values.min())) / top if top > 0 else 0.0
    return Straggler(rank=rank, by=by, imbalance_pct=spread)
