"""The short human summary ``perfguard analyze`` prints to the terminal."""

from __future__ import annotations

import pandas as pd

from perfguard.analysis import Analysis

_SUMMARY_KEYS = [
    "Capture Format", "GPU Names", "GPUs Used", "Wall Clock Time (ns)", "Iterations",
    "Iteration Range", "Average Iteration Time (ns)", "GPU Utilization (%)",
    "Total Kernel Time (ns)", "Total Memory Op Time (ns)", "Kernels", "Unique Ops",
    "Unassociated GPU Time (ns)", "Tensor Core Kernel Utilization (%)",
]  # fmt: skip

#: terminal labels for keys too long for the column
_SHORT = {"Tensor Core Kernel Utilization (%)": "Tensor Core Utilization (%)"}


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"


def _clip(text: str, width: int) -> str:
    text = str(text)
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def format_summary(analysis: Analysis, top: int = 10, width: int = 60) -> str:
    """Run figures, then the top ops by GPU time, as plain text."""
    s = analysis.summary
    lines = ["perfguard summary"]
    for key in _SUMMARY_KEYS:
        value = s.get(key)
        if value is None or value == "" or (not isinstance(value, str) and pd.isna(value)):
            continue
        if key.endswith("(ns)"):
            key, value = key.replace("(ns)", "(ms)"), _ms(float(value))
        elif key.endswith("(%)"):
            value = f"{float(value):.2f}"
        key = _SHORT.get(key, key)
        lines.append(f"  {key:<32} {value}")
    ops = analysis.ops.head(top)
    total_gpu = float(analysis.ops["gpu_time_total"].sum()) if len(analysis.ops) else 0.0
    lines.append("")
    by = "GPU time" if total_gpu else "CPU time (no GPU activity in the capture)"
    lines.append(f"Top {len(ops)} ops by {by}")
    header = (
        f"  {'Op Name':<{width}} {'Dir':<5} {'Calls':>7} {'GPU ms':>10} {'GPU %':>6} {'CPU ms':>10}"
    )
    lines.append(header)
    for row in ops.itertuples(index=False):  # at most `top` rows
        share = 100.0 * row.gpu_time_total / total_gpu if total_gpu else 0.0
        lines.append(
            f"  {_clip(row.op_name, width):<{width}} {row.direction:<5} {row.calls:>7}"
            f" {_ms(row.gpu_time_total):>10} {share:>6.1f} {_ms(row.cpu_time_total):>10}"
        )
    return "\n".join(lines)
