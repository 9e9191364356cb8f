"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip'd.

Three schema generations are handled (see ``shared/reference/kineto_and_hta.md``):

* modern (2023+): lower-case categories, ``ac2g`` flows, float ``ts`` with
  ns decimals;
* 2022: ``async_cpu_to_gpu`` flows;
* legacy (2021): ``Operator/Runtime/Kernel/Memcpy/Memset`` categories,
  string ``tid`` (``"stream 7"``), lower-case ``external id``.

Kernels are joined to their launching call on ``correlation`` (flows are
not needed and are incomplete in real traces). A GPU event carries the
device as its pid, so the launching process is taken from that call.
Fields are pulled out of the event dicts with pandas' record constructors,
not a Python loop per event.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.arrays import factorize
from perfguard.errors import TraceError
from perfguard.trace.model import NO_CORRELATION, Trace
from perfguard.trace.names import is_backward_name, is_iteration_name, op_type_of
from perfguard.trace.ranges import finalize_ranges

#: Legacy (2021) category names -> modern ones.
LEGACY_CATEGORIES = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Python": "python_function",
    "User annotation": "user_annotation",
}
RANGE_CATEGORIES = ("cpu_op", "user_annotation")
API_CATEGORIES = ("cuda_runtime", "cuda_driver")
MEMOP_CATEGORIES = ("gpu_memcpy", "gpu_memset")
_ARGS = [
    "correlation", "External id", "external id", "device", "stream", "grid", "block",
    "registers per thread", "shared memory", "bytes", "Input Dims", "Input type",
    "Sequence number", "Call stack", "Concrete Inputs",
]  # fmt: skip
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)


def load_json(path: Path) -> dict[str, Any]:
    """Parse a ``.json`` or ``.json.gz`` trace; errors name the file."""
    try:
        with open(path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
    except OSError as exc:
        raise TraceError(path, f"cannot read file ({exc.strerror or exc})") from None
    try:
        if gzipped:
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            with open(path, "rb") as fh:
                raw = fh.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(path, f"truncated or corrupt gzip file ({exc})") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read file ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except RecursionError:
        raise TraceError(path, "not a trace: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise TraceError(path, f"not valid JSON, truncated or corrupt ({exc})") from None
    del raw  # the parsed events are what is kept; free the text before reading them
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(path, "JSON is not a Kineto/Chrome trace (no traceEvents list)")
    events = data["traceEvents"]
    if not events:
        raise TraceError(path, "trace holds no events (traceEvents is empty)")
    bad = next((i for i, e in enumerate(events) if not isinstance(e, dict)), None)
    if bad is not None:
        raise TraceError(
            path,
            f"not a valid trace: traceEvents[{bad}] is not an event object "
            f"(a JSON {_JSON_TYPES.get(type(events[bad]), 'value')})",
        )
    return data


_JSON_TYPES = {int: "number", float: "number", str: "string", list: "array", bool: "boolean"}
_JSON_TYPES[type(None)] = "null"

#: exceptions that malformed event data (wrong types, absurd values) raises in :func:`_read`
_MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError)


def _rank_of(path: Path, value: Any) -> int:
    """``distributedInfo.rank`` (or a rank from the file name) as an int, or TraceError."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TraceError(path, f"distributedInfo.rank is not an integer ({value!r})")
    try:
        return int(value)
    except ValueError:
        raise TraceError(path, f"distributedInfo.rank is not an integer ({value!r})") from None


def _dist_info(data: dict[str, Any]) -> dict[str, Any]:
    info = data.get("distributedInfo")
    return info if isinstance(info, dict) else {}


def _read_checked(path: Path, data: dict[str, Any], rank: int | None) -> Trace:
    """:func:`_read`, with malformed event data reported as a TraceError naming the file."""
    try:
        return _read(path, data, rank)
    except _MALFORMED as exc:
        problem = " ".join(str(exc).split())[:200]
        raise TraceError(
            path, f"malformed trace: unexpected event data ({type(exc).__name__}: {problem})"
        ) from exc


def read_kineto(path: str | Path, rank: int | None = None) -> Trace:
    """Read one Kineto trace file. ``rank`` overrides ``distributedInfo.rank``."""
    path = Path(path)
    return _read_checked(path, load_json(path), rank)


def read_kineto_dir(path: str | Path) -> Trace:
    """Read a directory of per-rank Kineto files into one Trace with a ``rank`` column."""
    path = Path(path)
    try:
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
        )
    except OSError as exc:
        raise TraceError(path, f"cannot list directory ({exc.strerror or exc})") from None
    if not files:
        raise TraceError(path, "directory holds no .json or .json.gz trace files")
    traces, ranks = [], []
    for i, f in enumerate(files):
        data = load_json(f)
        m = _RANK_IN_NAME.search(f.name)
        r = _rank_of(f, _dist_info(data).get("rank", int(m.group(1)) if m else i))
        if r in ranks:
            other = files[ranks.index(r)].name
            raise TraceError(f, f"rank {r} appears twice in {path} (also in {other})")
        ranks.append(r)
        traces.append(_read_checked(f, data, r))
    merged = {
        t: pd.concat([getattr(tr, t) for tr in traces], ignore_index=True)
        for t in ("ranges", "api_calls", "kernels", "memops", "devices", "threads")
    }
    offset = np.cumsum([0] + [len(tr.ranges) for tr in traces[:-1]])
    parts = []
    for tr, off in zip(traces, offset, strict=True):
        r = tr.ranges
        parts.append(np.where(r["parent_id"] >= 0, r["parent_id"] + off, r["parent_id"]))
    merged["ranges"]["range_id"] = np.arange(len(merged["ranges"]), dtype=np.int64)
    if parts:
        merged["ranges"]["parent_id"] = np.concatenate(parts)
    meta = dict(traces[0].meta)
    meta.update(path=str(path), ranks=sorted(ranks), files=[str(f) for f in files])
    return Trace(meta=meta, **merged)


#: |time| in µs above which ns overflow int64 (~292 years; epoch µs today are ~1.7e15)
_MAX_US = 9.2e15


def _check_times(path: Path, x: pd.DataFrame) -> None:
    """Every GPU/CPU event needs a finite ``ts`` (and ``dur`` when given) in µs."""
    for field, required in (("ts", True), ("dur", False)):
        v = pd.to_numeric(x[field], errors="coerce").to_numpy(np.float64)
        present = x[field].notna().to_numpy() if not required else np.ones(len(x), bool)
        with np.errstate(invalid="ignore"):
            bad = present & ~(np.abs(v) < _MAX_US)  # NaN, inf, non-numbers, absurd values
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            ev = x.iloc[i]
            value = ev[field]
            value = value.item() if isinstance(value, np.generic) else value
            missing = value is None or value != value  # absent or NaN
            has = f"no {field}" if missing else f"{field} {value!r}, not a time in µs"
            raise TraceError(
                path,
                f"malformed trace: event {x.index[i]} ({ev['cat']} {str(ev['name'])[:60]!r}) "
                f"has {has}",
            )


def _us_to_ns(values: pd.Series) -> np.ndarray:
    """Kineto µs (int epoch µs, or float with ns decimals) -> int64 ns, exactly."""
    v = pd.to_numeric(values, errors="coerce")
    if v.isna().any():
        v = v.fillna(0)
    if pd.api.types.is_integer_dtype(v.dtype):
        return v.to_numpy(np.int64) * 1000
    f = v.to_numpy(np.float64)
    whole = np.floor(f)
    return whole.astype(np.int64) * 1000 + np.rint((f - whole) * 1000).astype(np.int64)


def _int_column(s: pd.Series, default: int) -> np.ndarray:
    """Numbers or numeric strings (``"stream 7"`` -> 7) as int64.

    Numbers convert in one C pass; only values that are not numbers are
    searched for digits, once per distinct text (legacy string tids repeat).
    """
    if s.dtype == object:
        num = pd.to_numeric(s, errors="coerce")
        text = (num.isna() & s.notna()).to_numpy()
        if text.any():
            codes, uniques = factorize(s[text].astype(str))
            digits = pd.Series(uniques, dtype=object).str.extract(r"(-?\d+)")[0]
            found = pd.to_numeric(digits, errors="coerce").to_numpy(np.float64)
            num = num.astype(np.float64)
            num[text] = found[codes]
        s = num
    return pd.to_numeric(s, errors="coerce").fillna(default).astype(np.int64).to_numpy()


def _args_frame(args: pd.Series) -> pd.DataFrame:
    records = [a if isinstance(a, dict) else {} for a in args]
    df = pd.DataFrame.from_records(records, columns=_ARGS, index=args.index)
    ext = df["External id"].where(df["External id"].notna(), df["external id"])
    return df.drop(columns=["external id"]).assign(**{"External id": ext})


def _read(path: Path, data: dict[str, Any], rank: int | None) -> Trace:
    events = pd.DataFrame.from_records(
        data["traceEvents"], columns=["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
    )
    # categories repeat: renamed once per distinct value, not per event
    codes, distinct = factorize(events["cat"], use_na_sentinel=False)
    distinct = pd.Series(distinct, dtype=object)
    legacy = bool(distinct.isin(list(LEGACY_CATEGORIES)).any())
    events["cat"] = pd.Series(
        distinct.replace(LEGACY_CATEGORIES).to_numpy(dtype=object)[codes],
        index=events.index,
        dtype=object,
    )
    known = events["cat"].isin(RANGE_CATEGORIES + API_CATEGORIES + ("kernel",) + MEMOP_CATEGORIES)
    if len(events) and not known.any():
        found = ", ".join(sorted(map(str, events["cat"].dropna().unique()))[:8]) or "none"
        raise TraceError(
            path, f"no PyTorch profiler events in this trace (categories seen: {found})"
        )
    if rank is None:
        rank = _rank_of(path, _dist_info(data).get("rank", 0))
    x = events[(events["ph"] == "X") & known].copy()
    _check_times(path, x)
    x["start"] = _us_to_ns(x["ts"])
    x["end"] = x["start"] + _us_to_ns(x["dur"].fillna(0))
    x["pid_i"] = _int_column(x["pid"], -1)
    x["tid_i"] = _int_column(x["tid"], -1)
    a = _args_frame(x["args"])
    x["correlation_id"] = _int_column(a["correlation"], NO_CORRELATION)

    api = x[x["cat"].isin(API_CATEGORIES)]
    api_calls = pd.DataFrame(
        {
            "start": api["start"], "end": api["end"], "pid": api["pid_i"], "tid": api["tid_i"],
            "correlation_id": api["correlation_id"], "name": api["name"],
        }, copy=False
    )  # fmt: skip
    launcher = (
        api_calls[api_calls["correlation_id"] != NO_CORRELATION]
        .drop_duplicates("correlation_id")
        .set_index("correlation_id")["pid"]
    )
    kernels = _gpu_events(x, a, "kernel", launcher)
    k_args = a.loc[kernels.index]
    kernels["short_name"] = _short_names(kernels["name"])
    for axis, col in (("x", 0), ("y", 1), ("z", 2)):
        kernels[f"grid_{axis}"] = _triple(k_args["grid"], col)
        kernels[f"block_{axis}"] = _triple(k_args["block"], col)
    kernels["registers"] = pd.to_numeric(k_args["registers per thread"], errors="coerce")
    kernels["shared_mem"] = pd.to_numeric(k_args["shared memory"], errors="coerce")
    memops = _gpu_events(x, a, MEMOP_CATEGORIES, launcher)
    memops["kind"] = memops["name"].str.replace(r"\s*\(.*\)$", "", regex=True)
    memops["bytes"] = pd.to_numeric(a.loc[memops.index, "bytes"], errors="coerce")

    ranges = _ranges(x, a)
    for df in (api_calls, kernels, memops, ranges):
        df["rank"] = rank
    return Trace(
        ranges=finalize_ranges(ranges),
        api_calls=api_calls,
        kernels=kernels,
        memops=memops,
        devices=_devices(data, rank),
        threads=_threads(events, rank),
        meta=_meta(path, data, events, legacy),
    )


def _gpu_events(
    x: pd.DataFrame, a: pd.DataFrame, cats: str | tuple[str, ...], launcher: pd.Series
) -> pd.DataFrame:
    g = x[x["cat"].isin([cats] if isinstance(cats, str) else list(cats))]
    ga = a.loc[g.index]
    pid = g["correlation_id"].map(launcher)
    return pd.DataFrame(
        {
            "start": g["start"],
            "end": g["end"],
            "pid": pid.fillna(-1).astype(np.int64),
            "device_id": np.where(ga["device"].notna(), _int_column(ga["device"], -1), g["pid_i"]),
            "stream_id": np.where(ga["stream"].notna(), _int_column(ga["stream"], -1), g["tid_i"]),
            "correlation_id": g["correlation_id"],
            "name": g["name"],
        },
        copy=False,
    )


def _triple(s: pd.Series, i: int) -> pd.Series:
    """Element ``i`` of ``[x, y, z]`` lists (grid, block); NA where absent."""
    if s.dtype != object or not len(s):
        return pd.Series(pd.NA, index=s.index, dtype="Int64")
    return pd.to_numeric(s.str[i], errors="coerce").astype("Int64")


def _short_names(names: pd.Series) -> pd.Series:
    """``void ns::kernel<T>(args)`` -> ``kernel`` (computed per distinct name)."""
    codes, uniques = pd.factorize(names.fillna(""))
    u = pd.Series(uniques, dtype="object")
    base = u.str.replace(r"^void\s+", "", regex=True).str.replace(r"\(.*$", "", regex=True)
    # drop template arguments, then namespaces
    base = base.str.replace(r"<.*>", "", regex=True).str.split("::").str[-1].str.strip()
    base = base.where(base != "", u)
    return pd.Series(base.to_numpy(dtype=object)[codes], index=names.index, dtype="object")


def _ranges(x: pd.DataFrame, a: pd.DataFrame) -> pd.DataFrame:
    r = x[x["cat"].isin(RANGE_CATEGORIES)]
    ra = a.loc[r.index]
    names = r["name"].astype(object)
    kind = np.where(is_iteration_name(names), "iteration", "op").astype(object)
    stack = ra["Call stack"]
    call_site = stack.where(stack.notna() & (stack != ""), None)
    call_site = call_site.str.split(";").str[0] if call_site.notna().any() else call_site
    return pd.DataFrame(
        {
            "start": r["start"], "end": r["end"], "pid": r["pid_i"], "tid": r["tid_i"],
            "name": names, "category": r["cat"], "kind": kind, "source": "kineto",
            "op_type": op_type_of(names),
            "bprop": is_backward_name(names).to_numpy(dtype=bool),
            "seq": pd.to_numeric(ra["Sequence number"], errors="coerce").astype("Int64"),
            "input_shapes": _json_text(ra["Input Dims"]),
            "dtypes": _json_text(ra["Input type"]),
            "concrete_inputs": _json_text(ra["Concrete Inputs"]),
            "call_site": call_site,
        }, copy=False
    )  # fmt: skip


def _json_text(s: pd.Series) -> pd.Series:
    """Lists (shapes, dtypes) as compact JSON text, so tables stay flat."""
    ok = s.notna()
    out = pd.Series(None, index=s.index, dtype="object")
    if ok.any():
        out[ok] = [json.dumps(v, separators=(",", ":")) for v in s[ok]]
    return out


def _devices(data: dict[str, Any], rank: int) -> pd.DataFrame:
    props = data.get("deviceProperties") or []
    df = pd.DataFrame.from_records(
        [p for p in props if isinstance(p, dict)],
        columns=["id", "name", "numSms", "totalGlobalMem", "computeMajor", "computeMinor"],
    )
    cc = (
        df["computeMajor"].astype("Int64").astype(str)
        + "."
        + df["computeMinor"].astype("Int64").astype(str)
    )
    return pd.DataFrame(
        {
            "rank": rank, "device_id": df["id"], "name": df["name"], "sm_count": df["numSms"],
            "memory_bytes": df["totalGlobalMem"],
            "compute_capability": cc.where(df["computeMajor"].notna(), None),
        }, copy=False
    )  # fmt: skip


def _threads(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    m = events[(events["ph"] == "M") & (events["name"] == "thread_name")]
    names = pd.DataFrame.from_records(
        [a if isinstance(a, dict) else {} for a in m["args"]], columns=["name"], index=m.index
    )
    pid = pd.to_numeric(m["pid"], errors="coerce")
    tid = pd.to_numeric(m["tid"], errors="coerce")
    ok = pid.notna() & tid.notna()
    return pd.DataFrame(
        {"rank": rank, "pid": pid[ok], "tid": tid[ok], "name": names["name"][ok]}, copy=False
    ).astype({"pid": np.int64, "tid": np.int64})


def _meta(path: Path, data: dict[str, Any], events: pd.DataFrame, legacy: bool) -> dict[str, Any]:
    cats = set(events["cat"].dropna().unique())
    if legacy:
        schema = "legacy-2021"
    elif "async_cpu_to_gpu" in cats:
        schema = "2022"
    else:
        schema = "modern"
    meta: dict[str, Any] = {
        "format": "kineto-json",
        "path": str(path),
        "version": schema,
        "schema_version": data.get("schemaVersion"),
    }
    for key in ("cuda_runtime_version", "cuda_driver_version", "cupti_version"):
        if key in data:
            meta[key] = data[key]
    info = data.get("distributedInfo")
    if isinstance(info, dict):
        meta["distributed"] = {k: info.get(k) for k in ("backend", "rank", "world_size")}
    return meta
