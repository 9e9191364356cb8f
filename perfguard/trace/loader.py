"""One entry point that recognises a capture by its content and reads it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from perfguard.errors import TraceError
from perfguard.trace.kineto import read_kineto, read_kineto_dir
from perfguard.trace.model import Trace
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
    ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, sqlite3.Error,
)  # fmt: skip


def load_trace(path: str | Path) -> Trace:
    """Read an nsys SQLite export, a Kineto trace, or a directory of per-rank traces.

    Also TensorFlow/JAX profiles: an ``*.xplane.pb``, a TensorBoard logdir or
    ``plugins/profile/<run>`` folder holding them, or XProf's trace JSON
    (JAX's ``perfetto_trace.json.gz``).

    The format is decided by content (SQLite header, gzip/JSON), not by the
    file name. Anything unreadable raises :class:`perfguard.TraceError`
    whose message names the file and the problem on one line, including a
    capture too large for this machine's memory.
    """
    path = Path(path)
    try:
        return _load(path)
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


def _load(path: Path) -> Trace:
    if not path.exists():
        raise TraceError(path, "no such file or directory")
    if path.is_dir():
        return read_xplane_dir(path) if find_xplanes(path) else read_kineto_dir(path)
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
        return _read_nsys_checked(path)
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


def _read_nsys_checked(path: Path) -> Trace:
    """:func:`read_nsys`, with malformed table contents reported as a TraceError."""
    try:
        return read_nsys(path)
    except _MALFORMED as exc:
        problem = " ".join(str(exc).split())[:200]
        raise TraceError(
            path,
            f"malformed nsys export: unexpected table contents ({type(exc).__name__}: {problem})",
        ) from exc
