"""The published site's charts: SVG text, built on the session report's primitives.

:mod:`perfguard.report.svg` draws the session report's two charts; the site
needs a few more shapes (a sparkline, a level chart of a thousand runs with
every round as a point and vertical marks for change points and
acceptances, small line charts of counters and ops), and reuses its frame,
ticks, font and colours. matplotlib would cost seconds per hundred pages.

Size matters at a thousand runs: a round is one ``M x yh0`` move of a path
drawn with a round cap (a dot of 12 bytes, not a 60-byte ``<circle>``), and
coordinates have one decimal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from html import escape

import numpy as np

from perfguard.compare.units import axis, nice_ticks
from perfguard.report.svg import AXIS_COLOR, FONT, Frame, left_margin, text_px
from perfguard.report.svg import x_labels as placed_x_labels

__all__ = ["COLOURS", "Mark", "chart", "sparkline"]

#: the most points a sparkline draws (longer series are binned)
SPARK_POINTS = 70
#: line colours, in order (colour-blind safe: Okabe-Ito)
COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")


@dataclass(frozen=True)
class Mark:
    """A vertical line at ``x`` with a short label on top (a change point, an acceptance)."""

    x: float
    label: str
    colour: str
    title: str = ""
    dashed: bool = False


def _sx(f: Frame, v: np.ndarray) -> np.ndarray:
    """Frame.x over an array."""
    return f.left + (np.asarray(v, np.float64) - f.x0) / (f.x1 - f.x0) * (f.right - f.left)


def _sy(f: Frame, v: np.ndarray) -> np.ndarray:
    """Frame.y over an array."""
    return f.bottom - (np.asarray(v, np.float64) - f.y0) / (f.y1 - f.y0) * (f.bottom - f.top)


def _pairs(pattern: str, xs: np.ndarray, ys: np.ndarray) -> str:
    """``pattern`` (two ``%.1f``) for every point, in one ``%`` over the whole array (a
    thousand-run page has tens of thousands of coordinates)."""
    flat = np.empty(2 * len(xs))
    flat[0::2], flat[1::2] = xs, ys
    return (pattern * len(xs)) % tuple(flat.tolist())


def _path(xs: np.ndarray, ys: np.ndarray) -> str:
    return _pairs("M%.1f %.1fh0", xs, ys)


def _polyline(xs: np.ndarray, ys: np.ndarray) -> str:
    return _pairs("%.1f,%.1f ", xs, ys).rstrip()


def _bin_medians(v: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """``np.median`` of ``v[bins[i]:bins[i + 1]]`` for each bin (none empty), in one sort:
    the middle value, or the mean of the two middle values."""
    which = np.repeat(np.arange(len(bins) - 1), np.diff(bins))
    ordered = v[np.lexsort((v, which))]
    lo = bins[:-1] + (np.diff(bins) - 1) // 2
    hi = bins[:-1] + np.diff(bins) // 2
    return (ordered[lo] + ordered[hi]) / 2


def sparkline(
    values: np.ndarray,
    *,
    width: int = 140,
    height: int = 26,
    marks: Sequence[int] = (),
    counter_marks: Sequence[int] = (),
) -> str:
    """A small trend line of ``values`` with the last point dotted; ``marks``: indices of
    timing change points, ``counter_marks`` of counter steps, drawn as ticks."""
    v = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(v)
    v, where = v[keep], np.cumsum(keep) - 1
    if not len(v):
        return ""
    ticks = [(i, "#d55e00") for i in marks] + [(i, "#7c3aed") for i in counter_marks]
    ticks = [(int(where[i]), c) for i, c in ticks if 0 <= i < len(where)]
    if len(v) > SPARK_POINTS:  # a point per 2 px at most: bin medians (a step stays a step)
        bins = np.linspace(0, len(v), SPARK_POINTS + 1).astype(int)
        ticks = [(int(np.searchsorted(bins, i, side="right")) - 1, c) for i, c in ticks]
        v = _bin_medians(v, bins)
    lo, hi = float(v.min()), float(v.max())
    pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 1.0
    f = Frame(2, width - 4, 3, height - 3, -0.5, max(len(v) - 0.5, 0.5), lo - pad, hi + pad)
    xs, ys = _sx(f, np.arange(len(v))), _sy(f, v)
    body = [
        f'<polyline points="{_polyline(xs, ys)}" fill="none" stroke="{COLOURS[0]}" '
        f'stroke-width="1"/>'
    ]
    for i, colour in ticks:
        body.append(
            f'<line x1="{xs[i]:.1f}" y1="1" x2="{xs[i]:.1f}" y2="{height - 1}" '
            f'stroke="{colour}" stroke-width="1"/>'
        )
    body.append(f'<circle cx="{xs[-1]:.1f}" cy="{ys[-1]:.1f}" r="2" fill="{COLOURS[1]}"/>')
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} '
        f'{height}" aria-hidden="true">' + "".join(body) + "</svg>"
    )


def chart(
    *,
    label: str,
    x_count: int,
    lines: Sequence[tuple[str, np.ndarray, np.ndarray]],
    y_kind: str,
    points: tuple[np.ndarray, np.ndarray] | None = None,
    marks: Sequence[Mark] = (),
    x_labels: Sequence[tuple[float, str]] = (),
    width: int = 960,
    height: int = 260,
    legend: bool = False,
    log: bool = False,
) -> str:
    """A line chart over positions ``0..x_count-1``: each line ``(name, x, y)``, optional
    grey dots ``points`` (x, y) under them, vertical ``marks``, tick labels at
    ``x_labels`` and the y axis labelled as values of ``y_kind`` (:func:`units.axis`: a
    duration ``"ns"``, or a counter's name). ``log``: a log y axis (the ops of one test
    differ by orders of magnitude)."""
    ys = [y for _, _, y in lines] + ([points[1]] if points is not None else [])
    finite = np.concatenate([np.asarray(y, np.float64) for y in ys]) if ys else np.array([])
    finite = finite[np.isfinite(finite) & ((finite > 0) if log else True)]
    if not len(finite):
        return f'<p class="empty">{escape(label)}: nothing stored</p>'
    tf: Callable[[np.ndarray], np.ndarray] = np.log10 if log else (lambda a: a)
    lo, hi = float(tf(finite).min()), float(tf(finite).max())
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    ticks = nice_ticks(lo - pad, hi + pad, 5)
    labels = axis([10**t if log else t for t in ticks], y_kind, log=log)
    legend_h = 16 * ((len(lines) + 2) // 3) + 4 if legend else 0  # + a descender's room
    bottom = height - 22 - legend_h
    x1 = max(x_count - 0.5, 0.5)
    # the plot's top waits for the marks' label rows, which need their x: set it after
    f = Frame(left_margin(labels), width - 12, 0, bottom, -0.5, x1, lo - pad, hi + pad)
    spans = [_mark_span(f.x(m.x), m.label, width) for m in marks]
    rows = _label_rows(spans)
    f = replace(f, top=10 + 12 * (max(rows, default=-1) + 1))
    body: list[str] = []
    for t, text in zip(ticks, labels, strict=True):
        y = f.y(t)
        body.append(
            f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.right}" y2="{y:.1f}" stroke="#e5e7eb"/>'
        )
        body.append(
            f'<text x="{f.left - 5}" y="{y + 3.5:.1f}" text-anchor="end">{escape(text)}</text>'
        )
    body.append(
        f'<line x1="{f.left}" y1="{f.bottom}" x2="{f.right}" y2="{f.bottom}" '
        f'stroke="{AXIS_COLOR}"/>'
    )
    placed = placed_x_labels([(f.x(x), t) for x, t in x_labels], 2, width - 2)
    for px, anchor, text in (p for p in placed if p is not None):
        body.append(
            f'<text x="{px:.1f}" y="{f.bottom + 13}" text-anchor="{anchor}">{escape(text)}</text>'
        )
    for m, row, (lo_px, _) in zip(marks, rows, spans, strict=True):
        px = f.x(m.x)
        dash = ' stroke-dasharray="4 3"' if m.dashed else ""
        tip = f"<title>{escape(m.title)}</title>" if m.title else ""
        ty = 10 + 12 * row  # a baseline 10 px down: the 10 px font's capitals stay inside
        # a label runs right of its line, or left of it where it would cross the edge
        anchor = "start" if lo_px > px else "end"
        tx = px + 2 if anchor == "start" else px - 2
        body.append(
            f'<g class="mark"><line x1="{px:.1f}" y1="{ty - 8}" x2="{px:.1f}" '
            f'y2="{f.bottom}" stroke="{m.colour}" stroke-width="1.5"{dash}/>'
            f'<text x="{tx:.1f}" y="{ty}" text-anchor="{anchor}" fill="{m.colour}">'
            f"{escape(m.label)}</text>{tip}</g>"
        )
    if points is not None:
        dot_x, dot_y = points
        ok = np.isfinite(dot_y) & ((dot_y > 0) if log else True)
        xs, yv = _sx(f, dot_x[ok]), _sy(f, tf(dot_y[ok]))
        body.append(
            f'<path class="rounds" d="{_path(xs, yv)}" stroke="#9ca3af" '
            'stroke-width="3" stroke-linecap="round"/>'
        )
    for k, (name, lx, ly) in enumerate(lines):
        colour = COLOURS[k % len(COLOURS)]
        ok = np.isfinite(ly) & ((ly > 0) if log else True)
        xs, yv = _sx(f, np.asarray(lx)[ok]), _sy(f, tf(np.asarray(ly, np.float64)[ok]))
        if len(xs):
            body.append(
                f'<polyline points="{_polyline(xs, yv)}" fill="none" '
                f'stroke="{colour}" stroke-width="1.4"><title>{escape(name)}</title>'
                "</polyline>"
            )
        if legend:
            column = (f.right - f.left) / 3
            lx0 = f.left + (k % 3) * column
            ly0 = height - legend_h + 12 + 16 * (k // 3)
            body.append(
                f'<rect x="{lx0:.0f}" y="{ly0 - 8}" width="10" height="10" '
                f'fill="{colour}"/><text x="{lx0 + 14:.0f}" y="{ly0 + 1}">'
                f"{escape(_clip(name, int(column / 6.2) - 3))}</text>"
            )
    return (
        f'<svg role="img" aria-label="{escape(label)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" {FONT}>' + "".join(body) + "</svg>"
    )


def _mark_span(px: float, label: str, width: float) -> tuple[float, float]:
    """Where a mark's label at ``px`` lies, in px: right of its line, or left of it where
    it would run past the chart's right edge (change-point labels were cut: "bytes, d")."""
    w = text_px(label)
    return (px + 2, px + 2 + w) if px + 2 + w <= width - 2 else (px - 2 - w, px - 2)


def _label_rows(spans: Sequence[tuple[float, float]]) -> list[int]:
    """A text row for each mark's label, so labels of marks close together do not overlap."""
    ends: list[float] = []  # right end of the last label in each row
    rows = []
    for lo, hi in spans:
        row = next((r for r, end in enumerate(ends) if lo > end + 4), len(ends))
        if row == len(ends):
            ends.append(-1e9)
        ends[row] = hi
        rows.append(row)
    return rows


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else "…" + text[-(most - 1) :]
