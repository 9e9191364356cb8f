"""Ops: naming, per-instance metrics, and per-op aggregation.

An *op* is a unique ``(op_name, direction)``. ``op_name`` is the range's
hierarchical name: the names of its enclosing op ranges joined with ``/``
(iteration markers are transparent), as DLProf named PyTorch ops
(``/model/layer1/conv1``). ``op_id`` is a hash of name and direction, so it
is stable across runs and baselines can be matched on it.

Per op instance (one range, or one unassociated GPU activity):

* CPU time: the range's duration (0 for unassociated work);
* GPU time: the summed durations of the kernels *and* memops attributed to
  it (accumulating, overlap counted per activity). DESIGN.md says
  "kernels"; memops are included because they are GPU work the op issued
  and DLProf/nsys projections count them too; the kernel report lists
  kernels only;
* CPU overhead: CPU time minus the time of CUDA API calls on the range's
  thread that start inside it (clipped at 0);
* GPU idle: the span from first attributed activity start to last end,
  minus the union of those activities (flattened).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfguard.analysis import metrics
from perfguard.analysis.attribution import orphan_names
from perfguard.analysis.cpu_only import (
    CpuOnly,
    FoldedStats,
    Parts,
    first_valid_of_both,
    merge_codes,
    merged_figures,
    missing_as_first,
    typed_like,
)
from perfguard.analysis.intervals import segment_figures
from perfguard.arrays import (
    Groups,
    factorize,
    first_rows,
    first_valid,
    levels,
    narrow,
    plain_text,
)
from perfguard.trace.model import (
    INDEX,
    Trace,
    categorical,
    coded_text,
    concat_coded,
    fill_text,
    with_category,
)
from perfguard.trace.nesting import group_codes
from perfguard.trace.ranges import ids_are_rows

STATS = ("total", "avg", "min", "max")
#: op paths keep at most this many levels of nesting; deeper ranges are named
#: ``<outer levels>/.../<own name>`` (real captures nest 5-10 deep)
MAX_OP_PATH_DEPTH = 64
PATH_CUT = "..."


def op_paths(ranges: pd.DataFrame) -> pd.Series:
    """Hierarchical name of every range (Series aligned with ``ranges``).

    Names that start with ``/`` (from :func:`perfguard.instrument`) are
    absolute paths already. Computed on distinct paths, level by level, so a million ranges with a
    few thousand distinct paths build only those few thousand strings.
    """
    path_id, text = op_path_codes(ranges)
    out = np.where(path_id >= 0, text[np.clip(path_id, 0, None)] if len(text) else None, None)
    return pd.Series(out, index=ranges.index, dtype="object")


def op_path_codes(ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(path_id, text)``: each range's path as a code into ``text`` (-1: none).

    Two codes may spell the same text (``/a/b`` named absolutely, ``b``
    under ``a``); callers that need one code per distinct name factorize
    ``text``, which holds only the distinct paths.

    A range nested :data:`MAX_OP_PATH_DEPTH` levels deep or more is named by
    its outer levels, :data:`PATH_CUT` and its own name: a path holds at most
    that many levels, so ranges nested thousands deep (a damaged or recursive
    capture) cost text linear in their count, not quadratic.
    """
    n = len(ranges)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
    name_code, distinct = factorize(with_category(ranges["name"], "").fillna(""))
    # a reader may hand over a name that is not text (a number in a damaged capture)
    texts = [v if isinstance(v, str) else str(v) for v in distinct]
    names = pd.Index([*texts, PATH_CUT], dtype=object)
    cut_code = len(names) - 1
    depth = ranges["depth"].to_numpy()
    parent = ranges["parent_id"].to_numpy()
    range_id = ranges["range_id"].to_numpy()
    if np.array_equal(range_id, np.arange(n)):  # range_id is the row number (finalize_ranges)
        parent_row = np.where(parent >= 0, parent, -1).astype(np.int64)
    else:  # map parent ids to rows
        row_of = pd.Series(np.arange(n), index=range_id)
        parent_row = np.where(parent >= 0, row_of.reindex(parent).fillna(-1).to_numpy(np.int64), -1)
    transparent = (ranges["kind"] == "iteration").to_numpy()
    # perfguard.instrument names ranges by their full module path ("/model/fc/linear"):
    # such a name is already hierarchical and is not prefixed again
    absolute = np.asarray(names.str.startswith("/"), dtype=np.bool_)[name_code]
    path_id = np.full(n, -1, dtype=np.int64)
    base = np.full(n, -1, dtype=np.int64)  # the path a range's children hang under
    table_parent: list[np.ndarray] = []
    table_name: list[np.ndarray] = []
    next_id = 0
    n_names = len(names)
    for level, at in enumerate(levels(depth)):
        pp = np.where(parent_row[at] >= 0, base[np.clip(parent_row[at], 0, None)], -1)
        pp[absolute[at]] = -1
        keep = ~transparent[at]
        path_id[at[~keep]] = pp[~keep]
        base[at[~keep]] = pp[~keep]
        at, pp = at[keep], pp[keep]
        if not len(at):
            continue
        # distinct (parent path, name) pairs, numbered in order of appearance
        codes, uniq = pd.factorize((pp + 1) * n_names + name_code[at])
        path_id[at] = codes + next_id
        table_parent.append(uniq // n_names - 1)
        table_name.append(uniq % n_names)
        next_id += len(uniq)
        if level < MAX_OP_PATH_DEPTH - 1:
            base[at] = path_id[at]
        elif level == MAX_OP_PATH_DEPTH - 1:  # children hang under "<this path>/..."
            cut, parents = pd.factorize(path_id[at])
            base[at] = cut + next_id
            table_parent.append(np.asarray(parents, dtype=np.int64))
            table_name.append(np.full(len(parents), cut_code, dtype=np.int64))
            next_id += len(parents)
        else:  # deeper still: the children share their parent's cut path
            base[at] = np.where(absolute[at], path_id[at], pp)
    text = np.empty(next_id, dtype=object)
    first = 0
    # one vectorised concatenation per level: parents are built before children
    for tp, tn in zip(table_parent, table_name, strict=True):
        leaf = names.to_numpy(dtype=object)[tn]
        parent_text = np.where(tp >= 0, text[np.clip(tp, 0, None)], "")
        text[first : first + len(tp)] = np.where(tp < 0, leaf, parent_text + "/" + leaf)
        first += len(tp)
    return path_id, text


def deep_range_note(ranges: pd.DataFrame) -> list[str]:
    """The note for ranges whose op names :func:`op_path_codes` cut, if any."""
    if ranges.empty:
        return []
    deep = int((ranges["depth"].to_numpy() >= MAX_OP_PATH_DEPTH).sum())
    if not deep:
        return []
    return [
        f"{deep} ranges are nested {MAX_OP_PATH_DEPTH} levels deep or more: their op names "
        f"keep the outer {MAX_OP_PATH_DEPTH} levels, then '{PATH_CUT}' and their own name, "
        "and their GPU work is rolled up into the group nodes above them, not into their own"
    ]


def op_id(op_name: pd.Series, direction: pd.Series) -> pd.Series:
    """Stable 16-hex-digit id of ``(op_name, direction)``, hashed once per distinct op."""
    # distinct (name, direction) pairs by codes: no per-row string building
    name_code, names = pd.factorize(with_category(op_name, "").fillna(""))
    dir_code, dirs = pd.factorize(with_category(direction, "").fillna(""))
    width = max(len(dirs), 1)
    codes, pairs = pd.factorize(name_code.astype(np.int64) * width + dir_code)
    name_text = np.asarray([v if isinstance(v, str) else str(v) for v in names], dtype=object)
    keys = name_text[pairs // width] + "\x1f" + np.asarray(dirs, dtype=object)[pairs % width]
    ids = np.array(
        [
            hashlib.blake2b(u.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
            for u in keys
        ],
        dtype=object,
    )
    return pd.Series(ids[codes] if len(codes) else [], index=op_name.index, dtype="object")


def op_id_by_key(inst: pd.DataFrame) -> pd.Series:
    """:func:`op_id` of instances that carry ``op_key`` (one code per op): hashed once
    per distinct key, from one representative row, without touching the name of
    every row."""
    key = inst["op_key"].to_numpy(np.int64)
    codes, _ = pd.factorize(key)
    reps = inst.iloc[first_rows(codes)]
    ids = op_id(reps["op_name"].reset_index(drop=True), reps["direction"].reset_index(drop=True))
    return pd.Series(categorical(codes, ids.to_numpy(dtype=object)), index=inst.index)


@dataclass(frozen=True)
class OpCodes:
    """The op-name numbering of one analysis, shared by the instance table and the
    instances folded out of it (:class:`perfguard.analysis.cpu_only.CpuOnly`), so an
    ``op_key`` means the same op in both.

    ``op_rows``: the rows of ``trace.ranges`` that are ops, ascending; ``op_code``:
    the op-name code of each; ``orphan``: the rows of the activities that no range
    owns (each its own ``unassociated_<name>`` instance), ``orphan_name`` their op
    names (an untied CUDA-graph replay's under the path of the range that launched it)
    and ``orphan_code`` their codes; ``names``: the op name of each code;
    ``orphan_leaf`` and ``orphan_direction``: each orphan's own name (without that path)
    and direction (its launching range's, else ``fprop``).
    """

    op_rows: np.ndarray
    op_code: np.ndarray
    orphan: np.ndarray
    orphan_name: np.ndarray
    orphan_code: np.ndarray
    names: np.ndarray
    orphan_leaf: np.ndarray | None = None
    orphan_direction: np.ndarray | None = None

    @classmethod
    def of(cls, trace: Trace, acts: pd.DataFrame) -> OpCodes:
        r = trace.ranges
        path_id, path_text = op_path_codes(r)
        op_rows = np.flatnonzero((r["kind"] == "op").to_numpy(dtype=bool))
        orphan = np.flatnonzero(acts["range_id"].to_numpy() < 0)
        leaf = orphan_names(acts, orphan)
        under, direction = _launchers(r, path_id, path_text, acts, orphan)
        orphan_name = leaf if under is None else orphan_names(acts, orphan, under)
        code, names = _op_name_codes(path_id[op_rows], path_text, orphan_name)
        # int32 where they fit: kept alive through the fold, 4.8M entries each at
        # emit_nvtx density (copies: a slice would keep the whole int64 array)
        return cls(
            op_rows=narrow(op_rows),
            op_code=_own(narrow(code[: len(op_rows)])),
            orphan=orphan,
            orphan_name=orphan_name.to_numpy(dtype=object),
            orphan_code=_own(code[len(op_rows) :]),
            names=names,
            orphan_leaf=None if under is None else leaf.to_numpy(dtype=object),
            orphan_direction=direction,
        )

    def op_key(self, code: np.ndarray, bprop: np.ndarray) -> np.ndarray:
        """The int64 ``op_key`` of ops named by ``code``, backward where ``bprop``."""
        key = np.asarray(code).astype(np.int64)
        key *= 2
        key += bprop
        return key


def _launchers(
    r: pd.DataFrame,
    path_id: np.ndarray,
    path_text: np.ndarray,
    acts: pd.DataFrame,
    orphan: np.ndarray,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """For each orphan, the op path and direction of the range around the launch of the
    CUDA-graph replay it belongs to (None, ``fprop`` where none); ``(None, None)`` when no
    orphan has one (:func:`perfguard.analysis.attribution.attribute`'s ``graph_launcher``)."""
    if "graph_launcher" not in acts or not len(orphan):
        return None, None
    launcher = acts["graph_launcher"].to_numpy(np.int64)[orphan]
    held = np.flatnonzero(launcher >= 0)
    if not len(held):
        return None, None
    rows = launcher[held]
    if not ids_are_rows(r):
        rows = pd.Index(r["range_id"].to_numpy(np.int64)).get_indexer(rows)
    under = np.full(len(orphan), None, dtype=object)
    under[held] = np.asarray(path_text, dtype=object)[path_id[rows]]
    direction = np.full(len(orphan), "fprop", dtype=object)
    direction[held] = pd.Series(_rows_of(r["direction"], rows)).fillna("fprop").to_numpy(object)
    return under, direction


def _own(values: np.ndarray) -> np.ndarray:
    """``values``, copied when a view: a view keeps its whole base array alive."""
    return values.copy() if values.base is not None else values


def op_instances(
    trace: Trace,
    acts: pd.DataFrame,
    keep: np.ndarray | None = None,
    codes: OpCodes | None = None,
    api_time: np.ndarray | None = None,
) -> pd.DataFrame:
    """One row per op instance with its metrics.

    Input: ``trace`` and attributed activities (``range_id``, ``instance``
    from :func:`perfguard.analysis.attribution.attribute`). Output columns:
    ``instance``, ``rank, pid, tid, start, end,
    op_name, name, direction, op_type, input_shapes, dtypes, cpu_time,
    gpu_time, kernel_count, memop_count, cpu_overhead, gpu_span, gpu_idle``
    and ``op_key``, a code per op (distinct ``(op_name, direction)``) within
    this analysis: grouping millions of instances by it is far cheaper than by
    the two text columns. Text is coded and ids, keys and counts are int32, as
    in the Trace model (:data:`perfguard.trace.model.CODED_TEXT`).

    ``keep`` (a mask over ``codes.op_rows``) limits the rows to those op ranges
    (the unassociated instances are always rows): each row holds the same values
    as in the whole table, since every figure is the instance's own.
    ``api_time``: :func:`api_time_inside` of every op range, when computed already.

    The columns are kept to what the reports read: the API time and flattened
    busy time behind ``cpu_overhead`` and ``gpu_idle`` are not kept (36 MiB each
    at ``emit_nvtx``'s 4.8M ranges).
    """
    r = trace.ranges
    codes = OpCodes.of(trace, acts) if codes is None else codes
    op_rows, name_code = codes.op_rows, codes.op_code
    if keep is not None:
        op_rows, name_code = op_rows[keep], name_code[keep]
        api_time = api_time[keep] if api_time is not None else None
    orphan = codes.orphan
    n_un = len(orphan)

    def col(ranges_col: str, orphan_values: object) -> np.ndarray:
        """One column: the op ranges' values, then the unassociated instances'."""
        ours = _rows_of(r[ranges_col], op_rows)
        theirs = np.broadcast_to(np.asarray(orphan_values, dtype=ours.dtype), (n_un,))
        return np.concatenate([ours, theirs])

    def text(ranges_col: str, orphan_values: object) -> pd.Categorical:
        """A text column, coded (as the model keeps text): no object per row."""
        ours = r[ranges_col].array.take(op_rows)
        if not n_un:
            return ours
        theirs = np.broadcast_to(np.asarray(orphan_values, dtype=object), (n_un,))
        return concat_coded([ours, coded_text(theirs)])

    a_start = acts["start"].to_numpy(np.int64)
    name_code = np.concatenate([name_code, codes.orphan_code])
    start = col("start", a_start[orphan])
    end = col("end", a_start[orphan])  # unassociated work takes no CPU time
    direction = text(
        "direction", "fprop" if codes.orphan_direction is None else codes.orphan_direction
    )
    api = np.zeros(len(start), dtype=np.int64)
    api[: len(op_rows)] = api_time_inside(trace, op_rows) if api_time is None else api_time
    cpu_time = metrics.cpu_time(start, end)
    inst = pd.DataFrame(
        {
            "instance": col("range_id", acts["instance"].to_numpy(np.int64)[orphan]),
            "rank": col("rank", acts["rank"].to_numpy(np.int64)[orphan]),
            "pid": col("pid", acts["pid"].to_numpy(np.int64)[orphan]),
            "tid": col("tid", acts["launch_tid"].to_numpy(np.int64, na_value=-1)[orphan]),
            "start": start,
            "end": end,
            "op_name": categorical(name_code, codes.names),
            "name": text(
                "name", codes.orphan_name if codes.orphan_leaf is None else codes.orphan_leaf
            ),
            "direction": direction,
            "op_type": text("op_type", "unassociated"),
            "input_shapes": text("input_shapes", None),
            "dtypes": text("dtypes", None),
            "cpu_time": cpu_time,
            "op_key": codes.op_key(name_code, np.asarray(direction == "bprop")).astype(INDEX),
            "cpu_overhead": metrics.cpu_overhead(cpu_time, api),
        },
        copy=False,
    )
    for column, values in _gpu_per_instance(inst["instance"].to_numpy(np.int64), acts).items():
        inst[column] = values.astype(INDEX) if column in ("kernel_count", "memop_count") else values
    return inst


def fold_cpu_only(trace: Trace, codes: OpCodes, keep: np.ndarray, api_time: np.ndarray) -> CpuOnly:
    """The op ranges ``keep`` leaves out of the instance table, as a
    :class:`CpuOnly` (their iterations unassigned, -1): what a row of theirs would
    hold beyond the range itself is no GPU work and no figure. ``api_time``:
    :func:`api_time_inside` of every op range."""
    r = trace.ranges
    fold = np.flatnonzero(~keep)
    rows = codes.op_rows[fold]
    # each column taken, narrowed and dropped in turn: 3.4M entries at emit_nvtx density
    cpu_time = r["end"].to_numpy(np.int64)[rows]
    metrics.cpu_time(r["start"].to_numpy(np.int64)[rows], cpu_time, out=cpu_time)
    bprop = _rows_of(r["direction"] == "bprop", rows)
    op_key = narrow(codes.op_key(codes.op_code[fold], bprop))
    del bprop
    overhead = api_time[fold]
    metrics.cpu_overhead(cpu_time, overhead, out=overhead)
    return CpuOnly(
        range_row=narrow(rows),
        order=narrow(fold),
        op_key=op_key,
        rank=narrow(_rows_of(r["rank"], rows)),
        iteration=np.full(len(rows), -1, dtype=np.int32),
        cpu_time=cpu_time,
        cpu_overhead=overhead,
        kept_order=narrow(
            np.concatenate([np.flatnonzero(keep), len(keep) + np.arange(len(codes.orphan))])
        ),
        names=codes.names,
        ranges=r,
    )


def _rows_of(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """``column``'s values at ``rows`` as a numpy array, taken before converting: a
    categorical or string column is not first turned into millions of objects."""
    return np.asarray(column.array.take(rows))


def api_time_inside(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Summed duration of the CUDA API calls on each of the ranges ``rows``' thread
    that start inside it: CPU time minus this is the range's CPU overhead."""
    api = trace.api_calls
    if api.empty or not len(rows):
        return np.zeros(len(rows), dtype=np.int64)
    r = trace.ranges
    # every row in order (op_rows when every range is an op): the columns, not copies
    every = len(rows) == len(r) and bool((rows[1:] > rows[:-1]).all())

    def column(c: str) -> np.ndarray:
        values = r[c].to_numpy()
        return values if every else values[rows]

    keys = ["rank", "pid", "tid"]
    a_code, i_code = group_codes(api[keys], pd.DataFrame({k: column(k) for k in keys}, copy=False))
    start, end = column("start"), column("end")
    t0 = int(min(api["start"].min(), start.min()))
    span = int(max(api["end"].max(), end.max())) - t0 + 2
    a_key = a_code * span + (api["start"].to_numpy() - t0)
    order = np.argsort(a_key, kind="stable")  # calls come nearly in order: timsort runs
    a_key = a_key[order]
    cum = np.concatenate([[0], np.cumsum((api["end"] - api["start"]).to_numpy()[order])])
    # one query array, moved from the ranges' starts to their ends in place
    query = i_code * span
    del i_code
    query -= t0
    query += start
    lo = np.searchsorted(a_key, query, side="left")
    query -= start
    query += end
    hi = np.searchsorted(a_key, query, side="right")
    del query
    out = cum[hi]
    out -= cum[lo]
    return out


def instance_rows(instance: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Row of each of ``ids`` in an ``instance`` column, -1 where absent.

    Instance ids are range ids (>= 0, at most the number of ranges) or
    ``-1 - k`` for unassociated work, so two lookup tables find them without
    hashing.
    """
    instance = np.asarray(instance, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    if np.array_equal(instance, np.arange(len(instance))):  # ids are row numbers already
        return np.where((ids >= 0) & (ids < len(instance)), ids, -1)
    out = np.full(len(ids), -1, dtype=np.int64)
    for sign in (1, -1):
        mine = instance >= 0 if sign == 1 else instance < 0
        want = ids >= 0 if sign == 1 else ids < 0
        if not mine.any() or not want.any():
            continue
        key = instance[mine] if sign == 1 else -1 - instance[mine]
        table = np.full(int(key.max()) + 1, -1, dtype=np.int64)
        table[key] = np.flatnonzero(mine)
        q = ids[want] if sign == 1 else -1 - ids[want]
        ok = q < len(table)
        found = np.full(len(q), -1, dtype=np.int64)
        found[ok] = table[q[ok]]
        out[want] = found
    return out


def _gpu_per_instance(instance: np.ndarray, acts: pd.DataFrame) -> dict[str, np.ndarray]:
    """GPU figures per instance row: time, kernel and memop counts, span and idle
    (span minus flattened busy); 0 where nothing ran. Sorted segments and ``reduceat``."""
    n = len(instance)
    names = ("gpu_time", "kernel_count", "memop_count", "gpu_span", "gpu_idle")
    out = {c: np.zeros(n, dtype=np.int64) for c in names}
    rows = instance_rows(instance, acts["instance"].to_numpy(np.int64))
    owned = np.flatnonzero(rows >= 0)
    at, fig = segment_figures(
        rows[owned],
        owned,
        acts["start"].to_numpy(np.int64),
        acts["end"].to_numpy(np.int64),
        (acts["activity"] == "kernel").to_numpy(dtype=bool),
    )
    out["gpu_time"][at] = fig["time"]
    out["kernel_count"][at] = fig["kernels"]
    out["memop_count"][at] = fig["count"] - fig["kernels"]
    out["gpu_span"][at] = fig["span"]
    out["gpu_idle"][at] = metrics.gpu_idle(fig["span"], fig["busy"])
    return out


def _op_name_codes(
    path_id: np.ndarray, path_text: np.ndarray, orphan_name: pd.Series
) -> tuple[np.ndarray, np.ndarray]:
    """Op-name codes of the op ranges (by path) then the unassociated instances,
    one code per distinct name: ``(codes, names)``. Only distinct texts are hashed."""
    orphan_code, orphan_names = pd.factorize(orphan_name.to_numpy(dtype=object))
    table = np.concatenate([np.asarray(path_text, dtype=object), np.asarray(orphan_names, object)])
    table_code, names = pd.factorize(table)
    codes = np.concatenate([table_code[path_id], table_code[len(path_text) + orphan_code]])
    return codes.astype(np.int64), np.asarray(names, dtype=object)


def aggregate_ops(inst: pd.DataFrame, cpu_only: CpuOnly | None = None) -> pd.DataFrame:
    """Per-op totals: one row per ``(op_name, direction)``, sorted by GPU time.

    Output: ``op_id, op_name, direction, op_type, calls, kernel_count`` and
    ``{cpu_time,gpu_time,cpu_overhead,gpu_idle}_{total,avg,min,max}``. With
    ``cpu_only``, ``inst`` is the kept table and the folded instances count too:
    the same table as from every instance.
    """
    metrics = ["cpu_time", "gpu_time", "cpu_overhead", "gpu_idle"]
    if inst.empty and not (cpu_only is not None and len(cpu_only)):
        cols = ["op_id", "op_name", "direction", "op_type", "calls", "kernel_count"]
        cols += [f"{m}_{s}" for m in metrics for s in STATS]
        return pd.DataFrame(columns=cols)
    if cpu_only is not None and len(cpu_only):
        out = _fold_into_ops(inst, cpu_only, metrics)
    else:
        codes: np.ndarray
        if "op_key" in inst.columns:  # one code per op, as analyze() leaves it
            codes, _ = pd.factorize(inst["op_key"].to_numpy(np.int64))
        else:  # groupby drops NA keys: so do these codes
            codes = inst.groupby(["op_name", "direction"], sort=False).ngroup().to_numpy(np.int64)
        grouped = _Grouped.of(inst, codes)
        out = _group_stats(grouped, ["op_name", "direction", "op_type"], metrics)
        if "tc_eligible" in inst.columns:  # Tensor Core / FLOP columns (analysis.enrich)
            out = pd.concat([out, _gpu_metrics(grouped)], axis=1)
    out.insert(0, "op_id", op_id(out["op_name"], out["direction"]))
    out = out.sort_values(
        ["gpu_time_total", "cpu_time_total", "op_name"], ascending=[False, False, True]
    )
    return out.reset_index(drop=True)


def by_gpu_share(ops: pd.DataFrame) -> pd.DataFrame:
    """``ops`` by GPU time, most first (stable), with ``gpu_share``: each op's share in %
    of the summed GPU time of the ops (NaN when that is 0)."""
    out = ops.sort_values("gpu_time_total", ascending=False, kind="stable")
    total = float(out["gpu_time_total"].sum()) if len(out) else 0.0
    return out.assign(gpu_share=metrics.percent(out["gpu_time_total"], total))


def nested_flops(ops: pd.DataFrame) -> pd.Series:
    """Per op row, the FLOPs of the ops nested in it (same direction, any depth) where the op
    has none of its own, else NaN: ``aten::linear`` counts nothing itself (each FLOP is
    counted once, on the innermost op with a formula: its ``aten::addmm``), and a reader
    looking at the linear should see them, marked as its children's. One pass over the
    ops (hundreds), adding each op's FLOPs to its ancestors' paths."""
    if "flops" not in ops or not len(ops):
        return pd.Series(np.nan, index=ops.index, dtype=np.float64)
    own = pd.to_numeric(ops["flops"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    names = ops["op_name"].astype(str).to_numpy()
    dirs = ops["direction"].astype(str).to_numpy() if "direction" in ops else [""] * len(ops)
    below: dict[tuple[str, str], float] = {}
    for name, d, f in zip(names, dirs, own, strict=True):
        if not (f > 0):
            continue
        parts = name.split("/")
        for k in range(1, len(parts)):
            key = ("/".join(parts[:k]), d)
            below[key] = below.get(key, 0.0) + f
    nested = np.array([below.get((n, d), np.nan) for n, d in zip(names, dirs, strict=True)])
    return pd.Series(np.where(own > 0, np.nan, nested), index=ops.index)


def tc_missed(ops: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``ops`` that are Tensor Core eligible, ran GPU work and used no Tensor
    Core kernel (no rows without the Tensor Core columns). A group range's kernels count
    on its ops, so an eligible range without GPU time of its own is left out."""
    if "tc_eligible" not in ops.columns or "using_tc" not in ops.columns:
        return ops.iloc[0:0]
    eligible = ops["tc_eligible"].astype("boolean").fillna(False).astype(bool).to_numpy()
    using = ops["using_tc"].astype("boolean").fillna(False).astype(bool).to_numpy()
    ran = (ops["gpu_time_total"] > 0).to_numpy()
    return ops[eligible & ~using & ran]


@dataclass(frozen=True)
class _Merge:
    """The kept rows and the folded instances grouped by one key, numbered as the
    whole table's codes would be: each part's groups (``grouped``, ``folded``), the
    kept groups' figures (``kept``) and where each merged group is in each part."""

    grouped: _Grouped
    kc: np.ndarray
    fc: np.ndarray
    part: Parts
    kept: pd.DataFrame
    folded: FoldedStats
    cpu_only: CpuOnly

    @classmethod
    def of(
        cls,
        inst: pd.DataFrame,
        kept_key: np.ndarray,
        fold_key: np.ndarray,
        cpu_only: CpuOnly,
        firsts: list[str],
        metrics: list[str],
    ) -> _Merge:
        kc, kept_codes, fc, fold_codes, n = merge_codes(
            kept_key, cpu_only.kept_order, fold_key, cpu_only.order
        )
        grouped = _Grouped.of(inst, kc)
        part = Parts.of(n, kept_codes, fold_codes)
        kept = _group_stats(grouped, firsts, metrics)
        return cls(grouped, kc, fc, part, kept, cpu_only.by(fc), cpu_only)

    def key_of_each(self, kept_key: np.ndarray, fold_key: np.ndarray) -> np.ndarray:
        """Each merged group's key (its first value in either part)."""
        key = np.empty(self.part.n, dtype=np.asarray(kept_key).dtype)
        key[self.part.fold_codes] = np.asarray(fold_key)[first_rows(self.fc)]
        key[self.part.kept_codes] = np.asarray(kept_key)[self.grouped.rows]
        return key

    def figures(self, out: pd.DataFrame, metrics: list[str]) -> None:
        merged_figures(out, self.kept, self.folded, self.part, metrics)

    def gpu_metrics(self, drop: tuple[str, ...] = ()) -> pd.DataFrame:
        """:func:`_gpu_metrics` per merged group: the folded instances add nothing."""
        gpu = self.part.kept_only(_gpu_metrics(self.grouped).drop(columns=list(drop)))
        first_kept = self.cpu_only.kept_order[self.grouped.rows]
        missing_as_first(gpu, self.part, first_kept, self.folded, self.cpu_only)
        return gpu


def _fold_into_ops(inst: pd.DataFrame, cpu_only: CpuOnly, metrics: list[str]) -> pd.DataFrame:
    """:func:`aggregate_ops`' per-op columns (before ``op_id``) from the kept rows
    and the folded instances, in the order the whole table's codes would give.

    A folded instance adds a call, its CPU time and overhead, and zero GPU time,
    kernels, GPU idle and Tensor Core time; it has no shapes, dtypes or FLOPs,
    so the first values and sums of those come from the kept rows alone.
    """
    kept_key = inst["op_key"].to_numpy(np.int64)
    fold_key = cpu_only.op_key  # int32 at most: coded as it is, not widened first
    m = _Merge.of(inst, kept_key, fold_key, cpu_only, ["op_name", "direction", "op_type"], metrics)
    name, direction = cpu_only.op_text(m.key_of_each(kept_key, fold_key))
    op_type = first_valid_of_both(
        inst["op_type"].to_numpy(dtype=object),
        m.kc,
        cpu_only.column("op_type"),
        m.fc,
        cpu_only,
        m.part,
    )
    out = pd.DataFrame(
        {
            "op_name": typed_like(name, inst["op_name"]),
            "direction": typed_like(direction, inst["direction"]),
            "op_type": op_type,
        },
        copy=False,
    )
    m.figures(out, metrics)
    if "tc_eligible" in inst.columns:
        out = pd.concat([out, m.gpu_metrics()], axis=1)
    return out


def _fold_into_op_types(inst: pd.DataFrame, cpu_only: CpuOnly, metrics: list[str]) -> pd.DataFrame:
    """:func:`aggregate_op_types`' columns from the kept rows (``op_type`` already
    filled with the name) and the folded instances (:func:`_fold_into_ops`)."""
    kept_key = inst["op_type"].to_numpy(dtype=object)
    # taken before converting: the ranges' columns hold millions of rows
    rows = cpu_only.range_row
    fold_key = np.array(_rows_of(cpu_only.ranges["op_type"], rows), dtype=object)
    unnamed = pd.isna(fold_key)
    if unnamed.any():
        fold_key[unnamed] = _rows_of(cpu_only.ranges["name"], rows[unnamed])
    m = _Merge.of(inst, kept_key, fold_key, cpu_only, ["op_type"], metrics)
    # each group's key is its op type
    out = pd.DataFrame(
        {"op_type": typed_like(m.key_of_each(kept_key, fold_key), inst["op_type"])}, copy=False
    )
    m.figures(out, metrics)
    if "tc_eligible" in inst.columns:
        out = pd.concat([out, m.gpu_metrics(drop=("input_shapes",))], axis=1)
    return out


@dataclass(frozen=True)
class _Grouped:
    """Instances grouped by codes numbered as first seen (rows coded -1 dropped), with
    what every per-group figure needs, computed once: each group's first row and
    the sort of :class:`perfguard.arrays.Groups`."""

    inst: pd.DataFrame
    codes: np.ndarray
    rows: np.ndarray
    groups: Groups

    @classmethod
    def of(cls, inst: pd.DataFrame, codes: np.ndarray) -> _Grouped:
        keep = codes >= 0
        if not keep.all():
            inst, codes = inst[keep], codes[keep]
        return cls(inst, codes, first_rows(codes), Groups(codes))

    def first(self, values: pd.Series) -> pd.Series:
        """Each group's first non-NA value of ``values`` (a column of ``inst``)."""
        return first_valid(values, self.codes, self.rows)


def _group_stats(grouped: _Grouped, firsts: list[str], metrics: list[str]) -> pd.DataFrame:
    """Per group, one row per code in code order: the first value of each of
    ``firsts``, ``calls``, ``kernel_count`` and the total/avg/min/max of each of
    ``metrics``.

    The text columns come from each group's first row (:func:`first_valid`),
    not from a groupby "first", which costs 10-15 ms per million rows each.
    """
    inst, groups = grouped.inst, grouped.groups
    out = pd.DataFrame({c: plain_text(grouped.first(inst[c])) for c in firsts}, copy=False)
    out["calls"] = groups.size
    out["kernel_count"] = groups.sum(inst["kernel_count"].to_numpy(np.int64))
    for m in metrics:
        values = inst[m].to_numpy(np.int64)
        for stat, fn in zip(STATS, (groups.sum, groups.mean, groups.min, groups.max), strict=True):
            out[f"{m}_{stat}"] = fn(values)
    return out


def aggregate_op_types(inst: pd.DataFrame, cpu_only: CpuOnly | None = None) -> pd.DataFrame:
    """Per op type (DLProf's op_type report): calls, CPU/GPU time statistics and, when
    the instances carry them, the Tensor Core and FLOP columns of :func:`aggregate_ops`.

    Unassociated GPU work is its own type (``unassociated``). With ``cpu_only``,
    ``inst`` is the kept table and the folded instances count too.
    """
    metrics = ["cpu_time", "gpu_time"]
    stats = [f"{m}_{s}" for m in metrics for s in STATS]
    folded = cpu_only is not None and len(cpu_only) > 0
    if inst.empty and not folded:
        return pd.DataFrame(columns=["op_type", "calls", "kernel_count", *stats])
    op_type = fill_text(inst["op_type"], inst["name"])
    if folded:
        assert cpu_only is not None
        out = _fold_into_op_types(inst.assign(op_type=op_type), cpu_only, metrics)
    else:
        code, _ = factorize(op_type, use_na_sentinel=False)  # grouped by code, not by text
        grouped = _Grouped.of(inst.assign(op_type=op_type), code)
        out = _group_stats(grouped, ["op_type"], metrics)
        if "tc_eligible" in inst.columns:
            gpu = _gpu_metrics(grouped).drop(columns=["input_shapes"])
            out = pd.concat([out, gpu], axis=1)
    out = out.sort_values(["gpu_time_total", "op_type"], ascending=[False, True])
    return out.reset_index(drop=True)


def _gpu_metrics(grouped: _Grouped) -> pd.DataFrame:
    """Per group (an op, an op type; one row per code in code order): Tensor Core
    use and utilization, shapes, FLOPs, bytes and efficiency.

    * ``tc_eligible`` / ``using_tc``: any instance eligible / using TC;
    * ``tc_utilization``: 100 x TC kernel time / kernel time over the op's
      eligible instances (DESIGN.md), NaN for an op that is not eligible;
    * ``flops``, ``bytes``: summed over instances (counted once up the op
      tree before this), NA when no instance has a known figure;
    * ``achieved_tflops``: FLOPs / GPU time of the instances with known FLOPs;
    * ``flop_efficiency_pct``: 100 x FLOPs / sum(GPU time x peak) over the
      instances with known FLOPs and peak, which is FLOPs / GPU time / peak
      when every instance ran on the same GPU and path.
    """
    inst, codes, groups = grouped.inst, grouped.codes, grouped.groups
    eligible = inst["tc_eligible"].fillna(False).astype(bool)
    flops = inst["flops"].astype("Float64")
    known = flops.notna().to_numpy(bool) & (inst["gpu_time"] > 0).to_numpy(bool)
    peak = inst["peak_flops"].astype("Float64")
    rated = known & peak.notna().to_numpy(bool)
    gpu_s = metrics.gpu_seconds(inst["gpu_time"].to_numpy(np.float64))
    # integers and flags reduced exactly with numpy; floating-point sums by pandas
    sums = pd.DataFrame(
        {
            "tc_eligible": groups.any(eligible.to_numpy(bool)),
            "using_tc": groups.any(inst["uses_tc"].fillna(False).astype(bool).to_numpy(bool)),
            "tc_kernel_time": groups.sum(inst["tc_kernel_time"].to_numpy(np.int64)),
            "kernel_time": groups.sum(inst["kernel_time"].to_numpy(np.int64)),
            "el_tc": groups.sum(np.where(eligible, inst["tc_kernel_time"], 0)),
            "el_k": groups.sum(np.where(eligible, inst["kernel_time"], 0)),
        },
        copy=False,
    )
    f = pd.DataFrame(
        {
            "f_known": np.where(known, flops.fillna(0).to_numpy(np.float64), 0.0),
            "t_known": np.where(known, gpu_s, 0.0),
            "f_rated": np.where(rated, flops.fillna(0).to_numpy(np.float64), 0.0),
            "tp_rated": np.where(rated, gpu_s * peak.fillna(0).to_numpy(np.float64), 0.0),
            "flops": flops.array,
            "bytes": inst["bytes"].astype("Int64").array,
        },
        copy=False,
    )
    g = f.groupby(codes, sort=True)
    floats = g[["f_known", "t_known", "f_rated", "tp_rated"]].sum()
    for col in floats.columns:
        sums[col] = floats[col].to_numpy()
    out = sums[["tc_eligible", "using_tc", "tc_kernel_time", "kernel_time"]].copy()
    out["data_type"] = grouped.first(fill_text(inst["compute_dtype"], inst["dtypes"]))
    out["input_shapes"] = grouped.first(inst["input_shapes"])
    out["flops"] = g["flops"].sum(min_count=1).array
    out["bytes"] = g["bytes"].sum(min_count=1).array
    out["tc_utilization"] = metrics.tc_utilization(sums["el_tc"], sums["el_k"]).to_numpy()
    out["achieved_tflops"] = metrics.achieved_tflops(sums["f_known"], sums["t_known"]).to_numpy()
    efficiency = metrics.flop_efficiency(sums["f_rated"], sums["tp_rated"])
    out["flop_efficiency_pct"] = efficiency.to_numpy()
    return out
