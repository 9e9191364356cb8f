"""One identity for a TensorFlow op across sessions: its node name without the numbers that
only say how often a scope was entered.

Keras and TensorFlow make every name scope and node name of a graph unique by appending
``_<n>``: a model built or called a second time runs under ``sequential_1``, then
``sequential_2``; a Dense layer called again under ``dense_1``; a layer named ``dense_1`` by
Keras (the second Dense of the process) entered twice becomes ``dense_1_1``; the second
``MatMul`` of one scope is ``MatMul_1``. Those numbers depend on what ran before in the process
(another model built first, the model called three times in a step instead of once), so the
same layer's ops are new names from one session or call to the next, and a comparison keyed on
names saw ``sequential_5/dense_1_2/BiasAdd added`` where the same op ran three times as often.

:func:`op_identities` strips every trailing ``_<n>`` group of each ``/``-separated component
(``sequential_5/dense_1_2/BiasAdd`` -> ``sequential/dense/BiasAdd``), so ops that differ only in
those numbers are one op and their calls add up, as a PyTorch op called three times in one
module is one op with three calls. Digits that are part of a name stay: ``conv2d``, ``Conv2D``,
``h0``, ``x2`` (only ``_<n>`` groups at a component's end go). The cost: two layers Keras named
``dense`` and ``dense_1`` (two Dense layers of one model) are one op, ``sequential/dense/MatMul``
with two calls per step. Keras' own name for the second layer and TensorFlow's uniquified name
of the first one entered again are the same text (``dense_1``), so no rule on one name can keep
them apart; a user who wants them apart names the layers (``Dense(4, name="head")``).

User numbering is kept: neither Keras nor TensorFlow ever appends ``_0``, so a capture with a
component ``<base>_0`` (``block_0``, ``h_0``) numbers ``<base>`` itself, and for that base the
first number stays (``block_0``, ``block_1``, ``block_1_1`` -> ``block_1``). That is decided
over the names of one capture, which the same model gives alike in every session.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pandas as pd

from perfguard.arrays import per_distinct

__all__ = ["identity_of", "op_identities"]

#: a scope component with its uniquifying suffix: ``dense_1_2`` -> ``dense``, ``_1_2``
_SUFFIXED = re.compile(r"^(?P<base>.+?)(?P<nums>(?:_\d+)+)$")


def op_identities(names: pd.Series) -> pd.Series:
    """Each TF node name's identity (module docstring), aligned with ``names``; NA stays NA.
    Worked out once per distinct name."""
    distinct = pd.Series(names.dropna().unique(), dtype=object)
    numbered = _user_numbered(distinct.astype(str))

    def rule(u: pd.Series) -> pd.Series:
        return pd.Series(
            [_identity(v, numbered) if isinstance(v, str) else v for v in u], dtype=object
        )

    return per_distinct(names.astype(object), rule)


def identity_of(name: str) -> str:
    """One name's identity with every uniquifying ``_<n>`` gone (no user numbering kept:
    what a lookup of one name against another graph's can know)."""
    return _identity(name, frozenset())


def _user_numbered(names: Iterable[str]) -> frozenset[str]:
    """The bases that some component numbers from zero (``block`` of ``block_0``)."""
    found = set()
    for name in names:
        for part in name.split("/"):
            m = _SUFFIXED.match(part)
            if m and m["nums"].split("_")[1] == "0":
                found.add(m["base"])
    return frozenset(found)


def _identity(name: str, numbered: frozenset[str]) -> str:
    parts = []
    for part in name.split("/"):
        m = _SUFFIXED.match(part)
        if m is None:
            parts.append(part)
        elif m["base"] in numbered:
            parts.append(f"{m['base']}_{m['nums'].split('_')[1]}")
        else:
            parts.append(m["base"])
    return "/".join(parts)
