"""perfguard's own names for the run summary's figures, for the pages people read.

The HTML page and the terminal summary show these; the DLProf-compatible
files use DLProf's names (:data:`perfguard.report.dlprof.SUMMARY_ROWS`), so
renaming a DLProf header leaves the page and the terminal as they are.
"""

from __future__ import annotations

#: :class:`~perfguard.analysis.RunSummary` field -> (label, unit: "ns", "%" or "")
SUMMARY_LABELS: dict[str, tuple[str, str]] = {
    "profile_name": ("Profile Name", ""),
    "capture_format": ("Capture Format", ""),
    "gpu_names": ("GPU Names", ""),
    "ranks": ("Ranks", ""),
    "gpus_used": ("GPUs Used", ""),
    "wall_time": ("Wall Clock Time", "ns"),
    "iterations": ("Iterations", ""),
    "iteration_range": ("Iteration Range", ""),
    "iteration_time_avg": ("Average Iteration Time", "ns"),
    "gpu_utilization": ("GPU Utilization", "%"),
    "kernel_time": ("Total Kernel Time", "ns"),
    "memop_time": ("Total Memory Op Time", "ns"),
    "gpu_busy": ("GPU Busy Time, flattened", "ns"),
    "kernel_busy": ("Kernel Busy Time, flattened", "ns"),
    "memop_only_busy": ("Memory-only Busy Time, flattened", "ns"),
    "kernels": ("Kernels", ""),
    "memops": ("Memory Ops", ""),
    "unique_kernels": ("Unique Kernels", ""),
    "op_instances": ("Op Instances", ""),
    "unique_ops": ("Unique Ops", ""),
    "unassociated_activities": ("Unassociated GPU Activities", ""),
    "unassociated_gpu_time": ("Unassociated GPU Time", "ns"),
    "tc_utilization": ("Tensor Core Kernel Utilization", "%"),
    "tc_kernel_time": ("Tensor Core Kernel Time", "ns"),
}


def with_unit(label: str, unit: str) -> str:
    """``label (unit)``, or the label alone for a count or a text."""
    return f"{label} ({unit})" if unit else label
