"""``nvidia-smi -q``: the driver and each GPU's settings, read once per session.

One call gives everything the environment needs (driver and its CUDA version; per GPU
the name, persistence, MIG and ECC mode, the enforced power limit, the application and
maximum clocks), where ``--query-gpu`` has no CUDA version. The human-readable report is
read, not ``-x``: it is the format people paste and tools such as gpud parse, and this
module is tested on real reports of H100 and TITAN V machines (``tests/data/nvidia_smi``).
Its labels moved between drivers (``Power Readings`` → ``GPU Power Readings``, ``Enforced
Power Limit`` → ``Current Power Limit``), so each value is looked up under each spelling.

Nothing here may fail a run: a missing, hung or failing ``nvidia-smi`` gives None.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, fields

from perfguard.environment import Environment

__all__ = ["NVIDIA_SMI_TIMEOUT_S", "SmiGpu", "SmiReport", "parse_report", "query"]

#: a hung driver must not hang the session
NVIDIA_SMI_TIMEOUT_S = 10.0

#: ``Key   : value``; section headers have no `` : `` (``GPU 00000000:19:00.0``, ``MIG Mode``)
_LINE = re.compile(r"^(?P<indent> *)(?P<key>\S.*?)\s+:\s?(?P<value>.*)$")
#: where each setting is, under every spelling seen (first found wins)
_PATHS: dict[str, tuple[str, ...]] = {
    "name": ("Product Name",),
    "persistence": ("Persistence Mode",),
    "mig": ("MIG Mode/Current",),
    "ecc": ("ECC Mode/Current",),
    "power_limit": (
        "GPU Power Readings/Current Power Limit",
        "Power Readings/Enforced Power Limit",
        "Power Readings/Power Limit",
    ),
    "app_sm_clock": ("Applications Clocks/Graphics",),
    "app_mem_clock": ("Applications Clocks/Memory",),
    "max_sm_clock": ("Max Clocks/SM",),
    "max_mem_clock": ("Max Clocks/Memory",),
}


@dataclass(frozen=True)
class SmiGpu:
    """One GPU's settings as the report says them (``""``: not reported, or N/A)."""

    name: str = ""
    persistence: str = ""
    mig: str = ""
    ecc: str = ""
    power_limit: str = ""
    app_sm_clock: str = ""
    app_mem_clock: str = ""
    max_sm_clock: str = ""
    max_mem_clock: str = ""


@dataclass(frozen=True)
class SmiReport:
    """A whole report: the driver and its CUDA version, and the GPUs in report order."""

    driver: str = ""
    cuda: str = ""
    gpus: tuple[SmiGpu, ...] = ()

    @property
    def gpu_names(self) -> list[str]:
        return [g.name for g in self.gpus if g.name]

    def environment(self) -> Environment:
        """The driver and the GPUs' settings; a setting the GPUs differ in is their distinct
        values in report order (``1980 MHz, 1410 MHz``)."""
        settings = {
            f.name: ", ".join(dict.fromkeys(v for g in self.gpus if (v := getattr(g, f.name))))
            for f in fields(SmiGpu)
            if f.name != "name"
        }
        return Environment(driver=self.driver, driver_cuda=self.cuda, **settings)


def _value(text: str) -> str:
    """A setting in one spelling: N/A is unknown, Enabled/Disabled are on/off, a trailing
    ``.00`` of a power figure is dropped (``700.00 W`` → ``700 W``)."""
    text = " ".join(text.split())
    if text in ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error"):
        return ""
    if text in ("Enabled", "Disabled"):
        return "on" if text == "Enabled" else "off"
    return re.sub(r"^(\d+)\.0+ W$", r"\1 W", text)


def _sections(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The header's keys, and each GPU's keys as ``Section/Key`` paths."""
    header: dict[str, str] = {}
    gpus: list[dict[str, str]] = []
    stack: list[tuple[int, str]] = []  # (indent, section) of the open sections
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0 and line.startswith("GPU ") and " : " not in line:
            gpus.append({})
            stack = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = _LINE.match(line)
        if m is None:  # a section header
            stack.append((indent, line.strip()))
            continue
        path = "/".join([s for _, s in stack] + [m["key"].strip()])
        target = gpus[-1] if gpus and indent > 0 else header
        target.setdefault(path, m["value"])
    return header, gpus


def parse_report(text: str) -> SmiReport:
    """A :class:`SmiReport` of ``nvidia-smi -q`` output (an unreadable one: empty)."""
    header, sections = _sections(text)
    gpus = []
    for keys in sections:
        found = {
            name: _value(next((keys[p] for p in paths if p in keys), ""))
            for name, paths in _PATHS.items()
        }
        gpus.append(SmiGpu(**found))
    return SmiReport(
        driver=_value(header.get("Driver Version", "")),
        cuda=_value(header.get("CUDA Version", "")),
        gpus=tuple(gpus),
    )


def query(timeout: float = NVIDIA_SMI_TIMEOUT_S) -> SmiReport | None:
    """This machine's report, or None (no ``nvidia-smi``, it failed, or it hung)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "-q"], capture_output=True, text=True, timeout=timeout, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return None
    report = parse_report(out)
    return report if report.driver or report.gpus else None
