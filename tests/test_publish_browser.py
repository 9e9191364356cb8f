"""The published site in a real browser: headless Chromium loads every page of a site
published from a real store (the recorded history of 30 real sessions, an acceptance
added) and from the scale benchmark's synthetic store (three machines), with no console
error, no exception, no failed or blocked load, and no request for anything but the
site's own files; the index's filter hides rows as typed.

Driven over the DevTools pipe by ``test_report_browser.Browser``; skipped, with the reason,
where no Chromium is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_history import RECORDED, replay
from test_report_browser import CHROMIUM, Browser

from perfguard.baseline.store import Store
from perfguard.publish import publish

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (chromium, chromium-browser or google-chrome) on PATH; "
    "install Debian's `chromium` package (.ci/run does)",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """One site with both stores' series: the real history and three synthetic machines."""
    tmp = tmp_path_factory.mktemp("publish")
    location, repo, shas, steps = replay(RECORDED, tmp, tmp / "real.db")
    with Store(location) as store:
        store.accept(
            "test_bench.py::test_step",
            shas[steps["up"]],
            "more work, intended",
            time="2030-01-01T00:00:00Z",
        )
    out = tmp / "site"
    publish(location, out, repo=repo, report_url="reports/{commit}.html")
    sys.path.insert(0, str(REPO / "benchmarks"))
    import publish_scale

    synth = publish_scale.make_repo(tmp / "synth-repo", 40)
    publish_scale.write_store(tmp / "synth.db", synth, publish_scale.Plan(6, 40))
    publish(tmp / "synth.db", tmp / "site2", repo=tmp / "synth-repo")
    return tmp


def _requests(browser: Browser) -> list[str]:
    return [
        e["params"]["request"]["url"]
        for e in browser.events
        if e.get("method") == "Network.requestWillBeSent"
    ]


def test_every_page_loads_clean_and_offline(site, tmp_path):
    browser = Browser(tmp_path / "profile")
    try:
        browser.page("Network.enable")
        pages = sorted((site / "site").rglob("*.html")) + sorted((site / "site2").rglob("*.html"))
        assert len(pages) >= 1 + 1 + 1 + 1 + 3 + 18  # fronts, machine indexes, test pages
        for page in pages:
            browser.events.clear()
            browser.open(page.as_uri())
            assert browser.errors() == [], page
            wanted = page.as_uri()
            assert [u for u in _requests(browser) if u != wanted] == [], page
            assert browser.eval("document.querySelectorAll('svg').length") >= (
                0 if page.name == "index.html" and page.parent.name.startswith("site") else 1
            )
        # the filter: typing hides the rows that do not match
        machine = next(p for p in (site / "site2").glob("*/index.html"))
        browser.open(machine.as_uri())
        rows = "document.querySelectorAll('tr[data-test]')"
        shown = f"Array.from({rows}).filter(r => r.style.display !== 'none').length"
        assert browser.eval(shown) == 6
        browser.eval(
            "const q = document.getElementById('q'); q.value = 'case_003';"
            "q.dispatchEvent(new Event('input'))"
        )
        assert browser.eval(shown) == 1
        assert browser.errors() == []
    finally:
        browser.close()


def test_the_test_page_shows_its_change_points_and_acceptance(site, tmp_path):
    (page,) = [p for p in (site / "site").rglob("*.html") if p.name != "index.html"]
    browser = Browser(tmp_path / "profile2", width=1100, height=1400)
    try:
        browser.open(page.as_uri())
        labels = browser.eval(
            "Array.from(document.querySelectorAll('g.mark text')).map(t => t.textContent)"
        )
        assert any(label.startswith("+") for label in labels), labels  # the +10 % step
        assert "accepted" in labels and any("calls" in label for label in labels), labels
        # mark labels never overlap one another
        boxes = browser.eval(
            "Array.from(document.querySelectorAll('g.mark text')).map(t => {"
            " const b = t.getBoundingClientRect(); return [b.left, b.right, b.top]; })"
        )
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert not (a[2] == b[2] and a[0] < b[1] and b[0] < a[1]), (a, b)
        link = browser.eval("document.querySelector('details a').getAttribute('href')")
        assert link.startswith("reports/") and link.endswith(".html")
        shot = tmp_path / "page.png"
        browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        browser.close()
