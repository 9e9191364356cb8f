"""The session report's two small charts, written as SVG text directly.

A ``pytest --perfguard`` session draws a strip/box chart of each test's rounds and a line
of its history. Drawn with matplotlib they cost the session its import (about 1 s of CPU
on this project's VM: more than the analysis of a small test) for two kinds of chart
that are a few dozen SVG elements each. The analysis page of the CLI, which has more
kinds of figure, keeps matplotlib (:mod:`perfguard.report.figures`).

Coordinates are in CSS pixels; text stays text, with the page's font.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from perfguard.compare.units import axis, nice_ticks

WIDTH, HEIGHT = 520, 150
FONT = 'font-family="system-ui,sans-serif" font-size="10"'
AXIS_COLOR = "#444"
#: the widest a character of the 10 px font draws (a digit is about 5.6 px in the usual
#: sans fonts, a capital up to 7): room is made by this, so no label is ever cut
CHAR_PX = 6.6


def text_px(text: str) -> float:
    """The most a label of the charts' font takes, in px."""
    return CHAR_PX * len(text)


def left_margin(labels: Sequence[str], title: str = "") -> float:
    """The plot area's left edge: room for the longest y label right-aligned 5 px before
    it, and for a rotated y title beside them (``2.1228 GFLOP`` was cut to ``.1228 GFLOP``
    by a fixed margin)."""
    return max(40.0, 4 + (16 if title else 0) + max(map(text_px, labels), default=0.0) + 5)


def x_label(x: float, text: str, lo: float, hi: float) -> tuple[float, str]:
    """An x label's anchor point and ``text-anchor`` so that it stays within [lo, hi]:
    centred on its tick where it fits, else flush with the edge it would cross."""
    half = text_px(text) / 2
    if x - half < lo:
        return lo, "start"
    if x + half > hi:
        return hi, "end"
    return x, "middle"


def x_labels(
    points: Sequence[tuple[float, str]], lo: float, hi: float
) -> list[tuple[float, str, str] | None]:
    """Per x label at ``points`` (px, text), its ``(anchor point, text-anchor, text)`` inside
    [lo, hi] (:func:`x_label`), or None where it would overlap: placed right to left, so the
    last (the newest) always shows, and one that would overlap the label to its right is
    left out (its tick stays)."""
    out: list[tuple[float, str, str] | None] = []
    room = hi
    for x, text in reversed(points):
        at, anchor = x_label(x, text, lo, hi)
        w = text_px(text)
        start = {"start": at, "middle": at - w / 2, "end": at - w}[anchor]
        if start + w > room:
            out.append(None)
            continue
        room = start - 6
        out.append((at, anchor, text))
    return out[::-1]


def _ticks(lo: float, hi: float, most: int = 5) -> list[tuple[float, str]]:
    """An axis' round ticks in [lo, hi] and their labels (:func:`units.axis`: labels that
    differ, as few digits as that takes, never in exponent notation)."""
    ticks = nice_ticks(lo, hi, most)
    return list(zip(ticks, axis(ticks), strict=True))


@dataclass(frozen=True)
class Frame:
    """The plot area inside the chart, and the data ranges mapped onto it."""

    left: float
    right: float
    top: float
    bottom: float
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, v: float) -> float:
        return self.left + (v - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def y(self, v: float) -> float:
        return self.bottom - (v - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


def _svg(label: str, body: list[str]) -> str:
    return (
        f'<svg role="img" aria-label="{escape(label)}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" {FONT}>' + "".join(body) + "</svg>"
    )


def _x_axis(f: Frame, ticks: Sequence[tuple[float, str]], title: str) -> list[str]:
    out = [
        f'<line x1="{f.left}" y1="{f.bottom}" x2="{f.right}" y2="{f.bottom}" '
        f'stroke="{AXIS_COLOR}"/>'
    ]
    placed = x_labels([(f.x(v), t) for v, t in ticks], 2, WIDTH - 2)
    for (v, _), label in zip(reversed(ticks), reversed(placed), strict=True):
        x = f.x(v)
        out.append(
            f'<line x1="{x:.1f}" y1="{f.bottom}" x2="{x:.1f}" y2="{f.bottom + 3}" '
            f'stroke="{AXIS_COLOR}"/>'
        )
        if label is not None:
            at, anchor, text = label
            out.append(
                f'<text x="{at:.1f}" y="{f.bottom + 13}" text-anchor="{anchor}">'
                f"{escape(text)}</text>"
            )
    if title:
        at, anchor = x_label((f.left + f.right) / 2, title, 2, WIDTH - 2)
        out.append(
            f'<text x="{at:.1f}" y="{HEIGHT - 4}" text-anchor="{anchor}">{escape(title)}</text>'
        )
    return out


def _y_axis(f: Frame, ticks: Sequence[tuple[float, str]], title: str) -> list[str]:
    out = [
        f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{f.bottom}" stroke="{AXIS_COLOR}"/>'
    ]
    for v, text in ticks:
        y = f.y(v)
        out.append(
            f'<text x="{f.left - 5}" y="{y + 3.5:.1f}" text-anchor="end">{escape(text)}</text>'
        )
    if title:
        y = (f.top + f.bottom) / 2
        out.append(
            f'<text transform="translate(11 {y:.1f}) rotate(-90)" '
            f'text-anchor="middle">{escape(title)}</text>'
        )
    return out


def strip_box(groups: Sequence[tuple[str, np.ndarray, str]], x_title: str, label: str) -> str:
    """One row per ``(name, values, colour)``, top to bottom: the values as jittered points
    over a box of their quartiles with a bar at the median."""
    values = [v for _, v, _ in groups if len(v)]
    lo = min(float(v.min()) for v in values)
    hi = max(float(v.max()) for v in values)
    pad = (hi - lo) * 0.06 or abs(hi) * 0.05 or 1.0
    f = Frame(
        left=left_margin([name for name, _, _ in groups]),
        right=WIDTH - 16,
        top=6,
        bottom=HEIGHT - 45,
        x0=lo - pad,
        x1=hi + pad,
        y0=-0.6,
        y1=len(groups) - 0.4,
    )
    body: list[str] = []
    rng = np.random.default_rng(0)  # the same jitter every render: reports diff cleanly
    rows = []
    for k, (name, v, colour) in enumerate(groups):
        row = len(groups) - 1 - k
        rows.append((float(row), name))
        jitter = rng.uniform(-0.22, 0.22, len(v))
        for value, j in zip(v, jitter, strict=True):
            body.append(
                f'<circle cx="{f.x(float(value)):.1f}" cy="{f.y(row + j):.1f}" r="1.6" '
                f'fill="{colour}" fill-opacity="0.6"/>'
            )
        if len(v):
            q1, med, q3 = (float(q) for q in np.percentile(v, [25, 50, 75]))
            top, bottom = f.y(row + 0.3), f.y(row - 0.3)
            body.append(
                f'<rect x="{f.x(q1):.1f}" y="{top:.1f}" '
                f'width="{max(f.x(q3) - f.x(q1), 0.5):.1f}" height="{bottom - top:.1f}" '
                f'fill="none" stroke="{AXIS_COLOR}" stroke-width="1.2"/>'
            )
            body.append(
                f'<line x1="{f.x(med):.1f}" y1="{f.y(row + 0.34):.1f}" '
                f'x2="{f.x(med):.1f}" y2="{f.y(row - 0.34):.1f}" stroke="#1e3a8a" '
                f'stroke-width="1.6"/>'
            )
    ticks = _ticks(f.x0, f.x1)
    body += _x_axis(f, ticks, x_title)
    body += _y_axis(f, [(r, n) for r, n in rows], "")
    return _svg(label, body)


def line(values: np.ndarray, x_labels: Sequence[str], y_title: str, label: str, colour: str) -> str:
    """``values`` in order as a line with points, the last one marked; at most five x labels,
    anchored at the last point."""
    n = len(values)
    lo, hi = float(values.min()), float(values.max())
    pad = (hi - lo) * 0.15 or hi * 0.05 or 1.0
    yticks = _ticks(lo - pad, hi + pad, 4)
    f = Frame(
        left=left_margin([t for _, t in yticks], y_title),
        right=WIDTH - 16,
        top=6,
        bottom=HEIGHT - 25,
        x0=-0.5,
        x1=n - 0.5,
        y0=lo - pad,
        y1=hi + pad,
    )
    points = " ".join(f"{f.x(i):.1f},{f.y(float(v)):.1f}" for i, v in enumerate(values))
    body = [f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1"/>']
    body += [
        f'<circle cx="{f.x(i):.1f}" cy="{f.y(float(v)):.1f}" r="2" fill="{colour}"/>'
        for i, v in enumerate(values)
    ]
    body.append(
        f'<circle cx="{f.x(n - 1):.1f}" cy="{f.y(float(values[-1])):.1f}" r="3.5" fill="#dc2626"/>'
    )
    step = -(-n // 5)
    xticks = [(float(i), x_labels[i]) for i in range(n - 1, -1, -step)][::-1]
    body += _x_axis(f, xticks, "")
    body += _y_axis(f, yticks, y_title)
    return _svg(label, body)


#: the colours of a split bar's parts, in order (the rest: grey)
SPLIT_COLOURS = ("#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#06b6d4", "#84cc16")
SPLIT_OTHER = "#cbd5e1"


def split_bar(parts: Sequence[tuple[str, float, str]], label: str, width: int = WIDTH) -> str:
    """One horizontal bar split into ``(name, share %, caption)`` parts, left to right, each
    in a colour of :data:`SPLIT_COLOURS` (an unnamed last part in grey), with a legend
    below it: the step's time split by op. The captions are the legend's text."""
    height = 22 + 14 * ((len(parts) + 1) // 2)
    body: list[str] = []
    x = 4.0
    span = width - 8.0
    legend: list[str] = []
    for k, (name, share, caption) in enumerate(parts):
        colour = SPLIT_COLOURS[k % len(SPLIT_COLOURS)] if name else SPLIT_OTHER
        w = max(span * share / 100.0, 0.0)
        body.append(
            f'<rect x="{x:.1f}" y="2" width="{w:.1f}" height="14" fill="{colour}">'
            f"<title>{escape(caption)}</title></rect>"
        )
        x += w
        lx = 4 + (k % 2) * (width / 2)
        ly = 30 + 14 * (k // 2)
        room = int((width / 2 - 16) / CHAR_PX)  # a caption stays in its half of the legend
        shown = caption if len(caption) <= room else caption[: room - 1] + "…"
        legend.append(
            f'<rect x="{lx:.1f}" y="{ly - 8}" width="8" height="8" fill="{colour}"/>'
            f'<text x="{lx + 12:.1f}" y="{ly}">{escape(shown)}<title>{escape(caption)}</title>'
            "</text>"
        )
    return (
        f'<svg role="img" aria-label="{escape(label)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" {FONT}>' + "".join(body + legend) + "</svg>"
    )


def iteration_strip(
    values: np.ndarray, rounds: np.ndarray, y_title: str, label: str, colour: str
) -> str:
    """Each iteration's time in order as a bar, a round's bars side by side with a gap
    between rounds: a strip that shows warm-up drift, a slow spell, a periodic spike."""
    n = len(values)
    hi = float(np.nanmax(values)) if n else 1.0
    yticks = _ticks(0.0, hi * 1.08 or 1.0, 4)
    f = Frame(
        left=left_margin([t for _, t in yticks], y_title),
        right=WIDTH - 16,
        top=6,
        bottom=HEIGHT - 25,
        x0=-0.5,
        x1=n - 0.5 + max(int(len(np.unique(rounds))) - 1, 0),
        y0=0.0,
        y1=hi * 1.08 or 1.0,
    )
    slot = (f.right - f.left) / max(f.x1 - f.x0, 1.0)
    body = []
    gap = 0
    for i in range(n):
        if i and rounds[i] != rounds[i - 1]:
            gap += 1
        x = f.x(i + gap) - slot * 0.4
        y = f.y(float(values[i]))
        body.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" '
            f'height="{f.bottom - y:.1f}" fill="{colour}"/>'
        )
    body += _x_axis(f, [], "iterations in order, rounds apart")
    body += _y_axis(f, yticks, y_title)
    return _svg(label, body)
