"""``--perfguard-store`` and ``--perfguard-output`` written with a space or with ``=``.

pytest chooses its rootdir and ini file from its positional arguments before it loads any
plugin, so a value written apart from its option is one of pytest's paths at that moment:
a store or output folder outside the project made the rootdir their common parent, the
project's pytest.ini went unread and collection failed (``ModuleNotFoundError``: the ini's
``pythonpath``). No plugin can undo that, so such a session now stops at once with one line
saying to write ``--perfguard-store=PATH``; where the value does not move the rootdir (a
path inside the project) the spaced form works as before. Real sessions in a git project
whose conftest and test import a module only the ini's ``pythonpath`` finds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
from history_repo import git, init_project  # noqa: E402

TEST = """
import pytest
import torch
from helper import value


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1, tolerance="500%")
def test_x(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.ones(8).add(value())
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose imports need its pytest.ini (``pythonpath = lib``), and a folder
    beside it."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (tmp_path / "elsewhere").mkdir()
    init_project(proj)
    (proj / "pytest.ini").write_text("[pytest]\npythonpath = lib\n")
    (proj / "lib").mkdir()
    (proj / "lib" / "helper.py").write_text("def value():\n    return sum(range(100))\n")
    (proj / "conftest.py").write_text("import helper  # found through the ini's pythonpath\n")
    (proj / "test_x.py").write_text(TEST)
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "A")
    return proj


def session(proj: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADD"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def judged(results: Path) -> str:
    (test,) = json.loads(results.read_text())["tests"]
    return str(test["outcome"])


def refused(done: subprocess.CompletedProcess[str], flag: str, value: Path, proj: Path) -> None:
    """The session stopped before collecting, with one line naming the form that works."""
    out = done.stdout + done.stderr
    assert done.returncode == 4, out[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: {flag} {value}: written with a space")
    assert lines[0].endswith(f"write {flag}={value}")
    assert f"its ini file none, not {proj / 'pytest.ini'}" in lines[0]
    assert "ModuleNotFoundError" not in out and "Traceback" not in out


def test_store_with_a_space(project: Path) -> None:
    store = project.parent / "elsewhere" / "runs.db"
    done = session(project, "--perfguard-save", f"--perfguard-store={store}")
    assert done.returncode == 0 and store.is_file(), done.stdout[-3000:]
    # written apart, the existing store is one of pytest's paths: refused, nothing run
    before = store.read_bytes()
    done = session(project, "--perfguard", "--perfguard-store", str(store))
    refused(done, "--perfguard-store", store, project)
    assert store.read_bytes() == before and not (project.parent / ".perfguard").exists()
    # with '=' the session compares with the run saved there
    done = session(project, "--perfguard", f"--perfguard-store={store}")
    assert done.returncode == 0, done.stdout[-3000:]
    assert judged(project / ".perfguard" / "results.json") in ("unchanged", "noisy")
    # a store inside the project moves nothing: the spaced form saves there
    done = session(project, "--perfguard-save", "--perfguard-store", "baselines/mine.db")
    assert done.returncode == 0, done.stdout[-3000:]
    assert (project / "baselines" / "mine.db").is_file()


def test_output_with_a_space(project: Path) -> None:
    out = project.parent / "elsewhere"
    done = session(project, "--perfguard", "--perfguard-output", str(out))
    refused(done, "--perfguard-output", out, project)
    assert not list(out.iterdir())
    done = session(project, "--perfguard-save", f"--perfguard-output={out}")
    assert done.returncode == 0, done.stdout[-3000:]
    assert judged(out / "results.json") == "no-baseline"
    assert (project / "baselines" / "perfguard.db").is_file()  # the project's default store
    done = session(project, "--perfguard", "--perfguard-output", "inside")
    assert done.returncode == 0, done.stdout[-3000:]
    assert judged(project / "inside" / "results.json") in ("unchanged", "noisy")
