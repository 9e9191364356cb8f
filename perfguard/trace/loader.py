"""One entry point that recognises a capture by its content and reads it.

A directory holds one capture per rank (Kineto JSON or nsys SQLite exports,
a multi-GPU job's per-rank files). Its files are read in parallel worker
processes, at most ``min(ranks, cores)`` and no more than fit in the available
memory (:func:`worker_count`), each worker reading one rank and
then exiting (``max_tasks_per_child=1``), so a worker holds one rank's
capture at a time and gives its memory back; the per-rank traces are merged
into one Trace with a ``rank`` column, in rank-file order.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TypeVar

import numpy as np

from perfguard.errors import TraceError
from perfguard.trace.gpu_ranges import RangeFilter
from perfguard.trace.kineto import read_kineto
from perfguard.trace.model import (
    SCHEMA,
    Trace,
    checked_rank,
    concat_tables,
    merged_environment,
)
from perfguard.trace.nsys import is_sqlite, read_nsys
from perfguard.trace.xplane import (
    find_xplanes,
    is_xprof_json,
    read_xplane,
    read_xplane_dir,
    read_xprof_json,
)

_NSYS_REPORTS = (".nsys-rep", ".qdrep")
_UTF8_BOM = b"\xef\xbb\xbf"
#: what malformed values in an otherwise valid SQLite export raise while it is read
_MALFORMED = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
    OverflowError,
    sqlite3.Error,
)


#: the files of a directory that are read as one rank's capture each
RANK_FILE_SUFFIXES = (".json", ".json.gz", ".sqlite")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)
#: below this many bytes in all, a directory is read in this process: starting a
#: worker (a fresh interpreter importing pandas) costs more than reading small files
PARALLEL_MIN_BYTES = 32 * 2**20

T = TypeVar("T")

#: ``on_rank(ranks_done, ranks_total, events_read)``, called as each rank is read
RankProgress = Callable[[int, int, int], None]


def load_trace(
    path: str | Path,
    *,
    jobs: int | None = None,
    on_rank: RankProgress | None = None,
    range_filter: RangeFilter | None = None,
) -> Trace:
    """Read an nsys SQLite export, a Kineto trace, or a directory of per-rank traces.

    Also TensorFlow/JAX profiles: an ``*.xplane.pb``, a TensorBoard logdir or
    ``plugins/profile/<run>`` folder holding them, or XProf's trace JSON
    (JAX's ``perfetto_trace.json.gz``).

    The format is decided by content (SQLite header, gzip/JSON), not by the
    file name. Anything unreadable raises :class:`perfguard.TraceError`
    whose message names the file and the problem on one line, including a
    capture too large for this machine's memory. ``jobs`` caps the worker
    processes that read a directory's ranks (default: the cores; 1 reads in
    this process); ``on_rank`` hears of each rank read. ``range_filter`` keeps only
    the NVTX ranges of nsys exports that enclose GPU work (:mod:`perfguard.trace.gpu_ranges`).
    """
    path = Path(path)
    try:
        if path.is_dir():
            if find_xplanes(path):  # a TensorBoard logdir or plugins/profile/<run>
                return read_xplane_dir(path)
            return _load_dir(path, jobs, on_rank, range_filter)
        return _load(path, range_filter)
    except MemoryError:
        size = _size_text(path)
        raise TraceError(
            path,
            f"not enough memory to read this capture{size}: JSON traces are parsed whole "
            "(about 5x their size); export a shorter window or use nsys's SQLite export",
        ) from None


def _size_text(path: Path) -> str:
    try:
        if path.is_dir():
            return ""
        size = path.stat().st_size
        return f" ({size / 2**30:.1f} GiB)" if size >= 2**30 else f" ({size / 2**20:.1f} MiB)"
    except OSError:
        return ""


def _load(path: Path, range_filter: RangeFilter | None = None) -> Trace:
    if not path.exists():
        raise TraceError(path, "no such file or directory")
    if path.name.endswith(".xplane.pb"):
        return read_xplane(path)
    if path.name.lower().endswith(_NSYS_REPORTS):
        raise TraceError(
            path,
            "is an nsys report, not an export: run `nsys export --type sqlite "
            f"--output {path.with_suffix('.sqlite').name} {path.name}` and pass the .sqlite",
        )
    if is_sqlite(path):
        _check_sqlite_size(path)
        return _read_nsys_checked(path, range_filter)
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise TraceError(path, f"cannot read file ({exc.strerror or exc})") from None
    if not head:
        raise TraceError(path, "file is empty")
    if head[:2] == b"\x1f\x8b" or head.removeprefix(_UTF8_BOM).lstrip()[:1] in (b"{", b"["):
        return read_xprof_json(path) if is_xprof_json(path) else read_kineto(path)
    raise TraceError(
        path,
        "not an nsys SQLite export or a PyTorch profiler (Kineto) JSON trace "
        "(nor a TensorFlow/JAX profile, *.xplane.pb)",
    )


def _check_sqlite_size(path: Path) -> None:
    """A file shorter than its SQLite header says was cut off (a partial copy or download)."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(path, f"cannot read file ({exc.strerror or exc})") from None
    if len(header) < 100:
        raise TraceError(path, f"truncated SQLite file ({size} bytes, shorter than its header)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # the page count is only valid when the change counter matches "version-valid-for"
    if pages and header[24:28] == header[92:96] and size < page_size * pages:
        raise TraceError(
            path,
            f"truncated SQLite file: {size:,} bytes, but its header says {page_size * pages:,} "
            "(an incomplete copy or download?)",
        )


def _read_nsys_checked(path: Path, range_filter: RangeFilter | None = None) -> Trace:
    """:func:`read_nsys`, with malformed table contents reported as a TraceError."""
    try:
        return read_nsys(path, range_filter)
    except _MALFORMED as exc:
        problem = " ".join(str(exc).split())[:200]
        raise TraceError(
            path,
            f"malformed nsys export: unexpected table contents ({type(exc).__name__}: {problem})",
        ) from exc


#: the nsys export tables whose rows are the events a progress line counts
_EVENT_TABLES = tuple(
    f"CUPTI_ACTIVITY_KIND_{t}" for t in ("KERNEL", "RUNTIME", "MEMCPY", "MEMSET")
) + ("NVTX_EVENTS",)


def events_in(path: str | Path) -> int | None:
    """About how many events an nsys export holds (the largest rowid of its event tables,
    read from each b-tree without a scan), for a progress line; None when unknown."""
    path = Path(path)
    if not path.is_file() or not is_sqlite(path):
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            return sum(
                conn.execute(f"SELECT max(rowid) FROM {t}").fetchone()[0] or 0
                for t in _EVENT_TABLES
                if t in have
            )
        finally:
            conn.close()
    except sqlite3.Error:
        return None


def rank_files(path: Path) -> list[Path]:
    """The per-rank capture files of a directory, sorted by name; TraceError for none."""
    try:
        files = sorted(p for p in path.iterdir() if p.is_file() and _is_rank_file(p.name))
    except OSError as exc:
        raise TraceError(path, f"cannot list directory ({exc.strerror or exc})") from None
    if not files:
        raise TraceError(path, "directory holds no .json, .json.gz or .sqlite capture files")
    return files


def _is_rank_file(name: str) -> bool:
    return name.lower().endswith(RANK_FILE_SUFFIXES)


def _load_dir(
    path: Path, jobs: int | None, on_rank: RankProgress | None, range_filter: RangeFilter | None
) -> Trace:
    files = rank_files(path)
    traces: list[Trace] = []
    events = 0
    read = functools.partial(_read_rank, range_filter=range_filter)
    for _, trace in map_ranks(files, read, worker_count(files, jobs), __name__):
        traces.append(trace)
        events += sum(len(getattr(trace, t)) for t in ("ranges", "api_calls", "kernels", "memops"))
        if on_rank is not None:
            on_rank(len(traces), len(files), events)
    return merge_ranks(path, files, traces)


#: the memory one worker needs for one rank, per byte of the rank's file and in all
#: (interpreter, imports): measured peaks of analysing one rank (benchmarks/README.md,
#: "Multi-rank directories"): an nsys export ~5x its size, Kineto JSON ~1.3x, gzipped ~13x
_MEMORY_PER_BYTE = {".sqlite": 6.0, ".json": 2.0, ".gz": 16.0}
_WORKER_BASE_BYTES = 200 * 2**20


def rank_memory(path: Path) -> int:
    """About the peak memory of reading and analysing one rank's capture, in bytes."""
    per_byte = _MEMORY_PER_BYTE.get(path.suffix.lower(), _MEMORY_PER_BYTE[".sqlite"])
    return _WORKER_BASE_BYTES + int(per_byte * _size(path))


def available_memory() -> int | None:
    """Memory the kernel can give without swapping (``MemAvailable``), bytes; None unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def worker_count(files: list[Path], jobs: int | None) -> int:
    """Worker processes for a directory's ranks: ``jobs`` when given, else one per core,
    no more than the ranks, and no more than fit in the available memory at the largest
    rank's estimated need (:func:`rank_memory`); 1 (this process) for a small directory."""
    if jobs is not None:
        return max(1, min(len(files), jobs))
    if sum(_size(f) for f in files) < PARALLEL_MIN_BYTES:
        return 1
    workers = min(len(files), os.cpu_count() or 1)
    free = available_memory()
    if free is not None and files:
        workers = min(workers, max(1, int(0.8 * free) // max(rank_memory(f) for f in files)))
    return workers


def map_ranks(
    files: list[Path],
    task: Callable[[Path], tuple[T | None, str]],
    workers: int,
    preload: str,
) -> Iterator[tuple[Path, T]]:
    """``(file, task(file))`` for each rank file, in file order.

    ``task`` returns ``(result, "")`` or ``(None, problem)`` (a worker's exceptions
    would have to survive pickling on the way back); a problem raises a TraceError
    naming that file. With more than one worker, tasks run in at most ``workers``
    processes, each running one task and then exiting (``max_tasks_per_child=1``),
    so a worker holds one rank at a time and gives its memory back; ``preload`` is
    the module the fork server imports once (the one defining ``task``).
    """
    if workers <= 1:
        for f in files:
            result, problem = task(f)
            if result is None:
                raise TraceError(f, problem)
            yield f, result
        return
    # forkserver: a fork of this process could inherit a lock held by one of its
    # threads; the server imports the module once and forks each worker from it
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([preload])
    with ProcessPoolExecutor(workers, mp_context=ctx, max_tasks_per_child=1) as pool:
        futures = [pool.submit(task, f) for f in files]
        for f, future in zip(files, futures, strict=True):
            try:
                result, problem = future.result()
            except BrokenProcessPool:  # a worker killed (out of memory) while working
                for other in futures:
                    other.cancel()
                raise TraceError(
                    f,
                    f"the worker for this rank died (out of memory?): {workers} ranks "
                    "were worked on at once; try fewer workers (--jobs 1)",
                ) from None
            if result is None:
                for other in futures:
                    other.cancel()
                raise TraceError(f, problem)
            yield f, result


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_rank(path: Path, range_filter: RangeFilter | None = None) -> tuple[Trace | None, str]:
    """``(trace, "")`` or ``(None, problem)``: runs in a worker, whose exceptions
    would have to survive pickling on the way back."""
    try:
        return _load_rank(path, range_filter), ""
    except TraceError as exc:
        return None, exc.problem


def _load_rank(path: Path, range_filter: RangeFilter | None = None) -> Trace:
    """One rank's capture."""
    try:
        return _load(path, range_filter)
    except MemoryError:
        size = _size_text(path)
        raise TraceError(path, f"not enough memory to read this capture{size}") from None


def rank_of(path: Path, trace: Trace, index: int) -> int:
    """The capture's own rank (Kineto ``distributedInfo.rank``), else ``rank<N>`` in the
    file name, else the file's position in the directory."""
    dist = trace.meta.get("distributed")
    own = dist.get("rank") if isinstance(dist, dict) else None
    if own is not None:
        return checked_rank(path, int(own))
    m = _RANK_IN_NAME.search(path.name)
    return checked_rank(path, int(m.group(1))) if m else index


def check_unique_ranks(path: Path, files: list[Path], ranks: list[int]) -> None:
    """TraceError naming the second file of a rank that two files claim."""
    seen: dict[int, Path] = {}
    for f, r in zip(files, ranks, strict=True):
        if r in seen:
            raise TraceError(f, f"rank {r} appears twice in {path} (also in {seen[r].name})")
        seen[r] = f


def set_rank(trace: Trace, rank: int) -> None:
    """Set ``rank`` on every row of every table of ``trace``, in place (no table copied)."""
    for t in SCHEMA:
        table = getattr(trace, t)
        table["rank"] = np.full(len(table), rank, dtype=SCHEMA[t]["rank"])


def merge_ranks(path: Path, files: list[Path], traces: list[Trace]) -> Trace:
    """One Trace of per-rank traces: each table's rows rank by rank, ``rank`` set on
    every row, range ids renumbered to stay unique (parents shifted with them)."""
    ranks = [rank_of(f, tr, i) for i, (f, tr) in enumerate(zip(files, traces, strict=True))]
    check_unique_ranks(path, files, ranks)
    pairs = list(zip(traces, ranks, strict=True))
    merged = {
        table: concat_tables([getattr(tr, table).assign(rank=np.int64(r)) for tr, r in pairs])
        for table in SCHEMA
    }
    offset = np.cumsum([0] + [len(tr.ranges) for tr in traces[:-1]])
    parents = [
        np.where(tr.ranges["parent_id"] >= 0, tr.ranges["parent_id"] + off, tr.ranges["parent_id"])
        for tr, off in zip(traces, offset, strict=True)
    ]
    merged["ranges"]["range_id"] = np.arange(len(merged["ranges"]), dtype=np.int64)
    merged["ranges"]["parent_id"] = np.concatenate(parents).astype(np.int64)
    meta = dict(traces[0].meta)
    meta.update(path=str(path), ranks=sorted(ranks), files=[str(f) for f in files])
    notes = [f"rank {r}: {n}" for tr, r in zip(traces, ranks, strict=True) for n in tr.notes]
    return Trace(meta=meta, notes=notes, environment=merged_environment(traces), **merged)
