"""Every figure a reader sees, written one way: the one formatting module of the terminal,
``summary.md``, the HTML reports, the published site, the charts' axes, ``history``,
``bisect`` and the CLI.

- durations (ns in): ``812 ns``, ``6.49 ms``, ``1.5 s`` (:func:`format_ns`);
- counters: integers as integers (``1,824``), FLOPs and bytes with SI prefixes
  (``757 MFLOP``, ``6.11 MB``), host instructions to four digits (:func:`human`); a
  change of one (:func:`signed`: ``+12 kB``, never ``+1.229e+04``);
- percentages with no space before the sign (``+1.2%``, :func:`percent`) and intervals
  (``[+1.2%, +3.4%]``, :func:`interval`);
- p-values as decimals, the smallest as ``< 0.001`` (:func:`p_value`: never ``1e-5``);
- axis ticks: round values whose labels share a unit and differ (:func:`axis`).

No number leaves it in exponent notation. Standard library only: the gates' messages and
the explanation use it.
"""

from __future__ import annotations

import math
from typing import Any

#: the unit of each counter that has one (the rest are counts)
_UNITS = {"flops": "FLOP", "bytes": "B", "memcpy_bytes": "B", "peak_memory": "B"}
#: counts in the millions whose gate is a fraction of a percent: four digits, a word
_FINE = {"instructions": "instr", "est_cycles": "cycles"}
#: SI prefixes of counters with a unit, and of durations (ns in)
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_TIME = ((1e9, "s"), (1e6, "ms"), (1e3, "us"))
#: the smallest p-value written as a number; below it, ``< 0.001``
P_FLOOR = 1e-3


def _missing(value: Any) -> bool:
    """No number to write: None, a flag, NaN, infinity, pandas' NA, or not a number."""
    if value is None or isinstance(value, bool):
        return True
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def _sig(v: float, digits: int) -> str:
    """``v`` to ``digits`` significant digits, never in exponent notation."""
    text = f"{v:.{digits}g}"
    if "e" not in text:
        return text
    if abs(v) >= 1:  # a whole number past the digits: all of it
        return f"{v:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(v)))
    return f"{v:.{decimals}f}".rstrip("0").rstrip(".")


def _scaled(v: float, scales: tuple[tuple[float, str], ...], digits: int) -> tuple[str, str]:
    """``v`` in the largest of ``scales`` (descending; ``(1.0, "")`` implied) it reaches,
    to ``digits`` significant digits: (number, prefix). A value that rounds up to 1,000 of
    one scale is written in the next (``1 MB``, never ``1e+03 kB``); past the largest, whole
    (``1,500 s``)."""
    bigger: tuple[float, str] | None = None
    for scale, prefix in (*scales, (1.0, "")):
        if abs(v) >= scale or scale == 1.0:
            text = _sig(v / scale, digits)
            if abs(float(text.replace(",", ""))) >= 1000:  # rounded up, or past the last
                if bigger is None:
                    return f"{v / scale:,.0f}", prefix
                return _sig(v / bigger[0], digits), bigger[1]
            return text, prefix
        bigger = (scale, prefix)
    raise AssertionError("unreachable")


def human(value: Any, counter: str = "") -> str:
    """A counter's value as a reader wants it: integers as integers, FLOPs and bytes with
    SI prefixes (``757 MFLOP``, ``6.11 MB``)."""
    if isinstance(value, str | bool):  # a dtype, a kernel name, a yes/no gate's state
        return str(value)
    if _missing(value):
        return "n/a"
    v = float(value)
    if counter in _FINE:
        num, prefix = _scaled(v, _SI[1:], 4)
        return f"{num} {prefix} {_FINE[counter]}" if prefix else f"{num} {_FINE[counter]}"
    unit = _UNITS.get(counter, "")
    if unit:
        num, prefix = _scaled(v, _SI, 3)
        return f"{num} {prefix}{unit}"
    return count(v)


def count(value: Any) -> str:
    """A plain count: an integer with thousands separators (``3,538,944``, never
    ``3538944.0``), else three significant digits (``3.5``, ``0.25``)."""
    if _missing(value):
        return "n/a"
    v = float(value)
    if v == int(v):
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else _sig(v, 3)


def signed(value: Any, counter: str = "") -> str:
    """A change of a counter (or of a duration, ``counter="ns"``), its sign always
    written: ``+12.3 kB``, ``-40``, ``+1.2 ms``."""
    if _missing(value):
        return "n/a"
    v = float(value)
    text = format_ns(abs(v)) if counter == "ns" else human(abs(v), counter)
    return ("-" if v < 0 else "+") + text


def format_ns(v: Any) -> str:
    """A duration given in ns, in the unit that keeps it readable: ``6.49 ms``."""
    if _missing(v):
        return "n/a"
    num, unit = _scaled(float(v), _TIME, 3)
    return f"{num} {unit or 'ns'}"


duration = format_ns


def seconds(s: Any, unit: bool = True) -> str:
    """A wall time of perfguard's own, in seconds to the hundredth (``0.35 s``; without the
    unit in a list that says it once): its cost lines sum and compare such figures, which
    one unit keeps readable."""
    return "n/a" if _missing(s) else f"{float(s):,.2f}" + (" s" if unit else "")


def percent(value: Any, signed: bool = False, digits: int | None = 1) -> str:
    """A percentage, ``digits`` decimals (None: as few as it needs, for a setting such as a
    tolerance: ``5%``, ``2.5%``), no space before the sign: ``+1.2%``, ``45.0%``; ``n/a``
    when missing."""
    if _missing(value):
        return "n/a"
    v = float(value)
    if digits is None:
        text = _sig(v, 3)
        return f"{'+' if signed and v >= 0 else ''}{text}%"
    v = 0.0 if round(v, digits) == 0 else v  # never "-0.0%"
    return f"{v:+,.{digits}f}%" if signed else f"{v:,.{digits}f}%"


def interval(lo: Any, hi: Any, digits: int = 1) -> str:
    """An interval of signed percentages: ``[+1.2%, +3.4%]``; ``n/a`` when either end is
    missing."""
    if _missing(lo) or _missing(hi):
        return "n/a"
    return f"[{percent(lo, True, digits)}, {percent(hi, True, digits)}]"


def p_value(p: Any) -> str:
    """A p-value as a decimal: two significant digits (``0.034``), ``< 0.001`` below
    :data:`P_FLOOR`; ``n/a`` when missing."""
    if _missing(p):
        return "n/a"
    v = float(p)
    return f"< {P_FLOOR:g}" if v < P_FLOOR else _sig(v, 2)


def rate(value: Any, counter: str = "flops") -> str:
    """A per-second rate of ``counter`` (``12.4 GFLOP/s``, ``3.1 GB/s``)."""
    text = human(value, counter)
    return text if text == "n/a" else f"{text}/s"


def ratio(value: Any) -> str:
    """A factor: ``2.5x``."""
    return "n/a" if _missing(value) else f"{_sig(float(value), 3)}x"


def figure(value: Any, kind: str = "") -> str:
    """A value of a quantity ``kind``: ``"ns"`` a duration, ``"%"`` a percentage, else a
    counter's (:func:`human`; ``""``: a plain count). What a column or an axis of values
    of one kind is written with."""
    if kind == "ns":
        return format_ns(value)
    if kind == "%":
        return percent(value)
    return human(value, kind)


def nice_ticks(lo: float, hi: float, most: int = 5) -> list[float]:
    """At most ``most`` round values (1, 2, 2.5 or 5 times a power of ten apart) in [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(most - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * power
        first = math.ceil(lo / step - 1e-9) * step
        ticks = [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]
        if len(ticks) <= most:
            return [round(t, 12) for t in ticks]
    return [lo, hi]


def axis(values: list[float], kind: str = "", log: bool = False) -> list[str]:
    """Labels of an axis' ticks ``values`` of a quantity ``kind`` (``"ns"`` for a duration,
    a counter name, ``"%"``, or ``""`` for a plain number): one unit for the whole axis
    (the largest tick's), and the fewest decimals that tell every tick apart, so an axis
    never reads ``3.44e+03, 3,435`` or ``67.4 MB`` five times. ``log``: ticks a decade or
    so apart, each in its own unit (:func:`figure`)."""
    ticks = [float(v) for v in values]
    if not ticks:
        return []
    if log:
        return [figure(t, kind) for t in ticks]
    top = max(abs(t) for t in ticks)
    scale, suffix = 1.0, ""
    if kind == "ns":
        scale, suffix = next(((s, f" {u}") for s, u in _TIME if top >= s), (1.0, " ns"))
    elif kind == "%":
        suffix = "%"
    elif kind in _FINE:
        scale, prefix = next(((s, p) for s, p in _SI[1:] if top >= s), (1.0, ""))
        suffix = f" {prefix} {_FINE[kind]}" if prefix else f" {_FINE[kind]}"
    elif kind in _UNITS:
        scale, prefix = next(((s, p) for s, p in _SI if top >= s), (1.0, ""))
        suffix = f" {prefix}{_UNITS[kind]}"
    for decimals in range(0, 7):
        labels = [f"{t / scale:,.{decimals}f}" for t in ticks]
        if len(set(labels)) == len(labels) and all(
            abs(float(lab.replace(",", "")) * scale - t) <= 1e-9 * max(top, 1.0) or decimals == 6
            for lab, t in zip(labels, ticks, strict=True)
        ):
            break
    return [("0" if float(lab.replace(",", "")) == 0 else lab) + suffix for lab in labels]
