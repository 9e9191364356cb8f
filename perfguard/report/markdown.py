"""``summary.md``: a session's verdicts, short enough for a pull-request comment.

The session's badge (PASS / FAIL / ADVISORY / INCOMPLETE / NOT JUDGED)
with its reason; one line per test that regressed, crashed, errored, was
too noisy, incomparable or not judged, or improved, worst first, with its
numbers or its reason; every other test in a collapsed ``<details>`` table
(with its reason), and a link to the HTML report.
The link to the report is a real link or none (:func:`report_link`): the URL given
(``perfguard report --report-url``, or ``$PERFGUARD_REPORT_URL``), else the CI run's page
where the CI says it (GitHub Actions: ``$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/
$GITHUB_RUN_ID``, where the report is an artifact; ``examples/github-actions.yml`` swaps in
the artifact's own URL after the upload), else a line saying where the report is and how to
link it. A placeholder URL (``(PERFGUARD_REPORT_URL)``) was a dead link outside that workflow.

Test and op names are user text: they go into code spans (with a fence
longer than any backtick run inside) and table pipes are escaped, so a
name can neither break the layout nor inject HTML into the comment.
GitHub caps a comment at 65,536 characters; the lists are capped well
below that and say how many entries they left out.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from perfguard.compare.explanation import shorten
from perfguard.compare.listing import detail_lines, headline, shared_environment
from perfguard.compare.results import OUTCOMES, SessionResults, TestEntry
from perfguard.compare.units import format_ns, p_value, percent
from perfguard.errors import ReportError
from perfguard.report.html.render import clean_text, write_text
from perfguard.report.profile import one_line

#: the environment variable that gives the report's URL (an artifact, a static host)
REPORT_URL_ENV = "PERFGUARD_REPORT_URL"
ICON = {
    "regressed": ":red_circle:",
    "crashed": ":boom:",
    "error": ":warning:",
    "noisy": ":yellow_circle:",
    "incomparable": ":no_entry_sign:",
    "not-judged": ":grey_question:",
    "improved": ":green_circle:",
}
BADGE_ICON = {
    "FAIL": ":x:",
    "ADVISORY": ":warning:",
    "INCOMPLETE": ":boom:",
    "NOT JUDGED": ":grey_question:",
    "PASS": ":white_check_mark:",
}
#: outcomes that get a line of their own; the rest go into the collapsed table
_LISTED = tuple(o for o in OUTCOMES if o in ICON)
_MAX_LINES = 30  # listed lines
_MAX_ROWS = 150  # rows of the collapsed table
_MAX_REASON = 500  # characters of a table cell's reason (shortened between words)


def code(text: Any, table: bool = False) -> str:
    """``text`` as an inline code span that nothing inside can end early."""
    text = " ".join(str(text).split())
    runs = re.findall(r"`+", text)
    fence = "`" * (max((len(r) for r in runs), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    span = f"{fence}{pad}{text}{pad}{fence}"
    return span.replace("|", "\\|") if table else span


def plain(text: Any, limit: int | None = None) -> str:
    """Plain user text for Markdown: HTML and emphasis characters escaped, one line; a
    table cell's ``limit`` shortens it between words (:func:`shorten`)."""
    text = " ".join(str(text).split())
    if limit is not None:
        text = shorten(text, limit)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#~])", r"\\\1", text)


def _line(t: TestEntry) -> str:
    """One listed test: its headline and the lines under it (:mod:`~perfguard.compare.listing`,
    as the terminal lists them)."""
    o = t.outcome.value
    out = [f"- {ICON[o]} **{o}** {code(t.nodeid)}: {plain(headline(t))}"]
    out += [f"  - {plain(line)}" for line in detail_lines(t)]
    return "\n".join(out)


def _level_or_median(t: TestEntry) -> float | None:
    """The current level; a test compared with nothing has only its rounds' median."""
    return t.level_current_ns if t.level_current_ns is not None else t.median_current_ns


def _count(x: float | None) -> str:
    return "?" if x is None else str(int(x))


def render_markdown(results: SessionResults | dict[str, Any], report_url: str | None = None) -> str:
    """The Markdown summary of a session's ``results`` (typed, or a results.json dict)."""
    results = SessionResults.from_dict(results)
    tests = results.sorted_tests()
    counts = results.counts
    badge = results.badge()
    parts = ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o]) or "no tests"
    out = [
        f"## perfguard {BADGE_ICON[badge]} {badge}: {parts}",
        "",
        plain(results.badge_reason()),
        "",
    ]
    seen = results.resolution()
    if seen:
        out[-1:] = ["", plain(seen[0].upper() + seen[1:]), ""]

    run, base = results.run, results.baseline
    fp = run.fingerprint
    where = [f"current commit {code((run.commit or 'unknown')[:12])}"]
    if base:
        what = "vs base commit" if base.ab else "vs baseline commit"
        where.append(f"{what} {code((base.commit or 'unknown')[:12])}")
        ref = base.ref or ""
        # the ref the baseline was looked up from, named once and only when it says more
        # than the two commits do (a branch or tag; not the current commit's own sha)
        same = bool(ref) and bool(run.commit) and (run.commit or "").startswith(ref)
        if ref and not same and not ref.startswith(base.commit or "\0"):
            where.append(f"(nearest stored run at or before {code(ref)})")
    else:
        where.append("(no baseline)")
    if results.mode == "ab":
        where.append("(A/B: both measured in turn on one machine)")
    machine = fp.gpu_name or (f"CPU {fp.cpu}" if fp.cpu else "")
    backend = fp.backend or results.settings.get("backend")
    extra = [plain(x) for x in (machine, backend) if x]
    out += [" ".join(where) + (" on " + ", ".join(extra) if extra else ""), ""]

    listed = [t for t in tests if t.outcome.value in _LISTED]
    out += [_line(t) for t in listed[:_MAX_LINES]]
    if len(listed) > _MAX_LINES:
        out.append(f"- … and {len(listed) - _MAX_LINES} more (see the report)")
    if listed:
        out.append("")

    rest = [t for t in tests if t.outcome.value not in _LISTED]
    shared = shared_environment(rest)  # what changed anyway, said once for the tests sharing it
    for line, nodeids in shared.items():
        who = code(nodeids[0]) if len(nodeids) == 1 else f"{len(nodeids)} tests"
        out.append(f"- {plain(line)} ({who})")
    if shared:
        out.append("")
    if rest:
        by = ", ".join(f"{o}: {n}" for o in OUTCOMES if (n := sum(t.outcome == o for t in rest)))
        out += [f"<details><summary>{len(rest)} other tests ({by})</summary>", ""]
        counted = any(t.host_count is not None for t in rest)
        host_head = " Host instructions per iteration |" if counted else ""
        out += [
            f"| Test | Outcome | Change | p | Level baseline → current |{host_head} Reason |",
            "|---|---|---|---|---|" + ("---|" if counted else "") + "---|",
        ]
        for t in rest[:_MAX_ROWS]:
            host = t.host_count
            cell = (f" {plain(host.short()) if host else '-'} |") if counted else ""
            out.append(
                f"| {code(t.nodeid, table=True)} | {t.outcome.value} "
                f"| {percent(t.delta_pct, True)} | {p_value(t.p_value)} "
                f"| {format_ns(t.level_baseline_ns)} → "
                f"{format_ns(_level_or_median(t))} |{cell} "
                f"{plain('; '.join(filter(None, [t.accepted_text, t.reason])), _MAX_REASON)} |"
            )
        if len(rest) > _MAX_ROWS:
            out.append(f"\n… and {len(rest) - _MAX_ROWS} more (see the report)")
        out += ["", "</details>", ""]

    profiled = [t for t in rest if t.profile is not None]
    if profiled:
        out += [
            f"<details><summary>Profiles of {len(profiled)} test"
            f"{'' if len(profiled) == 1 else 's'} (level, top op, Tensor Cores, FLOPs)"
            "</summary>",
            "",
        ]
        out += [
            f"- {code(t.nodeid)} ({t.outcome.value}): {plain(one_line(t))}"
            for t in profiled[:_MAX_ROWS]
        ]
        if len(profiled) > _MAX_ROWS:
            out.append(f"- … and {len(profiled) - _MAX_ROWS} more (see the report)")
        out += ["", "</details>", ""]

    for note in results.notes:
        out.append(f"> {plain(note, 300)}")
    if results.notes:
        out.append("")
    out.append(report_link(report_url))
    return "\n".join(out) + "\n"


def ci_run_url() -> str | None:
    """The CI run's page, where the CI's environment gives it (GitHub Actions)."""
    env = os.environ
    server, repo, run = (
        env.get(k, "").strip() for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")
    )
    if server and repo and run:
        return f"{server.rstrip('/')}/{repo}/actions/runs/{run}"
    return None


def report_link(report_url: str | None = None) -> str:
    """The summary's last line: a link to the report, or where it is and how to link it."""
    given = report_url or os.environ.get(REPORT_URL_ENV, "").strip()
    if given:
        return f"[Full HTML report (report.html)]({given})"
    run = ci_run_url()
    if run:
        return f"[Full HTML report: report.html in this run's artifacts]({run})"
    return (
        f"Full HTML report: `report.html` beside this summary (set {REPORT_URL_ENV}, or "
        "pass --report-url to `perfguard report`, to link it here)"
    )


def write_markdown(
    results: SessionResults | dict[str, Any],
    path: str | Path,
    *,
    report_url: str | None = None,
    step_summary: bool = True,
) -> Path:
    """Write ``summary.md`` to ``path``; also append it to ``$GITHUB_STEP_SUMMARY`` when set.

    ``step_summary=False`` skips the append (e.g. when re-rendering locally
    inside a CI job that already posted one).
    """
    text = clean_text(render_markdown(results, report_url))
    written = write_text(path, text, "Markdown summary")
    target = os.environ.get("GITHUB_STEP_SUMMARY") if step_summary else None
    if target:
        try:
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            raise ReportError(
                f"{target}: cannot append to GITHUB_STEP_SUMMARY ({exc.strerror})"
            ) from None
    return written
