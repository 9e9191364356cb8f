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


def _scaled(v: float, scales: tuple[tuple[float, str], ...], digits: int) -> tuple[str, str]:
    """``v`` in the largest of ``scales`` (descending; ``(1.0, "")`` implied) it reaches,
    to ``digits`` significant digits: (number, prefix). A value that rounds up to 1,000 of
    one scale is written in the next (``1 MB``, never ``1e+03 kB``); past the largest, whole
    (``1,500 s``)."""
    bigger: tuple[float, str] | None = None
    for scale, prefix in (*scales, (1.0, "")):
        if abs(v) >= scale or scale == 1.0:
            text = f"{v / scale:.{digits}g}"
            if abs(float(text)) >= 1000:  # rounded up to the next scale, or past the last
                if bigger is None:
                    return f"{v / scale:,.0f}", prefix
                return f"{v / bigger[0]:.{digits}g}", bigger[1]
            return text, prefix
        bigger = (scale, prefix)
    raise AssertionError("unreachable")


def human(value: Any, counter: str = "") -> str:
    """A counter's value as a reader wants it: integers as integers, FLOPs and bytes with
    SI prefixes (``757 MFLOP``, ``6.11 MB``)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, str | bool):  # a dtype, a kernel name, a yes/no gate's state
        return str(value)
    v = float(value)
    if counter in _FINE:
        num, prefix = _scaled(v, ((1e9, "G"), (1e6, "M"), (1e3, "k")), 4)
        return f"{num} {prefix} {_FINE[counter]}" if prefix else f"{num} {_FINE[counter]}"
    unit = _UNITS.get(counter, "")
    if unit:
        num, prefix = _scaled(v, ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")), 3)
        return f"{num} {prefix}{unit}"
    if v == int(v):
        return f"{int(v):,}"
    return f"{v:.3g}"


def format_ns(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    num, unit = _scaled(float(v), ((1e9, "s"), (1e6, "ms"), (1e3, "us")), 3)
    return f"{num} {unit or 'ns'}"


def percent(value: Any, signed: bool = False, digits: int = 1) -> str:
    """A percentage, ``digits`` decimals, no space before the sign: ``+1.2%``, ``45.0%``;
    ``n/a`` when missing."""
    if value is None or isinstance(value, bool):
        return "n/a"
    v = float(value)
    if not math.isfinite(v):
        return "n/a"
    return f"{v:+.{digits}f}%" if signed else f"{v:.{digits}f}%"


def rate(value: Any, counter: str = "flops") -> str:
    """A per-second rate of ``counter`` (``12.4 GFLOP/s``, ``3.1 GB/s``)."""
    text = human(value, counter)
    return text if text == "n/a" else f"{text}/s"
