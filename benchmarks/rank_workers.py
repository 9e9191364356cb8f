"""Multi-rank directory: merged analysis against ``--per-rank`` workers, peak RSS of each process.

Builds one nsys rank (``large_capture.build_nsys`` from the real 2-GPU
torchrun fixture, ``--nvtx owners`` density by default) and a directory of
N hard links to it (``rank-K.sqlite``), then runs in fresh child processes:

* ``single``: ``perfguard analyze -d rank-0.sqlite`` (one rank alone);
* ``merged``: ``perfguard analyze -d DIR`` (ranks read in workers, the
  merged run analysed in the command);
* ``per-rank``: ``perfguard analyze -d DIR --per-rank`` (each rank read and
  analysed in its own worker).

Peak RSS: the command's own from ``os.wait4``; every process of its tree
(the forkserver's workers are not the command's children, so ``wait4``
does not see them) is sampled every 0.1 s from ``/proc/<pid>/status``
(``VmHWM``, the process's own peak, so a sample late in its life is
enough); the command's own children (the fork server, the resource tracker)
are reported apart from the workers (the fork server's children). The workers' ``ru_maxrss``
reported by the workers themselves (``RankResult.peak_rss``) is printed
by a last child that calls :func:`perfguard.report.rank_workers.analyze_ranks`.

Check: every rank holds the same events, so each column of the per-rank
run's rank report must equal N times the single rank's (and the merged
run's rank report must equal the per-rank one); exit status 1 otherwise.

Usage::

    nice -n 10 python benchmarks/rank_workers.py --kernels 200000 --ranks 8 --keep /tmp/ranks
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(REPO)]

from large_capture import FIXTURES, NSYS_FIXTURE, build_nsys, process_tree, rank_dir  # noqa: E402

from perfguard.report.dlprof import RANK_COLUMNS  # noqa: E402

#: rank-report columns that add up over ranks
_SUMS = (
    "gpu_time",
    "kernel_time",
    "comm_time",
    "compute_time",
    "memop_time",
    "gpu_busy",
    "idle_time",
    "iterations",
)
_WORKERS_CHILD = r"""
import json, sys
from perfguard.report.rank_workers import AnalysisOptions, analyze_ranks
run = analyze_ranks(sys.argv[1], AnalysisOptions(reports=("summary", "kernel", "rank")))
print(json.dumps({str(r.rank): r.peak_rss for r in run.ranks}))
"""


def _sample_tree(root: int, peaks: dict[int, tuple[str, int]], stop: threading.Event) -> None:
    while not stop.is_set():
        for pid, fields in process_tree(root).items():
            if pid == root:
                continue
            hwm = int(fields.get("VmHWM", "0 kB").split()[0])
            # the command's own children are the fork server and the resource
            # tracker; the workers are the fork server's children (same cmdline)
            role = "helper" if int(fields["PPid"]) == root else "worker"
            peaks[pid] = (role, max(hwm, peaks.get(pid, ("", 0))[1]))
        stop.wait(0.1)


def run(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``; wall, CPU (its own and reaped children's), its peak RSS and its tree's."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    peaks: dict[int, tuple[str, int]] = {}
    stop = threading.Event()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=REPO)  # see large_capture
        sampler = threading.Thread(target=_sample_tree, args=(proc.pid, peaks, stop))
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        print(f"  ! {' '.join(cmd[:4])} exited {rc}: {errors.strip()[-300:]}")
    server = [kb for role, kb in peaks.values() if role == "helper"]
    workers = [kb for role, kb in peaks.values() if role == "worker"]
    return {
        "rc": rc,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_kb": usage.ru_maxrss,
        "workers_kb": sorted(workers),
        "helper_kb": max(server, default=0),
        "stdout": text,
    }


def _rank_rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", type=int, default=200_000, help="kernels per rank")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--nvtx", choices=("all", "owners"), default="owners")
    p.add_argument("--keep", type=Path, metavar="DIR", help="build into DIR and keep it")
    p.add_argument("--skip-merged", action="store_true", help="do not run the merged analysis")
    args = p.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="perfguard-ranks-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        one = work / f"rank_{args.kernels}_{args.nvtx}.sqlite"
        if not one.exists():
            built = build_nsys(FIXTURES / NSYS_FIXTURE, one, args.kernels, False, args.nvtx)
            print(f"built {one}: {built['kernels']:,} kernels, {built['bytes'] / 1e6:,.0f} MB")
        ranks = rank_dir(one, work / f"ranks_{args.ranks}", args.ranks)
        py = [sys.executable, "-m", "perfguard", "analyze", "--force", "-q"]
        cases = {
            "single": py
            + [
                "-d",
                str(ranks / "rank-0.sqlite"),
                "--output-path",
                str(work / "o1"),
                "--reports",
                "summary,kernel,rank",
                "--formats",
                "csv",
            ],
            "merged": py
            + [
                "-d",
                str(ranks),
                "--output-path",
                str(work / "om"),
                "--reports",
                "summary,kernel,rank",
                "--formats",
                "csv",
            ],
            "per-rank": py
            + [
                "-d",
                str(ranks),
                "--per-rank",
                "--output-path",
                str(work / "op"),
                "--reports",
                "summary,kernel,rank",
                "--formats",
                "csv",
            ],
        }
        if args.skip_merged:
            del cases["merged"]
        results = {}
        for name, cmd in cases.items():
            load = os.getloadavg()[0]
            results[name] = r = run(cmd)
            w = r["workers_kb"]
            print(
                f"{name:>9}: rc {r['rc']}, wall {r['wall_s']:.2f} s, CPU (command) "
                f"{r['cpu_s']:.2f} s, command peak {r['peak_kb'] / 1024:,.0f} MiB, "
                f"{len(w)} workers peak {max(w, default=0) / 1024:,.0f} MiB "
                f"(min {min(w, default=0) / 1024:,.0f}), fork server "
                f"{r['helper_kb'] / 1024:,.0f} MiB; load {load:.1f} before"
            )
        env = dict(os.environ, PYTHONPATH=str(REPO))
        own = subprocess.run(
            [sys.executable, "-c", _WORKERS_CHILD, str(ranks)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO,
        )
        if own.returncode == 0:
            peaks = json.loads(own.stdout.strip().splitlines()[-1])
            print(
                "workers' own ru_maxrss (MiB): "
                + ", ".join(f"rank {k}: {v / 2**20:,.0f}" for k, v in peaks.items())
            )
        ok = all(r["rc"] == 0 for r in results.values())
        if ok:
            single = _rank_rows(work / "o1" / "dlprof_rank.csv")[0]
            per_rank = _rank_rows(work / "op" / "dlprof_rank.csv")
            for header in (RANK_COLUMNS[c] for c in _SUMS):
                total = sum(int(row[header]) for row in per_rank)
                want = args.ranks * int(single[header])
                same = total == want
                ok &= same
                print(
                    f"  {header:<26} sum over ranks {total:>16,}  {args.ranks} x single "
                    f"{want:>16,}  {'equal' if same else 'DIFFERENT'}"
                )
            if "merged" in results:
                merged = _rank_rows(work / "om" / "dlprof_rank.csv")
                same = merged == per_rank
                ok &= same
                print(
                    f"  merged run's rank report {'equals' if same else 'DIFFERS from'} "
                    "the per-rank run's"
                )
        print("check:", "passed" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
