"""Expert systems: detectors that turn an analysis into findings a person can act on.

DLProf's expert systems (user guide, "Expert Systems") looked at a profile
and said what was wrong and what to do: bad iteration range, no iterations,
tensor shapes that keep GEMMs/convs off Tensor Cores, AMP not used,
dataloader-bound, GPU underutilized, imbalanced GPUs, missing framework
NVTX ranges. We keep those a capture can support and add four that none of
the peers have: an eligible op that stopped using Tensor Cores between
iterations, split-K / GEMV fallbacks, launch-bound ops made of tiny
kernels, and host<->device copies inside the measured iterations.

Each detector is a function ``(Analysis, Thresholds) -> list[Finding]``
registered in :data:`DETECTORS`; a finding carries the problem, the evidence
(numbers and op names) and a recommendation. Thresholds are data, so a team
can tune them without touching the detectors. Rules behind the Tensor Core
findings: ``shared/reference/tensor_cores_flops.md`` section 5.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd

from perfguard.analysis.enrich import activity_rows
from perfguard.analysis.intervals import union_length
from perfguard.analysis.metrics import gpu_time
from perfguard.arrays import per_distinct
from perfguard.trace.model import with_category

if TYPE_CHECKING:  # the Analysis dataclass imports this module
    from perfguard.analysis import Analysis


@dataclass(frozen=True)
class Finding:
    """One problem found in a profile."""

    check: str
    severity: str  # "warning" (costs time now) or "info" (worth a look)
    problem: str
    evidence: str
    recommendation: str


@dataclass(frozen=True)
class Thresholds:
    """Where each detector fires. Defaults follow DLProf where it published one."""

    min_iterations: int = 3
    warmup_ratio: float = 1.5  # first iteration slower than this x the median of the rest
    gpu_utilization_pct: float = 50.0
    imbalance_ratio: float = 1.2  # busiest / least busy GPU
    unassociated_share: float = 0.5  # share of GPU time outside every op range
    dataloader_share: float = 0.10  # of wall time in dataloader ranges
    tiny_kernel_ns: int = 5_000
    tiny_kernel_min_count: int = 20
    launch_bound_idle_share: float = 0.5  # GPU idle within the op's GPU span
    min_gpu_share: float = 0.01  # ignore ops below this share of GPU time
    fp32_gemm_share: float = 0.10  # GPU time in fp32 eligible ops before AMP is suggested


FINDING_COLUMNS = ["check", "severity", "problem", "evidence", "recommendation"]

_DATALOADER = re.compile(r"DataLoader|dataloader|_next_data|data_loader", re.I)
_SPLITK = re.compile(r"splitKreduce|splitK_reduce|reduce_1Block", re.I)
_GEMV = re.compile(r"gemv|gemmSN|dot_kernel", re.I)
_COPY_ACROSS = ("HtoD", "DtoH")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _top(names: pd.Series, n: int = 3) -> str:
    shown = [str(x) for x in names.head(n)]
    return ", ".join(shown) + (", ..." if len(shown) == n else "")


# --------------------------------------------------------------------------- iterations


def no_iterations(a: Analysis, th: Thresholds) -> list[Finding]:
    if len(a.window):
        return []
    return [
        Finding(
            "no_iterations",
            "info",
            "No iterations were found in the profile.",
            "no ProfilerStep#N or perfguard.iteration ranges, and no --key-node",
            "Mark iterations (torch.profiler's prof.step(), the gpuprofile fixture, or "
            "perfguard.iteration ranges) or pass --key-node NAME so per-iteration figures, "
            "--iter-start/--iter-stop and regression checks work.",
        )
    ]


def bad_iteration_range(a: Analysis, th: Thresholds) -> list[Finding]:
    it = a.iterations
    if it.empty:
        return []
    out = []
    n = int(it.groupby("rank").size().max())
    if n < th.min_iterations:
        out.append(
            Finding(
                "bad_iteration_range",
                "info",
                f"Only {n} iteration(s) are aggregated; timings of so few are noisy.",
                f"iterations {a.summary.iteration_range}",
                f"Profile or select at least {th.min_iterations} iterations.",
            )
        )
    first = it.sort_values("iteration").groupby("rank").head(1)
    rest = it.drop(first.index)
    if len(rest):
        med = rest.groupby("rank")["duration"].median()
        ratio = first.set_index("rank")["duration"] / med
        slow = ratio[ratio > th.warmup_ratio]
        if len(slow):
            r = slow.index[0]
            f = first.set_index("rank").loc[r]
            out.append(
                Finding(
                    "bad_iteration_range",
                    "warning",
                    f"Iteration {int(f['iteration'])} looks like warm-up: it takes "
                    f"{float(slow.iloc[0]):.1f}x the median of the others and is aggregated.",
                    f"rank {r}: {_ms(f['duration'])} vs median {_ms(med[r])}",
                    f"Start the range after warm-up: --iter-start {int(f['iteration']) + 1}.",
                )
            )
    return out


# --------------------------------------------------------------------------- utilization


def gpu_underutilized(a: Analysis, th: Thresholds) -> list[Finding]:
    util = a.summary.gpu_utilization
    if a.summary.gpus_used == 0 or util >= th.gpu_utilization_pct:
        return []
    return [
        Finding(
            "gpu_underutilized",
            "warning",
            f"The GPU is busy only {util:.1f}% of the wall time.",
            f"flattened busy {_ms(a.summary.gpu_busy)} of {_ms(a.summary.wall_time)} wall time",
            "Look for CPU-side gaps: data loading, host synchronisation (.item(), .cpu()), "
            "small launch-bound kernels; raise the batch size or overlap work with streams.",
        )
    ]


def imbalanced_gpus(a: Analysis, th: Thresholds) -> list[Finding]:
    acts = a.activities
    if acts.empty:
        return []
    busy = (
        pd.Series(gpu_time(acts), index=acts.index).groupby([acts["rank"], acts["device_id"]]).sum()
    )
    if len(busy) < 2 or busy.min() <= 0:
        return []
    ratio = float(busy.max() / busy.min())
    if ratio <= th.imbalance_ratio:
        return []
    hi = cast(tuple[int, int], busy.idxmax())
    lo = cast(tuple[int, int], busy.idxmin())
    return [
        Finding(
            "imbalanced_gpus",
            "warning",
            f"GPU work is imbalanced: the busiest GPU does {ratio:.2f}x the work of the least.",
            f"rank {hi[0]} GPU {hi[1]}: {_ms(busy.max())}; rank {lo[0]} GPU {lo[1]}: "
            f"{_ms(busy.min())}",
            "Balance the data or model partition across GPUs; in data parallel runs check "
            "uneven batch sizes and ranks that do extra work (logging, evaluation).",
        )
    ]


def emit_nvtx_missing(a: Analysis, th: Thresholds) -> list[Finding]:
    total = float(a.summary.kernel_time) + float(a.summary.memop_time)
    un = float(a.summary.unassociated_gpu_time)
    if total <= 0 or un / total <= th.unassociated_share:
        return []
    has_ranges = bool((a.trace.ranges["kind"] == "op").any())
    return [
        Finding(
            "emit_nvtx_missing",
            "warning",
            f"{100 * un / total:.0f}% of GPU time belongs to no framework op"
            + ("" if has_ranges else ": the capture has no op ranges at all")
            + ".",
            f"unassociated {_ms(un)} of {_ms(total)}",
            "Capture with op ranges: perfguard.instrument() or torch.autograd.profiler."
            "emit_nvtx() under nsys (or nsys --pytorch=autograd-nvtx), or use the PyTorch "
            "profiler backend, which records ops itself.",
        )
    ]


def _matches(values: pd.Series, pattern: re.Pattern[str] | str) -> np.ndarray:
    """``values.str.contains(pattern)`` computed once per distinct value (names repeat)."""

    def rule(u: pd.Series) -> pd.Series:
        text = pd.Series(["" if pd.isna(x) else str(x) for x in u], dtype=object)
        return text.str.contains(pattern).astype(bool)

    return per_distinct(values, rule).to_numpy(dtype=bool)


def _inside(window: pd.DataFrame, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each time ``t`` on ``rank`` falls in one of the window's iterations
    (iterations of one rank do not overlap: a binary search per rank)."""
    keep = np.zeros(len(t), dtype=bool)
    for r, iv in window.groupby("rank"):  # one pass per rank, not per iteration
        iv = iv.sort_values("start")
        lo, hi = iv["start"].to_numpy(), iv["end"].to_numpy()
        on = np.flatnonzero(rank == r)
        at = np.searchsorted(lo, t[on], side="right") - 1
        ok = at >= 0
        keep[on[ok]] = t[on[ok]] < hi[at[ok]]
    return keep


def dataloader_bound(a: Analysis, th: Thresholds) -> list[Finding]:
    r = a.trace.ranges
    dl = r[_matches(r["name"], _DATALOADER)]
    if dl.empty:
        return []
    if len(a.window):
        dl = dl[_inside(a.window, dl["rank"].to_numpy(), dl["start"].to_numpy())]
    wall = float(a.summary.wall_time)
    if dl.empty or wall <= 0:
        return []
    spent = float(
        union_length(dl["start"].to_numpy(), dl["end"].to_numpy(), dl["rank"].to_numpy()).max()
    )
    share = spent / wall
    if share <= th.dataloader_share:
        return []
    return [
        Finding(
            "dataloader_bound",
            "warning",
            f"The data loader takes {100 * share:.0f}% of the wall time.",
            f"{len(dl)} loader ranges, {_ms(spent)} of {_ms(wall)}",
            "Use more DataLoader workers (num_workers), pin_memory=True, persistent_workers, "
            "prefetching, or move preprocessing to the GPU (e.g. DALI).",
        )
    ]


# --------------------------------------------------------------------------- launch and copies


def launch_bound_tiny_kernels(a: Analysis, th: Thresholds) -> list[Finding]:
    inst = a.kept_instances  # every instance with kernels is kept
    acts = a.activities
    kernel = (acts["activity"] == "kernel").to_numpy(bool)
    if not kernel.any() or inst.empty:
        return []
    # per instance row: its kernels and how many of them are tiny
    rows = activity_rows(acts, inst)[kernel]
    dur = gpu_time(acts).astype(np.int64, copy=False)[kernel]
    owned = rows >= 0
    size = np.bincount(rows[owned], minlength=len(inst))
    tiny = np.bincount(rows[owned & (dur < th.tiny_kernel_ns)], minlength=len(inst))
    span = inst["gpu_span"].to_numpy(np.int64)
    idle = inst["gpu_idle"].to_numpy(np.int64)
    hit = (size >= th.tiny_kernel_min_count) & (tiny >= 0.8 * size)
    hit &= (span > 0) & (idle > th.launch_bound_idle_share * span)
    j = inst.loc[hit, ["op_name", "direction", "gpu_span", "gpu_idle"]].assign(size=size[hit])
    if j.empty:
        return []
    g = (
        j.groupby(["op_name", "direction"])
        .agg(
            calls=("size", "size"),
            kernels=("size", "sum"),
            idle=("gpu_idle", "sum"),
            span=("gpu_span", "sum"),
        )
        .sort_values("idle", ascending=False)
    )
    names = pd.Series([n for n, _ in g.index])
    return [
        Finding(
            "launch_bound_tiny_kernels",
            "warning",
            f"{len(g)} op(s) launch many tiny kernels and leave the GPU idle between them.",
            f"{_top(names)}: {int(g['kernels'].sum())} kernels mostly under "
            f"{th.tiny_kernel_ns / 1000:.0f} µs, GPU idle {_ms(g['idle'].sum())} of a "
            f"{_ms(g['span'].sum())} span",
            "Fuse the work (torch.compile, fused optimizers such as foreach/fused Adam, "
            "fused kernels) or capture it in a CUDA graph to remove launch overhead.",
        )
    ]


def memcpy_in_iterations(a: Analysis, th: Thresholds) -> list[Finding]:
    m = a.activities[a.activities["activity"] == "memop"]
    if m.empty or not len(a.window):
        return []
    m = m[m["iteration"].notna() & _matches(m["name"], "|".join(_COPY_ACROSS))]
    if m.empty:
        return []
    n_iter = max(len(a.window), 1)
    t = float((m["end"] - m["start"]).sum())
    kinds = m["name"].astype(str).value_counts()
    owners = m["op_name"].astype(object).value_counts()  # coded text: no zero counts
    return [
        Finding(
            "memcpy_in_iterations",
            "info",
            f"{len(m) / n_iter:.1f} host<->device copies per iteration inside the measured "
            "iterations.",
            f"{', '.join(f'{k}: {v}' for k, v in kinds.items())}; {_ms(t)} in total; "
            f"issued by {_top(pd.Series(owners.index))}",
            "Keep tensors on the device; copy inputs with pin_memory=True and "
            "non_blocking=True; avoid .item()/.cpu()/print of GPU tensors inside the step.",
        )
    ]


# --------------------------------------------------------------------------- Tensor Cores


_SIZE = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8}
_ALIGN_BYTES = 16  # cuBLAS: dimensions x element size multiple of 16 bytes (reference 5.2)


def _gemm_dims(shapes: str, dtypes: str) -> tuple[list[int], int] | None:
    """The matrix dims of a GEMM-like op's two operands and the element size, or None."""
    try:
        sh, dt = json.loads(shapes), json.loads(dtypes)
    except (TypeError, ValueError):
        return None
    if not isinstance(sh, list) or not isinstance(dt, list):  # a damaged capture: 123, {}
        return None
    mats = [
        (s, d)
        for s, d in zip(sh, dt, strict=False)
        if isinstance(s, list) and len(s) >= 2 and all(type(v) is int for v in s)
    ]
    if len(mats) < 2 or mats[-2][1] not in _SIZE:
        return None
    (a, da), (b, _) = mats[-2], mats[-1]
    return [a[-2], a[-1], b[-1]], _SIZE[da]


def bad_tensor_shape(a: Analysis, th: Thresholds) -> list[Finding]:
    inst = a.kept_instances  # eligible or shaped instances are always kept
    if "tc_eligible" not in inst or inst.empty:
        return []
    gemm = inst[
        inst["tc_eligible"].fillna(False).astype(bool)
        & inst["op_type"].isin(["mm", "addmm", "bmm", "baddbmm", "matmul", "linear"])
        & inst["input_shapes"].notna()
    ]
    if gemm.empty:
        return []
    keys = gemm[["input_shapes", "dtypes"]].drop_duplicates()
    bad = []
    for shapes, dtypes in keys.itertuples(index=False):  # distinct shapes, not events
        dims = _gemm_dims(shapes, dtypes)
        if dims is None or dims[1] == 4:  # fp32: TF32 alignment is 4 elements, rarely the issue
            continue
        need = _ALIGN_BYTES // dims[1]
        off = [d for d in dims[0] if d % need]
        if off:
            bad.append((shapes, dtypes, need, off))
    if not bad:
        return []
    hit = gemm[gemm["input_shapes"].isin([b[0] for b in bad])]
    by_op = hit.groupby("op_name")["gpu_time"].sum().sort_values(ascending=False)
    ex = bad[0]
    return [
        Finding(
            "bad_tensor_shape",
            "warning",
            f"{len(by_op)} Tensor Core eligible GEMM op(s) have dimensions that are not "
            f"multiples of {ex[2]} elements.",
            f"{_top(pd.Series(by_op.index))}; e.g. shapes {ex[0]} ({ex[1]}) with dims "
            f"{ex[3]}; {_ms(by_op.sum())} GPU time",
            f"Pad hidden sizes, vocabulary and batch x sequence to multiples of {ex[2]} "
            "(64 or more is better on A100/H100) so cuBLAS picks full-width Tensor Core tiles.",
        )
    ]


def amp_not_used(a: Analysis, th: Thresholds) -> list[Finding]:
    inst = a.kept_instances  # eligible instances are always kept; folded ones ran no GPU work
    if "tc_eligible" not in inst or inst.empty:
        return []
    cc = pd.to_numeric(a.trace.devices["compute_capability"], errors="coerce")
    if not len(cc.dropna()) or float(cc.max()) < 7.0:
        return []  # no TC-capable GPU known: say nothing rather than guess
    elig = inst[inst["tc_eligible"].fillna(False).astype(bool)]
    first = with_category(elig["dtypes"], "").fillna("").str.extract(r'^\["([^"]+)"')[0]
    fp32 = elig[first == "float"]
    total = float(inst["gpu_time"].sum())
    share = float(fp32["gpu_time"].sum()) / total if total else 0.0
    if fp32.empty or share < th.fp32_gemm_share:
        return []
    tc = fp32["uses_tc"].fillna(False).astype(bool) if "uses_tc" in fp32 else False
    by_op = fp32.groupby("op_name")["gpu_time"].sum().sort_values(ascending=False)
    return [
        Finding(
            "amp_not_used",
            "warning",
            f"{100 * share:.0f}% of GPU time is in fp32 GEMMs/convolutions on a Tensor Core "
            "GPU: automatic mixed precision is not used.",
            f"{_top(pd.Series(by_op.index))}; {int(np.sum(tc))} of {len(fp32)} calls ran TF32 "
            "Tensor Core kernels",
            "Enable AMP (torch.autocast(device_type='cuda', dtype=torch.bfloat16) with a "
            "GradScaler for fp16) or at least TF32 "
            "(torch.backends.cuda.matmul.allow_tf32 = True).",
        )
    ]


def tc_lost_between_iterations(a: Analysis, th: Thresholds) -> list[Finding]:
    acts = a.activities
    inst = a.kept_instances  # every instance with kernels is kept
    if "uses_tc" not in acts or "tc_eligible" not in inst or acts["iteration"].isna().all():
        return []
    k = acts[(acts["activity"] == "kernel") & acts["iteration"].notna() & (acts["range_id"] >= 0)]
    elig = inst.set_index("instance")["tc_eligible"].fillna(False).astype(bool)
    k = k[elig.reindex(k["instance"]).fillna(False).to_numpy()]
    if k.empty:
        return []
    per = (
        k.assign(tc=k["uses_tc"].fillna(False).astype(bool))
        .groupby(["op_name", "direction", "iteration"])["tc"]
        .any()
        .unstack("iteration")
    )
    mixed = per[per.any(axis=1) & ~per.fillna(True).all(axis=1)]
    if mixed.empty:
        return []
    name, _ = mixed.index[0]
    row = mixed.iloc[0]
    lost = [int(cast(int, i)) for i, v in row.items() if pd.notna(v) and not bool(v)]
    return [
        Finding(
            "tc_lost_between_iterations",
            "warning",
            f"{len(mixed)} eligible op(s) use Tensor Cores in some iterations and not in others.",
            f"{name}: no TC kernel in iteration(s) {lost[:5]}",
            "Shapes or dtypes change between iterations (dynamic shapes, a last partial "
            "batch, autocast turned off), or cuDNN/cuBLAS heuristics chose another algorithm: "
            "fix the shapes (drop_last=True, padding) and set torch.backends.cudnn.benchmark.",
        )
    ]


def splitk_gemv_fallbacks(a: Analysis, th: Thresholds) -> list[Finding]:
    # the kernel report's rows (one per kernel and op) hold every count and time needed
    k = a.kernels
    if k.empty:
        return []
    total = float(k["gpu_time_total"].sum())
    out = []
    for check, pat, what, rec in (
        (
            "splitk_fallback",
            _SPLITK,
            "split-K GEMMs (an extra reduction kernel per call)",
            "Split-K means the GEMM is too small or too skinny to fill the GPU: batch several "
            "GEMMs together, grow M/N, or fuse them (grouped GEMM).",
        ),
        (
            "gemv_fallback",
            _GEMV,
            "GEMV / SIMT kernels (no Tensor Cores)",
            "A GEMM with M or N of 1 runs as GEMV: batch the requests (larger decode batch) or "
            "accept it as expected for token-by-token decoding.",
        ),
    ):
        hit = k[_matches(k["name"], pat)]
        if hit.empty:
            continue
        t = float(hit["gpu_time_total"].sum())
        if t < th.min_gpu_share * total:
            continue
        # kernels per owning op, most first (ties by name)
        owners = (
            hit.groupby("op_name")["calls"]
            .sum()
            .reset_index()
            .sort_values(["calls", "op_name"], ascending=[False, True])
        )
        out.append(
            Finding(
                check,
                "info",
                f"{int(hit['calls'].sum())} kernels are {what}.",
                f"{_ms(t)} GPU time; issued by {_top(owners['op_name'])}",
                rec,
            )
        )
    return out


DETECTORS: tuple[Callable[[Analysis, Thresholds], list[Finding]], ...] = (
    no_iterations,
    bad_iteration_range,
    gpu_underutilized,
    imbalanced_gpus,
    emit_nvtx_missing,
    dataloader_bound,
    bad_tensor_shape,
    amp_not_used,
    tc_lost_between_iterations,
    splitk_gemv_fallbacks,
    launch_bound_tiny_kernels,
    memcpy_in_iterations,
)


def run_detectors(analysis: Analysis, thresholds: Thresholds | None = None) -> pd.DataFrame:
    """Every detector's findings as a table (columns :data:`FINDING_COLUMNS`).

    With the default thresholds this is ``analysis.findings`` (a copy), kept on the
    analysis, so the reports that show it (CSV, HTML, the plugin) run the detectors once.
    """
    if thresholds is None:
        return analysis.findings.copy()
    return detect(analysis, thresholds)


def detect(analysis: Analysis, thresholds: Thresholds) -> pd.DataFrame:
    """Run every detector with ``thresholds`` (:func:`run_detectors` keeps the default's)."""
    found = [f for check in DETECTORS for f in check(analysis, thresholds)]
    return pd.DataFrame([asdict(f) for f in found], columns=FINDING_COLUMNS)
