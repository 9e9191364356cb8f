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
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    git = ["git", "-C", str(Path(repo))]
    is_ancestor = subprocess.run([*git, "merge-base", "--is-ancestor", commit, ref],
                                 capture_output=True, check=False)  # fmt: skip
    if is_ancestor.returncode != 0:
        return None
    path = subprocess.run([*git, "rev-list", "--ancestry-path", f"{commit}..{ref}"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    full = subprocess.run([*git, "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return frozenset([full.stdout.strip(), *path.stdout.split()])


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
