"""Argument types shared by the subcommands: each refuses bad text with a reason
argparse prints on one line."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from perfguard.compare.tolerance import parse_tolerance


def integer(minimum: int, what: str = "an integer") -> Callable[[str], int]:
    """An int ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def days(text: str) -> float:
    """A finite number of days >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def tolerance(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05, as the marker and the pytest option spell it."""
    try:
        return parse_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def alpha(text: str) -> float:
    """A significance level in (0, 0.5)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability, got {text!r}") from None
    if not 0.0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"must be in (0, 0.5), got {text}")
    return value
