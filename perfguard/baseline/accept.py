"""Accepted changes: "this test's new level at commit C is intended".

``perfguard baseline accept TEST --at C --reason TEXT`` records an
acceptance in the store (:meth:`Acceptances.record`, ``store.accepted``).
It applies to C and every commit that has C as an ancestor (any parent, so
the merge commit that brings a pull request's accepted slowdown into
``main`` carries it there); for a run of such a commit, the store-mode
baseline and the history noise are taken from runs of commits that have C
as an ancestor too, so the next run compares against the new level and the
old one can no longer fail it. A squash or rebase merge makes new commits:
accept at the commit on ``main`` then. Where several acceptances of a test
apply, the one nearest the commit judged wins (its commit is a descendant
of the others'; same commit: the latest).

:class:`Acceptances` is the store's table of them (``store.accepted``): recorded,
listed, and added from an export or another store alongside their runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from perfguard.baseline.db import Database
from perfguard.baseline.git import ancestry_path, is_ancestor, try_resolve
from perfguard.errors import BaselineError

if TYPE_CHECKING:
    from perfguard.baseline.store import Store

__all__ = ["Acceptance", "Acceptances", "applicable", "since"]


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
        return {
            "commit": self.commit,
            "reason": self.reason,
            "time": self.time,
            "author": self.author,
        }


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
    rows = store.accepted.table(nodeid)
    best: Acceptance | None = None
    for row in rows.itertuples(index=False):  # oldest first: a later one at a commit wins
        commits = since(repo, str(row.commit), ref)
        if commits is None:
            continue
        if best is None or len(commits) <= len(best.commits):
            author = row.author if isinstance(row.author, str) else None
            best = Acceptance(
                str(row.nodeid), str(row.commit), str(row.reason), str(row.time), author, commits
            )
    return best


def plain_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Plain Python rows (missing values as None, numpy scalars unboxed)."""
    obj = frame.astype(object)
    return cast(list[dict[str, Any]], obj.where(frame.notna(), None).to_dict("records"))


class Acceptances:
    """The store's acceptances (``store.accepted``), sharing its open database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(
        self,
        nodeid: str,
        commit: str,
        reason: str,
        *,
        time: str | None = None,
        author: str | None = None,
    ) -> int:
        """Record that ``nodeid``'s level at ``commit`` (a full sha) is intended: runs of
        that commit and its descendants are compared with runs since it only (module
        docstring). Returns the acceptance's id."""
        reason = " ".join(str(reason).split())
        if not reason:
            raise BaselineError(f"{self.db.name}: an acceptance needs a reason")
        if not nodeid:
            raise BaselineError(f"{self.db.name}: an acceptance needs a test node id")
        when = time or datetime.now(timezone.utc).isoformat(timespec="seconds")

        def write() -> int:
            with self.db.write():
                (new,) = self.db.execute(
                    'INSERT INTO acceptances (nodeid, "commit", reason, time, author) '
                    "VALUES (?, ?, ?, ?, ?) RETURNING acceptance_id",
                    (nodeid, commit, reason, when, author),
                ).fetchone()
                return int(new)

        return self.db.retry(write)

    def table(self, nodeid: str | None = None) -> pd.DataFrame:
        """Recorded acceptances (of ``nodeid``, or all), oldest first. Columns:
        acceptance_id, nodeid, commit, reason, time, author."""
        where, params = ("WHERE nodeid = ?", [nodeid]) if nodeid else ("", [])
        df = self.db.query(
            f'SELECT acceptance_id, nodeid, "commit", reason, time, author FROM acceptances '
            f"{where} ORDER BY time, acceptance_id",
            params,
        )
        df["acceptance_id"] = df["acceptance_id"].astype(np.int64)
        return df

    def rows(self) -> list[dict[str, Any]]:
        """Every acceptance as a plain row without the store's id (exports, copies)."""
        rows = self.table().drop(columns="acceptance_id")
        return plain_rows(rows.sort_values(["time", "nodeid", "commit"], kind="stable"))

    def add_missing(self, rows: Sequence[dict[str, Any]]) -> int:
        """Add acceptances not here yet (same test, commit and time) inside the caller's
        open write transaction; returns how many were added."""
        added = 0
        for a in rows:
            found = self.db.execute(
                'SELECT 1 FROM acceptances WHERE nodeid=? AND "commit"=? AND time=?',
                (a["nodeid"], a["commit"], a["time"]),
            ).fetchone()
            if found is None:
                self.db.execute(
                    'INSERT INTO acceptances (nodeid, "commit", reason, time, author) '
                    "VALUES (?, ?, ?, ?, ?)",
                    (a["nodeid"], a["commit"], a["reason"], a["time"], a.get("author")),
                )
                added += 1
        return added
