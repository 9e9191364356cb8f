"""Small matplotlib figures for the HTML reports, returned as inline SVG text.

The reports are single files that a reviewer opens from a CI artifact, so
every figure is SVG text placed in the page: no image files, no network.
Text stays text in the SVG (``svg.fonttype = none``), which keeps each
figure to a few kB. The figures are drawn on :class:`~matplotlib.figure.Figure`
objects directly, never through ``pyplot``, so rendering a report does not
change the backend of a notebook that imports perfguard.

A session report draws two figures per test (its rounds, or an older
file's per-iteration samples, and its history). Building a matplotlib figure
and its axes costs about as much as drawing it, so :class:`SessionFigures`
builds each kind once and only swaps the data between tests (about half the
time of a fresh figure per test; see ``benchmarks/report_size.py``).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

_RC = {
    "svg.fonttype": "none",  # text as <text>, not paths: smaller, selectable
    "svg.hashsalt": "perfguard",  # stable ids between runs
    "font.size": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
BASELINE_COLOR = "#8a8f98"
CURRENT_COLOR = "#2563eb"
_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))


def time_unit(max_ns: float) -> tuple[float, str]:
    """The divisor and unit that show ``max_ns`` with 1-3 digits before the point."""
    for scale, name in _UNITS:
        if max_ns >= scale:
            return scale, name
    return 1.0, "ns"


def svg_text(fig: Any, label: str, prefix: str) -> str:
    """``fig`` as an ``<svg>`` element to paste into HTML.

    Drops the XML prolog, DOCTYPE and namespace declarations (HTML knows the
    SVG namespace; they are the only URLs matplotlib writes), and prefixes
    every element id with ``prefix`` so several figures on one page cannot
    resolve each other's clip paths or markers.
    """
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata=_METADATA)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r'\s+xmlns(?::\w+)?="[^"]*"', "", svg, count=0)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = svg.replace(' id="', f' id="{prefix}').replace('href="#', f'href="#{prefix}')
    svg = svg.replace("url(#", f"url(#{prefix}")
    label = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return svg.replace("<svg", f'<svg role="img" aria-label="{label}"', 1).strip()


class SessionFigures:
    """Per-test figures of a session report, drawn on figures built once.

    ``distribution`` shows baseline and current per-iteration samples (points
    over a box of the quartiles and a median bar); ``trend`` shows the test's
    stored medians over commits.
    """

    def __init__(self) -> None:
        import matplotlib
        from matplotlib.figure import Figure

        self._count = 0
        with matplotlib.rc_context(_RC):
            # fixed margins: a layout engine would re-measure every label on every draw
            self._dist = Figure(figsize=(5.2, 1.5))
            self._dist.subplots_adjust(left=0.14, right=0.97, bottom=0.3, top=0.96)
            ax = self._dist.add_subplot()
            self._dist_ax = ax
            self._points = [
                ax.scatter([], [], s=7, color=c, alpha=0.6, linewidths=0)
                for c in (BASELINE_COLOR, CURRENT_COLOR)
            ]
            self._boxes = [ax.plot([], [], color=c, lw=1.2)[0] for c in ("#333", "#1e3a8a")]
            ax.set_yticks([1, 0], ["baseline", "current"])
            ax.set_ylim(-0.6, 1.6)
            ax.tick_params(axis="y", length=0)
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(5))

            self._trend = Figure(figsize=(5.2, 1.5))
            self._trend.subplots_adjust(left=0.14, right=0.97, bottom=0.17, top=0.96)
            ax = self._trend.add_subplot()
            self._trend_ax = ax
            (self._trend_line,) = ax.plot([], [], color=CURRENT_COLOR, marker="o", ms=3, lw=1)
            (self._trend_last,) = ax.plot([], [], color="#dc2626", marker="o", ms=5, lw=0)
            ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))

    def _prefix(self) -> str:
        self._count += 1
        return f"f{self._count}-"

    def distribution(
        self,
        baseline: Sequence[float],
        current: Sequence[float],
        label: str,
        unit_label: str = "per-iteration time",
    ) -> str | None:
        """Box/strip plot of the two sets of values (ns: per-iteration samples or per-round
        values, ``unit_label`` says which), or None when both are empty."""
        groups = [np.asarray(baseline, dtype=float), np.asarray(current, dtype=float)]
        if not any(len(g) for g in groups):
            return None
        top = max(float(g.max()) for g in groups if len(g))
        scale, unit = time_unit(top)
        rng = np.random.default_rng(0)  # same jitter every render: reports diff cleanly
        lo, hi = np.inf, -np.inf
        for y, g, pts, box in zip((1, 0), groups, self._points, self._boxes, strict=True):
            v = g / scale
            jitter = rng.uniform(-0.22, 0.22, len(v))
            pts.set_offsets(np.c_[v, y + jitter] if len(v) else np.empty((0, 2)))
            if len(v):
                q1, med, q3 = np.percentile(v, [25, 50, 75])
                box.set_data(
                    [q1, q3, q3, q1, q1, np.nan, med, med],
                    [y - 0.3, y - 0.3, y + 0.3, y + 0.3, y - 0.3, np.nan, y - 0.34, y + 0.34],
                )
                lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
            else:
                box.set_data([], [])
        pad = (hi - lo) * 0.06 or abs(hi) * 0.05 or 1.0
        self._dist_ax.set_xlim(lo - pad, hi + pad)
        self._dist_ax.set_xlabel(f"{unit_label} ({unit})")
        return svg_text(self._dist, label, self._prefix())

    def trend(self, history: Sequence[dict[str, Any]], label: str) -> str | None:
        """Median per stored commit (oldest first), or None with fewer than two points."""
        points = [h for h in history if h.get("median_ns") is not None]
        if len(points) < 2:
            return None
        y = np.array([float(h["median_ns"]) for h in points])
        scale, unit = time_unit(float(y.max()))
        y = y / scale
        x = np.arange(len(y))
        ax = self._trend_ax
        self._trend_line.set_data(x, y)
        self._trend_last.set_data(x[-1:], y[-1:])
        ax.set_xlim(-0.5, len(y) - 0.5)
        pad = (y.max() - y.min()) * 0.15 or y.max() * 0.05 or 1.0
        ax.set_ylim(y.min() - pad, y.max() + pad)
        step = -(-len(y) // 5)  # at most 5 labels, anchored at the latest commit
        ticks = np.arange(len(y) - 1, -1, -step)[::-1]
        ax.set_xticks(ticks, [str(points[i].get("commit") or "?")[:7] for i in ticks])
        ax.set_ylabel(f"median ({unit})")
        return svg_text(self._trend, label, self._prefix())


def iteration_bars(duration_ns: np.ndarray, gpu_ns: np.ndarray, label: str) -> str | None:
    """Bars of each iteration's wall time with its GPU time in front; None without iterations."""
    import matplotlib
    from matplotlib.figure import Figure

    duration = np.asarray(duration_ns, dtype=float)
    gpu = np.asarray(gpu_ns, dtype=float)
    if not len(duration):
        return None
    scale, unit = time_unit(float(np.nanmax(np.r_[duration, gpu])))
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6.4, 1.9), layout="constrained")
        ax = fig.add_subplot()
        x = np.arange(len(duration))
        ax.bar(x, duration / scale, color=BASELINE_COLOR, width=0.8, label="iteration time")
        ax.bar(x, gpu / scale, color=CURRENT_COLOR, width=0.5, label="GPU time")
        ax.set_xlabel("iteration")
        ax.set_ylabel(unit)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(8, integer=True))
        ax.legend(loc="upper right", frameon=False, fontsize=7)
    return svg_text(fig, label, "iter-")
