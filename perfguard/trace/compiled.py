"""Compiled kernels traced back to the aten ops they fuse (``torch.compile``/Inductor).

Inductor replaces a model's aten ops by kernels of its own: Triton kernels on a
GPU (``triton_poi_fused_add_mul_0``, ``triton_red_fused__softmax_1``), C++ ones
on a CPU (``cpp_fused__softmax_add_mul_relu_0``). The profiler records each as
one range named after the kernel (Triton: Inductor's launcher opens a
``RecordFunctionFast`` of that name; C++: with ``cpp.enable_kernel_profile`` the
kernel opens one itself, prefixed ``graph_<N>_``), so the per-op tables would
list kernel names the user never wrote, and an op added inside the compiled
function would only rename a kernel.

Inductor names a fused kernel by the sorted, distinct original aten ops of its
nodes (``descriptive_names = "original_aten"``, the default, at most
``kernel_name_max_ops`` of them), joined by ``_``. So each such range gets a sibling range
per aten op its name lists (``aten::_softmax``, ``aten::add``, ...), of zero
duration at the kernel's end (a range is open until just before its end, so
they sit beside the kernel, not in it): they count as calls of those ops in the
per-op tables and the gates, under the compiled graph's range as eager ops sit
under their module's, and own no time and no GPU work (nothing is launched at
an instant no range is open); the kernel's time stays with the kernel range,
since one kernel's time cannot be split between the ops it fuses. Beside the
kernel rather than under it, an op's path does not change when another op joins
its kernel (which renames the kernel): a gate then names the op that was added.
An op fused twice into one kernel is named once in the name, so it counts once.

Two names are made stable across runs as well: the ``graph_<N>_`` prefix (N
counts the graphs compiled in the process, so it moves with test selection and
order) is dropped, and the ``## Call CompiledFxGraph <hash> ##`` annotation
loses its hash (any change in the compiled graph changes it, and every op below
it would become a new op, out of reach of the per-op gates).

Splitting ``_softmax_add_mul_relu`` needs to know which ``_`` belong to an op
name: ``aten_op_names.txt`` lists the aten names that contain one.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib.resources import files

import numpy as np
import pandas as pd

from perfguard.trace.names import op_type_of

#: an Inductor kernel name: ``[graph_N_](triton|cpp)[_kind]_fused[_ops]_index``
KERNEL_NAME = re.compile(
    r"^(?:graph_\d+_)?(?P<kernel>(?P<backend>triton|cpp)_(?:(?P<kind>[a-z]+)_)?fused"
    r"(?:_(?P<ops>.+?))?_\d+)$"
)
_FX_GRAPH = re.compile(r"^## Call CompiledFxGraph \S+ ##$")
FX_GRAPH_NAME = "## Call CompiledFxGraph ##"
#: how every name :func:`stable_name` or :func:`fused_ops` acts on starts
_PREFIXES = ("triton_", "cpp_", "graph_", "## Call CompiledFxGraph")
#: ``ranges.source`` of the child ranges this module adds
SOURCE = "inductor"


@lru_cache(maxsize=1)
def _vocabulary() -> frozenset[str]:
    text = files("perfguard.trace").joinpath("aten_op_names.txt").read_text()
    return frozenset(s for s in text.split() if not s.startswith("#") and s)


def fused_ops(kernel_name: str) -> list[str] | None:
    """The aten ops an Inductor kernel's name lists (``aten::add``, ...), in the name's
    order; None when the name is not an Inductor fused kernel's.

    The fewest ops that spell the list, each a known aten name with ``_`` in it
    or a single word: ``_softmax_add`` is ``_softmax`` and ``add``, not three.
    """
    m = KERNEL_NAME.match(kernel_name)
    if m is None:
        return None
    text = m.group("ops")
    if not text:
        return []
    tokens = text.split("_")
    known = _vocabulary()
    n = len(tokens)
    # best[i]: the fewest ops spelling tokens[:i], and where the last one starts
    best: list[tuple[int, int]] = [(0, -1)] + [(n + 1, -1)] * n
    for j in range(1, n + 1):
        for i in range(j):
            word = "_".join(tokens[i:j])
            ok = word in known or (j == i + 1 and word != "")
            if ok and best[i][0] + 1 < best[j][0]:
                best[j] = (best[i][0] + 1, i)
    if best[n][0] > n:  # no spelling (e.g. a trailing "_"): the words as they are
        return [f"aten::{t}" for t in tokens if t]
    ops: list[str] = []
    j = n
    while j > 0:
        i = best[j][1]
        ops.append("aten::" + "_".join(tokens[i:j]))
        j = i
    return list(dict.fromkeys(reversed(ops)))


def stable_name(name: str) -> str:
    """A compiled range's name without what changes between equal runs: the
    ``graph_<N>_`` prefix of a kernel, the hash of ``CompiledFxGraph``."""
    m = KERNEL_NAME.match(name)
    if m is not None:
        return m.group("kernel")
    return FX_GRAPH_NAME if _FX_GRAPH.match(name) else name


def expand_compiled(ranges: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``ranges`` (a reader's table before :func:`perfguard.trace.ranges.finalize_ranges`)
    with compiled names made stable and a zero-length range per aten op at the end of
    each Inductor kernel range (their rows follow the kernel's); the notes to add.

    Works on the distinct names: a capture without compiled code costs one regex
    pass over them and is returned unchanged.
    """
    if not len(ranges):
        return ranges, []
    codes, uniques = pd.factorize(ranges["name"].astype(object))
    texts = [u if isinstance(u, str) else "" for u in uniques]
    if not any(t.startswith(_PREFIXES) for t in texts):
        return ranges, []
    renamed = np.array(
        [stable_name(t) if t else u for t, u in zip(texts, uniques, strict=True)], dtype=object
    )
    ops_of = [fused_ops(t) if t else None for t in texts]
    ranges = ranges.copy()
    ranges["name"] = renamed[codes]
    per_name = np.array([len(o) if o else 0 for o in ops_of], dtype=np.int64)
    extra = per_name[codes]
    kernels = int((np.array([o is not None for o in ops_of])[codes]).sum())
    if not extra.any():
        if "op_type" in ranges:
            ranges["op_type"] = op_type_of(ranges["name"]).to_numpy()
        return ranges, []
    n = len(ranges)
    src = np.repeat(np.arange(n), 1 + extra)
    first = np.cumsum(1 + extra) - (1 + extra)  # each source row's own position
    slot = np.arange(len(src)) - first[src] - 1  # -1: the row itself, k: its k-th op
    child = slot >= 0
    out = ranges.iloc[src].reset_index(drop=True)
    flat = np.array([op for o in ops_of for op in (o or [])], dtype=object)
    offset = np.cumsum(per_name) - per_name
    names = out["name"].to_numpy(dtype=object).copy()
    names[child] = flat[offset[codes[src[child]]] + slot[child]]
    out["name"] = names
    out.loc[child, "start"] = out.loc[child, "end"]
    fill: dict[str, str | bool] = {"kind": "op", "source": SOURCE, "bprop": False}
    for col, value in fill.items():
        if col in out:
            out.loc[child, col] = value
    if "op_type" in out:  # the kernels' renamed too
        out["op_type"] = op_type_of(out["name"]).to_numpy()
    for col in ("seq",):
        if col in out:
            out.loc[child, col] = pd.NA
    for col in ("input_shapes", "dtypes", "concrete_inputs", "call_site"):
        if col in out:
            out[col] = out[col].astype(object)
            out.loc[child, col] = None
    note = (
        f"{kernels} compiled kernel call(s) (torch.compile/Inductor) named by the aten ops they "
        f"fuse: {int(child.sum())} zero-length op range(s) added beside them, from the kernel "
        "names; a kernel's time stays with the kernel, and an op fused twice into one "
        "kernel counts once"
    )
    return out, [note]
