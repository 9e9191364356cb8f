"""The session report in a real browser: headless Chromium, driven over the DevTools protocol.

Chromium runs with ``--remote-debugging-pipe`` (commands on fd 3, replies
and events on fd 4, NUL-separated JSON), so no websocket library and no
port are needed. The test loads the report from a ``file://`` URL, collects
every console message, uncaught exception and browser log entry (a blocked
fetch or a Content-Security-Policy violation lands there), clicks a table
header with real mouse events and reads the row order back, then saves a
screenshot. A control page with a deliberate script error and a blocked
external image shows that the error collection does catch errors.

Skipped, with the reason, only where no Chromium binary is installed
(``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from perfguard.report.html import render_session_html, write_session_html

CHROMIUM = next(
    (p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None
)
NOTES_SCREENSHOT = Path("/work/notes/report_screenshot.png")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (chromium, chromium-browser or google-chrome) on PATH; "
    "install Debian's `chromium` package (.ci/run does)",
)


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Browser:
    """Headless Chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self, profile_dir: Path, width: int = 1280, height: int = 900) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # move the child's ends above 9 so `3<&R 4>&W` below cannot clobber one with the other
        to_child_r, from_child_w = (_high_fd(to_child_r), _high_fd(from_child_w))
        argv = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # CI containers run as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile_dir}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        # bash puts the two pipe ends on fds 3 and 4, where Chromium expects them (dash
        # cannot: it takes single-digit fds only)
        wrapper = f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w}'
        self.proc = subprocess.Popen(
            [shutil.which("bash") or "bash", "-c", wrapper, *argv],
            pass_fds=(to_child_r, from_child_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.page(f"{domain}.enable")

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_child, 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for m in messages:
                self._inbox.put(json.loads(m))
        self._inbox.put(None)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + 30
        while True:
            reply = self._inbox.get(timeout=max(deadline - time.monotonic(), 0.1))
            if reply is None:
                raise RuntimeError("Chromium closed the DevTools pipe")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, session=self.session, **params)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        seen = len(self.events)
        for e in self.events[:seen]:
            if e.get("method") == method:
                self.events.remove(e)
                return e
        deadline = time.monotonic() + timeout
        while True:
            e = self._inbox.get(timeout=max(deadline - time.monotonic(), 0.1))
            if e is None:
                raise RuntimeError("Chromium closed the DevTools pipe")
            if e.get("method") == method:
                return e
            self.events.append(e)

    def open(self, url: str) -> None:
        self.page("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")
        self.eval("1")  # let pending console events arrive before they are read

    def eval(self, expression: str) -> Any:
        r = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def click(self, css: str) -> None:
        """A real mouse click (press + release) at the centre of the element ``css``."""
        box = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(css)}); "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.page(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def errors(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions and browser log errors so far."""
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append("exception: " + p["exceptionDetails"].get("text", ""))
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning"):
                out.append(f"console.{p['type']}: " + str(p.get("args")))
            elif method == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['source']}: {p['entry']['text']}")
        return out

    def screenshot(self, path: Path) -> None:
        size = self.page("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.page(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": 1280, "height": min(size["height"], 2400), "scale": 1},
        )
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, queue.Empty):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


_ORDER = (
    "Array.from(document.querySelectorAll('#tests tbody tr'))"
    ".map(r => [r.cells[0].textContent.trim(), r.cells[5].getAttribute('data-v')])"
)


_ROWS = (
    "Array.from(document.querySelectorAll('#tests tbody tr')).map(r => {"
    " const b = r.getBoundingClientRect(); const s = getComputedStyle(r);"
    " return [r.cells[0].textContent.trim(), r.getAttribute('data-outcome'),"
    " b.width > 0 && b.height > 0 && s.visibility === 'visible' && s.display !== 'none',"
    " r.cells[10].textContent.trim()]; })"
)


def test_report_has_no_console_errors_and_sorts_on_click(session, browser, tmp_path):
    """The report of a session with every outcome (an error, a crashed and a not-judged
    test among them), written as the plugin writes it."""
    from test_report_html import CRASH_REASON, EXPECTED

    report = write_session_html(session["results"], tmp_path / "report.html")
    browser.events.clear()
    browser.open(report.as_uri())
    assert browser.errors() == []
    assert browser.eval("document.getElementById('badge').textContent") == "FAIL"
    shown = browser.eval(_ROWS)
    assert [(r[1]) for r in shown] == [o for _, o in EXPECTED]  # worst first
    assert all(r[2] for r in shown), [r for r in shown if not r[2]]  # every row visible
    by = {r[1]: r for r in shown}
    assert by["crashed"][3] == CRASH_REASON and by["error"][3].startswith("the test requests")
    assert by["not-judged"][3].startswith("too few rounds to judge timing")
    sections = browser.eval(
        "Array.from(document.querySelectorAll('section.test')).map(s => "
        "[s.getAttribute('data-outcome'), s.getBoundingClientRect().height > 0])"
    )
    assert [s[0] for s in sections] == [o for _, o in EXPECTED] and all(s[1] for s in sections)
    assert browser.eval("document.querySelectorAll('section.test svg').length") >= 6
    assert browser.eval("document.querySelectorAll('.halves .timing').length") == len(EXPECTED)

    before = browser.eval(_ORDER)
    browser.click("#tests thead th:nth-child(6)")  # "Δ median"
    after = browser.eval(_ORDER)
    assert sorted(before) == sorted(after) and after != before
    values = [float(v) if v else None for _, v in after]
    known = [v for v in values if v is not None]
    assert known == sorted(known)  # ascending by the number, not by its text
    assert values[len(known) :] == [None] * (len(values) - len(known))  # n/a last
    assert (
        browser.eval(
            "document.querySelector('#tests thead th:nth-child(6)').getAttribute('aria-sort')"
        )
        == "ascending"
    )

    browser.click("#tests thead th:nth-child(6)")
    again = [float(v) for _, v in browser.eval(_ORDER) if v]
    assert again == sorted(known, reverse=True)

    browser.click("#tests thead th:nth-child(1)")  # text column
    names = [n for n, _ in browser.eval(_ORDER)]
    assert names == sorted(names, key=str.lower)
    assert browser.errors() == []

    browser.eval("window.scrollTo(0, 0)")
    advisory = dict(
        session["results"], settings={**session["results"]["settings"], "fail_on": "never"}
    )
    page = write_session_html(advisory, tmp_path / "advisory.html")
    browser.open(page.as_uri())
    assert browser.eval("document.getElementById('badge').textContent") == "ADVISORY"
    colour = browser.eval("getComputedStyle(document.getElementById('badge')).backgroundColor")
    assert colour == "rgb(154, 103, 0)"  # --warn: not the red of FAIL, not the green of PASS
    browser.open(report.as_uri())
    shot = tmp_path / "report.png"
    browser.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if NOTES_SCREENSHOT.parent.is_dir():
        shutil.copyfile(shot, NOTES_SCREENSHOT)


def test_error_collection_catches_script_errors_and_blocked_fetches(browser, tmp_path):
    """Control: the same page policy plus a broken script and an external image."""
    html = render_session_html({"schema": 1, "tests": []}).replace(
        "</body>",
        '<img src="http://example.invalid/x.png"><script>undefinedFunction()</script></body>',
    )
    bad = tmp_path / "bad.html"
    bad.write_text(html, encoding="utf-8")
    browser.events.clear()
    browser.open(bad.as_uri())
    errors = browser.errors()
    assert any("undefinedFunction" in e or "exception" in e for e in errors), errors
    assert any("example.invalid" in e or "Content Security Policy" in e for e in errors), errors


@pytest.fixture(scope="module")
def session(fixture_file, cached_trace, tmp_path_factory) -> dict[str, Any]:
    """The real-results session of ``test_report_html`` (ResNet-50 fixture + CPU runs)."""
    from test_report_html import RESNET, build_session, with_rounds

    from perfguard import analyze
    from perfguard.baseline.record import record_from_analysis

    resnet = record_from_analysis("base", analyze(cached_trace(fixture_file(RESNET))))
    return build_session(with_rounds(resnet, range(6)), tmp_path_factory.mktemp("cpu"))


def test_analysis_page_has_no_console_errors_and_sorts(browser, tmp_path, fixture_file):
    """The page `perfguard analyze` writes, on the real H100 capture."""
    from perfguard import analyze, load_trace
    from perfguard.report.html import write_analysis_html

    trace = fixture_file("kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz")
    page = write_analysis_html(analyze(load_trace(trace)), tmp_path / "analysis.html")
    browser.events.clear()
    browser.open(page.as_uri())
    assert browser.errors() == []
    rows = "Array.from(document.querySelectorAll('#top-ops tbody tr'))"
    calls = f"{rows}.map(r => Number(r.cells[3].getAttribute('data-v')))"
    before = browser.eval(calls)
    browser.click("#top-ops thead th:nth-child(4)")  # "Calls"
    after = browser.eval(calls)
    assert sorted(before) == after != before
    first = browser.eval(f"{rows}[0].cells[0].textContent.trim()")
    assert first  # a real op name, rendered as text
    assert browser.errors() == []


#: every horizontally scrolling box and every reason/op cell that hides part of its text
_CLIPPED = (
    "Array.from(document.querySelectorAll('.scroll, td.reason, td.name, .why-lines li'))"
    ".filter(e => e.scrollWidth > e.clientWidth + 1)"
    ".map(e => (e.id || e.className || e.tagName) + ' ' + e.scrollWidth + '>' + e.clientWidth)"
)


def test_report_fits_1400_px_with_the_explanation_in_full(session, tmp_path):
    """At 1,400 px nothing in the tests table, the ops tables or the explanation needs a
    horizontal scroll or hides part of a reason or an op name (long hierarchical op names
    included); each regressed test's section shows its explanation's lines."""
    from perfguard.compare.results import SessionResults

    doc = SessionResults.from_dict(session["results"])
    report = write_session_html(doc, tmp_path / "report.html")
    wide = Browser(tmp_path / "profile-1400", width=1400, height=1000)
    try:
        wide.open(report.as_uri())
        assert wide.errors() == []
        assert wide.eval("document.documentElement.scrollWidth") <= 1400
        assert wide.eval(_CLIPPED) == []
        lines = wide.eval(
            "Array.from(document.querySelectorAll('section.test[data-outcome=regressed]'))"
            ".map(s => Array.from(s.querySelectorAll('.why-lines li')).map(l => l.textContent))"
        )
        wanted = [list(t.explanation.lines) for t in doc.sorted_tests() if t.outcome == "regressed"]
        assert lines == wanted and any(lines)
        shot = tmp_path / "report-1400.png"
        wide.screenshot(shot)
        if NOTES_SCREENSHOT.parent.is_dir():
            shutil.copyfile(shot, NOTES_SCREENSHOT.with_name("report_1400.png"))
    finally:
        wide.close()
