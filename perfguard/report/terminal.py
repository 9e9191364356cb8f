"""The short human summary ``perfguard analyze`` prints to the terminal."""

from __future__ import annotations

from typing import Any

import pandas as pd

from perfguard.analysis import Analysis
from perfguard.report.labels import SUMMARY_LABELS, with_unit

#: the run summary's fields the terminal shows, in order
_SUMMARY_FIELDS = [
    "capture_format",
    "gpu_names",
    "gpus_used",
    "wall_time",
    "iterations",
    "iteration_range",
    "iteration_time_avg",
    "gpu_utilization",
    "kernel_time",
    "memop_time",
    "kernels",
    "unique_ops",
    "unassociated_gpu_time",
    "tc_utilization",
]

#: terminal labels for fields whose label is too long for the column
_SHORT = {"tc_utilization": "Tensor Core Utilization"}


def _ms(ns: Any) -> str:
    return f"{ns / 1e6:,.3f}"


def _clip(text: object, width: int) -> str:
    text = str(text)
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def format_summary(analysis: Analysis, top: int = 10, width: int = 60) -> str:
    """Run figures, then the top ops by GPU time, as plain text."""
    lines = ["perfguard summary"]
    for name in _SUMMARY_FIELDS:
        value = getattr(analysis.summary, name)
        if value is None or value == "" or (not isinstance(value, str) and pd.isna(value)):
            continue
        label, unit = SUMMARY_LABELS[name]
        label = _SHORT.get(name, label)
        if unit == "ns":
            label, value = with_unit(label, "ms"), _ms(float(value))
        elif unit == "%":
            label, value = with_unit(label, unit), f"{float(value):.2f}"
        lines.append(f"  {label:<32} {value}")
    ops = analysis.top_ops.head(top)
    total_gpu = float(analysis.ops["gpu_time_total"].sum()) if len(analysis.ops) else 0.0
    lines.append("")
    by = "GPU time" if total_gpu else "CPU time (no GPU activity in the capture)"
    lines.append(f"Top {len(ops)} ops by {by}")
    header = (
        f"  {'Op Name':<{width}} {'Dir':<5} {'Calls':>7} {'GPU ms':>10} {'GPU %':>6} {'CPU ms':>10}"
    )
    lines.append(header)
    for row in ops.itertuples(index=False):  # at most `top` rows
        share: Any = row.gpu_share if total_gpu else 0.0
        lines.append(
            f"  {_clip(row.op_name, width):<{width}} {str(row.direction):<5} {row.calls:>7}"
            f" {_ms(row.gpu_time_total):>10} {share:>6.1f} {_ms(row.cpu_time_total):>10}"
        )
    return "\n".join(lines)
