"""DLProf-style report tables: DLProf's header names, in DLProf's order.

Existing DLProf spreadsheets and scripts read these files, so the headers
follow the DLProf user guide; perfguard adds ``No. Calls`` to the kernel
report and FLOP columns (``FLOPs``, ``Bytes``, ``Achieved TFLOP/s``,
``FLOP Efficiency (%)``) to detail and op_type. Columns a capture cannot
fill (shapes without ``record_shapes``) are present and empty rather than
missing, so the layout never changes.
"""

from __future__ import annotations

import pandas as pd

from perfguard.analysis import Analysis

REPORTS = ("summary", "detail", "iteration", "kernel")
#: every report ``--reports all`` selects (the default set stays the cheap four)
ALL_REPORTS = (*REPORTS, "tensor", "op_type", "group_node", "expert_systems", "rank")
FORMATS = ("csv", "json", "html")

_STAT_LABEL = {"total": "Total", "avg": "Avg.", "min": "Min", "max": "Max"}


def _stat_columns(metric: str, label: str) -> dict[str, str]:
    return {f"{metric}_{s}": f"{_STAT_LABEL[s]} {label} (ns)" for s in _STAT_LABEL}


#: FLOP columns perfguard adds to the detail and op_type reports.
_FLOP_COLUMNS: dict[str, str] = {
    "flops": "FLOPs",
    "bytes": "Bytes",
    "achieved_tflops": "Achieved TFLOP/s",
    "flop_efficiency_pct": "FLOP Efficiency (%)",
}

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
    "tc_utilization": "TC Utilization (%)",
    **_FLOP_COLUMNS,
    "call_site": "Call Site",
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

#: summary report: :class:`~perfguard.analysis.RunSummary` field -> DLProf's metric name,
#: in the report's order (every field; a test holds the two together).
SUMMARY_ROWS: dict[str, str] = {
    "profile_name": "Profile Name",
    "capture_format": "Capture Format",
    "gpu_names": "GPU Names",
    "ranks": "Ranks",
    "gpus_used": "GPUs Used",
    "wall_time": "Wall Clock Time (ns)",
    "iterations": "Iterations",
    "iteration_range": "Iteration Range",
    "iteration_time_avg": "Average Iteration Time (ns)",
    "gpu_utilization": "GPU Utilization (%)",
    "kernel_time": "Total Kernel Time (ns)",
    "memop_time": "Total Memory Op Time (ns)",
    "gpu_busy": "GPU Busy Time, flattened (ns)",
    "kernel_busy": "Kernel Busy Time, flattened (ns)",
    "memop_only_busy": "Memory-only Busy Time, flattened (ns)",
    "kernels": "Kernels",
    "memops": "Memory Ops",
    "unique_kernels": "Unique Kernels",
    "op_instances": "Op Instances",
    "unique_ops": "Unique Ops",
    "unassociated_activities": "Unassociated GPU Activities",
    "unassociated_gpu_time": "Unassociated GPU Time (ns)",
    "tc_utilization": "Tensor Core Kernel Utilization (%)",
    "tc_kernel_time": "Tensor Core Kernel Time (ns)",
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
    """The run summary as ``Metric, Value`` rows, DLProf's names in :data:`SUMMARY_ROWS`."""
    s = analysis.summary
    return pd.DataFrame(
        {
            "Metric": list(SUMMARY_ROWS.values()),
            "Value": pd.Series([getattr(s, f) for f in SUMMARY_ROWS], dtype=object),
        }
    )


#: op_type report: one row per op type.
OP_TYPE_COLUMNS: dict[str, str] = {
    "op_type": "Op Type",
    "calls": "No. Calls",
    "tc_eligible": "TC Eligibility",
    "using_tc": "Using TC",
    "tc_utilization": "TC Utilization (%)",
    **_stat_columns("cpu_time", "CPU Time"),
    **_stat_columns("gpu_time", "GPU Time"),
    "data_type": "Data Type",
    "kernel_count": "No. Kernels",
    **_FLOP_COLUMNS,
}

#: tensor report: TC eligible ops (or ops whose kernels used TC), DLProf's Tensor Core report.
TENSOR_COLUMNS: dict[str, str] = {
    "op_id": "Op ID",
    "op_name": "Op Name",
    "direction": "Direction",
    "op_type": "Op Type",
    "calls": "No. Calls",
    "using_tc": "Using TC",
    "tc_utilization": "TC Utilization (%)",
    "kernel_time": "Kernel Time (ns)",
    "tc_kernel_time": "TC Kernel Time (ns)",
    "non_tc_time": "Non-TC Kernel Time (ns)",
    "kernel_count": "Total Kernel Count",
    "tc_kernels": "Kernel Count Using Tensor Cores",
    "non_tc_kernels": "Kernel Count Not Using Tensor Cores",
    "unknown_kernels": "Kernel Count Unknown",
    "tc_names": "TC Kernel Names",
    "non_tc_names": "Non-TC Kernel Names",
    "data_type": "Data Type",
    "input_shapes": "Input Shapes",
}

#: group_node report: inclusive roll-ups over the op hierarchy.
GROUP_COLUMNS: dict[str, str] = {
    "op_id": "Op ID",
    "op_name": "Group Node Name",
    "direction": "Direction",
    "calls": "No. Calls",
    "child_ops": "No. Child Ops",
    "kernel_count": "No. Kernels",
    "cpu_time_total": "Total CPU Time (ns)",
    "gpu_time_total": "Total GPU Time, accumulated (ns)",
    "gpu_time_flattened": "Total GPU Time, flattened (ns)",
    "gpu_idle_total": "Total GPU Idle Time (ns)",
}

#: rank report (perfguard's, after DLProf's multi-GPU view and HTA's temporal
#: breakdown): one row per rank, see :mod:`perfguard.analysis.ranks`.
RANK_COLUMNS: dict[str, str] = {
    "rank": "Rank",
    "gpus": "GPUs",
    "iterations": "Iterations",
    "iteration_time_avg": "Avg. Iteration Time (ns)",
    "wall_time": "Wall Time (ns)",
    "gpu_time": "GPU Time (ns)",
    "kernel_time": "Kernel Time (ns)",
    "comm_time": "Communication Time, NCCL (ns)",
    "compute_time": "Compute Kernel Time (ns)",
    "memop_time": "Memory Op Time (ns)",
    "gpu_busy": "GPU Busy Time, flattened (ns)",
    "idle_time": "GPU Idle Time (ns)",
    "idle_pct": "GPU Idle (%)",
    "comm_wait": "Wait for Straggler in NCCL (ns)",
    "straggler": "Straggler",
}

EXPERT_COLUMNS: dict[str, str] = {
    "check": "Check",
    "severity": "Severity",
    "problem": "Problem",
    "evidence": "Evidence",
    "recommendation": "Recommendation",
}


def tensor_table(analysis: Analysis) -> pd.DataFrame:
    """Per TC-eligible op: TC and non-TC kernel time and counts, with the kernel names."""
    return _select(analysis.tensor_ops, TENSOR_COLUMNS)


def op_type_table(analysis: Analysis) -> pd.DataFrame:
    """One row per op type (DLProf's op_type report)."""
    return _select(analysis.op_types, OP_TYPE_COLUMNS)


def group_node_table(analysis: Analysis) -> pd.DataFrame:
    """Inclusive roll-ups: every op with everything below it in the op hierarchy."""
    return _select(analysis.group_nodes, GROUP_COLUMNS)


def expert_table(analysis: Analysis) -> pd.DataFrame:
    """The expert systems' findings: problem, evidence, recommendation."""
    return _select(analysis.findings, EXPERT_COLUMNS)


def rank_report(analysis: Analysis) -> pd.DataFrame:
    """One row per rank: GPU, communication, idle and iteration time, and the straggler."""
    return rank_report_of(analysis.ranks)


def rank_report_of(ranks: pd.DataFrame) -> pd.DataFrame:
    """The rank report of a rank table (:func:`perfguard.analysis.ranks.rank_table`)."""
    return _select(ranks, RANK_COLUMNS)


TABLES = {
    "summary": summary_table,
    "detail": detail_table,
    "iteration": iteration_table,
    "kernel": kernel_table,
    "tensor": tensor_table,
    "op_type": op_type_table,
    "group_node": group_node_table,
    "expert_systems": expert_table,
    "rank": rank_report,
}
