"""What decides a run's performance besides the code: the environment, and how two differ.

A :class:`Environment` is recorded with every run (the plugin probes this machine,
:mod:`perfguard.baseline.probe`) and read from every capture that says it (nsys
``TARGET_INFO_*``, Kineto's header, XSpace device planes). Values are text as a person
reads them (``535.161.08``, ``1980 MHz``, ``700 W``, ``on``); ``""`` means not known, and
an unknown value never differs from anything, so a run probed without ``nvidia-smi`` or a
capture that does not record a field is not called different for it.

Two runs' environments differ in two kinds of fields (:data:`FIELDS`):

* **blocking**: settings of the machine that change every kernel's speed and that the
  code under test does not choose: the driver's branch (a new branch brings a new CUDA
  driver and PTX JIT), the GPU clocks (application and maximum SM/memory clocks), the
  enforced power limit (it caps the clocks under load), ECC (it costs memory bandwidth)
  and MIG (a MIG instance has a fraction of the GPU), and the container's CPU quota (it
  throttles the host thread that launches the work). A difference makes the runs
  ``incomparable`` unless the user compares across that group
  (``--perfguard-compare-across driver``: :data:`GROUPS`);
* **reported**: everything else: library versions a project installs itself (CUDA
  runtime, cuDNN, cuBLAS, NCCL, the frameworks): changing them is a change a pull
  request should be judged on, not excused from; a driver patch release within its
  branch; persistence mode (start-up latency only); git, the CPU model (the fingerprint
  already separates CPU-only machines by it), the CPU governor and SMT (a slower machine
  is caught by the reference workload, ``capture/speed.py``), perfguard's version. They
  are listed with the verdict ("cuDNN 9.1.0 → 9.3.0 since the baseline").

Standard library only: the trace readers, the store and ``results.json`` all use it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = [
    "ALL",
    "FIELDS",
    "GROUPS",
    "Environment",
    "EnvironmentChange",
    "EnvironmentField",
    "incompatibility",
    "machine_key",
    "parse_across",
]

#: the option that compares across a blocking group, as each client spells it
PYTEST_OPTION = "--perfguard-compare-across"
CLI_OPTION = "--compare-across"
#: ``--perfguard-compare-across all``: every blocking group
ALL = "all"


@dataclass(frozen=True)
class Environment:
    """The environment of one run or capture (module docstring); ``""``: not known."""

    driver: str = ""  #: NVIDIA driver version, e.g. 535.161.08
    driver_cuda: str = ""  #: the CUDA version the driver supports (nvidia-smi, cuDriverGetVersion)
    app_sm_clock: str = ""  #: application clock of the SMs (graphics clock), e.g. 1980 MHz
    app_mem_clock: str = ""  #: application memory clock
    max_sm_clock: str = ""  #: the GPU's maximum SM clock
    max_mem_clock: str = ""  #: the GPU's maximum memory clock
    power_limit: str = ""  #: the enforced power limit, e.g. 700 W
    ecc: str = ""  #: on | off
    mig: str = ""  #: on | off
    persistence: str = ""  #: persistence mode, on | off
    cuda_runtime: str = ""  #: the CUDA runtime the framework uses
    cudnn: str = ""
    cublas: str = ""
    nccl: str = ""
    torch: str = ""
    tensorflow: str = ""
    jax: str = ""
    git: str = ""  #: git's own version
    cpu: str = ""  #: CPU model
    governor: str = ""  #: CPU frequency governor(s), e.g. performance
    smt: str = ""  #: simultaneous multithreading, on | off
    cpu_quota: str = ""  #: the container's CPU quota, e.g. 2 CPUs, or none
    perfguard: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):  # one spelling of "unknown", one line each
            value = getattr(self, f.name)
            text = "" if value is None else " ".join(str(value).split())
            if text != value:
                object.__setattr__(self, f.name, text)

    @property
    def empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))

    def filled_from(self, *others: Environment) -> Environment:
        """These values, each unknown one taken from the first of ``others`` that knows it."""
        known = {}
        for f in fields(self):
            if not getattr(self, f.name):
                found = next((getattr(o, f.name) for o in others if getattr(o, f.name)), "")
                if found:
                    known[f.name] = found
        return replace(self, **known) if known else self

    def changes_since(
        self, baseline: Environment, across: Iterable[str] = ()
    ) -> tuple[EnvironmentChange, ...]:
        """Every field known on both sides that differs, baseline → this, in
        :data:`FIELDS` order; ``across``: the blocking groups compared across anyway."""
        groups = _groups(across)
        out = []
        for spec in FIELDS:
            before, after = getattr(baseline, spec.name), getattr(self, spec.name)
            if not before or not after or before == after:
                continue
            blocks = spec.group is not None and spec.key(before) != spec.key(after)
            out.append(
                EnvironmentChange(
                    field=spec.name,
                    label=spec.label,
                    before=before,
                    after=after,
                    blocking=blocks and spec.group not in groups,
                    across=spec.group if blocks and spec.group in groups else "",
                )
            )
        return tuple(out)

    def to_dict(self) -> dict[str, str]:
        """The known fields only (an older run's empty environment is ``{}``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @classmethod
    def from_dict(cls, data: Any) -> Environment:
        """From :meth:`to_dict` (unknown keys, as a newer perfguard may write, are skipped)."""
        if not isinstance(data, dict):
            return cls()
        names = {f.name for f in fields(cls)}
        return cls(**{k: str(v) for k, v in data.items() if k in names and v is not None})


@dataclass(frozen=True)
class EnvironmentChange:
    """One field that differs from the baseline's. ``blocking``: it makes the runs
    incomparable; ``across``: it would have, but its group was compared across."""

    field: str
    label: str
    before: str
    after: str
    blocking: bool = False
    across: str = ""

    @property
    def text(self) -> str:
        said = f"{self.label} {self.before} → {self.after}"
        return f"{said} (compared across {self.across})" if self.across else said

    def to_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "label": self.label,
            "before": self.before,
            "after": self.after,
            "blocking": self.blocking,
            "across": self.across,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnvironmentChange:
        return cls(
            field=str(d.get("field") or ""),
            label=str(d.get("label") or d.get("field") or ""),
            before=str(d.get("before") or ""),
            after=str(d.get("after") or ""),
            blocking=bool(d.get("blocking")),
            across=str(d.get("across") or ""),
        )


def _same(value: str) -> str:
    return value


def _branch(version: str) -> str:
    """A driver's branch: its major number (535 of 535.161.08); the whole text otherwise."""
    m = re.match(r"\s*(\d+)", version)
    return m.group(1) if m else version


@dataclass(frozen=True)
class EnvironmentField:
    """How one field is named, and which override group makes its difference blocking
    (None: reported only); ``key``: what must differ to block (a driver's branch)."""

    name: str
    label: str
    group: str | None = None
    key: Callable[[str], str] = _same


#: every field, in the order changes are listed (blocking groups first)
FIELDS: tuple[EnvironmentField, ...] = (
    EnvironmentField("driver", "driver", "driver", _branch),
    EnvironmentField("driver_cuda", "driver CUDA", "driver"),
    EnvironmentField("app_sm_clock", "application SM clock", "clocks"),
    EnvironmentField("app_mem_clock", "application memory clock", "clocks"),
    EnvironmentField("max_sm_clock", "max SM clock", "clocks"),
    EnvironmentField("max_mem_clock", "max memory clock", "clocks"),
    EnvironmentField("power_limit", "power limit", "power_limit"),
    EnvironmentField("ecc", "ECC", "ecc"),
    EnvironmentField("mig", "MIG", "mig"),
    EnvironmentField("cpu_quota", "CPU quota", "cpu_quota"),
    EnvironmentField("cuda_runtime", "CUDA runtime"),
    EnvironmentField("cudnn", "cuDNN"),
    EnvironmentField("cublas", "cuBLAS"),
    EnvironmentField("nccl", "NCCL"),
    EnvironmentField("torch", "torch"),
    EnvironmentField("tensorflow", "TensorFlow"),
    EnvironmentField("jax", "JAX"),
    EnvironmentField("persistence", "persistence mode"),
    EnvironmentField("cpu", "CPU"),
    EnvironmentField("governor", "CPU governor"),
    EnvironmentField("smt", "SMT"),
    EnvironmentField("git", "git"),
    EnvironmentField("perfguard", "perfguard"),
)
#: the groups a difference blocks in, the names ``--perfguard-compare-across`` takes
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(f.group for f in FIELDS if f.group))


def _groups(across: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(across)
    return frozenset(GROUPS) if ALL in chosen else chosen


def parse_across(values: Iterable[str]) -> frozenset[str]:
    """The groups of ``--perfguard-compare-across`` values (repeated, or comma lists);
    ValueError naming the valid ones for any other name."""
    chosen = {part.strip() for v in values for part in str(v).split(",") if part.strip()}
    unknown = sorted(chosen - {*GROUPS, ALL})
    if unknown:
        raise ValueError(
            f"cannot compare across {', '.join(unknown)}: the groups are "
            f"{', '.join(GROUPS)} (or {ALL})"
        )
    return frozenset(chosen)


def incompatibility(changes: Iterable[EnvironmentChange]) -> str | None:
    """Why runs with these changes are incomparable (the blocking ones, before → after, and
    how to compare across them), or None when none blocks."""
    blocking = [c for c in changes if c.blocking]
    if not blocking:
        return None
    groups = ",".join(
        dict.fromkeys(g.group for c in blocking for g in FIELDS if g.name == c.field and g.group)
    )
    said = "; ".join(c.text for c in blocking)
    return (
        f"environment differs from the baseline's: {said}; to compare anyway: "
        f"{PYTEST_OPTION} {groups} (perfguard compare: {CLI_OPTION} {groups})"
    )


def machine_key(fp: Mapping[str, Any]) -> tuple[str, str]:
    """(key, label) of the machine kind a run's fingerprint describes: what must match for two
    runs' timings to be compared (GPU model and count, backend, CPU model without a GPU,
    and the test processes measuring at once), as ``Fingerprint.incompatibility`` and
    ``timing_incompatibility`` decide."""
    gpu, count = str(fp.get("gpu_name") or ""), int(fp.get("gpu_count") or 0)
    backend, cpu = str(fp.get("backend") or "?"), "" if gpu else str(fp.get("cpu") or "")
    workers = int(fp.get("workers") or 1)
    key = json.dumps([gpu, count, backend, cpu, workers])
    what = (f"{count}x {gpu}" if count > 1 else gpu) if gpu else f"CPU {cpu}".strip()
    label = f"{what} [{backend}]" + (f", {workers} workers" if workers > 1 else "")
    return key, label
