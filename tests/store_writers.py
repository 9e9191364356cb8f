"""Many processes writing one baseline store at once: the concurrency test's and the
benchmark's writers (``tests/test_baseline_store.py``, ``benchmarks/store_concurrency.py``).

Each writer is a fresh interpreter that waits at a gate until all have
started, opens the store (racing the others to create it) and saves its
runs one transaction each, with a commit and host that say which writer and
which run it is, so the reader can tell a lost run from a duplicated one.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from perfguard.baseline.record import TestRecord

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import json, pickle, sys, time
from pathlib import Path
from perfguard.baseline.record import Fingerprint, RunInfo
from perfguard.baseline.store import open_store

store, recs, worker, n_workers, n_runs, gate, *same = sys.argv[1:]
worker, n_workers, n_runs, gate = int(worker), int(n_workers), int(n_runs), Path(gate)
records = pickle.loads(Path(recs).read_bytes())
(gate / f"ready-{worker}").touch()
deadline = time.monotonic() + 300
while len(list(gate.glob("ready-*"))) < n_workers and time.monotonic() < deadline:
    time.sleep(0.005)
host = "shared" if same else f"w{worker}"  # same: one commit on one machine, replaced
fp = Fingerprint(gpu_name="NVIDIA H100", gpu_count=1, backend="torch", host=host)
with open_store(store, create=True) as s:  # all open (and race to create) the store at once
    ids = []
    for k in range(n_runs):
        when = f"2024-01-01T{worker:02d}:{k // 60:02d}:{k % 60:02d}+00:00"
        info = RunInfo(same[0] if same else f"{worker:02d}{k:038d}", "main", False, when, fp)
        ids.append(s.save_run(info, records))
print(json.dumps(ids))
"""


def writer_commit(worker: int, k: int) -> str:
    """The commit writer ``worker`` gives its run ``k`` (the worker script spells it too)."""
    return f"{worker:02d}{k:038d}"


def run_writers(
    tmp_path: Path,
    location: Path | str,
    recs: list[TestRecord],
    n_workers: int,
    n_runs: int,
    *,
    timeout: float = 600,
    same_commit: str | None = None,
) -> list[int]:
    """``n_workers`` processes that start together and each save ``n_runs`` runs of ``recs``
    (all on ``same_commit`` and one machine when given: each save replaces the last)."""
    (tmp_path / "recs.pkl").write_bytes(pickle.dumps(recs))
    (tmp_path / "worker.py").write_text(WORKER)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [str(location), str(tmp_path / "recs.pkl")]
    tail = [same_commit] if same_commit else []
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(tmp_path / "worker.py"),
                *args,
                str(w),
                str(n_workers),
                str(n_runs),
                str(gate),
                *tail,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(n_workers)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    return [i for out, _ in outs for i in json.loads(out)]
