"""Tolerances as users write them: ``"5%"`` or ``0.05``; and the one home of the two
defaults every verdict is judged with, :data:`TOLERANCE` and :data:`ALPHA`.

One parser for the marker, the pytest options and the CLI, so the three
accept and refuse exactly the same spellings. Standard library only: the plugin's
options and marker import it whenever pytest starts.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: the tolerance when neither the marker nor the session (nor a CLI flag) sets one
TOLERANCE = 0.05
#: significance level of every interval and test (the judge's, the ops', the CLI's default)
ALPHA = 0.01

_PERCENT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*%\s*$")


def parse_tolerance(value: Any, what: str = "tolerance") -> float:
    """``"5%"`` or ``0.05`` → ``0.05``. A bare number ≥ 1 is refused as ambiguous.

    Raises :class:`ValueError` with a one-line reason (callers add the source).
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a percentage like '5%' or a fraction like 0.05")
    if isinstance(value, (int, float)):
        frac = float(value)
        text = repr(value)
    elif isinstance(value, str):
        text = value.strip()
        m = _PERCENT.match(text)
        if m:
            frac = float(m.group(1)) / 100.0
        else:
            try:
                frac = float(text)
            except ValueError:
                raise ValueError(
                    f"{what} {value!r} is not a percentage like '5%' or a fraction like 0.05"
                ) from None
    else:
        raise ValueError(f"{what} must be a percentage like '5%' or a fraction like 0.05")
    if not math.isfinite(frac) or frac < 0:
        raise ValueError(f"{what} {text} must be a finite, non-negative amount")
    if "%" not in text and frac >= 1:
        raise ValueError(
            f"{what} {text} is ambiguous: write a percentage ('{frac:g}%') or a fraction "
            f"below 1 ('{frac / 100:g}')"
        )
    return frac
