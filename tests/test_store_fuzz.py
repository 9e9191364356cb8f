"""The store fuzzer (``benchmarks/store_fuzz.py``) at a small size: the recorded real
history (``tests/data/history_steps.json`` in a store over a git repository), damaged
four ways (bits flipped in random pages, a page of garbage, the file cut, negative
times), each read by ``history`` (text and JSON), ``baseline list`` and ``baseline
check`` in forked children, with the check at open and without it (a large store).

Zero bugs expected: never exit 0 with fewer tests or runs than the undamaged store,
never an internal error or a crash. The large run is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FUZZ = Path(__file__).resolve().parents[1] / "benchmarks" / "store_fuzz.py"
KINDS = ("flip", "garbage", "truncate", "negative")
COMMANDS = ("history", "history-json", "list", "check")


def test_store_fuzz_small_run_finds_no_bug(tmp_path: Path) -> None:
    log = tmp_path / "fuzz.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            str(FUZZ),
            "--cases",
            str(len(KINDS)),
            "--seed",
            "0",
            "--only",
            "history",
            "--kinds",
            ",".join(KINDS),
            "--commands",
            ",".join(COMMANDS),
            "--plugin-every",
            "0",
            "--seeds",
            str(tmp_path / "seeds"),
            "--log",
            str(log),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == len(KINDS) * len(COMMANDS) * 2, done.stdout[-2000:] + done.stderr
    bugs = [r for r in runs if r["outcome"] in ("partial", "untyped", "crash")]
    assert bugs == [], done.stdout[-3000:]
    assert done.returncode == 0
    assert {r["kind"] for r in runs} == set(KINDS)
    assert {r["outcome"] for r in runs} == {"error", "result"}  # damage found, and not
