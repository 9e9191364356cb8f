"""``--perfguard-changed``: what a benchmark executes (``plugin/footprint.py``), which
benchmarks a change can move (``plugin/changed.py``), and real sessions that skip the
others and carry their verdicts.

The import graph is read from ``tests/data/changed_project`` (a small model zoo) copied
into a temp folder; the decisions are pinned on real closures and real store metas; the
whole path runs as real pytest sessions in a git repository of that project.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import load_results
from perfguard.plugin.changed import CARRIED, VERDICT_KEY, classify, plan

sys.path.insert(0, str(Path(__file__).parent))
from history_repo import git  # noqa: E402

from perfguard.plugin.footprint import (
    FOOTPRINT_KEY,
    ImportGraph,
    code_text,
    packages_digest,
    project_modules,
)

PROJECT = Path(__file__).parent / "data" / "changed_project"
REPO = Path(__file__).resolve().parents[1]
CNN = ["tests/test_cnn.py::test_cnn[1]", "tests/test_cnn.py::test_cnn[2]"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    shutil.copytree(PROJECT, root)
    return root


def rel(root: Path, files: set[Path]) -> set[str]:
    return {p.relative_to(root.resolve()).as_posix() for p in files}


# ---------------------------------------------------------------------------- what it executes
def test_a_closure_holds_the_test_its_conftest_and_the_project_modules_it_imports(project):
    graph = ImportGraph(project, search=[])
    cnn = graph.closure(graph.test_starts(project / "tests" / "test_cnn.py"))
    assert rel(project, cnn.files) == {
        "tests/test_cnn.py",
        "tests/conftest.py",
        "proj/__init__.py",
        "proj/models/__init__.py",
        "proj/models/cnn.py",
        "proj/layers/__init__.py",
        "proj/layers/helpers.py",
    }
    assert not cnn.unknowable
    mlp = graph.closure(graph.test_starts(project / "tests" / "test_mlp.py"))
    assert {"proj/models/mlp.py", "proj/config.py"} <= rel(project, mlp.files)
    assert "proj/layers/helpers.py" not in rel(project, mlp.files)
    assert "configs/mlp.json" in mlp.literals  # the file it reads, named in its code


def test_relative_literal_and_plugin_imports_are_followed_and_computed_ones_are_said(project):
    (project / "proj" / "registry.py").write_text(
        "import importlib\n\n\ndef get(name):\n    return importlib.import_module(name)\n"
    )
    (project / "proj" / "models" / "zoo.py").write_text(
        "from . import rnn\nfrom ..layers import norm\nimport importlib\n"
        "importlib.import_module('proj.config')\n"
    )
    (project / "tests" / "test_zoo.py").write_text(
        "pytest_plugins = ['proj.registry']\nfrom proj.models import zoo\n"
    )
    graph = ImportGraph(project, search=[])
    zoo = graph.closure(graph.test_starts(project / "tests" / "test_zoo.py"))
    files = rel(project, zoo.files)
    assert {"proj/models/zoo.py", "proj/models/rnn.py", "proj/layers/norm.py"} <= files
    assert {"proj/config.py", "proj/registry.py"} <= files
    assert zoo.unknowable == ["proj/registry.py:5 imports a module by a computed name"]


def test_code_text_ignores_docstrings_comments_and_layout_but_not_code():
    before = 'def f(x):\n    """Old words."""\n    return x + 1  # one\n'
    assert code_text(before) == code_text('def f(x):\n    """New words."""\n\n    return x+1\n')
    assert code_text(before) != code_text('def f(x):\n    """Old words."""\n    return x + 2\n')
    assert code_text("def f(:\n") is None


def test_the_packages_digest_leaves_out_a_local_install_and_moves_with_a_version(tmp_path):
    site = tmp_path / "site"
    (site / "torch-2.13.0.dist-info").mkdir(parents=True)
    (site / "proj-0.1.dev3+g1a2b.dist-info").mkdir()
    (site / "proj-0.1.dev3+g1a2b.dist-info" / "direct_url.json").write_text(
        json.dumps({"url": "file:///src/proj", "dir_info": {"editable": True}})
    )
    one = packages_digest([str(site)])
    (site / "proj-0.1.dev3+g1a2b.dist-info").rename(site / "proj-0.1.dev4+g9f9f.dist-info")
    assert packages_digest([str(site)]) == one  # the project's own install, any version
    (site / "torch-2.13.0.dist-info").rename(site / "torch-2.14.0.dist-info")
    assert packages_digest([str(site)]) != one


def test_project_modules_are_the_loaded_files_of_the_project_only():
    loaded = project_modules(REPO)
    assert "perfguard/plugin/footprint.py" in loaded
    assert not any("site-packages" in p for p in loaded)


# ---------------------------------------------------------------------------- the decision
@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("requirements.txt", "manifest"),
        ("requirements/dev.txt", "data"),
        ("uv.lock", "manifest"),
        ("pyproject.toml", "manifest"),
        ("tests/pytest.ini", "manifest"),
        ("proj/models/cnn.py", "python"),
        ("README.md", "doc"),
        ("docs/guide/index.html", "doc"),
        ("LICENSE", "doc"),
        ("configs/mlp.json", "data"),
        ("csrc/kernel.cu", "data"),
        (".github/workflows/ci.yml", "data"),
    ],
)
def test_classify_says_what_a_changed_file_is(path, kind):
    assert classify(path) == kind


def metas(packages: str, **verdicts: str) -> dict[str, dict[str, object]]:
    return {
        n: {VERDICT_KEY: {"outcome": o}, FOOTPRINT_KEY: {"loaded": [], "packages": packages}}
        for n, o in verdicts.items()
    }


def change(project: Path, path: str, old: str, new: str) -> dict[str, str | None]:
    """Edit one file of ``project``; its text before, by path (what ``git show`` gives)."""
    f = project / path
    before = f.read_text() if f.is_file() else None
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(before.replace(old, new) if before is not None else new)
    return {path: before}


def decide(project: Path, old: dict[str, str | None], **kw: object):
    changes = sorted(old)
    tests = {
        "cnn": project / "tests" / "test_cnn.py",
        "mlp": project / "tests" / "test_mlp.py",
        "seq": project / "tests" / "test_seq.py",
    }
    stored = kw.pop("metas", metas("p", cnn="unchanged", mlp="noisy", seq="improved"))
    return plan(
        tests,
        graph=ImportGraph(project, search=[]),
        commit="c0ffee" * 7,
        changes=changes,
        old_text=old.get,
        metas=stored,  # type: ignore[arg-type]
        packages=str(kw.pop("packages", "p")),
    )


def test_a_model_file_moves_the_benchmarks_that_import_it_and_no_other(project):
    chosen = decide(project, change(project, "proj/models/cnn.py", "= 8", "= 16"))
    assert chosen.everything is None
    assert chosen.runs == {"cnn": "its code changed: proj/models/cnn.py"}
    assert sorted(chosen.carried) == ["mlp", "seq"]
    mlp = chosen.carried["mlp"]
    assert mlp.outcome is Outcome.NOISY and mlp.carried_from == "c0ffee" * 7
    assert (
        mlp.message
        == "not run: nothing it executes changed since c0ffeec0ffee (its verdict there: noisy)"
    )


def test_a_docstring_runs_nothing_a_config_runs_its_reader_a_lock_file_runs_all(project):
    words = change(project, "proj/layers/helpers.py", "shares.", "share, and more words.")
    assert decide(project, words).runs == {}
    config = change(project, "configs/mlp.json", "64", "128")
    assert decide(project, config).runs == {"mlp": "configs/mlp.json changed, which its code names"}
    lock = change(project, "requirements.txt", "\n", "\nnumpy\n")
    locked = decide(project, lock | change(project, "README.md", "zoo", "zoo of models"))
    assert locked.everything and locked.everything.startswith("requirements.txt changed")
    assert set(locked.runs) == {"cnn", "mlp", "seq"} and not locked.carried
    unread = decide(project, change(project, "csrc/kernel.cu", "", "// a kernel\n"))
    assert unread.everything and "no benchmark's code names it" in unread.everything


def test_what_cannot_be_carried_runs(project):
    stored = metas("p", cnn="regressed", mlp="noisy")
    stored["mlp"].pop(FOOTPRINT_KEY)
    chosen = decide(project, {}, metas=stored)
    assert chosen.runs == {
        "cnn": "its verdict at c0ffeec0ffee was regressed: measured again",
        "mlp": "its baseline record does not say what it loaded (saved by an older perfguard)",
        "seq": "the baseline run at c0ffeec0ffee has no record of it",
    }
    other = decide(project, {}, packages="q")
    assert set(other.runs.values()) == {"the installed packages differ from its baseline run's"}
    loaded = metas("p", cnn="unchanged", mlp="unchanged", seq="unchanged")
    loaded["seq"][FOOTPRINT_KEY] = {"loaded": ["proj/plugins.py"], "packages": "p"}
    plugins = change(project, "proj/plugins.py", "", "X = 1\n")  # loaded by an entry point
    assert decide(project, plugins, metas=loaded).runs == {
        "seq": "its code changed: proj/plugins.py"
    }


# ---------------------------------------------------------------------------- real sessions
def repo(root: Path) -> None:
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "ci@example.com")
    git(root, "config", "user.name", "CI")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "c0")


def session(root: Path, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PERFGUARD_CONFIRM_BUDGET": "0"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--perfguard"]
        + ["--perfguard-backend=cpu", "--perfguard-store=store.db", f"--perfguard-output={out}"]
        + list(extra),
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_a_pull_request_runs_what_it_moved_and_carries_the_rest_in_every_view(project):
    root = project
    repo(root)
    session(root, "m0", "--perfguard-save")
    git(root, "commit", "-q", "--allow-empty", "-m", "c1")
    main = git(root, "rev-parse", "HEAD")
    on_main = session(root, "m1", "--perfguard-save", "--perfguard-changed")
    assert "every benchmark runs: HEAD is on the default branch" in on_main.stdout
    m1 = load_results(root / "m1" / "results.json").tests
    assert not any(t.carried_from for t in m1)
    # what a pull request may carry: main's verdicts that are carried (a timing read
    # regressed on a busy machine, confirmation off here, is measured again instead)
    kept = {t.nodeid for t in m1 if t.outcome in CARRIED}
    again = sorted({t.nodeid for t in m1} - kept)
    assert len(m1) == 8

    git(root, "checkout", "-q", "-b", "wider")
    cnn = root / "proj/models/cnn.py"
    cnn.write_text(cnn.read_text().replace("CHANNELS = 8", "CHANNELS = 16"))
    git(root, "commit", "-q", "-am", "wider CNN")
    pr = session(root, "pr", "--perfguard-changed")
    skipped = kept - set(CNN)
    n = len(skipped)
    assert f"{n} deselected" in pr.stdout, pr.stdout[-3000:]
    doc = load_results(root / "pr" / "results.json")
    ran = sorted(t.nodeid for t in doc.tests if t.carried_from is None)
    assert ran == sorted(set(CNN) | set(again))
    assert all(t.outcome is Outcome.REGRESSED for t in doc.tests if t.nodeid in CNN)
    carried = [t for t in doc.tests if t.carried_from is not None]
    assert {t.nodeid for t in carried} == skipped and {t.carried_from for t in carried} == {main}
    said = f"not run: nothing it executes changed since {main[:12]}"
    assert all(t.message.startswith(said) for t in carried)
    assert all(t.outcome.judged and t.outcome is not Outcome.REGRESSED for t in carried)
    summary = (root / "pr" / "summary.md").read_text()
    assert summary.count(said) == n and f"{n} not run: nothing they execute changed" in summary
    assert (root / "pr" / "report.html").read_text().count(said) >= n
    assert said in pr.stdout  # the terminal's table
    assert f"{n} of 8 benchmark(s) not run" in pr.stdout
    if again:
        assert "was regressed: measured again" in pr.stdout

    # a docstring alone: nothing runs but what main left regressed, every verdict carried
    git(root, "checkout", "-q", "-b", "words", "main")
    mlp = root / "proj/models/mlp.py"
    mlp.write_text(mlp.read_text().replace("sized by", "whose width is set by"))
    git(root, "commit", "-q", "-am", "words")
    words = session(root, "words", "--perfguard-changed")
    assert f"{len(kept)} deselected" in words.stdout
    assert words.returncode == 0 or again
    words_doc = load_results(root / "words" / "results.json").tests
    assert len(words_doc) == 8
    assert {t.nodeid for t in words_doc if t.carried_from == main} == kept

    # sharded: each job carries only its own part (the split comes first), merged once each
    for k in (1, 2):
        session(root, f"s{k}", "--perfguard-changed", f"--perfguard-shard={k}/2")
    merged = subprocess.run(
        [sys.executable, "-m", "perfguard", "merge", "s1/results.json", "s2/results.json"]
        + ["-o", "merged"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert merged.returncode == 0 or again, merged.stderr
    tests = load_results(root / "merged" / "results.json").tests
    assert len(tests) == 8 and {t.nodeid for t in tests if t.carried_from == main} == kept


def test_a_file_that_does_not_parse_moves_wherever_its_text_does(project):
    broken = change(project, "proj/layers/helpers.py", "return torch.relu(x)", "return (")
    assert decide(project, broken).runs == {
        "cnn": "perfguard cannot follow its imports: proj/layers/helpers.py cannot be parsed"
    }
    again = change(project, "proj/layers/helpers.py", "return (", "return ((")
    assert "cnn" in decide(project, again).runs
