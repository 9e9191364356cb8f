"""Vectorised decoding of serialized ``XEvent`` messages (numpy, no Python loop per event).

An XSpace holds its events as millions of small messages; asking the
protobuf runtime for each event's fields costs a Python object and about a
microsecond per field. Instead the lines' events are taken as raw bytes
(``XLine.events`` declared ``repeated bytes``, see
:mod:`perfguard.trace.xspace_proto`), concatenated, and decoded here with
array operations over all events at once, field by field. An ``XEvent``
(tsl ``xplane.proto``) is::

    int64 metadata_id = 1; int64 offset_ps = 2 (oneof with num_occurrences = 5);
    int64 duration_ps = 3; repeated XStat stats = 4;

and an ``XStat`` is ``int64 metadata_id = 1`` then one value: ``double = 2``,
``uint64 = 3``, ``int64 = 4``, ``string = 5``, ``bytes = 6``, ``ref = 7``.
Writers serialize fields in field-number order (protobuf's C++ encoder
does), which the decoder relies on; an event it cannot decode that way is
reported back (``bad``) and the caller decodes those few with the protobuf
runtime instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

#: wire tags (field number << 3 | wire type)
_T_METADATA, _T_OFFSET, _T_DURATION, _T_STATS, _T_OCCURRENCES = 0x08, 0x10, 0x18, 0x22, 0x28
_S_METADATA, _S_DOUBLE, _S_UINT, _S_INT, _S_STR, _S_BYTES, _S_REF = (
    0x08,
    0x11,
    0x18,
    0x20,
    0x2A,
    0x32,
    0x38,
)
#: stat value kinds (``Stats.kind``) callers tell apart
REF_KIND, DOUBLE_KIND, TEXT_KINDS = _S_REF, _S_DOUBLE, (_S_STR, _S_BYTES)
_PAD = 16  # zero bytes after the buffer: a varint read near the end never leaves it


@dataclass
class Stats:
    """The stats of the decoded events, one row each: which event, which stat, what value.

    ``kind`` is the value's wire tag; ``value`` holds integers (int64 bits),
    refs and doubles' bit patterns; ``text_start``/``text_len`` locate string
    and bytes values in the buffer.
    """

    event: np.ndarray
    metadata_id: np.ndarray
    kind: np.ndarray
    value: np.ndarray
    text_start: np.ndarray
    text_len: np.ndarray


@dataclass
class Events:
    metadata_id: np.ndarray
    offset_ps: np.ndarray
    duration_ps: np.ndarray
    stats: Stats
    #: events the vectorised pass could not decode (unexpected field order or wire type)
    bad: np.ndarray
    buf: np.ndarray

    def text(self, rows: np.ndarray) -> list[str]:
        """The string values of stat ``rows`` (only the few asked for are made objects)."""
        s, n = self.stats.text_start[rows], self.stats.text_len[rows]
        raw = self.buf
        return [bytes(raw[a : a + b]).decode("utf-8", "replace") for a, b in zip(s, n, strict=True)]


def varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint starting at each of ``pos``: (value as uint64, its length in bytes)."""
    value = np.zeros(len(pos), np.uint64)
    length = np.zeros(len(pos), np.int64)
    going = np.ones(len(pos), bool)
    for i in range(10):
        b = buf[pos + i].astype(np.uint64)
        value |= np.where(going, (b & np.uint64(0x7F)) << np.uint64(7 * i), np.uint64(0))
        length += going
        going &= b >= 0x80
        if not going.any():
            break
    return value, length


def decode_events(events: Iterable[bytes]) -> Events:
    """Decode serialized XEvents (an iterable of bytes, one per event)."""
    blobs = list(events)
    n = len(blobs)
    lens = np.fromiter(map(len, blobs), np.int64, n)
    ends = np.cumsum(lens)
    starts = ends - lens
    buf = np.frombuffer(b"".join(blobs) + bytes(_PAD), np.uint8)
    pos = starts.copy()

    def field(tag: int) -> np.ndarray:
        has = (pos < ends) & (buf[pos] == tag)
        value, length = varints(buf, pos + 1)
        np.add(pos, np.where(has, 1 + length, 0), out=pos)
        return np.where(has, value, np.uint64(0)).view(np.int64)

    metadata_id = field(_T_METADATA)
    offset_ps = field(_T_OFFSET)
    duration_ps = field(_T_DURATION)
    stats = _stats(buf, pos, ends)
    field(_T_OCCURRENCES)  # counted-event form (no offset): not used by the tables
    bad = pos != ends
    return Events(metadata_id, offset_ps, duration_ps, stats, bad, buf)


def _stats(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray) -> Stats:
    """Walk every event's stats in step: round k decodes the k-th stat of each event."""
    parts: list[tuple[np.ndarray, ...]] = []
    idx = np.flatnonzero((pos < ends) & (buf[pos] == _T_STATS))
    while len(idx):
        p = pos[idx] + 1
        size, length = varints(buf, p)
        p = p + length
        stop = p + size.astype(np.int64)
        has_id = (p < stop) & (buf[p] == _S_METADATA)
        mid, length = varints(buf, p + 1)
        p = p + np.where(has_id, 1 + length, 0)
        kind = np.where(p < stop, buf[p], 0).astype(np.int64)
        value, length = varints(buf, p + 1)
        text = (kind == _S_STR) | (kind == _S_BYTES)
        double = kind == _S_DOUBLE
        if double.any():  # fixed64 little-endian: the 8 bytes' bit pattern
            at = p[double] + 1
            bits = np.zeros(len(at), np.uint64)
            for i in range(8):
                bits |= buf[at + i].astype(np.uint64) << np.uint64(8 * i)
            value[double] = bits
        text_start = np.where(text, p + 1 + length, 0)
        text_len = np.where(text, value.astype(np.int64), 0)
        value = np.where(text, np.uint64(0), value)
        parts.append(
            (
                idx,
                np.where(has_id, mid, 0).view(np.int64),
                kind,
                value.view(np.int64),
                text_start,
                text_len,
            )
        )
        pos[idx] = stop
        idx = idx[(stop < ends[idx]) & (buf[stop] == _T_STATS)]
    if not parts:
        empty = np.zeros(0, np.int64)
        return Stats(empty, empty, empty, empty, empty, empty)
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    return Stats(*cols)
