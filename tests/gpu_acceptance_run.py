"""Running ``benchmarks/gpu_acceptance.py`` from the tests: the script as a module, and a
dry run of it in a child process (tests/test_gpu_acceptance*.py)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_acceptance.py"


def load_script() -> Any:
    """The script as a module (benchmarks/ is not a package)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        return importlib.import_module(SCRIPT.stem)
    finally:
        sys.path.remove(str(SCRIPT.parent))


def run_dry(
    out: Path, work: Path, *extra: str, timeout: float = 400
) -> subprocess.CompletedProcess:
    """``gpu_acceptance.py --dry`` with this tree's perfguard first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--dry", "--out", str(out), "--work", str(work), *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
