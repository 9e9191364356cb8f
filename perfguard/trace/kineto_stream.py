"""Stream a Kineto trace's event array through msgspec typed decoding, piece by piece.

The file (plain or gzip) is read in pieces of :data:`PIECE_BYTES`; each piece
is cut after a whole event (``}`` ``,`` ``{``) and decoded with one
``msgspec.json.Decoder(list[Event])`` call into small structs that keep only
the fields the reader uses (others are skipped without being built), then
handed to a callback that turns them into columns. So memory is bounded by
the output columns plus one piece, not by the text or a dict per event.
What is outside the event array (``deviceProperties``, ``distributedInfo``,
...) is parsed once with ``json``.

Chosen by measurement (``benchmarks/README.md``, Kineto reader section):
msgspec's typed decode of a piece is several times faster than ``json`` or
``orjson`` building dicts, and needs no compiled helper of our own.

A piece the fast decoder rejects goes through :mod:`kineto_repair` (torch's
own JSON bugs); a file that ends mid-event keeps its complete events. Each
repair adds a line to ``notes``. Anything else the typed decode rejects (an
event that is not an object, ``args`` that is not an object) raises
:class:`Fallback`, and the caller reads the file the plain way, which has
the precise error messages.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from perfguard.errors import TraceError
from perfguard.trace.kineto_repair import Unrepairable, repair_notes, repair_piece

#: bytes of text decoded per piece: large enough that per-piece costs vanish, small
#: enough that a piece's structs stay a few tens of MB
PIECE_BYTES = 16 << 20
#: how far into the file the ``"traceEvents": [`` key may be
_HEADER_LIMIT = 64 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
#: the gap between two events of the array
BETWEEN_EVENTS = re.compile(rb"\}\s*,\s*\{")
#: the end of the array: ``}`` (or the opening ``[``) then ``]`` and the rest of the object
_ARRAY_END = re.compile(rb"\]\s*[,}]")
_GAP = re.compile(rb"\s*,\s*")
#: the end of an event that may be the last complete one of a truncated file
_EVENT_END = re.compile(rb"\}(?=\s*(?:,|\Z))")
#: how near the end of the file the array must close (the object's tail is small)
_TAIL_LIMIT = 4 << 20
#: decodes a truncated file's salvage may spend finding its longest readable prefix
_MAX_SALVAGE_DECODES = 24
_BLANK = b" \t\r\n"


class Fallback(Exception):
    """The streaming decoder cannot read this file; read it with :func:`json.loads`."""


#: an integer field the event does not have (no real id or size is this value)
NA_INT = -(2**63)
_NA3 = (NA_INT, NA_INT, NA_INT)


class Args(msgspec.Struct, gc=False, frozen=True):
    """The ``args`` fields the reader uses, typed as torch writes them.

    Shapes/dtypes stay raw JSON text. ``null`` (a repaired NaN) reads as
    absent; a value of another type fails the typed decode and the file is
    read by the plain reader instead.
    """

    correlation: int | None = -1
    device: int | None = NA_INT
    stream: int | None = NA_INT
    grid: tuple[int, int, int] | None = _NA3
    block: tuple[int, int, int] | None = _NA3
    registers: int | None = msgspec.field(default=NA_INT, name="registers per thread")
    shared_memory: int | None = msgspec.field(default=NA_INT, name="shared memory")
    bytes: int | None = NA_INT
    graph_id: int | None = msgspec.field(default=NA_INT, name="graph id")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    seq: int | None = msgspec.field(default=NA_INT, name="Sequence number")
    call_stack: str | None = msgspec.field(default=None, name="Call stack")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")
    name: Any = None  # thread_name metadata events


_NO_ARGS = Args()
#: Kineto's ``args`` key of each :class:`Args` field: the one map of argument names, which
#: the plain reader's columns (:mod:`perfguard.trace.kineto`) follow too
ARG_KEYS: dict[str, str] = {
    f.name: f.encode_name for f in msgspec.structs.fields(Args) if f.name != "name"
}


class Event(msgspec.Struct, gc=False):
    """One trace event, only the fields the reader uses (``tid`` is text in 2021 traces)."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: Args = _NO_ARGS


_DECODER = msgspec.json.Decoder(list[Event])


def _blocks(path: Path, size: int, notes: list[str], start: int = 0) -> Iterator[bytes]:
    """The file's bytes (gunzipped), ``size`` at a time; a broken gzip stream ends with a note.
    ``start``: where to begin in a plain (not gzip) file."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(path, f"cannot read file ({exc.strerror or exc})") from None
    with fh:
        try:
            fh.seek(start)
            first = fh.read(size)
        except OSError as exc:
            raise TraceError(path, f"cannot read file ({exc.strerror or exc})") from None
        if first[:2] != b"\x1f\x8b":
            block = first
            while block:
                yield block
                block = fh.read(size)
            return
        d = zlib.decompressobj(31)
        data, out, done = first, [], 0
        while True:
            try:
                chunk = d.decompress(data)
                while d.eof and d.unused_data:  # a multi-member gzip file
                    rest = d.unused_data
                    d = zlib.decompressobj(31)
                    chunk += d.decompress(rest)
            except zlib.error as exc:
                notes.append(f"the gzip stream is corrupt after {done:,} bytes of text ({exc})")
                break
            out.append(chunk)
            done += len(chunk)
            if sum(map(len, out)) >= size:
                yield b"".join(out)
                out = []
            data = fh.read(size // 4)
            if not data:
                if not d.eof:
                    notes.append(
                        f"the gzip file is truncated (its stream ends after {done:,} bytes of text)"
                    )
                break
        if out:
            yield b"".join(out)


class _Reader:
    """Reads the file's text piece by piece: the header, then the event array, then the tail.

    ``limit`` (an offset) makes the reader stop there as if the file ended;
    :meth:`lift` lets it go on.
    """

    def __init__(self, path: Path, notes: list[str], start: int = 0):
        self.path = path
        self.notes = notes
        self.blocks = _blocks(path, PIECE_BYTES, notes, start)
        self.buf = b""
        self.eof = False
        self.offset = start  # file offset of buf[0]
        self.limit: int | None = None
        self.at_limit = False
        self._held = b""  # read past the limit, served after :meth:`lift`

    def fill(self, n: int) -> None:
        parts = [self.buf]
        have = len(self.buf)
        while have < n and not self.eof:
            b, self._held = (self._held, b"") if self._held else (next(self.blocks, None), b"")
            if b is None:
                self.eof = True
                break
            if self.limit is not None and self.offset + have + len(b) >= self.limit:
                room = self.limit - self.offset - have
                b, self._held = b[:room], b[room:]
                self.eof = self.at_limit = True
            parts.append(b)
            have += len(b)
        self.buf = b"".join(parts)

    def lift(self) -> None:
        """Read on past the limit."""
        self.limit = None
        if self.at_limit:
            self.eof = self.at_limit = False

    def take(self, n: int) -> bytes:
        out = self.buf[:n]
        self.skip(n)
        return out

    def skip(self, n: int) -> None:
        self.buf = self.buf[n:]
        self.offset += n

    def framed(self, cut: int) -> bytes:
        """``[`` + the first ``cut`` bytes + ``]``: a JSON array, in one copy."""
        with memoryview(self.buf) as view:
            return b"".join((b"[", view[:cut], b"]"))


def stream_events(
    path: Path, on_events: Callable[[list[Event]], None]
) -> tuple[dict[str, Any], list[str]]:
    """Decode the event array of ``path`` into ``on_events`` calls, in file order.

    Returns the top-level object (``traceEvents`` emptied) and the notes of
    whatever was repaired. Raises :class:`Fallback` for files this reader
    does not take, :class:`TraceError` when nothing can be read.
    """
    stream = EventStream(path)
    stream.run(on_events)
    top, notes = stream.finish(on_events)
    return top, repair_notes(stream.fixes) + notes


class EventStream:
    """The event array of one file, decoded piece by piece (see :func:`stream_events`).

    Two of them can share a file: one from the start that stops at an event
    boundary (``run(stop=...)``), one that starts there (``start``, with the
    first one's ``head``); :mod:`perfguard.trace.kineto_split` runs them in
    two processes.
    """

    def __init__(self, path: Path, start: int | None = None, head: bytes | None = None):
        self.path = path
        self.notes: list[str] = []
        self.fixes: Counter[str] = Counter()
        self.seen = 0  # events decoded
        if start is not None:  # a later part of the array: ``head`` is the object's start
            assert head is not None
            self.r = _Reader(path, self.notes, start)
            self.head = head
            return
        r = self.r = _Reader(path, self.notes)
        r.fill(PIECE_BYTES)
        m = _EVENTS_KEY.search(r.buf, 0, _HEADER_LIMIT)
        while m is None and not r.eof and len(r.buf) < _HEADER_LIMIT:
            r.fill(len(r.buf) + PIECE_BYTES)
            m = _EVENTS_KEY.search(r.buf, 0, _HEADER_LIMIT)
        if m is None or not r.buf.lstrip()[:1] == b"{":
            raise Fallback
        self.head = r.take(m.end())[: m.start()] + b'"traceEvents": ['

    def decode(self, text: bytes) -> list[Event]:
        """One framed piece: the fast typed decode, else torch's bugs repaired."""
        try:
            return _typed(text)
        except (msgspec.DecodeError, UnicodeDecodeError):
            pass
        events, _ = repair_piece(text, _typed, self.fixes)  # Unrepairable goes up
        return events

    def run(self, on_events: Callable[[list[Event]], None], stop: int | None = None) -> bool:
        """Decode whole pieces until the text ends (then :meth:`finish`) or, with
        ``stop`` (the offset of an event's ``{``), until every event before it is
        read: then True, and the reader waits at ``stop``. False when it is not
        an event boundary this reader can stop at (call again without ``stop``)."""
        r = self.r
        if stop is not None:
            r.limit = stop + 1  # the '{' too: it shows where the last event ends
        while True:
            r.fill(PIECE_BYTES)
            if r.eof:
                break
            cut = _last_between(r.buf)
            if cut is None:  # one event larger than a piece
                r.fill(len(r.buf) * 2)
                continue
            try:
                events = self.decode(r.framed(cut))
            except Unrepairable as exc:
                if not exc.truncated:
                    raise TraceError(self.path, _bad_json(exc, r.offset)) from None
                # the cut fell inside a string that holds "},{": cut at an earlier gap
                cut = _last_between(r.buf, cut - 1)
                if cut is None:
                    raise TraceError(self.path, _bad_json(exc, r.offset)) from None
                events = self.decode(r.framed(cut))
            self._consumed(on_events, events, cut)
            del events  # the piece's structs go before the next one is decoded
        stopped = r.at_limit
        r.lift()
        if stop is None or not stopped:
            return False
        cut = _last_between(r.buf)
        if cut is None or r.offset + len(r.buf) != stop + 1 or not r.buf.endswith(b"{"):
            return False
        gap = _GAP.match(r.buf, cut)
        if gap is None or gap.end() != len(r.buf) - 1:
            return False
        fixes = self.fixes.copy()
        try:
            events = self.decode(r.framed(cut))
        except Unrepairable:  # left for the serial reader, which words it
            self.fixes = fixes
            return False
        self._consumed(on_events, events, cut)
        return True

    def _consumed(
        self, on_events: Callable[[list[Event]], None], events: list[Event], cut: int
    ) -> None:
        self.seen += len(events)
        on_events(events)
        self.r.skip(cut)
        gap = _GAP.match(self.r.buf)  # an event's cut is always followed by its gap
        self.r.skip(gap.end() if gap else 0)  # up to the next '{'

    def finish(self, on_events: Callable[[list[Event]], None]) -> tuple[dict[str, Any], list[str]]:
        """The last events and the object's tail, after :meth:`run` read to the end:
        ``(top-level object, notes)``; the repairs' notes are :attr:`fixes`'."""
        r = self.r
        try:
            top, events, complete = _final(self.path, r, self.head, self.decode, self.notes)
        except Unrepairable as exc:
            raise TraceError(self.path, _bad_json(exc, r.offset)) from None
        self.seen += len(events)
        if self.seen == 0 and not complete:
            raise TraceError(self.path, "truncated or corrupt before its first complete event")
        on_events(events)
        return top, self.notes


def _typed(text: bytes) -> list[Event]:
    try:
        return _DECODER.decode(text)
    except msgspec.ValidationError:  # valid JSON, not events: the plain reader words the error
        raise Fallback from None


def _last_between(buf: bytes, end: int | None = None) -> int | None:
    """Offset just after the ``}`` of the last complete event before ``end``."""
    end = len(buf) if end is None else end
    start = max(0, end - (1 << 20))
    while True:
        last = None
        for m in BETWEEN_EVENTS.finditer(buf, start, end):
            last = m
        if last is not None:
            return last.start() + 1
        if start == 0:
            return None
        start = max(0, start - (4 << 20))


def _bad_json(exc: Exception, offset: int) -> str:
    return (
        f"not valid JSON, and not a known torch bug that can be repaired ({exc}; "
        f"in the piece at byte {offset:,})"
    )


def _final(
    path: Path,
    r: _Reader,
    head: bytes,
    decode: Callable[[bytes], list[Event]],
    notes: list[str],
) -> tuple[dict[str, Any], list[Event], bool]:
    """The last events, the array's end and the object's tail; salvages a truncated file.

    Returns (top-level object, events, whether the array was complete).
    """
    buf = r.buf
    ends = list(_ARRAY_END.finditer(buf, max(0, len(buf) - _TAIL_LIMIT)))
    error: Unrepairable | None = None
    for m in reversed(ends):  # the object's tail may hold arrays too (deviceProperties)
        k = m.start() - 1
        while k >= 0 and buf[k] in _BLANK:
            k -= 1
        if k >= 0 and buf[k] != ord("}"):
            continue
        try:
            top = json.loads(head + b"]" + buf[m.start() + 1 :])
        except ValueError:
            continue
        if not isinstance(top, dict):
            raise Fallback
        try:
            return top, (decode(b"[" + buf[: k + 1] + b"]") if k >= 0 else []), True
        except Unrepairable as exc:
            error = error or exc
    if error is not None:
        raise error
    # no end of array: the file stops inside it (the profiler was killed mid-write)
    events = _longest_prefix(buf, decode)
    try:
        top = json.loads(head + b"]}")
    except ValueError:
        raise TraceError(path, "truncated or corrupt before its event list") from None
    if not isinstance(top, dict):
        raise Fallback
    at = r.offset + len(buf)
    notes.append(
        f"the file ends inside its event list at byte {at:,} (truncated, e.g. the profiler "
        "was killed while writing): every complete event before that point was read, the "
        "cut event and the trace's closing fields are missing"
    )
    return top, events, False


_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")


def _longest_prefix(buf: bytes, decode: Callable[[bytes], list[Event]]) -> list[Event]:
    """The events of the longest prefix of ``buf`` (an event array cut short) that
    decodes, found in at most :data:`_MAX_SALVAGE_DECODES` decodes.

    Each failed decode costs a repair attempt over the whole piece, so trying event
    ends one by one from the last took 64 full attempts when the damage sat far
    before the end (a flipped gzip byte: over 30 CPU s on a 10 MB piece, fuzz case
    8015). The plain decoder's error names the first bad byte, so the last event
    ending before it is tried first; the rest is a bisection (a prefix that decodes
    has every shorter prefix decoding).
    """
    order = [m.end() for m in _EVENT_END.finditer(buf)]
    best: list[Event] = []
    lo, hi, tried = 0, len(order), 0
    first_bad = _first_bad_byte(buf)
    if first_bad is not None and order:
        k = bisect.bisect_right(order, first_bad) - 1
        if k >= 0:
            try:
                best, lo = decode(b"[" + buf[: order[k]] + b"]"), k + 1
            except Unrepairable:
                hi = k
            tried += 1
    while lo < hi and tried < _MAX_SALVAGE_DECODES:
        mid = (lo + hi) // 2
        try:
            best, lo = decode(b"[" + buf[: order[mid]] + b"]"), mid + 1
        except Unrepairable:
            hi = mid
        tried += 1
    return best


def _first_bad_byte(buf: bytes) -> int | None:
    """Where the plain decoder first fails on ``buf`` as an array, or None."""
    try:
        _DECODER.decode(b"[" + buf + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        found = _ERROR_BYTE.search(str(exc))
        return int(found.group(1)) - 1 if found else None  # less the '[' in front
    return None


def read_plain(path: Path) -> dict[str, Any]:
    """The whole file parsed with :func:`json.loads` (the fallback); errors name the file."""
    try:
        with open(path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        with opener(path, "rb") as fh:
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
    return data
