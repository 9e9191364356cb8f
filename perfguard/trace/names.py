"""Range-name parsing shared by the readers.

PyTorch's ``emit_nvtx`` / ``nsys --pytorch=autograd-nvtx`` ranges look like
``aten::mul, seq = 46174, op_id = 993406`` (backward ops say ``stashed
seq``; ``autograd-shapes-nvtx`` appends ``sizes = [[...]]``). The suffix
changes on every call, so it is split off into columns, otherwise every call
would be an op of its own. Work is done once per *distinct* name.

``perfguard.instrument`` writes its own suffix (grammar in
``perfguard/capture/instrument.py``)::

    /Net/fc1/aten::addmm, sizes = [[8],[4,16],[16,8],[],[]], dtypes = ["float",...],
    dir = fprop, site = train.py:42

recognised by its ``dir = fprop|bprop`` field; ``%2C``/``%25`` in the name
and site and ``,\\u0020`` in the JSON fields are undone, so the columns read
like the Kineto reader's (compact JSON, the same dtype spellings).

PyProf's and DLProf's dict-valued markers (``{'mod': ..., 'op': ...,
'args': [...]}``, ``{'traceMarker': [...]}``) are parsed by
:mod:`perfguard.trace.pyprof`, once per distinct name like the rest.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from perfguard.arrays import per_distinct
from perfguard.trace.pyprof import PYTHON_OP, parse_markers, python_op

_SUFFIX = re.compile(r",\s*(?:stashed seq|seq|op_id|sizes|input_op_ids)\s*=\s*.*$", flags=re.DOTALL)
_SEQ = re.compile(r",\s*(stashed )?seq\s*=\s*(\d+)")
_SIZES = re.compile(r",\s*sizes\s*=\s*(\[.*?\])(?:,\s*\w+\s*=|$)", flags=re.DOTALL)

# perfguard.instrument messages: ", " appears only between fields (see the module docstring)
_PG_JSON = r"\[(?:[^,]|,(?! ))*\]"
_PERFGUARD = re.compile(
    r"^(?P<name>[^,]*)"
    rf"(?:, sizes = (?P<sizes>{_PG_JSON}))?"
    rf"(?:, dtypes = (?P<dtypes>{_PG_JSON}))?"
    rf"(?:, concrete = (?P<concrete>{_PG_JSON}))?"
    r", dir = (?P<dir>fprop|bprop)"
    r"(?:, site = (?P<site>[^,]*))?$"
)

_REPEAT = re.compile(r"\(\d+\)$")

#: Ranges with these names mark iterations; they never own kernels as ops.
ITERATION_NAMES = ("perfguard.iteration",)
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def parse_range_names(names: pd.Series) -> pd.DataFrame:
    """Split framework suffixes off range names.

    Input: a Series of raw names. Output (same index): ``name`` (base name),
    ``seq`` (Int64), ``bprop`` (bool: a ``stashed seq``, an autograd backward
    name, or ``dir = bprop``), ``input_shapes``, ``dtypes``,
    ``concrete_inputs`` (JSON text) and ``call_site`` (missing: NA).
    The last three only come from ``perfguard.instrument`` messages.
    """
    codes, uniques = pd.factorize(names.fillna(""), sort=False)
    u = pd.Series(uniques, dtype="object")
    base = u.str.replace(_SUFFIX, "", regex=True).str.strip()
    seq_m = u.str.extract(_SEQ)
    seq = pd.to_numeric(seq_m[1], errors="coerce").astype("Int64")
    stashed = seq_m[0].notna()
    shapes = u.str.extract(_SIZES)[0]
    bprop = stashed | is_backward_name(base)
    pg = u.str.extract(_PERFGUARD)
    ours = pg["dir"].notna()
    if ours.any():
        base = base.where(~ours, _unescape(pg["name"]))
        shapes = shapes.where(~ours, pg["sizes"])
        bprop = bprop.where(~ours, pg["dir"] == "bprop")
    dtypes, concrete = (_unescape_json(pg[c]) for c in ("dtypes", "concrete"))
    site = _unescape(pg["site"])
    pyprof = parse_markers(u)
    marker = pyprof["marker"].notna()
    if marker.any():  # PyProf/DLProf markers: their own fields, no autograd suffix
        base = base.where(~marker, pyprof["name"])
        seq = seq.mask(marker)  # NA (Int64)
        bprop = bprop & ~marker
        shapes = shapes.where(~marker, pyprof["input_shapes"])
        dtypes = dtypes.where(~marker, pyprof["dtypes"])
        concrete = concrete.where(~marker, pyprof["concrete_inputs"])
        site = site.where(~marker, pyprof["call_site"])
    take = np.asarray(codes)
    return pd.DataFrame(
        {
            "name": base.to_numpy(dtype=object)[take],
            "seq": seq.to_numpy()[take],
            "bprop": bprop.to_numpy(dtype=bool)[take],
            "input_shapes": shapes.to_numpy(dtype=object)[take],
            "dtypes": dtypes.to_numpy(dtype=object)[take],
            "concrete_inputs": concrete.to_numpy(dtype=object)[take],
            "call_site": site.to_numpy(dtype=object)[take],
        },
        index=names.index,
        copy=False,
    ).astype({"seq": "Int64"})


def _unescape(s: pd.Series) -> pd.Series:
    """Undo ``perfguard.instrument``'s ``%2C``/``%25`` in names and call sites."""
    return s.str.replace("%2C", ",", regex=False).str.replace("%25", "%", regex=False)


def _unescape_json(s: pd.Series) -> pd.Series:
    """Undo the ``,\\u0020`` that keeps ``", "`` out of JSON string values."""
    return s.str.replace(",\\u0020", ", ", regex=False)


def is_backward_name(names: pd.Series) -> pd.Series:
    """True for autograd backward nodes (``MulBackward0``, ``autograd::engine::...``)."""

    def rule(u: pd.Series) -> pd.Series:
        s = u.fillna("")
        backward = s.str.contains(r"Backward\d*\b", regex=True)
        return (backward | s.str.startswith("autograd::engine::evaluate_function")).astype(bool)

    return per_distinct(names, rule)


def iteration_number(names: pd.Series) -> pd.Series:
    """``N`` of ``ProfilerStep#N`` (Int64), NA for other names."""

    def rule(u: pd.Series) -> pd.Series:
        m = u.fillna("").str.extract(_PROFILER_STEP)[0]
        return pd.to_numeric(m, errors="coerce").astype("Int64")

    return per_distinct(names, rule)


def is_iteration_name(names: pd.Series) -> pd.Series:
    """True for iteration markers: ``ProfilerStep#N`` and :data:`ITERATION_NAMES`."""
    return iteration_number(names).notna() | names.isin(ITERATION_NAMES)


def op_type_of(names: pd.Series) -> pd.Series:
    """A coarse op type: the name without its namespace (``aten::addmm`` -> ``addmm``).

    Absolute hierarchical names (``perfguard.instrument``) give their last level
    without the repeat number: ``/Net/fc(2)/aten::addmm(3)`` -> ``addmm``.
    PyProf's ``torch.nn.functional.conv2d`` / ``Tensor.__matmul__`` give the
    op (``conv2d``, ``matmul``).
    """

    def rule(u: pd.Series) -> pd.Series:
        u = u.fillna("")
        py = u.str.fullmatch(PYTHON_OP)
        if py.any():
            u = u.where(~py, python_op(u[py]))
        path = u.str.startswith("/")
        if path.any():
            leaf = u.str.rsplit("/", n=1).str[-1].str.replace(_REPEAT, "", regex=True)
            u = u.where(~path, leaf)
        t = u.str.rsplit("::", n=1).str[-1].str.strip()
        return pd.Series(t.to_numpy(dtype=object), dtype="object")

    return per_distinct(names, rule)
