"""Reader for TensorFlow / JAX / XProf profiles: XSpace protobuf and XProf's trace JSON.

``tf.profiler.experimental``, Keras' ``TensorBoard(profile_batch=...)`` and
``jax.profiler.trace`` write ``<logdir>/plugins/profile/<run>/<host>.xplane.pb``
(an ``XSpace``: planes ``/host:CPU``, ``/host:CUPTI``, ``/device:GPU:N``;
each plane holds lines (threads, streams) of events whose names and stats
live in per-plane metadata tables). ``jax.profiler.trace(...,
create_perfetto_trace=True)`` adds ``perfetto_trace.json.gz``, the same
events as Chrome-trace JSON (planes as processes, lines as threads, stats
as string ``args``). Both become one event table here, then one Trace.

What becomes what:

* **iterations**: an event with a ``step_num`` stat (``tf.profiler.experimental.Trace(name,
  step_num=N)``, ``jax.profiler.StepTraceAnnotation``, Keras' train steps) is the
  range ``ProfilerStep#N`` (the analysis numbers iterations by N; the
  annotation's own name is kept in ``domain``);
* **ops** (``ranges``, kind ``op``): TensorFlow op kernels (TraceMe ``node:Type``,
  ``category`` ``tf_op``, name the node, ``op_type`` the type; an eager op is
  its ``EagerExecute`` event, named by its ``eager_op`` stat), XLA HLO ops
  (an ``hlo_op`` stat; ``category`` ``hlo_op``, name ``<module>::<hlo op>``,
  ``op_type`` the name without its ``.N`` suffix) and ``tf.function`` calls
  (``category`` ``tf_function``). The runtime's own TraceMe events
  (``EagerExecute``, ``ExecutorState::Process``, thread-pool markers) and
  Python-tracer frames are left out: which thread runs them changes from
  run to run, so as ops they would make call counts differ between equal runs;
* **GPU work**: events on ``/device:GPU:N`` planes that carry a ``correlation_id``
  stat are kernels (``kernel_details`` gives registers, shared memory, grid,
  block) or, named ``Memcpy*``/``Memset*`` or with ``memcpy_details``, memops;
  ``/host:CUPTI`` events with a ``correlation_id`` are the launching API calls
  (their line id is the launching thread, as on ``/host:CPU``), so the
  analysis's correlation-id attribution applies unchanged.

Times: XSpace event start = line ``timestamp_ns`` + ``offset_ps`` (ps), so
nanoseconds are ``timestamp_ns + offset_ps // 1000`` (no ps sum overflows).
The protobuf is decoded by the ``protobuf`` package's C parser with
classes declared in :mod:`perfguard.trace.xspace_proto`; per event only
three integers are read in Python, stats only for events that carry them.
"""

from __future__ import annotations

import gzip
import itertools
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.arrays import NONE, factorize, not_none, per_distinct
from perfguard.errors import TraceError
from perfguard.trace.environments import from_xspace
from perfguard.trace.hlo_proto import range_costs, space_costs
from perfguard.trace.kineto import _MALFORMED, _check_plain, _us_to_ns
from perfguard.trace.kineto_stream import read_plain
from perfguard.trace.model import (
    NO_CORRELATION,
    Trace,
    coded_text,
    concat_tables,
    merged_environment,
)
from perfguard.trace.names import ITERATION_NAMES
from perfguard.trace.ranges import finalize_ranges
from perfguard.trace.site_pass import apply_sites, read_sites, site_details
from perfguard.trace.tf_graph import with_graph_facts
from perfguard.trace.tf_names import op_identities
from perfguard.trace.xevents import DOUBLE_KIND, REF_KIND, TEXT_KINDS, Events, decode_events
from perfguard.trace.xspace_proto import message_class, xspace_class

__all__ = ["find_xplanes", "is_xprof_json", "read_xplane", "read_xplane_dir", "read_xprof_json"]

#: stats the reader keeps; every other stat is skipped without decoding its value
STATS = (
    "step_num",
    "hlo_op",
    "hlo_module",
    "tf_function_call",
    "eager_op",
    "is_func",
    "correlation_id",
    "kernel_details",
    "memcpy_details",
    "tf_op",
    "program_id",
)
_EVENT_COLUMNS = ["plane", "line", "name", "display_name", "start", "end", *STATS]
_TF_OP = re.compile(r"^(?P<node>[^:\s]+):(?P<type>_?[A-Z][A-Za-z0-9_]*)$")
_HLO_SUFFIX = re.compile(r"\.\d+$")
_DEVICE_PLANE = re.compile(r"^/device:GPU:(\d+)")
_KERNEL_DETAIL = re.compile(r"(\w+):([\d,]+)")
_XPROF_JSON_SNIFF = re.compile(rb'"name"\s*:\s*"/(?:host|device):')
HOST_PLANE, CUPTI_PLANE = "/host:CPU", "/host:CUPTI"


# ---------------------------------------------------------------------------------------------
# decoding: XSpace protobuf -> event table


def read_xplane(path: str | Path) -> Trace:
    """Read one ``*.xplane.pb`` (an XSpace) into a Trace."""
    path = Path(path)
    space = _parse(path)
    events, planes = _xspace_events(space)
    if events.empty:
        raise TraceError(path, f"XSpace holds no events (planes: {_plane_list(planes)})")
    meta = {
        "format": "xplane",
        "version": "xspace",
        "path": str(path),
        "hostnames": list(space.hostnames),
    }
    meta.update(_versions(planes))
    if space.errors:
        meta["profiler_errors"] = list(space.errors)[:20]
    costs = space_costs(space, _programs_run(events))
    trace = _with_graph_sites(path, _with_xla_costs(_checked(path, events, planes, meta), costs))
    return _with_op_identities(with_graph_facts(path, trace))


def _with_op_identities(trace: Trace) -> Trace:
    """TensorFlow ops named by their identity across sessions
    (:func:`perfguard.trace.tf_names.op_identities`: ``sequential_5/dense_1_2/BiasAdd`` ->
    ``sequential/dense/BiasAdd``), the node name kept in ``node_name``. After the call sites
    and the graph's shapes, which are tied to the node names."""
    r = trace.ranges
    names = r["name"].astype(object).to_numpy()
    r["node_name"] = pd.Series(names, index=r.index, dtype=object)
    tf = (r["category"] == "tf_op").to_numpy(bool)
    if tf.any():
        names = names.copy()
        names[tf] = op_identities(pd.Series(names[tf], dtype=object)).to_numpy(dtype=object)
        r["name"] = coded_text(names)
    return trace


def _with_graph_sites(path: Path, trace: Trace) -> Trace:
    """TensorFlow graph ops with the line that created them, where the capture wrote them
    beside it (:func:`perfguard.capture.tensorflow.graph_sites`)."""
    found = read_sites(path, trace.notes)
    if found is None:
        return trace
    trace.ranges = apply_sites(trace.ranges, found, trace.notes)
    trace.ranges["call_site"] = coded_text(trace.ranges["call_site"].astype(object).to_numpy())
    trace.meta["site_details"] = site_details(found)
    return trace


def _programs_run(events: pd.DataFrame) -> set[tuple[str, int]]:
    """``(HLO module, program id)`` of the XLA ops the capture holds."""
    if "program_id" not in events or "hlo_module" not in events:
        return set()
    pid = pd.to_numeric(events["program_id"], errors="coerce")
    pairs = pd.DataFrame({"m": events["hlo_module"], "p": pid})
    pairs = pairs[pairs["m"].notna() & pairs["p"].notna()].drop_duplicates()
    return {(str(m), int(p)) for m, p in pairs.itertuples(index=False)}


def _with_xla_costs(trace: Trace, costs: dict[str, Any]) -> Trace:
    """HLO ops get the FLOPs of their instruction (``xla_flops``, from the module's HLO in
    the capture: :mod:`perfguard.trace.hlo_proto`), its source line where XLA kept one, and,
    for a fusion or call, what it holds in its ``op_type`` (``fusion (dot, add, maximum)``)."""
    r = trace.ranges
    if not costs or r.empty:
        return trace
    hlo = (r["category"] == "hlo_op").to_numpy(bool) if "category" in r else np.zeros(len(r), bool)
    flops = np.full(len(r), np.nan)
    if hlo.any():
        f, site, held = range_costs(r["name"].astype(object).to_numpy()[hlo], costs)
        flops[hlo] = f
        if not_none(held).any():  # a fusion's type says what it holds: fusion (dot, add)
            kind = r["op_type"].astype(object).to_numpy().copy()
            has = np.flatnonzero(hlo)[not_none(held)]
            kind[has] = [f"{k} ({h})" for k, h in zip(kind[has], held[not_none(held)], strict=True)]
            r["op_type"] = coded_text(kind)
        if "call_site" in r and not_none(site).any():
            cs = r["call_site"].astype(object).to_numpy().copy()
            cs[hlo] = np.where(not_none(site), site, cs[hlo])
            r["call_site"] = coded_text(cs)
    r["xla_flops"] = flops
    return trace


def _parse(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(path, f"cannot read file ({exc.strerror or exc})") from None
    if not raw:
        raise TraceError(path, "file is empty")
    space = xspace_class(raw_events=True)()
    try:
        space.ParseFromString(raw)
    except Exception as exc:  # noqa: BLE001 - google.protobuf.message.DecodeError and kin
        raise TraceError(
            path, f"not an XSpace protobuf, truncated or corrupt ({type(exc).__name__}: {exc})"
        ) from None
    if not space.planes:
        raise TraceError(path, "not a profiler XSpace: no planes (an empty or foreign protobuf?)")
    return space


def _plane_list(planes: dict[str, dict[str, Any]]) -> str:
    return ", ".join(sorted(planes)) or "none"


def _xspace_events(space: Any) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """Every event of every plane as one table, and each plane's own stats by name."""
    parts: list[pd.DataFrame] = []
    planes: dict[str, dict[str, Any]] = {}
    for plane in space.planes:
        stat_names = {e.key: e.value.name for e in plane.stat_metadata}
        planes[plane.name] = _stats(plane.stats, set(stat_names), stat_names)
        lines = [ln for ln in plane.lines if len(ln.events)]
        if lines:
            parts.append(_plane_events(plane, lines, stat_names))
    if not parts:
        return pd.DataFrame(columns=[*_EVENT_COLUMNS, "line_name"]), planes
    events = pd.concat(parts, ignore_index=True)
    # few distinct planes over millions of events: every "which plane" test compares codes
    events["plane"] = events["plane"].astype("category")
    return events, planes


def _plane_events(plane: Any, lines: list[Any], stat_names: dict[int, str]) -> pd.DataFrame:
    """One plane's events: decoded together (:mod:`perfguard.trace.xevents`), then named."""
    counts = np.fromiter((len(ln.events) for ln in lines), np.int64, len(lines))
    ev = decode_events(itertools.chain.from_iterable(ln.events for ln in lines))
    wanted = {k: v for k, v in stat_names.items() if v in STATS}
    repaired = _redecode(ev, lines, set(wanted), stat_names) if ev.bad.any() else {}
    line_of = np.repeat(np.arange(len(lines)), counts)
    base_ns = np.fromiter((ln.timestamp_ns for ln in lines), np.int64, len(lines))[line_of]
    emeta = {e.key: e.value for e in plane.event_metadata}
    md_ids = np.fromiter(emeta, np.int64, len(emeta))
    order = np.argsort(md_ids)
    md_ids = md_ids[order]
    slot = np.append(order, len(order))  # one slot past the end: missing metadata gets ""
    md_name = np.array([m.name for m in emeta.values()] + [""], dtype=object)[slot]
    md_display = np.array([m.display_name for m in emeta.values()] + [""], dtype=object)[slot]
    pos = np.searchsorted(md_ids, ev.metadata_id)
    found = pos < len(md_ids)
    found[found] = md_ids[pos[found]] == ev.metadata_id[found]
    pos = np.where(found, pos, len(md_ids))
    line_ids = np.fromiter((ln.id for ln in lines), np.int64, len(lines))
    line_names = np.array([ln.display_name or ln.name for ln in lines], dtype=object)
    n = len(pos)
    df = pd.DataFrame(
        {
            "plane": _text(np.full(n, plane.name, dtype=object)),
            "line": line_ids[line_of],
            "line_name": _text(line_names[line_of]),
            "name": _text(md_name[pos]),
            "display_name": _text(md_display[pos]),
            "start": base_ns + ev.offset_ps // 1000,
            "end": base_ns + (ev.offset_ps + ev.duration_ps) // 1000,
        },
        copy=False,
    )
    # metadata stats are every event's defaults; the event's own stats override them
    md_stats = {k: _stats(m.stats, set(wanted), stat_names) for k, m in emeta.items() if m.stats}
    md_of = np.append(md_ids, -1)[pos]
    for name in STATS:
        col = np.full(len(df), None, dtype=object)
        defaults = {k: v[name] for k, v in md_stats.items() if name in v}
        if defaults:
            keys = np.fromiter(defaults, np.int64, len(defaults))
            hit = np.isin(md_of, keys)
            col[hit] = pd.Series(md_of[hit]).map(defaults).to_numpy(object)
        ids = [k for k, v in wanted.items() if v == name]
        rows = np.flatnonzero(np.isin(ev.stats.metadata_id, ids)) if ids else np.zeros(0, int)
        if len(rows):
            col[ev.stats.event[rows]] = _stat_values(ev, rows, stat_names)
        for i, own in repaired.items():
            if name in own:
                col[i] = own[name]
        df[name] = _text(col)
    return df


def _text(values: np.ndarray) -> pd.Series:
    """Keep object dtype: pandas 3 would convert every string column to its string dtype,
    a copy of millions of names that the lookups then pay for again."""
    return pd.Series(values, dtype=object, copy=False)


def _stat_values(ev: Events, rows: np.ndarray, stat_names: dict[int, str]) -> np.ndarray:
    """The values of stat ``rows``: ints, refs resolved to their names, strings, doubles."""
    kind, value = ev.stats.kind[rows], ev.stats.value[rows]
    out = value.astype(object)
    ref = kind == REF_KIND
    if ref.any():
        out[ref] = pd.Series(value[ref]).map(stat_names).fillna("").to_numpy(object)
    text = np.isin(kind, TEXT_KINDS)
    if text.any():
        out[text] = ev.text(rows[text])
    dbl = kind == DOUBLE_KIND
    if dbl.any():
        out[dbl] = value[dbl].view(np.float64).astype(object)
    return out


def _redecode(
    ev: Events, lines: list[Any], wanted: set[int], stat_names: dict[int, str]
) -> dict[int, dict[str, Any]]:
    """Events the vectorised pass could not read (fields out of the usual order): decoded
    one by one with protobuf; returns their wanted stats by event index."""
    xevent = message_class("XEvent")
    flat = [b for ln in lines for b in ln.events]
    found = {}
    for i in np.flatnonzero(ev.bad):
        e = xevent.FromString(flat[i])
        ev.metadata_id[i], ev.offset_ps[i], ev.duration_ps[i] = (
            e.metadata_id,
            e.offset_ps,
            e.duration_ps,
        )
        found[int(i)] = _stats(e.stats, wanted, stat_names)
    # the vectorised pass may have read a stat or two of these before it lost its way
    stale = np.isin(ev.stats.event, np.flatnonzero(ev.bad))
    ev.stats.metadata_id[stale] = -1
    return found


def _stats(stats: Any, wanted: set[int], names: dict[int, str]) -> dict[str, Any]:
    """The ``wanted`` stats of one event or metadata entry, by name; refs resolved."""
    out: dict[str, Any] = {}
    for s in stats:
        if s.metadata_id not in wanted:
            continue
        kind = s.WhichOneof("value")
        if kind == "ref_value":
            value: Any = names.get(s.ref_value, "")
        elif kind == "bytes_value":
            continue  # opaque (profile options, HLO protos): nothing the tables use
        else:
            value = getattr(s, kind) if kind else 0
        out[names[s.metadata_id]] = value
    return out


def _versions(planes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Framework versions the capture recorded (JAX's ``/host:metadata`` plane)."""
    info = planes.get("/host:metadata", {})
    keys = ("jax_version", "jaxlib_version", "cpu_version", "process_id")
    return {k: info[k] for k in keys if k in info}


# ---------------------------------------------------------------------------------------------
# decoding: XProf trace JSON (``perfetto_trace.json.gz``, ``<host>.trace.json.gz``)


def is_xprof_json(path: Path) -> bool:
    """True for XProf's Chrome-trace JSON: its processes are named like planes (``/host:CPU``)."""
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rb") if gz else open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except (OSError, EOFError, zlib.error):
        return False
    return bool(_XPROF_JSON_SNIFF.search(head))


def read_xprof_json(path: str | Path) -> Trace:
    """Read JAX's ``perfetto_trace.json.gz`` (or XProf's trace JSON) into a Trace."""
    path = Path(path)
    data = read_plain(path)
    _check_plain(path, data)  # a Chrome trace: a non-empty list of event objects
    ev = pd.DataFrame.from_records(
        data["traceEvents"], columns=["ph", "pid", "tid", "ts", "dur", "name", "args"]
    )
    meta_ev = ev[(ev["ph"] == "M") & (ev["name"] == "process_name")]
    plane_of = {
        p: (a or {}).get("name", "") for p, a in zip(meta_ev["pid"], meta_ev["args"], strict=True)
    }
    threads = ev[(ev["ph"] == "M") & (ev["name"] == "thread_name")]
    line_name = {
        (p, t): (a or {}).get("name", "")
        for p, t, a in zip(threads["pid"], threads["tid"], threads["args"], strict=True)
    }
    x = ev[(ev["ph"] == "X")].reset_index(drop=True)
    if x.empty:
        raise TraceError(path, "trace holds no complete (ph X) events")
    bad = pd.to_numeric(x["ts"], errors="coerce").isna()
    if bad.any():
        raise TraceError(path, f"malformed trace: event {int(np.flatnonzero(bad)[0])} has no ts")
    start = _us_to_ns(x["ts"])  # µs with ns decimals (7.992), exactly
    args = pd.DataFrame.from_records(
        [a if isinstance(a, dict) else {} for a in x["args"]], columns=list(STATS)
    )
    for col in ("step_num", "correlation_id"):
        args[col] = pd.to_numeric(args[col], errors="coerce")
    keys = list(zip(x["pid"], x["tid"], strict=True))
    events = pd.DataFrame(
        {
            "plane": x["pid"].map(plane_of).fillna("").astype(object),
            "line": pd.to_numeric(x["tid"], errors="coerce").fillna(-1).astype(np.int64),
            "line_name": [line_name.get(k, "") for k in keys],
            "name": x["name"].astype(object),
            "display_name": "",
            "start": start,
            "end": start + _us_to_ns(x["dur"].fillna(0)),
        }
    ).join(args)
    planes: dict[str, dict[str, Any]] = {name: {} for name in plane_of.values()}
    meta = {"format": "xprof-json", "version": "chrome-trace", "path": str(path)}
    return _with_op_identities(_checked(path, events, planes, meta))


# ---------------------------------------------------------------------------------------------
# event table -> Trace (shared by both formats)


def _checked(
    path: Path, events: pd.DataFrame, planes: dict[str, dict[str, Any]], meta: dict[str, Any]
) -> Trace:
    try:
        return _trace(events, planes, meta)
    except _MALFORMED as exc:
        problem = " ".join(str(exc).split())[:200]
        raise TraceError(
            path, f"malformed profile: unexpected event data ({type(exc).__name__}: {problem})"
        ) from exc


def _trace(events: pd.DataFrame, planes: dict[str, dict[str, Any]], meta: dict[str, Any]) -> Trace:
    pid = int(meta.get("process_id", 0) or 0)
    host = events[events["plane"] == HOST_PLANE]
    gpu_plane = per_distinct(
        events["plane"].astype(object), lambda u: u.fillna("").str.match(_DEVICE_PLANE.pattern)
    )
    device = events[gpu_plane & events["correlation_id"].notna()]
    cupti = events[(events["plane"] == CUPTI_PLANE) & events["correlation_id"].notna()]
    notes = []
    ranges = _ranges(host, pid)
    if ranges.empty and len(host):
        notes.append(
            "no TensorFlow op, XLA op or step events on /host:CPU: the per-op tables are empty"
        )
    api_calls = pd.DataFrame(
        {
            "start": cupti["start"],
            "end": cupti["end"],
            "pid": pid,
            "tid": cupti["line"],
            "correlation_id": cupti["correlation_id"].astype(np.int64),
            "name": cupti["name"],
        },
        copy=False,
    )
    kernels, memops = _device_work(device, pid)
    lines = events[events["plane"].isin([HOST_PLANE, CUPTI_PLANE])]
    threads = lines.drop_duplicates("line")
    meta["planes"] = sorted(p for p in planes if p)
    # the tf.functions the capture ran (``__inference_step_970``): their graphs' shapes are
    # the ones its ops had (:func:`perfguard.trace.tf_graph.with_graph_facts`)
    ran = host.loc[(_numbers(host["is_func"]) == 1).to_numpy(bool), "eager_op"].dropna()
    if len(ran):
        meta["tf_functions"] = sorted({str(f) for f in ran})
    return Trace(
        ranges=finalize_ranges(ranges),
        api_calls=api_calls,
        kernels=kernels,
        memops=memops,
        devices=_devices(events, planes),
        threads=pd.DataFrame(
            {"rank": 0, "pid": pid, "tid": threads["line"], "name": threads["line_name"]}
        ),
        meta=meta,
        notes=notes,
        environment=from_xspace(planes),
    )


def _ranges(host: pd.DataFrame, pid: int) -> pd.DataFrame:
    """Steps, TF ops, HLO ops and tf.function calls of the host plane (see the module doc)."""
    name = host["name"].astype(object)
    display = host["display_name"].fillna("").astype(object)
    step = _numbers(host["step_num"])
    is_step = step.notna()
    own_iter = name.isin(ITERATION_NAMES) & ~is_step
    hlo = host["hlo_op"].notna() & (host["hlo_op"] != "") & ~is_step
    tf_node, tf_type = _tf_ops(name, display)
    # an eager op: EagerExecute with the op's type (functions are the tf_function events)
    eager = host["eager_op"].notna() & (_numbers(host["is_func"]) != 1)
    tf_node = tf_node.where(~eager, host["eager_op"])
    tf_type = tf_type.where(~eager, host["eager_op"])
    is_tf = tf_type.notna() & ~hlo & ~is_step & ~own_iter
    is_fn = host["tf_function_call"].notna() & ~is_step & ~hlo & ~is_tf
    keep = is_step | own_iter | hlo | is_tf | is_fn
    h = host[keep]
    k_step, k_hlo, k_tf = is_step[keep], hlo[keep], is_tf[keep]
    hlo_full, hlo_type = _pairwise(
        h["hlo_module"].fillna(""),
        h["hlo_op"].fillna(""),
        lambda m, o: (f"{m}::{o}" if m else o, _HLO_SUFFIX.sub("", o)),
    )
    steps = step[keep].fillna(0).astype(np.int64)
    out_name = np.select(
        [k_step.to_numpy(), k_hlo.to_numpy(), k_tf.to_numpy()],
        [
            per_distinct(steps, lambda u: "ProfilerStep#" + u.astype(str)).to_numpy(object),
            hlo_full,
            tf_node[keep].to_numpy(object),
        ],
        default=h["name"].to_numpy(object),
    )
    op_type = np.select(
        [k_step.to_numpy(), k_hlo.to_numpy(), k_tf.to_numpy(), is_fn[keep].to_numpy()],
        [
            np.full(len(h), None, object),
            hlo_type,
            tf_type[keep].to_numpy(object),
            np.full(len(h), "tf.function", object),
        ],
        default=NONE,
    )
    category = np.select(
        [k_step.to_numpy(), k_hlo.to_numpy(), k_tf.to_numpy(), is_fn[keep].to_numpy()],
        ["step", "hlo_op", "tf_op", "tf_function"],
        default="user_annotation",
    ).astype(object)
    is_iter = (k_step | own_iter[keep]).to_numpy()
    return pd.DataFrame(
        {
            "start": h["start"],
            "end": h["end"],
            "pid": pid,
            "tid": h["line"],
            "name": out_name,
            "category": category,
            "kind": np.where(is_iter, "iteration", "op").astype(object),
            "source": "xplane",
            "op_type": op_type,
            "domain": np.where(k_step.to_numpy(), h["name"].to_numpy(object), NONE),
            "bprop": _is_backward(out_name),
        },
        index=h.index,
        copy=False,
    )


def _numbers(values: pd.Series) -> pd.Series:
    """A sparse stat column (mostly None) as float, converting only the values present."""
    out = pd.Series(np.nan, index=values.index)
    present = values.notna()
    if present.any():
        out[present] = pd.to_numeric(values[present], errors="coerce")
    return out


def _tf_ops(name: pd.Series, display: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Node and type of TensorFlow op events (``node:Type``; NA for other events).

    XSpace states the type as the event's display name; XProf JSON does not,
    so there the name is parsed. Worked out once per distinct name.
    """

    def rule(n: str, d: str) -> tuple[object, object]:
        if d and n.endswith(":" + d):
            return n[: len(n) - len(d) - 1], d
        m = _TF_OP.match(n)
        return (m["node"], m["type"]) if m else (None, None)

    node, kind = _pairwise(name.fillna(""), display.fillna(""), rule)
    return (
        pd.Series(node, index=name.index, dtype=object),
        pd.Series(kind, index=name.index, dtype=object),
    )


def _pairwise(
    a: pd.Series, b: pd.Series, rule: Callable[[Any, Any], tuple[object, object]]
) -> tuple[np.ndarray, np.ndarray]:
    """``rule(a, b)`` (two results) once per distinct pair: names repeat millions of times."""
    a_codes, a_uniques = factorize(a)
    b_codes, b_uniques = factorize(b)
    width = len(b_uniques) + 1
    codes, pairs = pd.factorize(a_codes * width + b_codes)
    results = [rule(a_uniques[p // width], b_uniques[p % width]) for p in pairs]
    first = np.array([r[0] for r in results] + [None], dtype=object)[:-1]
    second = np.array([r[1] for r in results] + [None], dtype=object)[:-1]
    return first[codes], second[codes]


def _is_backward(names: np.ndarray) -> np.ndarray:
    """TF's gradient nodes live under ``gradient_tape/`` (or ``gradients/`` in TF1 graphs)."""
    pattern = r"(?:^|/)(?:gradient_tape|gradients)/"
    s = pd.Series(names, dtype=object)
    return per_distinct(s, lambda u: u.fillna("").str.contains(pattern, regex=True)).to_numpy(bool)


def _device_work(device: pd.DataFrame, pid: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Kernels and memops of the GPU planes (events with a correlation id)."""
    dev_id = device["plane"].str.extract(_DEVICE_PLANE)[0].astype(np.int64)
    label = device["display_name"].where(device["display_name"].fillna("") != "", device["name"])
    is_mem = label.str.match(r"^Mem(?:cpy|set)") | device["memcpy_details"].notna()
    common = pd.DataFrame(
        {
            "start": device["start"],
            "end": device["end"],
            "pid": pid,
            "device_id": dev_id,
            "stream_id": device["line"],
            "correlation_id": device["correlation_id"].fillna(NO_CORRELATION).astype(np.int64),
            "name": label,
        },
        copy=False,
    )
    kernels = common[~is_mem].copy()
    details = _kernel_details(device.loc[~is_mem, "kernel_details"])
    kernels["short_name"] = kernels["name"]
    for col in details:
        kernels[col] = details[col]
    memops = common[is_mem].copy()
    memops["kind"] = memops["name"].str.replace(r"\s*\(.*\)$", "", regex=True)
    mem_bytes = device.loc[is_mem, "memcpy_details"].fillna("").astype(str)
    memops["bytes"] = pd.to_numeric(
        mem_bytes.str.extract(r"num_bytes:(\d+)")[0], errors="coerce"
    ).astype("Int64")
    return kernels, memops


def _kernel_details(details: pd.Series) -> pd.DataFrame:
    """``regs:32 static_shared:0 dynamic_shared:0 grid:1,1,1 block:128,1,1 ...`` -> columns."""
    text = details.fillna("").astype(str)
    out = pd.DataFrame(index=details.index)
    if not len(text):
        return out
    pairs = text.str.extractall(_KERNEL_DETAIL)
    if pairs.empty:
        return out
    row = pairs.index.get_level_values(0)
    wide = pairs.groupby([row, pairs[0]])[1].first().unstack().reindex(details.index)

    def num(col: str) -> pd.Series:
        if col not in wide:
            return pd.Series(pd.NA, index=details.index, dtype="Int64")
        return pd.to_numeric(wide[col], errors="coerce").astype("Int64")

    out["registers"] = num("regs")
    static, dynamic = num("static_shared"), num("dynamic_shared")
    shared = static.fillna(0) + dynamic.fillna(0)
    out["shared_mem"] = shared.where(static.notna() | dynamic.notna(), pd.NA)
    for geo in ("grid", "block"):
        parts = wide[geo].str.split(",", expand=True) if geo in wide else None
        for i, axis in enumerate("xyz"):
            col = parts[i] if parts is not None and i in parts else None
            out[f"{geo}_{axis}"] = (
                pd.to_numeric(col, errors="coerce").astype("Int64") if col is not None else pd.NA
            )
    return out


def _devices(events: pd.DataFrame, planes: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for name, stats in planes.items():
        m = _DEVICE_PLANE.match(name)
        if not m:
            continue
        major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
        rows.append(
            {
                "rank": 0,
                "device_id": int(m.group(1)),
                "name": stats.get("device_type_string") or stats.get("gpu_model") or name,
                "sm_count": stats.get("core_count"),
                "memory_bytes": stats.get("memory_size"),
                "compute_capability": f"{int(major)}.{int(minor)}"
                if major is not None and minor is not None
                else None,
            }
        )
    return pd.DataFrame.from_records(
        rows,
        columns=["rank", "device_id", "name", "sm_count", "memory_bytes", "compute_capability"],
    )


# ---------------------------------------------------------------------------------------------
# directories: a TensorBoard logdir, a plugins/profile/<run> folder


def find_xplanes(path: Path) -> list[Path]:
    """The ``*.xplane.pb`` files of the newest profile run under ``path`` (one per host).

    ``path`` may be the run folder itself, or any folder above it (a logdir:
    runs are ``plugins/profile/<timestamp>``, newest last by name).
    """
    direct = sorted(path.glob("*.xplane.pb"))
    if direct:
        return direct
    found = sorted(path.rglob("*.xplane.pb"))
    if not found:
        return []
    newest = max(p.parent for p in found)
    return [p for p in found if p.parent == newest]


def read_xplane_dir(path: str | Path) -> Trace:
    """The newest profile run under ``path``; several hosts become ranks 0..N-1 (by name)."""
    path = Path(path)
    files = find_xplanes(path)
    if not files:
        raise TraceError(path, "directory holds no *.xplane.pb profile")
    traces = [read_xplane(f) for f in files]
    if len(traces) == 1:
        return traces[0]
    tables = ("ranges", "api_calls", "kernels", "memops", "devices", "threads")
    merged = {}
    offset = 0
    for rank, tr in enumerate(traces):
        for t in tables:
            getattr(tr, t)["rank"] = rank
        r = tr.ranges
        r["parent_id"] = np.where(r["parent_id"] >= 0, r["parent_id"] + offset, r["parent_id"])
        offset += len(r)
    for t in tables:
        merged[t] = concat_tables([getattr(tr, t) for tr in traces])
    merged["ranges"]["range_id"] = np.arange(len(merged["ranges"]), dtype=np.int64)
    meta = dict(traces[0].meta)
    meta.update(path=str(path), ranks=list(range(len(files))), files=[str(f) for f in files])
    notes = [n for tr in traces for n in tr.notes]
    return Trace(meta=meta, notes=notes, environment=merged_environment(traces), **merged)
