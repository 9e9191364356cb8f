"""Small figures for the HTML reports, returned as inline SVG text: matplotlib for the
analysis page, written directly for the session report.

The reports are single files that a reviewer opens from a CI artifact, so
every figure is SVG text placed in the page: no image files, no network.
Text stays text in the SVG (``svg.fonttype = none``), which keeps each
figure to a few kB. The figures are drawn on :class:`~matplotlib.figure.Figure`
objects directly, never through ``pyplot``, so rendering a report does not
change the backend of a notebook that imports perfguard.

A session report draws two figures per test (its rounds, or an older
file's per-iteration samples, and its history); :class:`SessionFigures` writes
them as SVG directly (:mod:`perfguard.report.svg`), so a ``pytest --perfguard``
session never imports matplotlib.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn, never at start-up
    from matplotlib.typing import RcKeyType

    from perfguard.compare.results import HistoryRow

_RC: dict[RcKeyType, Any] = {
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
    """Per-test figures of a session report, as SVG text (:mod:`perfguard.report.svg`: no
    matplotlib import in a ``pytest --perfguard`` session).

    ``distribution`` shows baseline and current values (points over a box of the
    quartiles and a median bar); ``trend`` shows the test's stored medians over commits.
    """

    def distribution(
        self,
        baseline: Sequence[float],
        current: Sequence[float],
        label: str,
        unit_label: str = "per-iteration time",
    ) -> str | None:
        """Box/strip plot of the two sets of values (ns: per-iteration samples or per-round
        values, ``unit_label`` says which), or None when both are empty."""
        from perfguard.report.svg import strip_box

        groups = [np.asarray(baseline, dtype=float), np.asarray(current, dtype=float)]
        if not any(len(g) for g in groups):
            return None
        scale, unit = time_unit(max(float(g.max()) for g in groups if len(g)))
        rows = [
            ("baseline", groups[0] / scale, BASELINE_COLOR),
            ("current", groups[1] / scale, CURRENT_COLOR),
        ]
        return strip_box(rows, f"{unit_label} ({unit})", label)

    def trend(self, history: Sequence[HistoryRow], label: str) -> str | None:
        """Median per stored commit (oldest first), or None with fewer than two points."""
        from perfguard.report.svg import line

        points = [h for h in history if h.median_ns is not None]
        if len(points) < 2:
            return None
        y = np.array([float(h.median_ns) for h in points if h.median_ns is not None])
        scale, unit = time_unit(float(y.max()))
        commits = [str(p.commit or "?")[:7] for p in points]
        return line(y / scale, commits, f"median ({unit})", label, CURRENT_COLOR)


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
