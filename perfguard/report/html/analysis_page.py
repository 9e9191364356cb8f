"""The analysis report: one capture's :class:`~perfguard.analysis.Analysis` as one HTML file.

It replaces the DLProf Viewer's pages for ``perfguard analyze``: run
summary, top ops by GPU time, Tensor Core eligible ops that do not use
Tensor Cores, per-iteration time, per-rank time and the straggler of a
multi-rank run, the kernel table and the expert findings. Tensor Core and
FLOP columns are shown when the analysis has them and read ``n/a``
otherwise (an analysis without shapes cannot know). A capture with no GPU work
ranks its ops by CPU time and leaves out every column and section that needs
kernels (said once); a parent op shows the FLOPs of its nested ops, marked so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfguard.analysis.ops import nested_flops
from perfguard.report.html.render import fmt_ns, render, write_text
from perfguard.report.labels import SUMMARY_LABELS, with_unit

if TYPE_CHECKING:
    from perfguard.analysis import Analysis, RunSummary

#: op columns the Tensor Core / FLOP part of the tables reads, with accepted spellings
_OP_OPTIONAL = {
    "tc_eligible": ("tc_eligible",),
    "using_tc": ("using_tc",),
    "tc_utilization": ("tc_utilization", "tc_utilization_pct"),
    "flops": ("flops",),
    "flop_efficiency": ("flop_efficiency_pct", "flop_efficiency"),
    "call_site": ("call_site",),
}


@dataclass
class AnalysisPage:
    """Everything ``analysis.html.j2`` shows."""

    title: str
    source: str
    summary: list[tuple[str, str]]  # (label, formatted value)
    top_ops: list[dict[str, Any]]
    total_gpu_ns: float
    #: whether the capture has GPU work: without it the ops are ranked by CPU time and the
    #: GPU, Tensor Core and FLOP-efficiency columns, which need kernels, are not shown
    on_gpu: bool
    has_tc_columns: bool  # False: the analysis has no Tensor Core columns at all
    tc_missing: list[dict[str, Any]]  # eligible ops with no Tensor Core kernel
    iterations_svg: str | None
    iteration_count: int
    kernels: list[dict[str, Any]]
    kernels_hidden: int
    findings: list[dict[str, Any]]
    ranks: list[dict[str, Any]]  # one per rank, shown for two ranks or more
    straggler: str | None  # the straggler line of a multi-rank run


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values, missing values as None."""
    if not len(df):
        return []
    return [
        {str(k): _plain(v) for k, v in row.items()} for row in df.to_dict(orient="records")
    ]  # at most the few hundred rows a page shows


def _plain(v: Any) -> Any:
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def _summary_rows(summary: RunSummary) -> list[tuple[str, str]]:
    """(label, text) per figure of the summary, in its order (a missing one: n/a)."""
    rows = []
    for name, (label, unit) in SUMMARY_LABELS.items():
        value = _plain(getattr(summary, name))
        if isinstance(value, str) and name == "profile_name":
            value = Path(value).name or value
        if value is None or value == "":
            label, text = with_unit(label, unit), "n/a"
        elif unit == "ns":
            text = fmt_ns(value)
        elif unit == "%" and isinstance(value, int | float):
            label, text = with_unit(label, unit), f"{value:.2f}"
        elif isinstance(value, float):
            text = f"{value:,.3f}"
        elif isinstance(value, int):
            text = f"{value:,}"
        else:
            text = str(value)
        rows.append((label, text))
    return rows


def _ops_view(ops: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """``ops`` with the optional columns under one spelling each (missing ones all None)."""
    out = ops.copy()
    present = False
    for name, spellings in _OP_OPTIONAL.items():
        found = next((s for s in spellings if s in ops.columns), None)
        present |= found is not None and name in ("tc_eligible", "using_tc")
        out[name] = ops[found] if found else None
    return out, present


def analysis_page(
    analysis: Analysis,
    *,
    findings: pd.DataFrame | None = None,
    top: int = 10,
    max_kernels: int = 200,
) -> AnalysisPage:
    """The page context for ``analysis``; runs the expert detectors unless given ``findings``."""
    from perfguard.report.figures import iteration_bars

    if findings is None:
        findings = analysis.findings
    ops, has_tc = _ops_view(analysis.top_ops)
    nested = nested_flops(ops).set_axis(ops["op_id"].to_numpy())  # over every op: any depth
    ops["nested_flops"] = nested.to_numpy()
    total_gpu = float(ops["gpu_time_total"].sum()) if len(ops) else 0.0
    if not total_gpu and len(ops):  # a CPU capture: the order a reader of CPU time expects
        ops = ops.sort_values("cpu_time_total", ascending=False, kind="stable")
    missed = _ops_view(analysis.tc_missed_ops)[0]
    missed["nested_flops"] = nested.reindex(missed["op_id"].to_numpy()).to_numpy()
    tc_missing = _records(missed) if has_tc else []

    it = analysis.iterations
    if len(it) and "rank" in it:
        it = it[it["rank"] == it["rank"].min()]
    source = analysis.summary.profile_name or "capture"
    svg = iteration_bars(
        it["duration"].to_numpy(dtype=float),
        it["gpu_time"].to_numpy(dtype=float),
        f"iteration time of {Path(source).name}",
    )

    k = analysis.kernels.sort_values("gpu_time_total", ascending=False, kind="stable")
    shown = k.head(max_kernels).copy()
    dims = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
    if all(c in shown for c in dims) and len(shown):
        for part in ("grid", "block"):
            cols = [shown[f"{part}_{a}"].astype("Int64").astype(str) for a in "xyz"]
            shown[part] = cols[0] + "×" + cols[1] + "×" + cols[2]
            shown[part] = shown[part].where(shown[f"{part}_x"].notna(), None)
    else:
        shown["grid"] = shown["block"] = None
    if "uses_tc" not in shown:
        shown["uses_tc"] = None

    ranks, found = analysis.ranks, analysis.straggler
    return AnalysisPage(
        title=f"perfguard analysis: {Path(source).name}",
        source=source,
        summary=_summary_rows(analysis.summary),
        top_ops=_records(ops.head(top)),
        total_gpu_ns=total_gpu,
        on_gpu=total_gpu > 0,
        has_tc_columns=has_tc,
        tc_missing=tc_missing,
        iterations_svg=svg,
        iteration_count=len(it),
        kernels=_records(shown),
        kernels_hidden=max(len(k) - max_kernels, 0),
        findings=_records(findings),
        ranks=_records(ranks) if len(ranks) > 1 else [],
        straggler=found.describe() if found is not None else None,
    )


def render_analysis_html(analysis: Analysis, **options: Any) -> str:
    """The analysis report as one HTML document (options: see :func:`analysis_page`)."""
    return render("analysis.html.j2", page=analysis_page(analysis, **options))


def write_analysis_html(analysis: Analysis, path: str | Path, **options: Any) -> Path:
    """Render the analysis report and write it to ``path``; returns the path."""
    return write_text(path, render_analysis_html(analysis, **options), "HTML report")
