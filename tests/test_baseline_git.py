r"""Git lookups on real repositories made with the git command in tmp_path.

History used throughout (``repo``)::

    main:     A - B - C - D - M      (M merges feature with --no-ff; first parent D)
                   \           /
    feature:        F1 - F2 --

Every expected sha comes from ``git rev-parse`` / ``git merge-base`` run
here, not from perfguard.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from perfguard.baseline import Fingerprint, RunInfo
from perfguard.baseline.git import (
    GitError,
    ancestry_path,
    common_dir,
    default_baseline_ref,
    find_baseline,
    first_parent_commits,
    is_ancestor,
    prepare_worktree,
    repo_state,
    resolve,
    run,
)
from perfguard.baseline.store import Store
from perfguard.errors import BaselineError

H100 = Fingerprint(gpu_name="NVIDIA H100", gpu_count=1, backend="torch", host="ci")
A100 = Fingerprint(gpu_name="NVIDIA A100", gpu_count=1, backend="torch", host="ci")
ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=ENV, check=True
    )
    return out.stdout.strip()


def commit(repo: Path, name: str) -> str:
    (repo / "file.txt").write_text(name + "\n")
    git(repo, "add", "file.txt")
    git(repo, "commit", "-q", "-m", name)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(autouse=True)
def isolated_git_config(monkeypatch):
    """perfguard's own git calls must not see the user's config either."""
    for key in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM"):
        monkeypatch.setenv(key, ENV[key])


@pytest.fixture()
def repo(tmp_path) -> tuple[Path, dict[str, str]]:
    """main: A-B-C-D-M, feature: B-F1-F2 merged into M (first parent of M is D)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    shas = {name: commit(root, name) for name in ("A", "B")}
    git(root, "checkout", "-q", "-b", "feature")
    shas.update({name: commit(root, name) for name in ("F1", "F2")})
    git(root, "checkout", "-q", "main")
    shas.update({name: commit(root, name) for name in ("C", "D")})
    git(root, "merge", "-q", "--no-ff", "-s", "ours", "-m", "M", "feature")
    shas["M"] = git(root, "rev-parse", "HEAD")
    return root, shas


# ------------------------------------------------------------------ repo_state / resolve


def test_repo_state_branch_detached_and_dirty(repo):
    root, shas = repo
    (root / "sub").mkdir()
    state = repo_state(root / "sub")  # found from a subfolder
    assert (state.root, state.commit, state.branch, state.dirty) == (root, shas["M"], "main", False)
    (root / "untracked.txt").write_text("x")
    assert repo_state(root).dirty is False  # untracked files (captures, stores) do not count
    (root / "file.txt").write_text("changed\n")
    assert repo_state(root).dirty is True
    git(root, "checkout", "-q", "--", "file.txt")
    git(root, "checkout", "-q", shas["C"])  # detached HEAD
    state = repo_state(root)
    assert (state.commit, state.branch, state.dirty) == (shas["C"], None, False)
    git(root, "checkout", "-q", "feature")
    assert repo_state(root).branch == "feature"


def test_repo_state_errors_are_one_line(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for path, problem in (
        (plain, "not inside a git repository"),
        (tmp_path / "nowhere", "no such directory"),
    ):
        with pytest.raises(BaselineError) as err:
            repo_state(path)
        assert str(err.value) == f"{path}: {problem}"
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(BaselineError, match=r": git repository has no commits yet$"):
        repo_state(empty)


def test_resolve(repo):
    root, shas = repo
    assert resolve(root, "main") == shas["M"]
    assert resolve(root, "HEAD~1") == git(root, "rev-parse", "HEAD~1") == shas["D"]
    assert resolve(root, shas["B"][:8]) == shas["B"]
    assert resolve(root, "feature") == shas["F2"]
    for bad in ("no-such-branch", "HEAD~99", "0" * 40):
        with pytest.raises(BaselineError) as err:
            resolve(root, bad)
        assert str(err.value) == f"{root}: git cannot resolve ref {bad!r} to a commit"


# ------------------------------------------------------------------ default_baseline_ref


def test_default_ref_on_a_feature_branch_is_the_merge_base(repo):
    root, shas = repo
    git(root, "checkout", "-q", "-b", "topic", shas["D"])
    topic = [commit(root, "T1"), commit(root, "T2")]
    assert default_baseline_ref(root) == git(root, "merge-base", "HEAD", "main") == shas["D"]
    git(root, "checkout", "-q", topic[0])  # detached inside the topic branch: same answer
    assert default_baseline_ref(root) == shas["D"]


def test_default_ref_on_the_default_branch_is_head(repo):
    """On main the walk starts at HEAD: its own run judges uncommitted changes, and a
    push measured before it is saved finds its parent's run (find_baseline tests)."""
    root, shas = repo
    head = git(root, "rev-parse", "HEAD")
    assert default_baseline_ref(root) == head
    git(root, "checkout", "-q", shas["C"])  # behind main: that commit
    assert default_baseline_ref(root) == shas["C"]
    git(root, "checkout", "-q", shas["A"])  # the root commit
    assert default_baseline_ref(root) == shas["A"]


def test_default_ref_uses_origin_head_then_master(repo, tmp_path):
    origin, shas = repo
    git(origin, "branch", "-m", "main", "trunk")  # a default branch of another name
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True, env=ENV)
    assert git(clone, "symbolic-ref", "refs/remotes/origin/HEAD") == "refs/remotes/origin/trunk"
    git(clone, "checkout", "-q", "-b", "work", shas["C"])
    commit(clone, "W")
    assert default_baseline_ref(clone) == shas["C"]  # merge base with origin/trunk

    old = tmp_path / "old"
    old.mkdir()
    git(old, "init", "-q", "-b", "master")
    base = [commit(old, "1"), commit(old, "2")][-1]
    git(old, "checkout", "-q", "-b", "fix")
    commit(old, "3")
    commit(old, "4")
    assert default_baseline_ref(old) == base

    git(old, "checkout", "-q", "--orphan", "unrelated")  # no history shared with master
    commit(old, "u1")
    last = commit(old, "u2")
    assert default_baseline_ref(old) == last


# ------------------------------------------------------------------ find_baseline


def save(store: Store, sha: str, fp: Fingerprint, when: str, dirty: bool = False) -> int:
    return store.save_run(RunInfo(sha, "main", dirty, when, fp), [])


def test_find_baseline_walks_first_parents_past_missing_and_incompatible_runs(repo, tmp_path):
    root, shas = repo
    with Store(tmp_path / "s.db") as store:
        assert find_baseline(store, root, "HEAD", H100).status == "no-runs"
        at_a = save(store, shas["A"], H100, "2024-01-01T00:00:00Z")
        save(store, shas["C"], A100, "2024-01-03T00:00:00Z")  # another GPU: skipped
        save(store, shas["F2"], H100, "2024-01-04T00:00:00Z")  # not a first parent of M

        match = find_baseline(store, root, "main", H100)
        assert (match.status, match.run_id, match.commit, match.distance) == (
            "found",
            at_a,
            shas["A"],
            4,
        )
        assert match.found and match.searched == 5  # M, D, C, B, A

        # the newest comparable run of the nearest commit wins; an incompatible newer one not
        older = save(store, shas["D"], H100, "2024-01-05T00:00:00Z")
        newer = save(store, shas["D"], H100, "2024-01-06T00:00:00Z", dirty=True)
        save(store, shas["D"], A100, "2024-01-07T00:00:00Z")
        match = find_baseline(store, root, "HEAD", H100)
        assert (match.run_id, match.distance, match.dirty) == (newer, 1, True)
        assert find_baseline(store, root, "HEAD", H100, exclude_run_id=newer).run_id == older

        # the ref itself counts
        at_m = save(store, shas["M"], H100, "2024-01-08T00:00:00Z")
        match = find_baseline(store, root, "HEAD", H100)
        assert (match.run_id, match.distance) == (at_m, 0)
        # from the feature branch the first parents are F2, F1, B, A
        assert find_baseline(store, root, "feature", H100).commit == shas["F2"]
        assert find_baseline(store, root, "feature~1", H100).commit == shas["A"]


def test_find_baseline_reports_incomparable_with_the_nearest_reason(repo, tmp_path):
    root, shas = repo
    with Store(tmp_path / "s.db") as store:
        save(
            store,
            shas["A"],
            Fingerprint(gpu_name="NVIDIA V100", gpu_count=1, backend="torch"),
            "2024-01-01T00:00:00Z",
        )
        near = save(store, shas["C"], A100, "2024-01-02T00:00:00Z")
        match = find_baseline(store, root, "main", H100)
        assert match.status == "incomparable" and not match.found and match.run_id is None
        assert match.reason == (
            f"run {near} at {shas['C'][:10]}: gpu_name differs: 'NVIDIA A100' (baseline) "
            "vs 'NVIDIA H100' (current)"
        )
        # max_depth bounds the walk: M and D have no runs at all
        assert find_baseline(store, root, "main", H100, max_depth=2).status == "no-runs"
        with pytest.raises(BaselineError, match="cannot resolve ref 'nope'"):
            find_baseline(store, root, "nope", H100)


# ------------------------------------------------------------------ the one git module


def test_git_commands_fail_in_one_line_naming_the_repository(repo):
    root, _ = repo
    with pytest.raises(GitError) as err:
        run(root, "rev-parse", "--verify", "no-such-ref^{commit}")
    assert str(err.value).startswith(f"{root}: git rev-parse: ") and "\n" not in str(err.value)
    assert isinstance(err.value, BaselineError)
    assert run(root, "rev-parse", "no-such-ref", ok=None).returncode != 0  # clean-up: any status


def test_ancestry_first_parents_and_the_common_git_folder(repo):
    root, shas = repo
    assert first_parent_commits(root, "main") == [shas[n] for n in ("M", "D", "C", "B", "A")]
    assert is_ancestor(root, shas["F1"], "main") and not is_ancestor(root, shas["C"], "feature")
    assert set(ancestry_path(root, shas["F1"], "main")) == {shas["F2"], shas["M"]}
    assert common_dir(root) == (root / ".git").resolve()


def test_prepare_worktree_checks_out_and_reuses_only_a_clean_tree(repo, tmp_path):
    root, shas = repo
    folder = tmp_path / "ab"
    path, sha = prepare_worktree(root, "HEAD~1", folder)
    assert sha == shas["D"] and git(path, "rev-parse", "HEAD") == sha
    assert common_dir(path) == common_dir(root)  # a worktree of the same repository
    made = (path / "file.txt").stat().st_mtime_ns
    assert prepare_worktree(root, shas["D"], folder) == (path, sha)  # clean: reused
    assert (path / "file.txt").stat().st_mtime_ns == made
    (path / "file.txt").write_text("edited\n")  # not clean: checked out again
    assert prepare_worktree(root, shas["D"], folder) == (path, sha)
    assert (path / "file.txt").read_text() == "D\n"
    with pytest.raises(GitError, match="git rev-parse"):
        prepare_worktree(root, "no-such-ref", folder)
