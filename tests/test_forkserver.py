"""The fork server that A/B rounds and isolated tests start their children from.

Real server processes and real child pytest sessions in a temporary project:
a child's return code, a segfault and a hang reported as a crash, the tree's
own code imported fresh in each child (never preloaded), and forking refused
where a preloaded module left a thread running.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from perfguard.plugin.forkserver import ForkServer, preload_names

TESTS = """
import ctypes
import os
import time

import helper


def test_ok():
    assert helper.VALUE == {value}


def test_fails():
    assert helper.VALUE == -1


def test_segfault():
    ctypes.string_at(0)


def test_hang():
    time.sleep(60)


def test_env_and_cwd():
    assert os.environ["ROUND_MARK"] == "yes"
    assert os.getcwd() == {tree!r}
"""


def tree(root: Path, value: int) -> Path:
    root.mkdir(parents=True)
    (root / "helper.py").write_text(f"VALUE = {value}\n")
    (root / "test_tree.py").write_text(TESTS.format(value=value, tree=str(root)))
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


@pytest.fixture
def server(tmp_path: Path):
    srv = ForkServer(["json", "ctypes"], tmp_path / "srv", tmp_path / "srv.log")
    assert srv.start(), srv.why_not
    yield srv
    srv.close()


def child(srv: ForkServer, root: Path, test: str, timeout: float = 120) -> tuple[int | str, str]:
    log = root / f"{test}.log"
    env = dict(os.environ, ROUND_MARK="yes")
    args = [f"test_tree.py::{test}", "-q", "-p", "no:cacheprovider", "-p", "no:perfguard"]
    code = srv.run(cwd=root, args=args, env=env, lead=[str(root)], log=log, timeout=timeout)
    return code, log.read_text(errors="replace")


def test_children_run_their_own_tree(server: ForkServer, tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a", 1), tree(tmp_path / "b", 2)
    for root in (a, b, a):  # each child imports its own tree's helper, fresh
        code, log = child(server, root, "test_ok")
        assert code == 0, log
    code, log = child(server, a, "test_fails")
    assert code == 1 and "assert 1 == -1" in log
    code, log = child(server, b, "test_env_and_cwd")
    assert code == 0, log


def test_a_crash_and_a_hang_are_reported_and_the_server_goes_on(
    server: ForkServer, tmp_path: Path
) -> None:
    a = tree(tmp_path / "a", 1)
    code, _ = child(server, a, "test_segfault")
    assert code == -11  # SIGSEGV, as subprocess reports a signal
    code, _ = child(server, a, "test_hang", timeout=3)
    assert code == "timed out after 3 s"
    code, log = child(server, a, "test_ok")
    assert code == 0, log


def test_preload_never_names_a_module_of_the_trees(tmp_path: Path) -> None:
    root = tree(tmp_path / "a", 7)
    sys.path.insert(0, str(root))
    try:
        import helper  # noqa: F401 - loaded from the tree

        names = preload_names([root])
        assert "helper" not in names
        assert "json" in names and "pytest" in names  # libraries are preloaded
        assert "helper" in preload_names([tmp_path / "elsewhere"])
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("helper", None)


def test_a_thread_left_running_refuses_forking(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "spins_a_thread.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    )
    srv = ForkServer(["spins_a_thread"], tmp_path / "srv", tmp_path / "srv.log")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(lib)
    try:
        assert not srv.start()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    assert srv.why_not is not None and "2 Python threads" in srv.why_not
    assert srv.proc is None
