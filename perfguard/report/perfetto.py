"""Export an analysed capture as a Chrome trace (JSON) that ui.perfetto.dev opens.

Why: the DLProf tables say *which* op is slow; a timeline says *when* and
what the GPU was doing around it. The export carries perfguard's
attribution into the timeline, so a kernel slice says which op launched
it, in which iteration, whether it used Tensor Cores and the op's FLOPs.

Layout (Chrome Trace Event Format, the subset Perfetto's JSON importer reads):

* one process per host process (``rank R pid P``) with its threads; every
  range is a complete (``X``) slice on its thread, attributed ops with
  ``op_name``, ``op_id``, ``direction``, ``iteration``, ``tc_eligible``,
  ``uses_tc``, ``flops`` in ``args``; ranges closed on another thread
  (``async``) are ``b``/``e`` pairs, since they need not nest;
* one process per GPU (``rank R GPU D``), one thread per stream: kernels and
  memcpy/memset, with the owning op, ``op_id``, ``iteration``, ``uses_tc``,
  ``tc_reason``, the op's ``op_flops`` and the correlation id in ``args``;
* one process per rank for the iterations perfguard used (``ProfilerStep``,
  ``perfguard.iteration`` or key-node intervals), a track of their own;
* a flow (``s`` on the launching thread at the launch, ``f`` bound to the
  kernel) from each op to every kernel it launched.

Timestamps are microseconds written with exactly three decimals (the
nanoseconds, as text, never through a float), counted from the earliest
exported event (``otherData.time_origin_ns`` holds it): absolute Kineto
times have 16 significant digits, more than a double holds.

Built column-wise: every field of every event is a numpy string array
(``StringDType``) concatenated with ``np.strings.add``; names are
JSON-quoted once per distinct value. No Python object or call per event.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from functools import reduce
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
from numpy.dtypes import StringDType

from perfguard.analysis import Analysis
from perfguard.arrays import factorize, unique_first
from perfguard.errors import PerfguardError

__all__ = ["FORMAT", "perfetto_path", "render_perfetto", "write_perfetto"]

#: the ``--formats`` value
FORMAT = "perfetto"
_S = StringDType()


def perfetto_path(out_dir: str | Path, base: str) -> Path:
    """Where ``--formats perfetto`` writes: ``<out_dir>/<base>_perfetto.json.gz``."""
    return Path(out_dir) / f"{base}_perfetto.json.gz"


def write_perfetto(analysis: Analysis, path: str | Path) -> Path:
    """Write the trace to ``path`` (gzip-compressed when it ends in ``.gz``), atomically,
    streaming: events are rendered and written a chunk of rows at a time."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.suffix == ".gz":
            # level 1: 3x faster than 6 on these files for 40% more bytes (measured on the
            # ResNet-50 fixture's export: 0.82 vs 0.59 MB); the export is I/O of millions of lines
            with gzip.GzipFile(tmp, "wb", compresslevel=1, mtime=0) as fh:
                _write(analysis, fh)
        else:
            with open(tmp, "wb") as fh:
                _write(analysis, fh)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PerfguardError(f"{path}: cannot write trace ({exc.strerror})") from None
    return path


def render_perfetto(analysis: Analysis) -> bytes:
    """The Chrome-trace JSON of ``analysis`` (UTF-8), in memory."""
    out = io.BytesIO()
    _write(analysis, out)
    return out.getvalue()


#: rows rendered at a time: bounds the string arrays held at once (a few hundred MB)
CHUNK_ROWS = 200_000


def _write(analysis: Analysis, fh: BinaryIO | gzip.GzipFile) -> None:
    trace = analysis.trace
    origin = _origin(trace.ranges, analysis.activities, analysis.window)
    other = {
        "source": str(trace.meta.get("path", "")),
        "format": str(trace.meta.get("format", "")),
        "time_origin_ns": origin,
        "exporter": "perfguard",
    }
    fh.write(
        (
            '{"displayTimeUnit":"ns","otherData":'
            + json.dumps(other, separators=(",", ":"))
            + ',"traceEvents":[\n'
        ).encode("utf-8")
    )
    sep = ""
    for lines in _events(analysis, origin):
        if len(lines):
            fh.write((sep + ",\n".join(lines.tolist())).encode("utf-8"))
            sep = ",\n"
    fh.write(b"\n]}\n")


def _events(analysis: Analysis, origin: int) -> Iterator[np.ndarray]:
    """The trace's events as arrays of JSON lines, a chunk of rows at a time."""
    trace, window, inst = analysis.trace, analysis.window, analysis.instances
    acts = _with_tracks(analysis.activities)
    procs = _Processes(trace, acts, window)
    ranges = trace.ranges.sort_values(["start", "end"], ascending=[True, False], kind="stable")
    for chunk in _chunks(ranges):
        yield _range_events(chunk, inst, procs, origin)
    for chunk in _chunks(acts):
        yield _gpu_events(chunk, inst, procs, origin)
        yield _flow_events(chunk, procs, origin)
    yield _iteration_events(window, procs, origin)
    yield procs.metadata()


def _chunks(frame: pd.DataFrame) -> Iterator[pd.DataFrame]:
    for at in range(0, len(frame), CHUNK_ROWS):
        yield frame.iloc[at : at + CHUNK_ROWS]


# ---- string columns ---------------------------------------------------------------------------


def _cat(*parts: object) -> np.ndarray:
    """Concatenate string arrays and constants element-wise."""
    arrays: list[Any] = [p if isinstance(p, str) else np.asarray(p, _S) for p in parts]
    return reduce(np.strings.add, arrays)


def _int(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).astype(_S)


def _us(ns: np.ndarray) -> np.ndarray:
    """Nanoseconds -> microseconds text with exactly three decimals (no float)."""
    ns = np.asarray(ns, dtype=np.int64)
    whole = (ns // 1000).astype(_S)
    frac = np.strings.slice((ns % 1000 + 1000).astype(_S), 1, None)
    return _cat(whole, ".", frac)


def _quoted(values: pd.Series | np.ndarray) -> np.ndarray:
    """JSON string literals, encoded once per distinct value (None -> ``null``)."""
    codes, uniques = factorize(pd.Series(values, dtype=object), use_na_sentinel=True)
    text = [json.dumps(str(u), ensure_ascii=False) for u in uniques] + ["null"]
    return np.asarray(text, dtype=_S)[np.where(codes >= 0, codes, len(uniques))]


def _nullable_int(values: pd.Series) -> np.ndarray:
    s = pd.Series(values).astype("Int64")
    return np.where(s.isna().to_numpy(), "null", s.fillna(0).to_numpy(np.int64).astype(_S))


def _nullable_bool(values: pd.Series) -> np.ndarray:
    s = pd.Series(values).astype("boolean")
    text = np.where(s.fillna(False).to_numpy(bool), "true", "false")
    return np.where(s.isna().to_numpy(), "null", text).astype(_S)


def _nullable_float(values: pd.Series) -> np.ndarray:
    f = pd.Series(values).astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    return np.where(np.isfinite(f), f.astype(_S), "null").astype(_S)


def _take(column: pd.Series, rows: np.ndarray) -> pd.Series:
    """``column`` at positions ``rows`` (-1 -> missing)."""
    return pd.Series(pd.api.extensions.take(column.array, rows, allow_fill=True))


# ---- processes and threads --------------------------------------------------------------------


class _Processes:
    """Chrome-trace pids: host processes, then GPUs, then one iteration track per rank."""

    def __init__(self, trace, acts: pd.DataFrame, window: pd.DataFrame) -> None:
        r = trace.ranges
        host = pd.concat(
            [r[["rank", "pid"]], acts.loc[acts["launch_tid"].notna(), ["rank", "pid"]]]
        ).drop_duplicates()
        self.host = host.sort_values(["rank", "pid"]).reset_index(drop=True)
        self.host["id"] = np.arange(1, len(self.host) + 1)
        gpus = acts[["rank", "device_id"]].drop_duplicates().sort_values(["rank", "device_id"])
        self.gpus = gpus.reset_index(drop=True)
        self.gpus["id"] = np.arange(len(self.gpus)) + len(self.host) + 1
        ranks = sorted(set(window["rank"]))
        first = len(self.host) + len(self.gpus) + 1
        self.iter_pid = {rank: first + i for i, rank in enumerate(ranks)}
        self.threads = trace.threads
        self.devices = trace.devices
        self.host_threads = (
            pd.concat(
                [
                    r[["rank", "pid", "tid"]],
                    acts.loc[acts["launch_tid"].notna(), ["rank", "pid", "launch_tid"]].rename(
                        columns={"launch_tid": "tid"}
                    ),
                ]
            )
            .astype(np.int64)
            .drop_duplicates()
        )
        self.streams = acts[["rank", "device_id", "stream_id", "track"]].drop_duplicates()

    def host_pid(self, rank: pd.Series, pid: pd.Series) -> np.ndarray:
        return _lookup(self.host, ["rank", "pid"], {"rank": rank, "pid": pid})

    def gpu_pid(self, rank: pd.Series, device: pd.Series) -> np.ndarray:
        return _lookup(self.gpus, ["rank", "device_id"], {"rank": rank, "device_id": device})

    def metadata(self) -> np.ndarray:
        """``M`` events naming every process and thread, GPUs sorted after the host."""
        out = []
        multi = self.host["rank"].nunique() > 1 or len(self.gpus["rank"].unique()) > 1

        def rank_text(ranks: pd.Series) -> pd.Series:
            return "rank " + ranks.astype(str) + " " if multi else pd.Series("", index=ranks.index)

        h = self.host
        out.append(_meta_process(h["id"], rank_text(h["rank"]) + "pid " + h["pid"].astype(str), 0))
        dev = self.devices.drop_duplicates(["rank", "device_id"])
        g = self.gpus.merge(
            dev[["rank", "device_id", "name"]], on=["rank", "device_id"], how="left"
        )
        label = rank_text(g["rank"]) + "GPU " + g["device_id"].astype(str)
        label = label.where(g["name"].isna(), label + " (" + g["name"].astype(str) + ")")
        out.append(_meta_process(g["id"], label, 1))
        if self.iter_pid:
            ranks = pd.Series(list(self.iter_pid))
            ids = pd.Series(list(self.iter_pid.values()))
            out.append(_meta_process(ids, rank_text(ranks) + "iterations", 2))
            out.append(
                _meta_thread(
                    ids, pd.Series(1, index=ids.index), pd.Series("iterations", index=ids.index)
                )
            )
        # host threads, named as the capture names them
        t = self.host_threads.merge(self.threads, on=["rank", "pid", "tid"], how="left")
        t = t.drop_duplicates(["rank", "pid", "tid"])
        names = t["name"].where(t["name"].notna(), "thread " + t["tid"].astype(str))
        out.append(_meta_thread(pd.Series(self.host_pid(t["rank"], t["pid"])), t["tid"], names))
        s = self.streams
        lane = s["track"] // _LANE
        stream = "stream " + s["stream_id"].astype(str)
        label = stream.where(lane == 0, stream + " (overlap " + lane.astype(str) + ")")
        out.append(
            _meta_thread(pd.Series(self.gpu_pid(s["rank"], s["device_id"])), s["track"], label)
        )
        return np.concatenate(out)


def _lookup(table: pd.DataFrame, keys: list[str], values: dict[str, Any]) -> np.ndarray:
    probe = pd.DataFrame({k: np.asarray(v, dtype=np.int64) for k, v in values.items()})
    return probe.merge(table, on=keys, how="left")["id"].fillna(0).to_numpy(np.int64)


def _meta_process(pid: pd.Series, name: pd.Series, sort: int) -> np.ndarray:
    pid_s = _int(pid)
    names = _cat(
        '{"ph":"M","name":"process_name","pid":',
        pid_s,
        ',"tid":0,"args":{"name":',
        _quoted(name.to_numpy(dtype=object)),
        "}}",
    )
    order = _cat(
        '{"ph":"M","name":"process_sort_index","pid":',
        pid_s,
        ',"tid":0,"args":{"sort_index":',
        _int(pid + sort * 1_000_000),
        "}}",
    )
    return np.concatenate([names, order])


def _meta_thread(pid: pd.Series, tid: pd.Series, name: pd.Series | str) -> np.ndarray:
    names = name.to_numpy(dtype=object) if isinstance(name, pd.Series) else [name] * len(pid)
    return _cat(
        '{"ph":"M","name":"thread_name","pid":',
        _int(pid),
        ',"tid":',
        _int(tid),
        ',"args":{"name":',
        _quoted(np.asarray(names, dtype=object)),
        "}}",
    )


# ---- events -----------------------------------------------------------------------------------


def _origin(ranges: pd.DataFrame, acts: pd.DataFrame, window: pd.DataFrame) -> int:
    starts = [t["start"].min() for t in (ranges, acts, window) if len(t)]
    launches = acts["launch_start"].dropna() if len(acts) else pd.Series([], dtype="Int64")
    if len(launches):
        starts.append(launches.min())
    return int(min(starts)) if starts else 0


def _range_events(
    ranges: pd.DataFrame, inst: pd.DataFrame, procs: _Processes, origin: int
) -> np.ndarray:
    """CPU ranges: ``X`` slices (``b``/``e`` for async ones), attributed from the instances."""
    if not len(ranges):
        return np.array([], dtype=_S)
    r = ranges  # sorted by start, longest first (parents before children)
    own = inst[inst["instance"] >= 0]
    at = pd.Index(own["instance"].to_numpy()).get_indexer(r["range_id"].to_numpy())
    fields = pd.DataFrame(
        {
            "name": r["name"].to_numpy(dtype=object),
            "kind": r["kind"].astype(str).to_numpy(),
            "direction": r["direction"].to_numpy(dtype=object),
            "call_site": r["call_site"].to_numpy(dtype=object),
            **{
                c: _take(own[c], at).array
                for c in ("op_name", "op_id", "iteration", "tc_eligible", "uses_tc", "flops")
            },
        },
    )

    spec = (
        ("iteration", _nullable_int),
        ("direction", _quoted),
        ("tc_eligible", _nullable_bool),
        ("uses_tc", _nullable_bool),
        ("flops", _nullable_float),
        ("op_id", _quoted),
        ("call_site", _quoted),
        ("op_name", _quoted),
    )
    static = _per_distinct(fields, lambda f: _closing_fields(f, spec))
    where = _cat(
        ',"pid":',
        _int(procs.host_pid(r["rank"], r["pid"])),
        ',"tid":',
        _int(r["tid"]),
        ',"args":{"range_id":',
        _int(r["range_id"]),
    )
    start = r["start"].to_numpy(np.int64)
    end = r["end"].to_numpy(np.int64)
    asyn = (r["kind"] == "async").to_numpy(bool)
    sync = ~asyn
    slices = _cat(
        _cat(
            '{"ph":"X","ts":',
            _us(start[sync] - origin),
            ',"dur":',
            _us(end[sync] - start[sync]),
            where[sync],
        ),
        static[sync],
    )
    if not asyn.any():
        return slices
    ident = _int(r["range_id"].to_numpy()[asyn])
    events = [slices]
    for ph, t in (("b", start[asyn]), ("e", end[asyn])):
        head = _cat('{"ph":"', ph, '","id":', ident, ',"ts":', _us(t - origin), where[asyn])
        events.append(_cat(head, static[asyn]))
    return np.concatenate(events)


def _closing_fields(f: pd.DataFrame, spec: tuple[Any, ...]) -> np.ndarray:
    """The tail of an event: ``args`` fields (``(key, formatter)`` pairs, long text last),
    the closing brace, ``cat`` (``kind``) and ``name``."""
    parts: list[Any] = []
    for key, fmt in spec:
        parts += [f',"{key}":', fmt(f[key])]
    return _cat(*parts, '},"cat":', _quoted(f["kind"]), ',"name":', _quoted(f["name"]), "}")


def _per_distinct(fields: pd.DataFrame, text) -> np.ndarray:
    """``text(rows)`` built once per distinct row of ``fields`` and taken back per row:
    names, attribution and reasons repeat across millions of events."""
    codes = np.zeros(len(fields), dtype=np.int64)
    for col in fields.columns:  # one code per column, combined and renumbered
        values = fields[col]
        u: np.ndarray | pd.Index
        if values.dtype == object:
            c, u = factorize(values, use_na_sentinel=False)
        else:
            c, u = pd.factorize(values, use_na_sentinel=False)
        codes, _ = pd.factorize(codes * (len(u) + 1) + c)
    _, first = unique_first(codes)
    return text(fields.iloc[first].reset_index(drop=True))[codes]


#: tid stride of the extra lanes of a stream (stream 7's overlap lane 1 is tid 1_000_007)
_LANE = 1_000_000
#: lanes assigned by vectorised passes; a stream needing more is finished first-fit
_VECTOR_LANES = 4


def _with_tracks(acts: pd.DataFrame) -> pd.DataFrame:
    """``acts`` sorted by start with a ``track`` (Chrome tid) per activity: its stream,
    or an overlap lane of it for work that overlaps earlier work on that stream
    (programmatic dependent launch, a memcpy beside a kernel): slices on one
    track must nest. One vectorised pass per lane, not a loop per activity.
    """
    a = acts.sort_values(["start", "end"], ascending=[True, False], kind="stable")
    a = a.reset_index(drop=True)
    track = a["stream_id"].to_numpy(np.int64).copy()
    if not len(a):
        a["track"] = track
        return a
    key = pd.MultiIndex.from_frame(a[["rank", "device_id", "stream_id"]]).factorize()[0]
    start, end = a["start"].to_numpy(np.int64), a["end"].to_numpy(np.int64)
    left = np.arange(len(a))
    lane = 0
    while len(left) and lane < _VECTOR_LANES:
        order = left[np.lexsort((start[left], key[left]))]  # by stream, then start
        k = key[order]
        first = np.r_[True, k[1:] != k[:-1]]
        # the latest end among the earlier activities of the same stream in this pass
        running = pd.Series(end[order]).groupby(k).cummax().to_numpy(np.int64)
        prev = np.r_[0, running[:-1]]
        fits = first | (start[order] >= prev)
        track[order[fits]] += lane * _LANE
        left = order[~fits]
        lane += 1
    # what is left (long chains of overlapping work, rare) goes first-fit into further
    # lanes; a loop over these few activities only
    free: dict[int, list[int]] = {}  # stream -> end of each further lane
    for i in left[np.argsort(start[left], kind="stable")]:
        ends = free.setdefault(int(key[i]), [])
        at = next((j for j, e in enumerate(ends) if e <= start[i]), len(ends))
        ends[at : at + 1] = [int(end[i])]
        track[i] += (_VECTOR_LANES + at) * _LANE
    a["track"] = track
    return a


def _gpu_events(
    acts: pd.DataFrame, inst: pd.DataFrame, procs: _Processes, origin: int
) -> np.ndarray:
    """Kernels and memops on their GPU's stream tracks, with their op's attribution."""
    if not len(acts):
        return np.array([], dtype=_S)
    a = acts  # sorted by start by _with_tracks
    rows = a["instance_row"].to_numpy(np.int64)
    flops = _take(inst["flops"], rows).array if "flops" in inst else [pd.NA] * len(a)
    fields = pd.DataFrame(
        {
            "name": a["name"].to_numpy(dtype=object),
            "kind": a["activity"].astype(str).to_numpy(),
            "op_name": a["op_name"].to_numpy(dtype=object),
            "op_id": a["op_id"].to_numpy(dtype=object),
            "direction": a["direction"].to_numpy(dtype=object),
            "uses_tc": a["uses_tc"].array,
            "tc_reason": a["tc_reason"].to_numpy(dtype=object),
            "op_flops": flops,
            "iteration": a["iteration"].array,
        }
    )

    spec = (
        ("iteration", _nullable_int),
        ("uses_tc", _nullable_bool),
        ("op_flops", _nullable_float),
        ("direction", _quoted),
        ("op_id", _quoted),
        ("tc_reason", _quoted),
        ("op_name", _quoted),
    )

    start = a["start"].to_numpy(np.int64)
    head = _cat(
        '{"ph":"X","ts":',
        _us(start - origin),
        ',"dur":',
        _us(a["end"].to_numpy(np.int64) - start),
        ',"pid":',
        _int(procs.gpu_pid(a["rank"], a["device_id"])),
        ',"tid":',
        _int(a["track"]),
        ',"args":{"correlation":',
        _int(a["correlation_id"]),
        ',"bytes":',
        _nullable_int(a["bytes"]),
    )
    return _cat(head, _per_distinct(fields, lambda f: _closing_fields(f, spec)))


def _flow_events(acts: pd.DataFrame, procs: _Processes, origin: int) -> np.ndarray:
    """A flow from the launching op (at the launch call) to each kernel it launched."""
    owned = (acts["range_id"].to_numpy() >= 0) & acts["launch_start"].notna().to_numpy()
    owned &= acts["launch_tid"].notna().to_numpy()
    a = acts[owned]
    if not len(a):
        return np.array([], dtype=_S)
    ident = _int(a.index.to_numpy() + 1)  # the activity's row in the whole table: unique
    head = _cat(',"id":', ident, ',"cat":"launch","name":"launch"')
    launch = a["launch_start"].to_numpy(np.int64)
    s = _cat(
        '{"ph":"s","ts":',
        _us(launch - origin),
        ',"pid":',
        _int(procs.host_pid(a["rank"], a["pid"])),
        ',"tid":',
        _int(a["launch_tid"].to_numpy(np.int64)),
        head,
        "}",
    )
    f = _cat(
        '{"ph":"f","bp":"e","ts":',
        _us(a["start"].to_numpy(np.int64) - origin),
        ',"pid":',
        _int(procs.gpu_pid(a["rank"], a["device_id"])),
        ',"tid":',
        _int(a["track"]),
        head,
        "}",
    )
    return np.concatenate([s, f])


def _iteration_events(window: pd.DataFrame, procs: _Processes, origin: int) -> np.ndarray:
    """The iterations the analysis used, on a track of their own per rank."""
    if not len(window):
        return np.array([], dtype=_S)
    w = window.sort_values(["rank", "start"])
    start = w["start"].to_numpy(np.int64)
    pid = np.array([procs.iter_pid[r] for r in w["rank"].unique()], dtype=np.int64)
    pid = pid[pd.factorize(w["rank"])[0]]  # one entry per rank, mapped back by code
    return _cat(
        '{"ph":"X","ts":',
        _us(start - origin),
        ',"dur":',
        _us(w["end"].to_numpy(np.int64) - start),
        ',"pid":',
        _int(pid),
        ',"tid":1,"cat":"iteration","name":',
        _quoted(("iteration " + w["iteration"].astype(str)).to_numpy(dtype=object)),
        ',"args":{"iteration":',
        _int(w["iteration"]),
        ',"source":',
        _quoted(w["source"].astype(str).to_numpy(dtype=object)),
        "}}",
    )
