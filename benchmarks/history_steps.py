"""Change points on a real history: 30 commits, one real ``pytest --perfguard --perfguard-save``
session each, a +10 % step at commit 10 and a -5 % step at commit 20 (real work added to
and taken from the test's code; see ``tests/history_repo.py``).

    python benchmarks/history_steps.py [--commits 30] [--up 10] [--down 20] [--repo DIR]
        [--export FILE]
    python benchmarks/history_steps.py --four [--commits 24] [--repo DIR] [--export FILE]

``--four``: two counter steps (op calls, commits 5 and 14) and two timing
steps (CPU time +15 % at 10, -10 % at 19) at four different commits
(``history_repo.four_steps``); both kinds of change point must be found
exactly where they were made.

Builds the repo (or reuses ``--repo`` when it already holds a store), then
prints every run's level, the change points found by
:func:`perfguard.compare.history.load_history`, and whether they are
exactly the injected ones. ``--export`` keeps the store as a perfguard
export (the test suite replays a recorded history from one). Sessions run
under ``nice``: the machine is shared, and the noise is part of the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import history_repo  # noqa: E402

from perfguard.baseline.store import open_store  # noqa: E402
from perfguard.compare.history import load_history  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=30)
    ap.add_argument("--up", type=int, default=10)
    ap.add_argument("--down", type=int, default=20)
    ap.add_argument("--repo", type=Path)
    ap.add_argument("--export", type=Path)
    ap.add_argument("--four", action="store_true", help="two counter and two timing steps")
    args = ap.parse_args()
    if args.four:
        return four(args.repo, 24 if args.commits == 30 else args.commits, args.export)
    root = args.repo or Path(tempfile.mkdtemp(prefix="perfguard-history-")) / "repo"
    store_path = root / "baselines" / "perfguard.db"
    have = len(history_repo.git(root, "rev-list", "HEAD").split()) if store_path.exists() else 0
    if have < args.commits:
        started = time.monotonic()
        history_repo.build(root, args.commits, args.up, args.down)
        print(f"{args.commits} sessions in {time.monotonic() - started:.0f} s ({root})")
    with open_store(store_path, create=False) as store:
        hist = load_history(store, history_repo.NODEID, repo=root)
        if args.export:  # the store's runs, and where the steps were injected (the truth)
            store.export_json(args.export)
            doc = json.loads(args.export.read_text())
            doc["steps"] = {"up": args.up, "down": args.down}
            args.export.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))
    levels = hist.levels
    base = levels["value"].iloc[: args.up].median()
    print(f"metric {hist.metric}; level before the first step {base / 1e6:.3f} ms")
    for row in levels.itertuples():
        extra = history_repo.extra_at(int(row.position), args.up, args.down)
        print(
            f"  {int(row.position):3d} {row.commit[:10]} extra={extra:2d} "
            f"{row.value / 1e6:8.3f} ms ({100 * (row.value / base - 1):+5.1f} %)"
        )
    print("change points:")
    for cp in hist.change_points:
        pos = int(levels["position"].iloc[cp.index])
        levels_ms = f"{cp.before_ns / 1e6:.3f} -> {cp.after_ns / 1e6:.3f} ms"
        print(
            f"  at commit {pos} ({cp.commit[:10]}): {cp.change_pct:+.1f} % "
            f"({levels_ms}, p={cp.p_value:.3f})"
        )
        for op in cp.ops:
            print(f"      {op.op_name}: {op.before_ns / 1e6:.3f} -> {op.after_ns / 1e6:.3f} ms")
    found = sorted(int(levels["position"].iloc[cp.index]) for cp in hist.change_points)
    ok = found == [args.up, args.down]
    print(
        f"expected change points at {[args.up, args.down]}, found {found}: "
        f"{'EXACT' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1


def four(repo: Path | None, commits: int, export: Path | None) -> int:
    """``--four``: build (or reuse) the history of ``history_repo.four_steps`` and check that
    the timing change points are exactly at TIMING_STEPS and the counter ones exactly at
    COUNTER_STEPS."""
    root = repo or Path(tempfile.mkdtemp(prefix="perfguard-history-")) / "repo"
    store_path = root / "baselines" / "perfguard.db"
    have = len(history_repo.git(root, "rev-list", "HEAD").split()) if store_path.exists() else 0
    if have < commits:  # a resumed build measures the empty loop again: same machine, same code
        started = time.monotonic()
        history_repo.build_plan(root, history_repo.four_steps(commits))
        print(f"{commits} sessions in {time.monotonic() - started:.0f} s ({root})")
    truth = {"counter": list(history_repo.COUNTER_STEPS), "timing": list(history_repo.TIMING_STEPS)}
    with open_store(store_path, create=False) as store:
        hist = load_history(store, history_repo.NODEID, repo=root)
        if export:
            store.export_json(export)
            doc = json.loads(export.read_text())
            doc["steps"] = truth
            export.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))
    levels = hist.levels
    calls = hist.counters.set_index("run_id")["calls"]
    print(f"metric {hist.metric}")
    for row in levels.itertuples():
        print(
            f"  {int(row.position):3d} {row.commit[:10]} {row.value / 1e6:8.3f} ms "
            f"calls {calls[row.run_id]:6.0f}"
        )
    position = levels["position"].to_numpy()
    timing = sorted(int(position[cp.index]) for cp in hist.change_points)
    counter = sorted({int(position[s.index]) for s in hist.counter_steps})
    for cp in hist.change_points:
        print(
            f"  timing at commit {position[cp.index]}: {cp.kind} {cp.change_pct:+.1f} % "
            f"(z={cp.z:.1f})"
        )
    for st in hist.counter_steps:
        print(
            f"  counter at commit {position[st.index]}: {st.counter} {st.before:g} -> {st.after:g}"
        )
    ok = timing == truth["timing"] and counter == truth["counter"]
    print(
        f"timing expected {truth['timing']}, found {timing}; counters expected "
        f"{truth['counter']}, found {counter}: {'EXACT' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
