"""Concurrent writers on one baseline store: 16 processes x 100 runs, on SQLite and PostgreSQL.

    python benchmarks/store_concurrency.py [--workers 16] [--runs 100] [--backend both]
        [--url postgresql://...]

Every writer saves its runs of two real records (the a100 and bert fixture
captures) one transaction each, all starting together. Then the store is
checked from outside the writers: every run id a writer got back is there
once (0 lost, 0 duplicated: one row per (commit, host), exactly workers x
runs rows, and the frame tables hold exactly the expected row counts), and
every stored run loads back equal to the records sent (0 corrupt).
Without ``--url`` a throwaway PostgreSQL cluster is started
(``tests/pgserver.py``). Prints the wall time and the runs per second.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from pandas.testing import assert_frame_equal  # noqa: E402
from pgserver import WHY_NOT, PgServer, find_binaries  # noqa: E402
from store_writers import run_writers, writer_commit  # noqa: E402

from perfguard.analysis import analyze  # noqa: E402
from perfguard.baseline import record_from_analysis  # noqa: E402
from perfguard.baseline.frames import FRAME_TYPES, conform_frame  # noqa: E402
from perfguard.baseline.store import open_store  # noqa: E402
from perfguard.trace import load_trace  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures"
CAPTURES = {
    "a100": "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz",
    "bert": "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz",
}


def checksums(store, recs) -> int:
    """Runs whose stored rows differ from the records sent, by per-(run, test, table) row
    count and sums of every numeric column and of the text lengths, one query per table."""
    bad: set[int] = set()
    for table, kinds in FRAME_TYPES.items():
        cols = [f'sum("{c}")' if k != "str" else f'sum(length("{c}"))' for c, k in kinds.items()]
        df = store.db.query(
            f"SELECT t.run_id, t.nodeid, count(*), {', '.join(cols)} FROM {table} x "
            "JOIN tests t ON t.test_id = x.test_id GROUP BY t.run_id, t.nodeid"
        )
        want = {}
        for rec in recs:
            frame = conform_frame(table, getattr(rec, table))
            sums = [len(frame)] + [
                float(frame[c].str.len().sum())
                if k == "str"
                else float(frame[c].astype("Float64").sum())
                for c, k in kinds.items()
            ]
            want[rec.nodeid] = sums
        for row in df.itertuples(index=False):
            got = [float(v) if v is not None else 0.0 for v in row[2:]]
            exp = want.get(row[1])
            if exp is None or any(
                abs(g - e) > 1e-6 * max(1.0, abs(e)) for g, e in zip(got, exp, strict=True)
            ):
                bad.add(int(row[0]))
    return len(bad)


def check(
    location, recs, n_workers: int, n_runs: int, ids: list[int], sample: int = 0
) -> dict[str, int]:
    """Lost, duplicated and corrupt runs, counted from outside the writers. ``sample``:
    load and compare that many runs whole (0: all), besides the checksums of every run."""
    expected = {(writer_commit(w, k), f"w{w}") for w in range(n_workers) for k in range(n_runs)}
    with open_store(location, create=False) as store:
        runs = store.runs()
        keys = list(zip(runs["commit"], runs["host"], strict=True))
        stored = set(keys)
        rows = {
            t: int(store.db.query(f"SELECT count(*) AS n FROM {t}")["n"].iloc[0])
            for t in ("tests", *FRAME_TYPES)
        }
        corrupt = checksums(store, recs)
        chosen = (
            runs["run_id"] if not sample else runs["run_id"].iloc[:: max(1, len(runs) // sample)]
        )
        for run_id in chosen:
            _, loaded = store.load_run(int(run_id))
            for rec in recs:
                try:
                    got = loaded[rec.nodeid]
                    for name in FRAME_TYPES:
                        want = conform_frame(name, getattr(rec, name))
                        assert_frame_equal(getattr(got, name), want)
                    assert got.meta == rec.meta and got.metric == rec.metric
                except (KeyError, AssertionError):
                    corrupt += 1
    want_rows = {"tests": len(expected) * len(recs)}
    want_rows |= {t: len(expected) * sum(len(getattr(r, t)) for r in recs) for t in FRAME_TYPES}
    return {
        "lost": len(expected - stored) + len(set(ids) - set(runs["run_id"])),
        "duplicated": len(keys) - len(stored) + len(ids) - len(set(ids)),
        "foreign": len(stored - expected),
        "corrupt": corrupt,
        "row_count_mismatches": sum(rows[t] != want_rows[t] for t in rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--url", help="an empty PostgreSQL database (default: a throwaway cluster)")
    ap.add_argument(
        "--sample",
        type=int,
        default=0,
        help="load and compare only this many runs whole (default: all); every "
        "run's rows are checksummed in SQL either way",
    )
    args = ap.parse_args()
    recs = []
    for key, rel in CAPTURES.items():
        analysis = analyze(load_trace(FIXTURES / rel))
        recs.append(record_from_analysis(f"bench.py::test_{key}", analysis, meta={"k": key}))
    tmp = Path(tempfile.mkdtemp(prefix="perfguard-conc-"))
    server = None
    failed = False
    try:
        for backend in ("sqlite", "postgresql"):
            if args.backend not in (backend, "both"):
                continue
            if backend == "sqlite":
                location: Path | str = tmp / "store.db"
            elif args.url:
                location = args.url
            else:
                bindir = find_binaries()
                if bindir is None:
                    print(f"postgresql: skipped ({'; '.join(WHY_NOT)})")
                    continue
                server = PgServer(bindir).start()
                location = server.new_database()
            work = tmp / backend
            work.mkdir()
            started = time.monotonic()
            ids = run_writers(work, location, recs, args.workers, args.runs, timeout=3600)
            took = time.monotonic() - started
            result = check(location, recs, args.workers, args.runs, ids, args.sample)
            n = args.workers * args.runs
            rate = f"{n / took:.1f} runs/s, incl. interpreter start"
            print(
                f"{backend}: {args.workers} writers x {args.runs} runs = {n} runs in "
                f"{took:.1f} s ({rate}); {result}"
            )
            failed |= any(result.values())
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
