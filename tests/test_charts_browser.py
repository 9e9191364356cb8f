"""Every chart's text inside its chart, in a real browser, at two widths.

The report's and the published site's charts are SVG text laid out by perfguard: a y label
longer than the margin it was given was cut (``2.1228 GFLOP`` read ``.1228 GFLOP``), a
change point's label near the right edge ran off it (``bytes, d``). Headless Chromium lays
out charts drawn at values and units chosen to be long (GFLOP at five digits, bytes in the
tens of millions, durations in seconds, long labels on marks at both edges, long test and
op names), and the published site of a real recorded history; every ``<text>`` of every
``<svg>`` must lie inside its chart's box, at 1280 and at 420 px wide. Screenshots are
saved beside the page (and to ``$PERFGUARD_SCREENSHOTS`` when set) for a reader to look at.

Skipped, with the reason, only where no Chromium is installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_report_browser import CHROMIUM, Browser

from perfguard.publish.charts import Mark, chart
from perfguard.report.svg import iteration_strip, line, split_bar, strip_box

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (chromium, chromium-browser or google-chrome) on PATH; "
    "install Debian's `chromium` package (.ci/run does)",
)

pytest_plugins = ["pytester"]

WIDTHS = (1280, 420)

#: every text of every chart outside its chart's box by more than half a pixel, and every
#: two texts of a chart that overlap
OUTSIDE = """(() => {
  const bad = [];
  document.querySelectorAll("svg").forEach((svg, i) => {
    const b = svg.getBoundingClientRect();
    svg.querySelectorAll("text").forEach((t) => {
      const r = t.getBoundingClientRect();
      if (!r.width) return;
      const gaps = [r.left - b.left, b.right - r.right, r.top - b.top, b.bottom - r.bottom];
      if (gaps.some((g) => g < -0.5))
        bad.push([i, svg.getAttribute("aria-label"), t.textContent, gaps.map(Math.round)]);
    });
    const boxes = [...svg.querySelectorAll("text")].map((t) => [t, t.getBoundingClientRect()]);
    boxes.forEach(([t, r], k) => boxes.slice(k + 1).forEach(([u, q]) => {
      const w = Math.min(r.right, q.right) - Math.max(r.left, q.left);
      const h = Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top);
      if (r.width && q.width && w > 1 && h > 1)
        bad.push([i, svg.getAttribute("aria-label"), t.textContent + " over " + u.textContent]);
    }));
  });
  return bad;
})()"""


def long_charts() -> str:
    """Each kind of chart at values and labels chosen to be long."""
    rng = np.random.default_rng(1)
    n = 30
    x = np.arange(n, dtype=np.float64)
    flops = 2.1228e9 + rng.normal(0, 2e4, n)
    marks = [
        Mark(0, "op calls, bytes and dtypes stepped", "#d55e00"),
        Mark(n - 1, "bytes, dtypes and op calls stepped +12.0 %", "#d55e00"),
        Mark(n - 2, "accepted: more work, intended", "#009e73", dashed=True),
    ]
    commits = [(0.0, "0123456789ab"), (n / 2, "fedcba987654"), (n - 1.0, "a1b2c3d4e5f6")]
    parts = [
        ("aten::scaled_dot_product_attention", 41.0, "aten::scaled_dot_product_attention 41%"),
        ("autograd::engine::evaluate_function: AddmmBackward0", 33.0, "AddmmBackward0 33%"),
        ("", 26.0, "312 other ops in the step's time 26% (each below 1%)"),
    ]
    svgs = [
        chart(
            label="FLOPs",
            x_count=n,
            lines=[("FLOPs", x, flops)],
            y_kind="flops",
            marks=marks,
            x_labels=commits,
        ),
        chart(
            label="bytes",
            x_count=n,
            lines=[("bytes", x, 67_400_000 + x * 12_288.0)],
            y_kind="bytes",
            marks=marks[1:],
            legend=True,
        ),
        chart(
            label="op time",
            x_count=n,
            lines=[(f"aten::op_{k}_with_a_long_name", x, 10 ** (k + x / n)) for k in range(6)],
            y_kind="ns",
            log=True,
            legend=True,
        ),
        line(
            123_456_789_012 + rng.normal(0, 1e8, 12),
            [f"commit{k:08d}" for k in range(12)],
            "median per iteration (s)",
            "history",
            "#2563eb",
        ),
        strip_box(
            [
                ("baseline 0123456789ab", 1.2345e9 + rng.normal(0, 1e7, 20), "#9ca3af"),
                ("current a1b2c3d4e5f6 (dirty)", 1.3345e9 + rng.normal(0, 1e7, 20), "#2563eb"),
            ],
            "wall time per iteration (s)",
            "rounds",
        ),
        iteration_strip(
            2.5e10 + rng.normal(0, 1e8, 40), np.repeat(np.arange(5), 8), "ms", "it", "#2563eb"
        ),
        split_bar(parts, "split"),
    ]
    style = "svg{max-width:100%;height:auto;display:block;margin:8px 0}"
    head = f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{style}</style></head>"
    return head + "<body>" + "".join(svgs) + "</body></html>"


def _screenshot(browser: Browser, path: Path, width: int) -> None:
    size = browser.page("Page.getLayoutMetrics")["cssContentSize"]
    shot = browser.page(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": 0, "y": 0, "width": width, "height": min(size["height"], 2400), "scale": 1},
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    keep = os.environ.get("PERFGUARD_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


def _outside(page: Path, tmp_path: Path, name: str) -> tuple[dict[int, list], int]:
    """Per width, the texts outside their chart; and how many chart texts the page has."""
    found, texts = {}, 0
    for width in WIDTHS:
        browser = Browser(tmp_path / f"profile-{name}-{width}", width=width)
        try:
            # a headless window is at least 500 px wide: the viewport is set exactly
            browser.page(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            browser.open(page.as_uri())
            assert browser.eval("window.innerWidth") == width
            found[width] = list(browser.eval(OUTSIDE))
            texts = browser.eval("document.querySelectorAll('svg text').length")
            # the page itself fits the window: a wide table scrolls inside its own box
            wide = browser.eval("document.documentElement.scrollWidth - window.innerWidth")
            if wide > 1:
                found.setdefault(width, []).append(f"the page is {wide} px wider than the window")
            _screenshot(browser, tmp_path / f"{name}-{width}.png", width)
        finally:
            browser.close()
    return found, texts


def test_no_chart_text_crosses_its_chart_at_long_values(tmp_path: Path) -> None:
    page = tmp_path / "charts.html"
    page.write_text(long_charts())
    found, texts = _outside(page, tmp_path, "charts")
    assert texts > 40, texts
    assert found == {w: [] for w in WIDTHS}, found


def test_no_chart_text_crosses_its_chart_on_a_published_site(tmp_path: Path) -> None:
    """The site of a real recorded history (30 sessions, steps found and marked): its
    index and its test page, at both widths."""
    from test_history import RECORDED, replay

    from perfguard.publish import publish

    location, repo, _, _ = replay(RECORDED, tmp_path, tmp_path / "real.db")
    out = tmp_path / "site"
    publish(location, out, repo=repo)
    pages = sorted(out.rglob("*.html"))
    assert len(pages) >= 3, pages  # the index, a machine's index, a test's page
    total = 0
    for k, page in enumerate(pages):
        found, texts = _outside(page, tmp_path, f"site{k}")
        total += texts
        assert found == {w: [] for w in WIDTHS}, (page.name, found)
    assert total > 20, total  # the test page's charts: axes, commits, change points


BENCH = """
import pytest
import torch


@pytest.mark.gpuprofile(iterations=4, rounds=3, warmup=1)
def test_a_step_with_a_rather_long_name_for_its_chart_labels(gpuprofile):
    x = torch.randn(64, 64)
    for _ in gpuprofile.iterations():
        torch.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None])
"""


def test_no_chart_text_crosses_its_chart_in_a_session_report(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A real session's report (rounds, history over three saved runs, the profile's split
    bar and iteration strip) at both widths."""
    from test_plugin import commit, init_repo, run

    init_repo(pytester)
    pytester.makepyfile(test_bench=BENCH)
    for k in range(3):
        (pytester.path / "note.txt").write_text(str(k))
        commit(pytester.path, f"c{k}")
        run(pytester, "--perfguard-save")
    found, texts = _outside(pytester.path / ".perfguard" / "report.html", tmp_path, "report")
    assert texts > 20, texts
    assert found == {w: [] for w in WIDTHS}, found
