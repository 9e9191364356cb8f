"""Run the seeded tests of ``tests/test_compare_timing.py`` over many seeds (issue 45).

A test that draws random numbers passes with its own seed; this checks that it
would pass with any other, so its tolerance is not luck. Each test that takes the
``rng`` fixture is called with ``np.random.default_rng(seed)`` for every seed, and
the failures are counted (with the first failing seeds and their messages).

    python benchmarks/seed_sweep.py              # 1,000 seeds
    python benchmarks/seed_sweep.py --seeds 5000
"""

from __future__ import annotations

import argparse
import inspect
import linecache
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import test_compare_timing as module  # noqa: E402


def seeded_tests() -> dict:
    """The module's tests that take the ``rng`` fixture, by name."""
    return {
        name: fn
        for name, fn in vars(module).items()
        if name.startswith("test_")
        and callable(fn)
        and list(inspect.signature(fn).parameters) == ["rng"]
    }


def _where(exc: AssertionError) -> str:
    """The failing assertion's line in the test module, and its message if any."""
    tb = exc.__traceback__
    line = ""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == module.__file__:
            line = linecache.getline(module.__file__, tb.tb_lineno).strip()
        tb = tb.tb_next
    return f"{line}  {str(exc).splitlines()[0] if str(exc) else ''}".strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000)
    args = parser.parse_args()
    worst = 0
    for name, fn in seeded_tests().items():
        failed: list[tuple[int, str]] = []
        for seed in range(args.seeds):
            try:
                fn(np.random.default_rng(seed))
            except AssertionError as exc:
                failed.append((seed, _where(exc)))
        worst = max(worst, len(failed))
        print(f"{name}: {len(failed)} of {args.seeds} seeds fail")
        for seed, why in failed[:3]:
            print(f"    seed {seed}: {why[:150]}")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
