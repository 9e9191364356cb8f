"""One entry point that recognises a capture by its content and reads it."""

from __future__ import annotations

from pathlib import Path

from perfguard.errors import TraceError
from perfguard.trace.kineto import read_kineto, read_kineto_dir
from perfguard.trace.model import Trace
from perfguard.trace.nsys import is_sqlite, read_nsys

_NSYS_REPORTS = (".nsys-rep", ".qdrep")


def load_trace(path: str | Path) -> Trace:
    """Read an nsys SQLite export, a Kineto trace, or a directory of per-rank traces.

    The format is decided by content (SQLite header, gzip/JSON), not by the
    file name. Anything unreadable raises :class:`perfguard.TraceError`
    whose message names the file and the problem on one line.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(path, "no such file or directory")
    if path.is_dir():
        return read_kineto_dir(path)
    if path.name.endswith(_NSYS_REPORTS):
        raise TraceError(
            path,
            "is an nsys report, not an export: run `nsys export --type sqlite "
            f"--output {path.with_suffix('.sqlite').name} {path.name}` and pass the .sqlite",
        )
    if is_sqlite(path):
        return read_nsys(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise TraceError(path, f"cannot read file ({exc.strerror})") from None
    if not head:
        raise TraceError(path, "file is empty")
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
        return read_kineto(path)
    raise TraceError(path, "not an nsys SQLite export or a PyTorch profiler (Kineto) JSON trace")
