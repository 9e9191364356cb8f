"""The modules every pytest run loads stay light: pytest imports ``perfguard.plugin`` (the
``pytest11`` entry point) at start-up, with or without ``--perfguard``, and its options, marker
and iteration loop come with it. None of them may import numpy or pandas (0.1-0.3 s and tens
of MB per pytest process, and per xdist worker); those load only when a test is measured.
The core's loop and spec come with them (light too); the core's measurement and verdict are
library calls that load no pytest.

Each module is imported alone in a fresh interpreter, so nothing a test imported before counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIGHT = (
    "perfguard.plugin",
    "perfguard.plugin.options",
    "perfguard.plugin.marker",
    "perfguard.plugin.iterate",
    "perfguard.core.loop",
    "perfguard.core.spec",
)
HEAVY = ("numpy", "pandas")


def _loaded(module: str | None) -> set[str]:
    """The top-level packages in ``sys.modules`` after importing ``module`` (None: nothing)."""
    code = (
        "import importlib, json, sys\n"
        f"name = {module!r}\n"
        "if name: importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    return set(json.loads(out.stdout))


@pytest.fixture(scope="module")
def bare() -> set[str]:
    """What this interpreter loads before any perfguard module (site hooks included)."""
    return _loaded(None)


@pytest.mark.parametrize("module", LIGHT)
def test_a_light_module_imports_neither_numpy_nor_pandas(module: str, bare: set[str]) -> None:
    loaded = _loaded(module)
    assert "perfguard" in loaded
    assert sorted((loaded - bare) & set(HEAVY)) == []


@pytest.mark.parametrize("module", ["perfguard.core.measure", "perfguard.core.verdict"])
def test_the_core_runs_without_pytest(module: str, bare: set[str]) -> None:
    """The measurement and the verdict are library calls: neither they nor anything they
    import loads pytest (the plugin translates pytest's events into them)."""
    loaded = _loaded(module)
    assert "numpy" in loaded  # the whole core came: not vacuous
    assert sorted((loaded - bare) & {"pytest", "_pytest"}) == []


def test_the_fence_sees_a_heavy_import(bare: set[str]) -> None:
    """Not vacuous: a perfguard module that does import pandas is caught the same way."""
    assert "pandas" in _loaded("perfguard.analysis.flops") - bare


def test_the_machine_fingerprint_reads_torch_without_importing_it_where_no_gpu_can_be() -> None:
    """A session's start took 1.2-3.2 s, 1.6 s of it ``import torch`` for the fingerprint's
    version strings (issue 53). Where no GPU can be (no ``nvidia-smi``, no device nodes),
    torch's version file says them; where torch is imported, its own figures agree."""
    pytest.importorskip("torch")
    from perfguard.baseline import fingerprint

    if fingerprint._gpu_possible():
        pytest.skip("this machine could have a GPU: torch is imported to ask it")
    code = (
        "import json, sys\n"
        "from perfguard.baseline.fingerprint import machine_fingerprint\n"
        "fp = machine_fingerprint('cpu')\n"
        "before = 'torch' in sys.modules\n"
        "import torch\n"
        "print(json.dumps([before, fp.torch, fp.cuda, torch.__version__,\n"
        "                  torch.version.cuda or '']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    imported, version, cuda, real_version, real_cuda = json.loads(out)
    assert not imported
    assert (version, cuda) == (real_version, real_cuda)
