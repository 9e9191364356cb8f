"""DLProf-style report tables: DLProf's header names, in DLProf's order.

Existing DLProf spreadsheets and scripts read these files, so the headers
follow the DLProf user guide; perfguard adds ``No. Calls`` to the kernel
report. Columns a later analysis fills (Tensor Cores, shapes, data types)
are present and empty rather than missing, so the layout never changes.
"""

from __future__ import annotations

import pandas as pd

from perfguard.analysis import Analysis

REPORTS = ("summary", "detail", "iteration", "kernel")
FORMATS = ("csv", "json")

_STAT_LABEL = {"total": "Total", "avg": "Avg.", "min": "Min", "max": "Max"}


def _stat_columns(metric: str, label: str) -> dict[str, str]:
    return {f"{metric}_{s}": f"{_STAT_LABEL[s]} {label} (ns)" for s in _STAT_LABEL}


#: detail report: internal column -> DLProf header, in DLProf's order.
DETAIL_COLUMNS: dict[str, str] = {
    "op_id": "Op ID",
    "op_name": "Op Name",
    "direction": "Direction",
    "op_type": "Op Type",
    "calls": "No. Calls",
    "tc_eligible": "TC Eligibility",
    "using_tc": "Using TC",
    **_stat_columns("cpu_time", "CPU Time"),
    **_stat_columns("gpu_time", "GPU Time"),
    **_stat_columns("cpu_overhead", "CPU Overhead Time"),
    **_stat_columns("gpu_idle", "GPU Idle Time"),
    "data_type": "Data Type",
    "input_shapes": "Input Shapes",
    "kernel_count": "No. Kernels",
}

#: kernel report: internal column -> DLProf header (``No. Calls`` added by perfguard).
KERNEL_COLUMNS: dict[str, str] = {
    "name": "Kernel Name",
    "op_id": "Op ID",
    "op_name": "Op Name",
    "direction": "Direction",
    "uses_tc": "Uses TC",
    "calls": "No. Calls",
    **_stat_columns("gpu_time", "GPU Time"),
    "grid": "Grid",
    "block": "Block",
    "registers": "Registers Per Thread",
    "shared_mem": "Shared Memory (bytes)",
    "short_name": "Kernel Short Name",
}

#: iteration report: internal column -> header.
ITERATION_COLUMNS: dict[str, str] = {
    "iteration": "Iteration",
    "rank": "Rank",
    "start": "Start Time (ns)",
    "end": "End Time (ns)",
    "duration": "Duration (ns)",
    "op_calls": "No. Op Calls",
    "kernel_count": "No. Kernels",
    "memop_count": "No. Memory Ops",
    "gpu_time": "GPU Time (ns)",
    "kernel_time": "Kernel Time (ns)",
    "gpu_busy": "GPU Busy Time (ns)",
    "gpu_utilization": "GPU Utilization (%)",
    "tc_kernel_time": "Tensor Core Kernel Time (ns)",
}


def _select(df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    out = pd.DataFrame(index=df.index)
    for src, header in columns.items():
        out[header] = df[src] if src in df.columns else None
    return out.reset_index(drop=True)


def detail_table(analysis: Analysis) -> pd.DataFrame:
    """One row per op, DLProf's detail report."""
    return _select(analysis.ops, DETAIL_COLUMNS)


def kernel_table(analysis: Analysis) -> pd.DataFrame:
    """One row per (kernel, op), DLProf's kernel report."""
    k = analysis.kernels.copy()
    if len(k):
        k["grid"] = _dims(k, "grid")
        k["block"] = _dims(k, "block")
    return _select(k, KERNEL_COLUMNS)


def _dims(k: pd.DataFrame, what: str) -> pd.Series:
    parts = [k[f"{what}_{a}"].astype("Int64").astype(str) for a in "xyz"]
    text = "(" + parts[0] + ", " + parts[1] + ", " + parts[2] + ")"
    return text.where(k[f"{what}_x"].notna(), None)


def iteration_table(analysis: Analysis) -> pd.DataFrame:
    """One row per (rank, iteration)."""
    return _select(analysis.iterations, ITERATION_COLUMNS)


def summary_table(analysis: Analysis) -> pd.DataFrame:
    """The run summary as ``Metric, Value`` rows."""
    s = analysis.summary
    return pd.DataFrame({"Metric": s.index, "Value": s.to_numpy()})


TABLES = {
    "summary": summary_table,
    "detail": detail_table,
    "iteration": iteration_table,
    "kernel": kernel_table,
}
