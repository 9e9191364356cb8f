"""A measured loop's host instructions, per iteration: the whole and the functions that did it.

From one Callgrind dump of ``iterations`` recorded steps
(:func:`perfguard.trace.callgrind.read_callgrind`):

* the test's figures per iteration: ``instructions`` (Callgrind's ``Ir``) and,
  when the cache simulator ran, ``est_cycles``: L1 hits + 5 x LL hits + 30 x
  RAM hits (the weights of pythonspeed.com's "consistent benchmarking in CI",
  Itamar Turner-Trauring 2020; iai-callgrind uses 35 for RAM), a cost that
  also moves when a change makes the same instructions miss the caches;
* one row per function (:data:`FUNCTION_COLUMNS`), its self and inclusive
  ``Ir`` per iteration, and the aten op it is the dispatcher entry of
  (``at::_ops::<op>::call``: the inclusive cost of that op, nested ops
  included) so a change can be named by op. Python code itself shows as
  the interpreter's functions (``libpython``): Callgrind sees C frames only.

Only the functions that make up :data:`KEEP_SHARE` of the instructions (at
most :data:`KEEP_FUNCTIONS`) and every op entry are kept: the tail is
thousands of functions of a few instructions each.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from importlib.resources import files
from typing import Any, overload

import numpy as np
import pandas as pd

from perfguard.trace.callgrind import CallgrindProfile

#: columns of a record's ``functions`` table, values per recorded iteration
FUNCTION_COLUMNS = ("function", "object", "op", "ir", "ir_inclusive", "est_cycles")
#: the functions kept: the most expensive, covering this share of the self cost
KEEP_SHARE = 0.995
KEEP_FUNCTIONS = 400
#: the weights of the estimated cycles (module docstring)
LL_HIT_CYCLES = 5
RAM_HIT_CYCLES = 30
CACHE_EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")

_OP_ENTRY = re.compile(r"^at::_ops::(\w+)::call\(")
_RECURSION = re.compile(r"'\d+$")


@overload
def estimated_cycles(costs: pd.DataFrame) -> pd.Series: ...
@overload
def estimated_cycles(costs: Mapping[str, int]) -> int: ...


def estimated_cycles(costs: pd.DataFrame | Mapping[str, int]) -> pd.Series | int:
    """L1 hits + 5 x LL hits + 30 x RAM hits from the cache simulator's events: per
    function of a functions table, or of one set of totals."""
    get: Callable[[str], Any] = costs.__getitem__
    ram = get("ILmr") + get("DLmr") + get("DLmw")
    ll_hits = get("I1mr") + get("D1mr") + get("D1mw") - ram
    l1_hits = get("Ir") + get("Dr") + get("Dw") - ll_hits - ram
    return l1_hits + LL_HIT_CYCLES * ll_hits + RAM_HIT_CYCLES * ram


def has_cache_sim(profile: CallgrindProfile) -> bool:
    return all(e in profile.events for e in CACHE_EVENTS)


@lru_cache(maxsize=1)
def _underscored_ops() -> frozenset[str]:
    text = files("perfguard.trace").joinpath("aten_op_names.txt").read_text(encoding="utf-8")
    return frozenset(ln.strip() for ln in text.splitlines() if ln.strip() and ln[0] != "#")


def op_of_struct(struct: str) -> str:
    """``aten::<name>`` of the dispatcher struct ``at::_ops::<name>[_<overload>]``.

    The struct joins name and overload with ``_``; the aten names that contain
    an ``_`` are a known vocabulary, so the longest prefix in it is the name,
    else the part before the first ``_`` (an in-place ``add_`` keeps its ``_``).
    """
    vocab = _underscored_ops()
    if struct in vocab:
        return f"aten::{struct}"
    cut = len(struct)
    while (cut := struct.rfind("_", 0, cut)) > 0:
        if struct[:cut] in vocab:
            return f"aten::{struct[:cut]}"
    head, _, rest = struct.partition("_")
    return f"aten::{head}_" if rest.startswith("_") else f"aten::{head}"


def summarize(profile: CallgrindProfile, iterations: int) -> tuple[dict[str, float], pd.DataFrame]:
    """(the test's figures per iteration, the functions table) of one dump."""
    if iterations < 1:
        raise ValueError(f"{profile.path}: iterations must be >= 1, got {iterations}")
    f = profile.functions
    totals: dict[str, float] = {"instructions": profile.totals.get("Ir", 0) / iterations}
    cache = has_cache_sim(profile)
    if cache:
        totals["est_cycles"] = float(estimated_cycles(profile.totals)) / iterations
    name = f["function"].astype(str).str.replace(_RECURSION, "", regex=True)
    table = pd.DataFrame(
        {
            "function": name,
            "object": f["object"].astype(str).str.rsplit("/", n=1).str[-1],
            "ir": f["Ir"].to_numpy(np.float64),
            "ir_inclusive": f["Ir_inclusive"].to_numpy(np.float64),
            "est_cycles": estimated_cycles(f).to_numpy(np.float64) if cache else np.nan,
        }
    )
    # a function Callgrind split by recursion depth ('2) is one function; its inclusive
    # cost is the outermost level's (the deeper ones are inside it)
    table = table.groupby(["function", "object"], sort=False, as_index=False).agg(
        ir=("ir", "sum"), ir_inclusive=("ir_inclusive", "max"), est_cycles=("est_cycles", "sum")
    )
    if not cache:  # a sum of missing values is 0 to pandas: missing it stays
        table["est_cycles"] = np.nan
    entry = table["function"].str.extract(_OP_ENTRY, expand=False)
    table["op"] = entry.map(lambda s: op_of_struct(s) if isinstance(s, str) else "")
    order = table["ir"].to_numpy().argsort(kind="stable")[::-1]
    table = table.iloc[order].reset_index(drop=True)
    share = table["ir"].cumsum() / max(float(table["ir"].sum()), 1.0)
    keep = (share.shift(fill_value=0.0) < KEEP_SHARE).to_numpy() & (
        np.arange(len(table)) < KEEP_FUNCTIONS
    )
    keep |= (table["op"] != "").to_numpy()
    table = table[keep].reset_index(drop=True)
    for col in ("ir", "ir_inclusive", "est_cycles"):
        table[col] = table[col] / iterations
    return totals, table[list(FUNCTION_COLUMNS)]


def mean_of(
    measurements: list[tuple[dict[str, float], pd.DataFrame]],
) -> tuple[dict[str, float], pd.DataFrame]:
    """One block counted in several heap layouts (:func:`summarize` of each) as their mean:
    the figures averaged, and each function's costs averaged over the layouts (0 where a
    layout's table does not have it)."""
    if not measurements:
        raise ValueError("no measurement to average")
    if len(measurements) == 1:
        return measurements[0]
    n = len(measurements)
    keys = set.intersection(*(set(f) for f, _ in measurements))
    figures = {k: sum(f[k] for f, _ in measurements) / n for k in sorted(keys)}
    both = pd.concat([t for _, t in measurements], ignore_index=True)
    table = both.groupby(["function", "object"], sort=False, as_index=False).agg(
        op=("op", "first"),
        ir=("ir", "sum"),
        ir_inclusive=("ir_inclusive", "sum"),
        est_cycles=("est_cycles", lambda c: c.sum(min_count=1)),
    )
    for col in ("ir", "ir_inclusive", "est_cycles"):
        table[col] = table[col] / n
    order = table["ir"].to_numpy().argsort(kind="stable")[::-1]
    return figures, table.iloc[order].reset_index(drop=True)[list(FUNCTION_COLUMNS)]
