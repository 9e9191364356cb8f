"""What a listed test says, the same in every view: the terminal summary, ``summary.md``.

A view chooses *which* tests it lists in full (the terminal: the regressed and improved
ones, under its table; ``summary.md``: every outcome with an icon) and how a line looks
(plain text, Markdown); *what* is said is decided here once, so the two cannot drift: a
listed test's headline and the lines under it, and the environment changes of the tests
not listed, said once for all the tests that share one.
"""

from __future__ import annotations

from collections.abc import Iterable

from perfguard.compare.results import TestEntry


def headline(t: TestEntry) -> str:
    """A listed test's first line after its outcome and id: the explanation's headline
    (the outcome itself when there is none)."""
    return t.explained.headline or t.outcome.value


def detail_lines(t: TestEntry) -> list[str]:
    """The lines under a listed test's headline: the explanation's lines (the timing's
    figures last), the host instructions when the explanation does not say them, what
    changed in the environment since the baseline, the acceptance it was judged under."""
    why = t.explained
    out = list(why.lines)
    host = t.host_count
    if host is not None and not any("host instructions" in line for line in why.lines):
        out.append(host.text())
    if why.environment:
        out.append(why.environment_line)
    if t.accepted:
        out.append(t.accepted_text)
    return out


def shared_environment(tests: Iterable[TestEntry]) -> dict[str, list[str]]:
    """The environment changes of ``tests`` (those a view does not list in full), each line
    with the node ids of the tests that share it, in the tests' order."""
    shared: dict[str, list[str]] = {}
    for t in tests:
        if t.explained.environment:
            shared.setdefault(t.explained.environment_line, []).append(t.nodeid)
    return shared
