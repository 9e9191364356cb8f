"""Repairs for the invalid JSON that real torch versions write in Kineto traces.

torch 2.13's ``export_chrome_trace`` writes a ``record_function`` name as it
is, so a ``"`` in it ends the JSON string early (checked with the real
profiler: ``attn"q<k>&v`` is written ``"name": "attn"q<k>&v",``). Older
writers leave ``\\`` unescaped, write ``NaN``/``Infinity`` and lone UTF-16
surrogates, and a profiler killed mid-write leaves a truncated tail (handled
by the streaming reader). None of this is on the fast path: a piece of the
event array is repaired only after the fast decoder has rejected it, and
only the lines the decoder points at (or that hold a quote between two word
characters) are rewritten.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

#: what :func:`repair_piece` counts -> the note that says so
REPAIR_NOTES = {
    "quote": "{n} unescaped double quote(s) inside names were escaped (torch writes a '\"' in a "
    "record_function name as it is, which is not valid JSON)",
    "backslash": "{n} unescaped backslash(es) inside names were escaped (not valid JSON)",
    "nan": "{n} NaN/Infinity value(s) (not JSON) were read as missing",
    "surrogate": "{n} lone UTF-16 surrogate(s) in names were replaced with U+FFFD",
    "utf8": "invalid UTF-8 bytes in {n} piece(s) of the event list were replaced with U+FFFD",
}

#: a quote between two word characters: inside a string, never JSON structure
_SUSPECT = re.compile(rb'[\w<>&.)\]-]"[\w<>&(\[-]')
#: a NaN/Infinity where a value goes, and a backslash that starts no JSON escape: found
#: up front, so a piece with thousands of them is repaired in one pass, not one decode each
_NAN_VALUE = re.compile(rb"[:,\[]\s*-?(?:NaN|Infinity)")
_BAD_ESCAPE = re.compile(rb'\\(?![\\"/bfnrtu])')
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<![0-9a-fA-F]{4})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_BYTE_AT = re.compile(r"\(byte (\d+)\)")
_ESCAPES = set('"\\/bfnrt')
_HEX = set("0123456789abcdefABCDEF")
#: a closing quote is followed by one of these (after blanks) ...
_AFTER_CLOSE = set(":}]\r\n")
#: ... or by a comma and then the start of a key or value
_AFTER_COMMA = set('"{[-0123456789tfnNI}]\r\n')
#: the longest line the repair rewrites (torch writes one key per line)
_MAX_LINE = 1 << 20
#: fixes per piece before giving up (each costs one decode of the piece)
_MAX_ROUNDS = 2000


class Unrepairable(ValueError):
    """The piece is not valid JSON and no repair applies; ``truncated`` if it just ends early."""

    def __init__(self, message: str, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated


def _closes(line: str, k: int) -> bool:
    """Does a quote just before ``line[k]`` close the string (judged by what follows)?"""
    n = len(line)
    while k < n and line[k] in " \t":
        k += 1
    if k >= n or line[k] in _AFTER_CLOSE:
        return True
    if line[k] != ",":
        return False
    k += 1
    while k < n and line[k] in " \t":
        k += 1
    return k >= n or line[k] in _AFTER_COMMA


def _string(line: str, i: int, fixes: Counter[str], end: int | None = None) -> tuple[str, int]:
    """The JSON string opening at ``line[i]``, re-escaped; returns (text, index after it).

    It closes at the quote at ``end`` when given, else at the first quote
    that :func:`_closes` accepts.
    """
    n = len(line)
    j = i + 1
    s: list[str] = ['"']
    while j < n:
        ch = line[j]
        if ch == "\\":
            nxt = line[j + 1 : j + 2]
            if nxt and nxt in _ESCAPES and not (nxt == '"' and j + 1 == end):
                s.append(line[j : j + 2])
                j += 2
                continue
            if nxt == "u" and set(line[j + 2 : j + 6]) <= _HEX and len(line) >= j + 6:
                s.append(line[j : j + 6])
                j += 6
                continue
            s.append("\\\\")
            fixes["backslash"] += 1
            j += 1
            continue
        if ch == '"':
            if j == end if end is not None else _closes(line, j + 1):
                break
            s.append('\\"')
            fixes["quote"] += 1
            j += 1
            continue
        s.append(ch)
        j += 1
    s.append('"')
    return "".join(s), j + 1


def repair_line(line: str, fixes: Counter[str]) -> str:
    """One line of JSON with strings re-escaped and NaN/Infinity made null.

    A quote inside a string closes it only when what follows could follow a
    JSON value (``:``, ``,`` and a key or value, ``}``, ``]``, end of line);
    any other quote, and a backslash that starts no valid escape, is escaped.
    When that does not give a valid ``"key": value`` line and the line holds
    one key and a string (torch writes ``"name": "...",`` alone on a line),
    the value runs to the line's last quote: ``say "hi", "there"`` is a name.
    """
    local: Counter[str] = Counter()
    out = _repair_scan(line, local)
    if not _pair_ok(out):
        m = _ONE_PAIR.match(line)
        if m:
            greedy: Counter[str] = Counter()
            value, _ = _string(line, m.end(1), greedy, end=m.start(3) - 1)
            candidate = m.group(1) + value + m.group(3)
            if _pair_ok(candidate):
                out, local = candidate, greedy
    fixes.update(local)
    return out


#: ``"key": "..."`` alone on a line (group 3: what follows the value's last quote)
_ONE_PAIR = re.compile(r'^(\s*"[^"\\]*"\s*:\s*)(".*")(\s*,?\s*)$')


def _pair_ok(line: str) -> bool:
    """Is ``line`` a valid ``"key": value`` line (or not such a line at all)?"""
    t = line.strip().rstrip(",")
    if not (t.startswith('"') and ":" in t) or t.endswith(("{", "[")):
        return True
    try:
        json.loads("{" + t + "}")
    except ValueError:
        return False
    return True


def _repair_scan(line: str, fixes: Counter[str]) -> str:
    out: list[str] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == '"':
            text, i = _string(line, i, fixes)
            out.append(text)
            continue
        for word in ("-Infinity", "Infinity", "NaN"):
            if line.startswith(word, i):
                out.append("null")
                fixes["nan"] += 1
                i += len(word)
                break
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _repair_lines(text: bytes, starts: list[int], fixes: Counter[str]) -> bytes:
    """``text`` with the lines that hold the given offsets rewritten by :func:`repair_line`."""
    spans = sorted({(text.rfind(b"\n", 0, p) + 1, _line_end(text, p)) for p in starts})
    out, last = [], 0
    for a, b in spans:
        if a < last:
            continue
        if b - a > _MAX_LINE:
            raise Unrepairable(f"not valid JSON near byte {starts[0]} (line too long to repair)")
        out.append(text[last:a])
        out.append(repair_line(text[a:b].decode("utf-8", "replace"), fixes).encode("utf-8"))
        last = b
    out.append(text[last:])
    return b"".join(out)


def _line_end(text: bytes, p: int) -> int:
    e = text.find(b"\n", p)
    return len(text) if e < 0 else e


def repair_piece(
    piece: bytes, decode: Callable[[bytes], Any], fixes: Counter[str]
) -> tuple[Any, bytes]:
    """Decode ``piece`` (a JSON text) after repairing it; returns (decoded, repaired text).

    Raises :class:`Unrepairable` when it stays invalid (``truncated`` when the
    decoder ran out of input, which the caller may salvage).
    """
    text = piece
    suspects = [m.start() + 1 for m in _SUSPECT.finditer(text)]
    suspects += [m.end() - 1 for rx in (_NAN_VALUE, _BAD_ESCAPE) for m in rx.finditer(text)]
    if suspects:
        before = fixes.copy()
        repaired = _repair_lines(text, suspects, fixes)
        if fixes != before:
            text = repaired
    for _ in range(_MAX_ROUNDS):
        try:
            return decode(text), text
        except UnicodeDecodeError:
            text = text.decode("utf-8", "replace").encode("utf-8")
            fixes["utf8"] += 1
            continue
        except ValueError as exc:  # msgspec.DecodeError is a ValueError
            msg = str(exc)
        m = _BYTE_AT.search(msg)
        if m is None or "surrogate" in msg:  # a lone surrogate may read as running out of input
            lone = _LONE_SURROGATE.findall(text)
            if lone:
                text = _LONE_SURROGATE.sub(rb"\\ufffd", text)
                fixes["surrogate"] += len(lone)
                continue
        if m is None:
            raise Unrepairable(msg, truncated=True)
        p = int(m.group(1))
        before = fixes.copy()
        repaired = _repair_lines(text, [min(p, len(text) - 1)], fixes)
        if fixes == before:  # nothing on that line is a known torch bug
            raise Unrepairable(msg)
        text = repaired
    raise Unrepairable(f"too many repairs needed (over {_MAX_ROUNDS} in one piece)")


def repair_notes(fixes: Counter[str]) -> list[str]:
    """One note per kind of repair made."""
    return [REPAIR_NOTES[k].format(n=n) for k, n in fixes.items() if n and k in REPAIR_NOTES]
