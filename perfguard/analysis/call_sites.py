"""Each op's call sites: the user's ``file:line`` behind it, the top ones by time.

The ranges carry ``call_site`` from whichever source the capture has (PyProf/DLProf
trace markers, ``instrument(ops=True)``, the PyTorch profiler's Python frames, the
capture's sidecar). An op called from several places lists the top ones by its
time there (GPU time where the op has any, else CPU time), with their shares:
``model.py:63 (72%); data.py:10 (28%)``. Folded CPU-only instances count by
their CPU time, as in every other per-op figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfguard.analysis.cpu_only import CpuOnly
from perfguard.analysis.ops import op_id
from perfguard.arrays import levels
from perfguard.trace.call_sites import top_sites_text

#: call sites listed per op
TOP_SITES = 3


def has_call_sites(ranges: pd.DataFrame) -> bool:
    """Whether any range of the capture says where in the user's code it was called."""
    return "call_site" in ranges and bool(ranges["call_site"].notna().any())


def range_site_codes(ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each range's call-site code (-1: none) and the texts, a range without one taking
    it from where the user's code is still the answer: a backward node from the forward
    op of its sequence number (autograd runs it on another thread, with no Python
    frame around it; PyProf ties them the same way), then any range from its parent
    (the ops a backward node or a compiled graph runs inside it)."""
    site = pd.Categorical(ranges["call_site"])
    codes, texts = site.codes.astype(np.int64), np.asarray(site.categories, dtype=object)
    if "seq" in ranges and (codes < 0).any():
        seq = ranges["seq"].to_numpy(dtype=np.float64, na_value=np.nan)
        fwd = (ranges["direction"].astype(object) != "bprop").to_numpy(bool)
        known = fwd & (codes >= 0) & ~np.isnan(seq)
        if known.any():
            by_seq = pd.Series(codes[known], index=seq[known])
            by_seq = by_seq[~by_seq.index.duplicated()]
            want = (codes < 0) & ~np.isnan(seq)
            got = by_seq.reindex(seq[want]).to_numpy(dtype=np.float64)
            fill = codes[want]
            fill[~np.isnan(got)] = got[~np.isnan(got)].astype(np.int64)
            codes[want] = fill
    if "parent_id" in ranges and "depth" in ranges and (codes < 0).any():
        parent = ranges["parent_id"].to_numpy(np.int64)
        for at in levels(ranges["depth"].to_numpy(np.int64))[1:]:  # parents first
            missing = at[codes[at] < 0]
            up = parent[missing]
            ok = up >= 0
            codes[missing[ok]] = codes[up[ok]]
    return codes, texts


@dataclass(frozen=True)
class _Pairs:
    """Instances grouped by (op key, site code): one entry per pair that has a site."""

    key: np.ndarray
    site: np.ndarray
    texts: np.ndarray
    calls: np.ndarray
    gpu: np.ndarray
    cpu: np.ndarray
    #: FLOPs and bytes summed over the pair's instances that have a figure (NaN: none has)
    flops: np.ndarray
    bytes: np.ndarray


def _known_sum(first: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """Per group, the sum of the known values; NaN where no member has one."""
    have = ~np.isnan(v)
    total = np.bincount(first[have], weights=v[have], minlength=n)
    return np.where(np.bincount(first[have], minlength=n) > 0, total, np.nan)


def _pairs(
    ranges: pd.DataFrame, inst: pd.DataFrame, cpu_only: CpuOnly | None, iterations: bool
) -> _Pairs | None:
    """Kept and folded instances (only those inside an iteration with ``iterations``)
    grouped on integer codes (op key, site code): no object per instance. None when no
    instance has a site."""
    codes, texts = range_site_codes(ranges)
    row = inst["instance"].to_numpy(np.int64)
    ok = (row >= 0) & (row < len(codes))
    if iterations:
        ok &= inst["iteration"].notna().to_numpy(bool)
    keys = [inst["op_key"].to_numpy(np.int64)[ok]]
    sites = [codes[row[ok]]]
    gpu = [inst["gpu_time"].to_numpy(np.float64, na_value=0.0)[ok]]
    cpu = [inst["cpu_time"].to_numpy(np.float64, na_value=0.0)[ok]]
    work = {
        c: [
            inst[c].to_numpy(np.float64, na_value=np.nan)[ok]
            if c in inst
            else np.full(ok.sum(), np.nan)
        ]
        for c in ("flops", "bytes")
    }
    if cpu_only is not None and len(cpu_only):
        fold = cpu_only.iteration >= 0 if iterations else np.ones(len(cpu_only), bool)
        keys.append(cpu_only.op_key.astype(np.int64)[fold])
        sites.append(codes[cpu_only.range_row[fold]])
        gpu.append(np.zeros(int(fold.sum())))
        cpu.append(cpu_only.cpu_time.astype(np.float64)[fold])
        for parts in work.values():  # a folded instance carries no shapes: no figure
            parts.append(np.full(int(fold.sum()), np.nan))
    key, code = np.concatenate(keys), np.concatenate(sites)
    g_all, c_all = np.concatenate(gpu), np.concatenate(cpu)
    f_all, b_all = np.concatenate(work["flops"]), np.concatenate(work["bytes"])
    has = code >= 0
    if not has.any():
        return None
    key, code, g_all, c_all = key[has], code[has], g_all[has], c_all[has]
    f_all, b_all = f_all[has], b_all[has]
    width = len(texts) + 1
    pair, first = np.unique(key * width + code, return_inverse=True)
    return _Pairs(
        key=pair // width,
        site=pair % width,
        texts=texts,
        calls=np.bincount(first, minlength=len(pair)).astype(np.int64),
        gpu=np.bincount(first, weights=g_all, minlength=len(pair)),
        cpu=np.bincount(first, weights=c_all, minlength=len(pair)),
        flops=_known_sum(first, f_all, len(pair)),
        bytes=_known_sum(first, b_all, len(pair)),
    )


def op_call_sites(
    ranges: pd.DataFrame, inst: pd.DataFrame, cpu_only: CpuOnly | None
) -> pd.DataFrame:
    """``op_id, call_site`` (text of the top :data:`TOP_SITES`) for ops with a call site.

    ``inst``: the kept instances (``instance`` is the range's row, ``op_key``,
    ``op_name``, ``direction``, ``gpu_time``, ``cpu_time``); ``cpu_only``: the folded ones.
    """
    p = _pairs(ranges, inst, cpu_only, iterations=False)
    if p is None:
        empty = pd.Series(dtype=object)
        return pd.DataFrame({"op_id": empty, "call_site": empty.copy()})
    op_codes, op_of_pair = np.unique(p.key, return_inverse=True)
    on_gpu = np.bincount(op_of_pair, weights=p.gpu, minlength=len(op_codes)) > 0
    time = np.where(on_gpu[op_of_pair], p.gpu, p.cpu)
    order = np.lexsort((p.texts[p.site], -time, op_of_pair))
    rows = []
    bounds = np.searchsorted(op_of_pair[order], np.arange(len(op_codes) + 1))
    for k in range(len(op_codes)):  # one entry per op (hundreds), not per instance
        at = order[bounds[k] : bounds[k + 1]]
        listed = list(zip(p.texts[p.site[at]].astype(str), time[at].astype(float), strict=True))
        rows.append(top_sites_text(listed, TOP_SITES))
    names, direction = _op_text(op_codes, inst, cpu_only)
    out = pd.DataFrame({"op_name": names, "direction": direction, "call_site": rows})
    out.insert(0, "op_id", op_id(out["op_name"], out["direction"]))
    return out[["op_id", "call_site"]]


#: columns of :func:`op_sites`
OP_SITE_COLUMNS = (
    "op_id",
    "op_name",
    "direction",
    "call_site",
    "calls",
    "gpu_time",
    "cpu_time",
    "flops",
    "bytes",
)


def op_sites(ranges: pd.DataFrame, inst: pd.DataFrame, cpu_only: CpuOnly | None) -> pd.DataFrame:
    """One row per (op, call site) over the iterations: its calls, GPU and CPU time, FLOPs
    and bytes (NaN where no instance there has a figure; the per-site comparison of
    :mod:`perfguard.compare.sites` divides by the iterations)."""
    p = _pairs(ranges, inst, cpu_only, iterations=True)
    if p is None:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in OP_SITE_COLUMNS})
    names, direction = _op_text(p.key, inst, cpu_only)
    out = pd.DataFrame(
        {
            "op_name": names,
            "direction": direction,
            "call_site": p.texts[p.site].astype(object),
            "calls": p.calls,
            "gpu_time": p.gpu,
            "cpu_time": p.cpu,
            "flops": p.flops,
            "bytes": p.bytes,
        }
    )
    out.insert(0, "op_id", op_id(out["op_name"], out["direction"]))
    return out[list(OP_SITE_COLUMNS)]


def _op_text(
    keys: np.ndarray, inst: pd.DataFrame, cpu_only: CpuOnly | None
) -> tuple[np.ndarray, np.ndarray]:
    """Op name and direction of each op key (the kept rows' where they have it)."""
    if cpu_only is not None and len(cpu_only.names):
        return cpu_only.op_text(keys)
    first = inst.drop_duplicates("op_key").set_index(inst.drop_duplicates("op_key")["op_key"])
    names = first["op_name"].astype(object).reindex(keys).to_numpy(dtype=object)
    direction = first["direction"].astype(object).reindex(keys).to_numpy(dtype=object)
    return names, direction


def with_call_sites(
    ops: pd.DataFrame, ranges: pd.DataFrame, inst: pd.DataFrame, cpu_only: CpuOnly | None
) -> pd.DataFrame:
    """``ops`` with a ``call_site`` column (None where the capture has none for an op)."""
    ops = ops.copy()
    if not has_call_sites(ranges) or ops.empty:
        ops["call_site"] = pd.Series([None] * len(ops), index=ops.index, dtype=object)
        return ops
    sites = op_call_sites(ranges, inst, cpu_only).set_index("op_id")["call_site"]
    ops["call_site"] = ops["op_id"].map(sites).astype(object)
    ops["call_site"] = ops["call_site"].where(ops["call_site"].notna(), None)
    return ops
