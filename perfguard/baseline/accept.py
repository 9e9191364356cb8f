"""Accepted changes: "this test's new level at commit C is intended".

``perfguard baseline accept TEST --at C --reason TEXT`` records an
acceptance in the store (:meth:`~perfguard.baseline.store.Store.accept`).
It applies to C and every commit that has C as an ancestor (any parent, so
the merge commit that brings a pull request's accepted slowdown into
``main`` carries it there); for a run of such a commit, the store-mode
baseline and the history noise are taken from runs of commits that have C
as an ancestor too, so the next run compares against the new level and the
old one can no longer fail it. A squash or rebase merge makes new commits:
accept at the commit on ``main`` then. Where several acceptances of a test
apply, the one nearest the commit judged wins (its commit is a descendant
of the others'; same commit: the latest).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.baseline.git import ancestry_path, is_ancestor, try_resolve

if TYPE_CHECKING:
    from perfguard.baseline.store import Store

__all__ = ["Acceptance", "applicable", "since"]


@dataclass(frozen=True)
class Acceptance:
    """One recorded acceptance, and the commits from it to the commit judged."""

    nodeid: str
    commit: str
    reason: str
    time: str
    author: str | None = None
    #: commits that have ``commit`` as an ancestor (it included), up to the ref judged
    commits: frozenset[str] = frozenset()

    def describe(self) -> str:
        """``accepted at <sha>: <reason>`` (what every report shows)."""
        return f"accepted at {self.commit[:12]}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "reason": self.reason, "time": self.time,
                "author": self.author}  # fmt: skip


def since(repo: str | os.PathLike[str], commit: str, ref: str) -> frozenset[str] | None:
    """``commit`` and the commits between it and ``ref`` that descend from it (``ref``
    included), or None when ``commit`` is not an ancestor of ``ref`` (or unknown here)."""
    if not is_ancestor(repo, commit, ref):
        return None
    return frozenset([try_resolve(repo, commit) or "", *ancestry_path(repo, commit, ref)])


def applicable(
    store: Store, repo: str | os.PathLike[str], nodeid: str, ref: str
) -> Acceptance | None:
    """The acceptance of ``nodeid`` that applies to commit ``ref`` (module docstring)."""
    rows = store.acceptances(nodeid)
    best: Acceptance | None = None
    for row in rows.itertuples(index=False):  # oldest first: a later one at a commit wins
        commits = since(repo, str(row.commit), ref)
        if commits is None:
            continue
        if best is None or len(commits) <= len(best.commits):
            author = row.author if isinstance(row.author, str) else None
            best = Acceptance(str(row.nodeid), str(row.commit), str(row.reason),
                              str(row.time), author, commits)  # fmt: skip
    return best
