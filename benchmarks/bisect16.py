"""``perfguard bisect`` for real: a 16-commit git history with one real regression at
commit 11 (an ``.item()`` per step and 30 % more matmuls: ``tests/bisect_repo.py``),
bisected in A/B mode (each candidate measured against GOOD in alternating rounds of
fresh processes, nothing stored beforehand).

    nice -n 10 python benchmarks/bisect16.py [--oracle verdict|gates|timing] [--pairs 3]

Prints the bisection's report and whether the first bad commit is commit 11, the
steps, and the wall time; writes bisect.md/bisect.json under the temp repo.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import bisect_repo  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle", default="verdict", choices=("verdict", "gates", "timing"))
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfguard-bisect16-") as tmp:
        root = Path(tmp) / "repo"
        shas = bisect_repo.build(root, slow=True)
        out = Path(tmp) / "out"
        cmd = [
            sys.executable,
            "-m",
            "perfguard",
            "bisect",
            shas[0],
            shas[-1],
            bisect_repo.NODEID,
            "--oracle",
            args.oracle,
            "--mode",
            "ab",
            "--output",
            str(out),
            "--pytest-args",
            f"--perfguard-ab-pairs={args.pairs} --perfguard-ab-budget={args.budget:g}",
        ]
        t0 = time.monotonic()
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        print(done.stdout)
        print(done.stderr, file=sys.stderr)
        found = (out / "bisect.json").read_text() if (out / "bisect.json").is_file() else ""
        want = shas[bisect_repo.REGRESSION]
        ok = f'"first_bad": "{want}"' in found
        print(
            f"oracle {args.oracle}, {args.pairs} pairs: exit {done.returncode}, "
            f"{wall:.0f} s; first bad is commit {bisect_repo.REGRESSION} ({want[:10]}): "
            f"{'yes' if ok else 'NO'}"
        )
        print((out / "bisect.md").read_text() if (out / "bisect.md").is_file() else "")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
