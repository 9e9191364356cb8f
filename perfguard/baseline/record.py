"""What perfguard keeps of one benchmark test, and of the run it belongs to.

These records are the contract between the layers below the store (the
analysis makes them), the store (persists them), ``perfguard.compare``
(compares two of them) and the reports. They hold pandas DataFrames with
fixed columns so a notebook can read them as easily as the code does.

The *primary metric* of a test is per-iteration GPU time (sum of the
durations of the kernels and memops attributed to the iteration) when the
capture saw a GPU; a CPU-only capture has no GPU time, so its primary
metric is the iteration's wall time, or, when the marker asks for it, the
CPU time of the thread that ran the iteration (``cpu_time``: inflated
far less than wall time by other jobs on a shared CPU runner, blind to
time spent waiting; caches and clock speed still move it).
``TestRecord.metric`` says which one was used, and two records are only
compared on the same metric.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: columns of :attr:`TestRecord.samples`: one row per recorded iteration
#: (``cpu_time_ns``: the harness thread's CPU time, NA when not measured)
SAMPLE_COLUMNS = ("iteration", "gpu_time_ns", "wall_time_ns", "cpu_time_ns")
#: columns of :attr:`TestRecord.op_samples`: one row per (op, iteration)
OP_SAMPLE_COLUMNS = ("op_id", "iteration", "calls", "gpu_time_ns", "cpu_time_ns")
#: columns of :attr:`TestRecord.ops`: one row per op (whole capture)
OP_COLUMNS = (
    "op_id", "op_name", "direction", "op_type", "calls", "kernel_count",
    "cpu_time_total", "gpu_time_total", "tc_eligible", "using_tc", "tc_utilization",
    "flops", "bytes", "flop_efficiency",
)  # fmt: skip
#: columns of :attr:`TestRecord.kernels`: one row per (kernel name, op)
KERNEL_COLUMNS = ("op_id", "op_name", "kernel_name", "calls", "gpu_time_total", "uses_tc")

#: metric names a record's samples can carry
METRICS = {"gpu_time": "gpu_time_ns", "wall_time": "wall_time_ns", "cpu_time": "cpu_time_ns"}


@dataclass(frozen=True)
class Fingerprint:
    """The machine a run was measured on; results from different ones never compare."""

    gpu_name: str = ""  # "" on a CPU-only machine
    gpu_count: int = 0
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    perfguard: str = ""
    backend: str = ""  # "nsys" | "torch" | "cpu"
    host: str = field(default_factory=platform.node)
    python: str = field(default_factory=platform.python_version)
    cpu: str = field(default_factory=platform.processor)

    def incompatibility(self, other: Fingerprint) -> str | None:
        """Why results measured on ``other`` cannot be compared with these, or None.

        Same GPU model, same device count and same backend are required;
        versions and host are recorded for the reader but do not block.
        A CPU-only run is compared only with CPU-only runs on the same CPU
        model, since its figures are wall times of that CPU.
        """
        for name in ("gpu_name", "gpu_count", "backend"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                return f"{name} differs: {theirs!r} (baseline) vs {mine!r} (current)"
        if not self.gpu_name and self.cpu and other.cpu and self.cpu != other.cpu:
            return f"cpu differs: {other.cpu!r} (baseline) vs {self.cpu!r} (current)"
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class RunInfo:
    """One session of measurements: which commit, which machine, when."""

    commit: str
    branch: str | None
    dirty: bool
    time: str  # ISO 8601, UTC
    fingerprint: Fingerprint

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fingerprint"] = self.fingerprint.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunInfo:
        return cls(
            commit=data["commit"],
            branch=data.get("branch"),
            dirty=bool(data.get("dirty", False)),
            time=data["time"],
            fingerprint=Fingerprint.from_dict(data.get("fingerprint", {})),
        )


@dataclass
class TestRecord:
    """One benchmark test's measurements in one run.

    ``samples`` (SAMPLE_COLUMNS), ``op_samples`` (OP_SAMPLE_COLUMNS), ``ops``
    (OP_COLUMNS) and ``kernels`` (KERNEL_COLUMNS) are DataFrames; ``meta``
    holds the marker's settings (iterations, warmup, tolerance, metrics),
    the capture path and any note (e.g. "test did not use the gpuprofile
    fixture: captured as one iteration").
    """

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    metric: str  # a key of METRICS
    samples: pd.DataFrame
    op_samples: pd.DataFrame
    ops: pd.DataFrame
    kernels: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def values(self, metric: str | None = None) -> np.ndarray:
        """Per-iteration values of ``metric`` (default: the primary one), in ns, as float64."""
        col = METRICS[metric or self.metric]
        return self.samples[col].to_numpy(dtype=np.float64)

    def op_values(self, op_id: str, metric: str | None = None) -> np.ndarray:
        """Per-iteration values of one op (GPU time, or CPU time for a wall/CPU-time record)."""
        col = "gpu_time_ns" if (metric or self.metric) == "gpu_time" else "cpu_time_ns"
        rows = self.op_samples[self.op_samples["op_id"] == op_id]
        return rows[col].to_numpy(dtype=np.float64)


def empty_frame(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})


def record_from_analysis(
    nodeid: str,
    analysis: Any,
    *,
    wall_times_ns: np.ndarray | None = None,
    cpu_times_ns: np.ndarray | None = None,
    metric: str | None = None,
    meta: dict[str, Any] | None = None,
) -> TestRecord:
    """A :class:`TestRecord` from a :class:`perfguard.analysis.Analysis` of one test.

    ``wall_times_ns`` are the harness's own per-iteration wall times (the
    ``gpuprofile`` fixture measures them around each recorded iteration,
    after synchronising the device); without them the iteration ranges'
    durations are used. ``cpu_times_ns`` (the same iterations' thread CPU
    time) fills ``cpu_time_ns``, else it is NA. ``metric`` defaults to ``gpu_time`` when the
    capture has GPU activity and ``wall_time`` otherwise.
    """
    it = analysis.iterations
    it = it[it["rank"] == it["rank"].min()] if len(it) and "rank" in it else it
    samples = pd.DataFrame(
        {
            "iteration": it["iteration"].to_numpy(dtype=np.int64),
            "gpu_time_ns": it["gpu_time"].to_numpy(dtype=np.int64),
            "wall_time_ns": it["duration"].to_numpy(dtype=np.int64),
        }
    )
    if wall_times_ns is not None and len(wall_times_ns) == len(samples):
        samples["wall_time_ns"] = np.asarray(wall_times_ns, dtype=np.int64)
    cpu = np.zeros(len(samples), dtype=np.int64)
    measured = cpu_times_ns is not None and len(cpu_times_ns) == len(samples)
    if measured:
        cpu = np.asarray(cpu_times_ns, dtype=np.int64)
    samples["cpu_time_ns"] = pd.arrays.IntegerArray(cpu, np.full(len(cpu), not measured))
    if metric is None:
        metric = "gpu_time" if len(analysis.activities) else "wall_time"

    inst = analysis.instances
    real = inst[inst["iteration"].notna()]
    g = real.groupby(["op_id", "iteration"], sort=False)
    op_samples = g.agg(
        calls=("instance", "size"), gpu_time_ns=("gpu_time", "sum"), cpu_time_ns=("cpu_time", "sum")
    ).reset_index()
    op_samples["iteration"] = op_samples["iteration"].astype(np.int64)
    op_samples = op_samples[list(OP_SAMPLE_COLUMNS)]

    ops = analysis.ops.rename(
        columns={"tc_utilization_pct": "tc_utilization", "flop_efficiency_pct": "flop_efficiency"}
    )
    ops = ops.reindex(columns=list(OP_COLUMNS))
    k = analysis.kernels
    kernels = pd.DataFrame(
        {
            "op_id": k["op_id"],
            "op_name": k["op_name"],
            "kernel_name": k["name"],
            "calls": k["calls"],
            "gpu_time_total": k["gpu_time_total"],
            "uses_tc": k["uses_tc"] if "uses_tc" in k else pd.Series(pd.NA, index=k.index),
        }
    )
    return TestRecord(nodeid, metric, samples, op_samples, ops, kernels, dict(meta or {}))
