"""The one conversion of a document's values to what JSON can hold.

JSON has no NaN and no infinity: ``json.dumps(..., allow_nan=False)`` (every document
perfguard writes) raises on either, and a reader in another language cannot parse
``NaN``/``Infinity``. The documents' ``to_dict`` (a bisection, a test's profile, a
session's results) go through :func:`finite`, so a figure that could not be computed
reads ``null`` in each alike.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinity as ``None``, through dicts, lists and tuples
    (tuples become lists, as JSON writes them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
