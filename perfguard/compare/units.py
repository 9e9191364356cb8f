"""Counters and times as a reader wants them, one rule for every view: integers as integers,
FLOPs and bytes with SI prefixes (``757 MFLOP``, ``6.11 MB``), times in s/ms/us/ns.

Standard library only: the gates' messages and the explanation use it.
"""

from __future__ import annotations

import math
from typing import Any

#: the unit of each counter that has one (the rest are counts)
_UNITS = {"flops": "FLOP", "bytes": "B", "memcpy_bytes": "B", "peak_memory": "B"}
#: counts in the millions whose gate is a fraction of a percent: four digits, a word
_FINE = {"instructions": "instr", "est_cycles": "cycles"}


def human(value: Any, counter: str = "") -> str:
    """A counter's value as a reader wants it: integers as integers, FLOPs and bytes with
    SI prefixes (``757 MFLOP``, ``6.11 MB``)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, str | bool):  # a dtype, a kernel name, a yes/no gate's state
        return str(value)
    v = float(value)
    if counter in _FINE:
        for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= scale:
                return f"{v / scale:.4g} {prefix} {_FINE[counter]}"
        return f"{v:.4g} {_FINE[counter]}"
    unit = _UNITS.get(counter, "")
    if unit:
        for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= scale:
                return f"{v / scale:.3g} {prefix}{unit}"
        return f"{v:.3g} {unit}"
    if v == int(v):
        return f"{int(v):,}"
    return f"{v:.3g}"


def format_ns(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    a = abs(float(v))
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if a >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} ns"
