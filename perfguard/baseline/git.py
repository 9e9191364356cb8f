"""The one git module: every git command perfguard runs goes through here.

Git is driven as the ``git`` program (``git -C ROOT ...``), except the state of
the work tree (:func:`repo_state`: HEAD, branch, dirty), which GitPython reads
from the repository's files: the store's baseline lookups (which commit to
compare with), acceptances (:mod:`perfguard.baseline.accept`), A/B mode's
worktree of the base commit, ``perfguard compare``'s A/B run and ``perfguard
bisect`` call the typed functions below. A git command that fails is a
:class:`GitError` (a :class:`~perfguard.errors.BaselineError`), one line:
``<root>: git <command>: <git's last line>``, or the lookup's own wording.

A baseline is the nearest first-parent ancestor of a ref that has a run on
a comparable machine (DESIGN.md, Baselines). First parents only, because
that is the history of the branch itself: on ``main`` it is the sequence of
merged states, not the commits of every merged feature branch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from perfguard.baseline.record import IMPORTED_BACKENDS, Fingerprint
from perfguard.environment import Environment
from perfguard.environment import incompatibility as env_incompatibility
from perfguard.errors import BaselineError

if TYPE_CHECKING:
    import pandas as pd

    from perfguard.baseline.store import Store

__all__ = [
    "BaselineMatch",
    "GitError",
    "GitState",
    "ancestry_path",
    "changed_since",
    "common_dir",
    "default_baseline_ref",
    "file_at",
    "find_baseline",
    "first_parent_commits",
    "is_ancestor",
    "match_runs",
    "output",
    "prepare_worktree",
    "repo_state",
    "resolve",
    "run",
    "subject",
    "toplevel",
    "try_resolve",
]

#: where the default branch is looked for, in order
DEFAULT_BRANCH_REFS = ("origin/HEAD", "main", "master", "origin/main", "origin/master")

Where = str | os.PathLike[str]


class GitError(BaselineError):
    """A git command failed, or git cannot be run: one line naming the repository."""


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


# --------------------------------------------------------------------------- commands


def run(
    root: Where, *args: str, ok: Collection[int] | None = (0,)
) -> subprocess.CompletedProcess[str]:
    """``git -C root args``, text out; a :class:`GitError` with git's last line unless the
    exit status is one of ``ok`` (``None``: any status, as clean-up code wants)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
    except OSError as exc:  # no git program
        raise GitError(f"{root}: cannot use git: {exc.strerror or exc}") from None
    if ok is not None and done.returncode not in ok:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["git failed"]
        raise GitError(f"{root}: git {args[0]}: {tail[0]}")
    return done


def output(root: Where, *args: str) -> str:
    """What ``git -C root args`` prints, stripped (:func:`run`'s errors)."""
    return run(root, *args).stdout.strip()


def toplevel(path: Where) -> Path:
    """The work tree holding ``path``; one-line errors for no folder, no repository."""
    if not Path(path).is_dir():
        raise GitError(f"{path}: no such directory")
    done = run(path, "rev-parse", "--show-toplevel", ok=None)
    if done.returncode != 0 or not done.stdout.strip():
        raise GitError(f"{path}: not inside a git repository")
    return Path(done.stdout.strip())


def common_dir(root: Where) -> Path:
    """The repository's common git folder (``.git`` of the main worktree), where A/B
    mode and bisect keep their worktrees."""
    return (Path(root) / output(root, "rev-parse", "--git-common-dir")).resolve()


def try_resolve(root: Where, ref: str) -> str | None:
    """The full sha of the commit ``ref`` names (branch, tag, sha, ``HEAD~2``...), or None."""
    if not ref or ref.startswith("-"):  # never let a ref read as an option
        return None
    done = run(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", ok=None)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def resolve(repo_path: Where, ref: str) -> str:
    """The full sha of ``ref``; :class:`GitError` if git cannot resolve it."""
    sha = try_resolve(repo_path, ref)
    if sha is None:
        raise GitError(f"{repo_path}: git cannot resolve ref {ref!r} to a commit")
    return sha


def is_ancestor(root: Where, ancestor: str, ref: str) -> bool:
    """Whether ``ancestor`` is ``ref`` or an ancestor of it, through any parent."""
    return run(root, "merge-base", "--is-ancestor", ancestor, ref, ok=None).returncode == 0


def ancestry_path(root: Where, commit: str, ref: str) -> list[str]:
    """The commits after ``commit`` up to ``ref`` that descend from it (``ref`` included)."""
    return run(root, "rev-list", "--ancestry-path", f"{commit}..{ref}", ok=None).stdout.split()


def subject(root: Where, sha: str) -> str:
    """The first line of ``sha``'s commit message."""
    return output(root, "log", "-1", "--format=%s", sha)


def changed_since(root: Where, commit: str) -> tuple[list[str], list[str]]:
    """Paths (relative to the work tree, posix) whose content differs between ``commit``
    and the work tree, committed, staged or not (a rename is its two paths); and the
    untracked files git does not ignore."""
    tracked = run(root, "diff", "--name-only", "--no-renames", "-z", commit, "--").stdout
    untracked = run(root, "ls-files", "--others", "--exclude-standard", "-z").stdout
    return sorted({p for p in tracked.split("\0") if p}), sorted(
        {p for p in untracked.split("\0") if p}
    )


def file_at(root: Where, commit: str, path: str) -> str | None:
    """The text of ``path`` (relative, posix) at ``commit``; None where it did not exist."""
    done = run(root, "show", f"{commit}:{path}", ok=None)
    return done.stdout if done.returncode == 0 else None


def repo_state(path: Where = ".") -> GitState:
    """Commit, branch and dirty flag of the repository containing ``path``.

    Read with GitPython (the design's git library): HEAD and its branch come from the
    repository's files, with no process started; the dirty flag is git's own diff."""
    import git as gitpython  # runs `git version` when imported: only when a state is read

    root = toplevel(path)
    try:
        repo = gitpython.Repo(root)
    except (gitpython.InvalidGitRepositoryError, gitpython.NoSuchPathError) as exc:
        raise GitError(f"{path}: not inside a git repository ({type(exc).__name__})") from None
    try:
        try:
            head = repo.head.commit.hexsha
        except ValueError:
            raise GitError(f"{path}: git repository has no commits yet") from None
        branch = None if repo.head.is_detached else repo.active_branch.name
        # tracked files modified or staged; untracked ones (captures, stores) do not count
        dirty = repo.is_dirty(index=True, working_tree=True, untracked_files=False)
        return GitState(root, head, branch, dirty)
    finally:
        repo.close()


def default_baseline_ref(repo_path: Where = ".") -> str | None:
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
    root = toplevel(repo_path)
    head = try_resolve(root, "HEAD")
    if head is None:
        raise GitError(f"{repo_path}: git repository has no commits yet")
    for name in DEFAULT_BRANCH_REFS:
        default = try_resolve(root, name)
        if default is None:
            continue
        base = run(root, "merge-base", head, default, ok=(0, 1)).stdout.strip()
        if base and base != head:
            return base
        break  # HEAD is on (or behind) the default branch, or unrelated to it
    return head


def first_parent_commits(repo_path: Where, ref: str, *, max_depth: int = 1000) -> list[str]:
    """Shas of ``ref`` and its first-parent ancestors, newest first (at most ``max_depth``)."""
    sha = resolve(repo_path, ref)
    return output(repo_path, "rev-list", "--first-parent", f"--max-count={max_depth}", sha).split()


def prepare_worktree(head_root: Path, ref: str, folder: Path) -> tuple[Path, str]:
    """A detached worktree of ``ref`` under ``folder`` (reused when already at ``ref``
    and clean): its path and the commit. A/B mode's base tree."""
    sha = output(head_root, "rev-parse", "--verify", f"{ref}^{{commit}}")
    path = folder / f"base-{sha[:12]}"
    if path.is_dir():
        try:
            if output(path, "rev-parse", "HEAD") == sha and not output(
                path, "status", "--porcelain"
            ):
                return path, sha
        except GitError:
            pass
        shutil.rmtree(path, ignore_errors=True)
        run(head_root, "worktree", "prune")
    folder.mkdir(parents=True, exist_ok=True)
    run(head_root, "worktree", "add", "--detach", "--force", str(path), sha)
    return path, sha


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
        store.reader.runs(),
        walk,
        ref,
        fingerprint,
        exclude_run_id=exclude_run_id,
        only=only,
        environment=environment,
        across=across,
    )
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
        "found",
        ref,
        len(walk),
        run_id=int(row.run_id),
        commit=str(row.commit),
        distance=int(row.distance),
        dirty=bool(row.dirty),
    )
    return match, comparable[comparable["commit"] == match.commit]
