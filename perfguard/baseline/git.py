"""Git lookups for baselines: the state of the work tree, and which commit to compare with.

A baseline is the nearest first-parent ancestor of a ref that has a run on
a comparable machine (DESIGN.md, Baselines). First parents only, because
that is the history of the branch itself: on ``main`` it is the sequence of
merged states, not the commits of every merged feature branch.

GitPython is imported inside the functions: it needs the ``git`` program at
import time, and a machine without git should still load perfguard and
fail only here, with a one-line :class:`~perfguard.errors.BaselineError`.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from perfguard.baseline.record import IMPORTED_BACKENDS, Fingerprint
from perfguard.environment import Environment
from perfguard.environment import incompatibility as env_incompatibility
from perfguard.errors import BaselineError

if TYPE_CHECKING:
    import pandas as pd

    from perfguard.baseline.store import Store

__all__ = [
    "BaselineMatch",
    "GitState",
    "default_baseline_ref",
    "find_baseline",
    "first_parent_commits",
    "match_runs",
    "repo_state",
    "resolve",
]

#: where the default branch is looked for, in order
DEFAULT_BRANCH_REFS = ("origin/HEAD", "main", "master", "origin/main", "origin/master")


@dataclass(frozen=True)
class GitState:
    """Where the code under test comes from."""

    root: Path
    commit: str
    branch: str | None  # None on a detached HEAD
    dirty: bool  # tracked files modified or staged (untracked files do not count)


@dataclass(frozen=True)
class BaselineMatch:
    """What :func:`find_baseline` found, or why nothing.

    ``status`` is ``found`` (``run_id``, ``commit``, ``distance`` in
    first-parent steps from the ref, ``dirty`` of that run), ``no-runs``
    (no run in the searched history), or ``incomparable`` (only runs from
    other machines; ``reason`` is the nearest one's incompatibility).
    """

    status: Literal["found", "no-runs", "incomparable"]
    ref: str
    searched: int  # commits walked
    run_id: int | None = None
    commit: str | None = None
    distance: int | None = None
    dirty: bool = False
    reason: str | None = None

    @property
    def found(self) -> bool:
        return self.status == "found"


def _open(path: str | os.PathLike[str]) -> Any:
    try:
        import git
    except ImportError as exc:  # GitPython raises ImportError when git is not installed
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "git not found"
        raise BaselineError(f"{path}: cannot use git: {first}") from None
    try:
        return git.Repo(path, search_parent_directories=True)
    except git.NoSuchPathError:
        raise BaselineError(f"{path}: no such directory") from None
    except git.InvalidGitRepositoryError:
        raise BaselineError(f"{path}: not inside a git repository") from None


def _head(repo: Any, path: str | os.PathLike[str]) -> Any:
    try:
        return repo.head.commit
    except ValueError:
        raise BaselineError(f"{path}: git repository has no commits yet") from None


def repo_state(path: str | os.PathLike[str] = ".") -> GitState:
    """Commit, branch and dirty flag of the repository containing ``path``."""
    repo = _open(path)
    try:
        head = _head(repo, path)
        branch = None if repo.head.is_detached else repo.active_branch.name
        dirty = repo.is_dirty(index=True, working_tree=True, untracked_files=False)
        return GitState(Path(repo.working_tree_dir or path), head.hexsha, branch, dirty)
    finally:
        repo.close()


def resolve(repo_path: str | os.PathLike[str], ref: str) -> str:
    """The full sha of ``ref`` (branch, tag, sha, ``HEAD~2`` ...); BaselineError if git cannot."""
    repo = _open(repo_path)
    try:
        return _resolve(repo, repo_path, ref)
    finally:
        repo.close()


def _try_resolve(repo: Any, ref: str) -> str | None:
    """The commit sha ``ref`` names, or None (asks git itself: GitPython trusts any sha)."""
    import git

    if not ref or ref.startswith("-"):  # never let a ref read as an option
        return None
    try:
        out = repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")
    except git.GitCommandError:
        return None
    return str(out).strip() or None


def _resolve(repo: Any, repo_path: str | os.PathLike[str], ref: str) -> str:
    sha = _try_resolve(repo, ref)
    if sha is None:
        raise BaselineError(f"{repo_path}: git cannot resolve ref {ref!r} to a commit")
    return sha


def default_baseline_ref(repo_path: str | os.PathLike[str] = ".") -> str | None:
    """The commit a change on HEAD should be compared with, as a sha.

    On a feature branch (or a pull request's merge commit): the merge base
    of HEAD with the default branch (``origin/HEAD``, else ``main``, else
    ``master``, else their ``origin/`` copies), i.e. the state the branch
    started from. When HEAD is already part of the default branch, or shares
    no history with it: HEAD itself, and since :func:`find_baseline` walks
    first parents from the ref, that is the nearest run at or before HEAD:
    HEAD's own stored run when the working tree holds uncommitted changes
    to judge, else (a push to main, measured before it is saved) its
    parent's. The issue's "HEAD's first parent" fallback would skip HEAD's
    own baseline when judging uncommitted changes, so it is not used.
    """
    repo = _open(repo_path)
    try:
        head = _head(repo, repo_path)
        for name in DEFAULT_BRANCH_REFS:
            default = _try_resolve(repo, name)
            if default is None:
                continue
            bases = repo.merge_base(head, default)
            if bases and bases[0].hexsha != head.hexsha:
                return str(bases[0].hexsha)
            break  # HEAD is on (or behind) the default branch, or unrelated to it
        return str(head.hexsha)
    finally:
        repo.close()


def first_parent_commits(
    repo_path: str | os.PathLike[str], ref: str, *, max_depth: int = 1000
) -> list[str]:
    """Shas of ``ref`` and its first-parent ancestors, newest first (at most ``max_depth``)."""
    repo = _open(repo_path)
    try:
        sha = _resolve(repo, repo_path, ref)
        return [c.hexsha for c in repo.iter_commits(sha, first_parent=True, max_count=max_depth)]
    finally:
        repo.close()


def find_baseline(
    store: Store,
    repo_path: str | os.PathLike[str],
    ref: str,
    fingerprint: Fingerprint,
    *,
    exclude_run_id: int | None = None,
    max_depth: int = 1000,
    only: Collection[str] | None = None,
    environment: Environment | None = None,
    across: Collection[str] = (),
) -> BaselineMatch:
    """The latest comparable run on the nearest first-parent ancestor of ``ref`` (ref included).

    Commits without runs, and runs from machines ``fingerprint`` cannot be
    compared with, are skipped, and so are runs whose environment differs from
    ``environment`` in a blocking field of a group not in ``across``
    (:mod:`perfguard.environment`). ``exclude_run_id`` leaves out the run being
    measured now (it may already be saved under HEAD's commit). ``only``: runs of these
    commits alone count (an acceptance: :mod:`perfguard.baseline.accept`).
    """
    walk = first_parent_commits(repo_path, ref, max_depth=max_depth)
    match, _ = match_runs(
        store.runs(), walk, ref, fingerprint, exclude_run_id=exclude_run_id, only=only,
        environment=environment, across=across,
    )  # fmt: skip
    return match


def match_runs(
    runs: pd.DataFrame,
    walk: list[str],
    ref: str,
    fingerprint: Fingerprint,
    *,
    exclude_run_id: int | None = None,
    only: Collection[str] | None = None,
    environment: Environment | None = None,
    across: Collection[str] = (),
) -> tuple[BaselineMatch, pd.DataFrame]:
    """:func:`find_baseline`'s rule on given ``runs`` (``Store.runs`` or
    ``Store.runs_with_test`` rows) and a first-parent ``walk``, newest first: the match,
    and every comparable run of its commit, latest first (empty unless found)."""
    if exclude_run_id is not None:
        runs = runs[runs["run_id"] != exclude_run_id]
    if only is not None:
        runs = runs[runs["commit"].isin(list(only))]
    if fingerprint.backend not in IMPORTED_BACKENDS:  # imported history is no baseline
        own = runs["fingerprint"].map(lambda fp: fp.backend not in IMPORTED_BACKENDS)
        runs = runs[own.astype(bool)]
    distance = {c: i for i, c in enumerate(walk)}
    runs = runs.assign(distance=runs["commit"].map(distance)).dropna(subset=["distance"])
    if runs.empty:
        return BaselineMatch("no-runs", ref, len(walk)), runs
    # nearest commit first; within a commit the latest run first
    runs = runs.sort_values(["distance", "time", "run_id"], ascending=[True, False, False])
    reasons = [fingerprint.incompatibility(fp) for fp in runs["fingerprint"]]
    if environment is not None and "environment" in runs:
        reasons = [
            why or env_incompatibility(environment.changes_since(env, across))
            for why, env in zip(reasons, runs["environment"], strict=True)
        ]
    comparable = runs[[r is None for r in reasons]]
    if comparable.empty:
        first = runs.iloc[0]
        why = f"run {first.run_id} at {str(first.commit)[:10]}: {reasons[0]}"
        return BaselineMatch("incomparable", ref, len(walk), reason=why), comparable
    row = comparable.iloc[0]
    match = BaselineMatch(
        "found", ref, len(walk), run_id=int(row.run_id), commit=str(row.commit),
        distance=int(row.distance), dirty=bool(row.dirty),
    )  # fmt: skip
    return match, comparable[comparable["commit"] == match.commit]
