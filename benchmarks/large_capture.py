"""Large-capture benchmark: ``perfguard analyze`` on >= 1M kernels and >= 1M NVTX ranges.

Builds two large captures from real fixtures, then times ``perfguard
analyze`` on each in a subprocess:

* nsys SQLite: the 2-GPU torchrun export (PyTorch ``emit_nvtx`` ranges,
  NCCL) replicated N times *inside SQLite* (one ``INSERT ... SELECT`` per
  table, a recursive CTE of copy indices). Copy ``k`` is shifted by ``k``
  capture spans in time and by ``k * (max correlationId + 1)`` in
  correlationId, so kernel -> runtime-call joins stay exact per process
  (``globalPid``/``globalTid`` unchanged). Every other table and index of
  the export is kept as it is.
* Kineto JSON: the A100 2-rank NCCL training trace (rank 0) replicated the
  same way (``ts`` shifted, ``correlation``/``External id``/flow ids
  shifted, ``ProfilerStep#N`` renumbered), written as ``.json`` (``--gzip``
  for ``.json.gz``).

Each capture is measured twice, each time in a fresh child process: the CLI
(``python -m perfguard analyze --database X --output-path DIR --force``),
and a phase split (import, ``load_trace``, ``analyze``, ``write_reports``).
Peak RSS is the child's ``ru_maxrss`` (KiB on Linux), taken per child with
``os.wait4``.

Targets (the performance issues): the SQLite case at ``emit_nvtx`` density
(``--nvtx all``, 4.8 ranges per kernel) within 6 s wall and 1.5 GB peak RSS,
with only the ranges that launch work (``--nvtx owners``) within 3 s and
1 GB, on a 2-core machine. Exit status 1 when the SQLite CLI run misses
either. ``--ranks N`` also measures a directory of N per-rank exports
(hard links to the capture), which the CLI reads in worker processes; its
peak RSS is the largest of the command and its workers (``wait4`` reports
the maximum over the reaped process tree), the phase child's is the
command's own.

Usage::

    python benchmarks/large_capture.py                     # build + measure both
    python benchmarks/large_capture.py --skip-kineto --keep /tmp/big
    python benchmarks/large_capture.py --kernels 200000 --repeat 3
    python benchmarks/large_capture.py --skip-kineto --kernels 200000 --nvtx owners --ranks 8
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("PERFGUARD_FIXTURES", REPO.parent / "shared" / "fixtures"))
NSYS_FIXTURE = "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite"
KINETO_FIXTURE = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"

#: the issue's targets per NVTX density: (wall s, peak RSS KiB; GB read strictly, 1e9
#: bytes, since ru_maxrss is KiB): emit_nvtx density (4.8 ranges per kernel) and owners
SQLITE_TARGETS = {"all": (6.0, 1.5e9 / 1024), "owners": (3.0, 1.0e9 / 1024)}

#: Tables replicated per copy (when present): GPU activities, the API calls that
#: launch them, and NVTX. Correlation ids link the CUPTI tables.
CUPTI_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
)
NVTX_TABLE = "NVTX_EVENTS"
NVTX_RANGE_TYPES = (59, 60)  # push/pop, start/end
#: Timestamp columns shifted per copy (where the table has them).
TIME_COLUMNS = ("start", "end")


# --------------------------------------------------------------------------- nsys


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({_q(table)})")]


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


#: the launching thread and time of every GPU activity of the fixture: the runtime call
#: of the same process with the same correlation id (globalTid >> 24 is the process)
_LAUNCHES = """
SELECT r.globalTid AS gtid, r.start AS t
FROM {activity} AS a JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r
  ON r.correlationId = a.correlationId AND (r.globalTid >> 24) = (a.globalPid >> 24)
"""


def keep_owner_ranges(conn: sqlite3.Connection, cupti: list[str]) -> int:
    """Delete every NVTX range that launches no GPU work itself; returns how many are left.

    A range is kept when it is the innermost range on a launching call's thread
    that encloses the call (the attribution rule, computed here in SQL,
    independently of perfguard). What is left models coarse annotation
    (module ranges, ``perfguard.instrument``'s default), about one range per
    launch, instead of ``emit_nvtx``'s range per aten op.
    """
    launches = " UNION ALL ".join(
        _LAUNCHES.format(activity=t)
        for t in cupti
        if t != "CUPTI_ACTIVITY_KIND_RUNTIME"
        and "correlationId" in _columns(conn, t)
        and "globalPid" in _columns(conn, t)
    )
    conn.execute(f"CREATE INDEX _bench_nvtx ON {NVTX_TABLE}(globalTid, start)")
    conn.execute(
        f"CREATE TEMP TABLE _owners AS SELECT DISTINCT (SELECT n.rowid FROM {NVTX_TABLE} AS n"
        f" WHERE n.globalTid = l.gtid AND n.eventType IN {NVTX_RANGE_TYPES}"
        " AND n.start <= l.t AND l.t <= n.end ORDER BY n.start DESC, n.end ASC LIMIT 1) AS rid"
        f" FROM ({launches}) AS l"
    )
    conn.execute(
        f"DELETE FROM {NVTX_TABLE} WHERE eventType IN {NVTX_RANGE_TYPES + (70, 71)}"
        " AND rowid NOT IN (SELECT rid FROM _owners WHERE rid IS NOT NULL)"
    )
    conn.execute("DROP INDEX _bench_nvtx")
    conn.execute("VACUUM")
    return int(
        conn.execute(
            f"SELECT count(*) FROM {NVTX_TABLE} WHERE eventType IN {NVTX_RANGE_TYPES}"
        ).fetchone()[0]
    )


def build_nsys(
    src: Path, dest: Path, kernels: int, unique_op_ids: bool, nvtx: str = "all"
) -> dict[str, Any]:
    """Copy ``src`` to ``dest`` and replicate its events in place; returns figures.

    ``nvtx="owners"`` first keeps only the ranges that launch GPU work
    (:func:`keep_owner_ranges`), so a 1M-kernel capture holds about 1.2M
    ranges instead of 4.8M.
    """
    t0 = time.perf_counter()
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o644)
    conn = sqlite3.connect(dest, isolation_level=None)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")  # 256 MiB
    tables = _tables(conn)
    cupti = [t for t in CUPTI_TABLES if t in tables]
    present = cupti + ([NVTX_TABLE] if NVTX_TABLE in tables else [])
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        raise SystemExit(f"{src}: no kernels to replicate")
    if nvtx == "owners" and NVTX_TABLE in tables:
        keep_owner_ranges(conn, cupti)

    def one(sql: str) -> int:
        return int(conn.execute(sql).fetchone()[0] or 0)

    base_kernels = one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    base_nvtx = (
        one(f"SELECT count(*) FROM {NVTX_TABLE} WHERE eventType IN {NVTX_RANGE_TYPES}")
        if NVTX_TABLE in tables
        else 0
    )
    per_copy = min(base_kernels, base_nvtx) if base_nvtx else base_kernels
    copies = max(1, math.ceil(kernels / per_copy))

    lo = min(one(f"SELECT min(start) FROM {t}") for t in present)
    hi = max(one(f"SELECT max(coalesce(end, start)) FROM {t}") for t in present)
    span = hi - lo + 1  # copies never touch: nothing of copy k nests in copy k-1
    corr_stride = 1 + max(one(f"SELECT max(correlationId) FROM {t}") for t in cupti)
    range_stride = (
        1 + one(f"SELECT max(rangeId) FROM {NVTX_TABLE}")
        if NVTX_TABLE in tables and "rangeId" in _columns(conn, NVTX_TABLE)
        else 0
    )
    # PyTorch emit_nvtx names end in ", op_id = N"; N is unique per call in a real capture
    op_id_stride = 0
    if unique_op_ids and NVTX_TABLE in tables:
        op_id_stride = 1 + one(
            f"SELECT max(CAST(substr(text, instr(text, ', op_id = ') + 10) AS INTEGER))"
            f" FROM {NVTX_TABLE} WHERE text GLOB '*, op_id = [0-9]*'"
        )

    before = {t: one(f"SELECT count(*) FROM {t}") for t in present}
    conn.execute("BEGIN")
    for table in present:
        cols = _columns(conn, table)
        exprs = []
        for c in cols:
            if c in TIME_COLUMNS:
                exprs.append(f"{_q(c)} + k * {span}")
            elif c == "correlationId" and table in cupti:
                exprs.append(f"{_q(c)} + k * {corr_stride}")
            elif c == "rangeId" and table == NVTX_TABLE and range_stride:
                exprs.append(f"{_q(c)} + k * {range_stride}")
            elif c == "text" and table == NVTX_TABLE and op_id_stride:
                p = "instr(text, ', op_id = ')"
                exprs.append(
                    f"CASE WHEN text GLOB '*, op_id = [0-9]*' THEN substr(text, 1, {p} + 9)"
                    f" || (CAST(substr(text, {p} + 10) AS INTEGER) + k * {op_id_stride})"
                    " ELSE text END"
                )
            else:
                exprs.append(_q(c))
        n0 = before[table]
        conn.execute(
            f"WITH RECURSIVE copies(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM copies"
            f" WHERE k < {copies - 1})"
            f" INSERT INTO {_q(table)} ({', '.join(map(_q, cols))})"
            f" SELECT {', '.join(exprs)} FROM copies CROSS JOIN"
            f" (SELECT * FROM {_q(table)} WHERE rowid <= {n0} ORDER BY rowid)"
            if copies > 1
            else "SELECT 1"
        )
    conn.execute("COMMIT")
    rows = {t: one(f"SELECT count(*) FROM {t}") for t in present}
    nvtx_ranges = (
        one(f"SELECT count(*) FROM {NVTX_TABLE} WHERE eventType IN {NVTX_RANGE_TYPES}")
        if NVTX_TABLE in tables
        else 0
    )
    conn.close()
    return {
        "path": dest,
        "copies": copies,
        "span_ns": span,
        "correlation_stride": corr_stride,
        "rows_before": before,
        "rows": rows,
        "kernels": rows["CUPTI_ACTIVITY_KIND_KERNEL"],
        "nvtx_ranges": nvtx_ranges,
        "bytes": dest.stat().st_size,
        "build_s": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------------- kineto

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: args that hold ids which must stay unique per copy.
_ID_ARGS = ("correlation", "External id", "external id")


def build_kineto(src: Path, dest: Path, kernels: int) -> dict[str, Any]:
    """Replicate a Kineto trace's events until it holds ``kernels`` kernels.

    The per-copy work is columnar: each shifted field is one numpy array per
    copy, and each copy's events are serialised with one ``json.dumps``
    (a list) into a streamed file, so memory stays at one copy.
    """
    import numpy as np

    t0 = time.perf_counter()
    with gzip.open(src, "rb") as fh:
        data = json.load(fh)
    events: list[dict[str, Any]] = data.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]  # process/thread names: once
    body = [e for e in events if e.get("ph") != "M"]
    base_kernels = sum(1 for e in body if e.get("cat") in ("kernel", "Kernel"))
    copies = max(1, math.ceil(kernels / base_kernels))

    ts = np.array([float(e["ts"]) for e in body if "ts" in e])
    te = np.array([float(e["ts"]) + float(e.get("dur", 0)) for e in body if "ts" in e])
    span_us = math.ceil(float(te.max() - ts.min())) + 1  # whole µs: ns decimals stay exact
    id_max = 0
    for e in body:
        a = e.get("args") or {}
        for k in _ID_ARGS:
            if isinstance(a.get(k), int):
                id_max = max(id_max, a[k])
        if isinstance(e.get("id"), int):
            id_max = max(id_max, e["id"])
    id_stride = id_max + 1
    steps = [int(m.group(1)) for e in body if (m := _STEP.match(str(e.get("name", ""))))]
    step_stride = (max(steps) - min(steps) + 1) if steps else 0

    # columns of what changes per copy
    has_ts = np.array(["ts" in e for e in body])
    base_ts = np.array([float(e.get("ts", 0.0)) for e in body])
    id_slots: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for k in _ID_ARGS:
        idx = [i for i, e in enumerate(body) if isinstance((e.get("args") or {}).get(k), int)]
        id_slots[k] = (np.array(idx, dtype=np.int64), np.array([body[i]["args"][k] for i in idx]))
    flow_idx = np.array([i for i, e in enumerate(body) if isinstance(e.get("id"), int)], np.int64)
    flow_ids = np.array([body[i]["id"] for i in flow_idx], dtype=np.int64)
    step_idx = [i for i, e in enumerate(body) if _STEP.match(str(e.get("name", "")))]
    step_num = [int(_STEP.match(body[i]["name"]).group(1)) for i in step_idx]  # type: ignore[union-attr]

    opener = gzip.open if dest.name.endswith(".gz") else open
    head = json.dumps(data)[:-1]  # everything but traceEvents, without the closing brace
    n_events = len(meta)
    with opener(dest, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        out.write(head + (", " if data else "") + '"traceEvents": ')
        out.write(json.dumps(meta)[:-1])
        for c in range(copies):
            ts_c = (base_ts + c * span_us).tolist()
            for i in np.flatnonzero(has_ts):
                body[i]["ts"] = ts_c[i]
            for k, (idx, vals) in id_slots.items():
                for i, v in zip(idx.tolist(), (vals + c * id_stride).tolist(), strict=True):
                    body[i]["args"][k] = v
            for i, v in zip(flow_idx.tolist(), (flow_ids + c * id_stride).tolist(), strict=True):
                body[i]["id"] = v
            for i, n in zip(step_idx, step_num, strict=True):
                body[i]["name"] = f"ProfilerStep#{n + c * step_stride}"
            out.write(", " if (n_events or c) else "")
            out.write(json.dumps(body)[1:-1])
            n_events += len(body)
        out.write("]}\n")
    return {
        "path": dest,
        "copies": copies,
        "span_us": span_us,
        "id_stride": id_stride,
        "events": n_events,
        "kernels": base_kernels * copies,
        "steps": len(step_idx) * copies,
        "bytes": dest.stat().st_size,
        "build_s": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------------- measuring

_CHILD = r"""
import json, resource, sys, time
t = [time.perf_counter()]
def mark():
    t.append(time.perf_counter())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
import perfguard
from perfguard.report import format_summary, write_reports
from perfguard.memory import reuse_freed_memory
reuse_freed_memory()  # as the command does
rss = {"import": mark()}
from perfguard.trace.gpu_ranges import RangeFilter
trace = perfguard.load_trace(sys.argv[1], range_filter=RangeFilter() if sys.argv[3:] else None)
rss["load"] = mark()
result = perfguard.analyze(trace)
rss["analyze"] = mark()
format_summary(result)
write_reports(result, sys.argv[2], force=True)
rss["report"] = mark()
times = {k: t[i + 1] - t[i] for i, k in enumerate(rss)}
counts = {"kernels": len(trace.kernels), "ranges": len(trace.ranges),
          "api_calls": len(trace.api_calls), "memops": len(trace.memops),
          "ops": len(result.ops), "instances": len(result.instances)}
print(json.dumps({"times": times, "rss_kb": rss, "counts": counts}))
"""


#: peak of the summed RSS of the last ``_run``'s process and its descendants, KiB
LAST_TREE_KB = [0]


def process_tree(root: int) -> dict[int, dict[str, str]]:
    """``/proc/<pid>/status`` fields (plus ``cmdline``) of ``root`` and every live
    descendant, by pid."""
    procs: dict[int, dict[str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                fields["cmdline"] = fh.read().replace(b"\0", b" ").decode(errors="replace")
            int(fields["PPid"])
        except (OSError, KeyError, ValueError):  # gone meanwhile, or unreadable
            continue
        procs[int(entry)] = fields
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, fields in procs.items():
            if int(fields["PPid"]) in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: procs[pid] for pid in tree if pid in procs}


class TreeRss:
    """Samples the summed ``VmRSS`` of a process and its descendants every 50 ms.

    ``ru_maxrss`` from ``wait4`` is the largest single process; a command that
    forks a helper (the Kineto reader's second half) uses the sum. Shared pages
    count in each process, so the sum is an upper bound.
    """

    def __init__(self, root: int):
        self.root, self.peak = root, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, self._total())

    def _total(self) -> int:
        tree = process_tree(self.root)
        return sum(int(f.get("VmRSS", "0 kB").split()[0]) for f in tree.values())

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def _run(cmd: list[str], mem_limit_gb: float | None) -> tuple[int, float, int, float, str, str]:
    """Run ``cmd``; returns (exit status, wall s, peak RSS KiB, CPU s, stdout, error)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def limit() -> None:  # keep a runaway child from taking the machine down
        if mem_limit_gb:
            import resource

            cap = int(mem_limit_gb * 1024**3)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        # cwd: ``-m``/``-c`` put the working directory first on sys.path, ahead of
        # PYTHONPATH; from another checkout, its perfguard would be measured instead
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, preexec_fn=limit, cwd=REPO)
        tree = TreeRss(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        LAST_TREE_KB[0] = tree.stop()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    error = ""
    if proc.returncode:
        lines = errors.strip().splitlines() or [f"exit status {proc.returncode}"]
        error = lines[-1][:200]
        print(
            f"  ! {cmd[1] if cmd[1] != '-c' else 'phase child'} exited {proc.returncode}: {error}"
        )
    cpu = usage.ru_utime + usage.ru_stime
    return proc.returncode, wall, int(usage.ru_maxrss), cpu, text, error


def measure(
    path: Path, out_dir: Path, repeat: int, mem_limit_gb: float, gpu_ranges: bool = False
) -> dict[str, Any]:
    py = sys.executable
    cli = [py, "-m", "perfguard", "analyze", "--database", str(path)]
    cli += ["--output-path", str(out_dir / "cli"), "--force"]
    cli += ["--gpu-ranges-only"] if gpu_ranges else []
    runs, phases = [], []
    for _ in range(repeat):
        rc, wall, rss, cpu, _, error = _run(cli, mem_limit_gb)
        runs.append({"rc": rc, "wall_s": wall, "peak_kb": rss, "cpu_s": cpu, "error": error})
        rc, wall, rss, cpu, text, error = _run(
            [py, "-c", _CHILD, str(path), str(out_dir / "phase")]
            + (["gpu-ranges-only"] if gpu_ranges else []),
            mem_limit_gb,
        )
        ph = json.loads(text.strip().splitlines()[-1]) if rc == 0 else {}
        phases.append({"rc": rc, "wall_s": wall, "peak_kb": rss, "cpu_s": cpu, **ph})
    best = min(runs, key=lambda r: r["wall_s"])
    best_ph = min(phases, key=lambda r: r["wall_s"])
    return {"cli": best, "phase": best_ph, "all_cli": runs}


# --------------------------------------------------------------------------- report


def _mb(kb: float) -> str:
    return f"{kb / 1024:,.0f} MiB"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(cases: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> str:
    head = [
        "case",
        "kernels",
        "ranges",
        "file",
        "build s",
        "import s",
        "load s",
        "analyze s",
        "report s",
        "CLI wall s",
        "CLI CPU s",
        "CLI peak RSS",
        "peak after load",
    ]
    rows = [head]
    for name, built, m in cases:
        ph, cli = m["phase"], m["cli"]
        t = ph.get("times", {})
        rss = ph.get("rss_kb", {})
        counts = ph.get("counts", {})

        def s(key: str, t: dict[str, float] = t) -> str:
            return f"{t[key]:.2f}" if key in t else "-"

        rows.append(
            [
                name,
                f"{counts.get('kernels', built['kernels']):,}",
                f"{counts['ranges']:,}" if "ranges" in counts else "-",
                f"{built['bytes'] / 1e6:,.0f} MB",
                f"{built['build_s']:.1f}",
                s("import"),
                s("load"),
                s("analyze"),
                s("report"),
                f"{cli['wall_s']:.2f}" + ("" if cli["rc"] == 0 else f" (FAILED rc {cli['rc']})"),
                f"{cli['cpu_s']:.2f}",
                _mb(cli["peak_kb"]),
                _mb(rss["load"]) if "load" in rss else "-",
            ]
        )
    return _table(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--kernels",
        type=int,
        default=1_000_000,
        help="target kernel count (and NVTX ranges for nsys); default 1,000,000",
    )
    p.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="build into DIR and keep the captures (reused when present)",
    )
    p.add_argument("--skip-kineto", action="store_true", help="only the nsys SQLite case")
    p.add_argument("--skip-nsys", action="store_true", help="only the Kineto case")
    p.add_argument(
        "--kineto-kernels",
        type=int,
        metavar="N",
        help="kernel target of the Kineto case (default: --kernels)",
    )
    p.add_argument("--gzip", action="store_true", help="write the Kineto trace as .json.gz")
    p.add_argument(
        "--unique-op-ids",
        action="store_true",
        help="renumber PyTorch 'op_id = N' in NVTX names per copy, as in a real "
        "capture where every range name is distinct",
    )
    p.add_argument(
        "--nvtx",
        choices=("all", "owners"),
        default="all",
        help="NVTX ranges per copy: 'all' of the fixture (emit_nvtx: 4.8 per kernel) or only "
        "'owners', the ranges that launch GPU work (1.2 per kernel: 1M kernels, 1.2M ranges)",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per case; best wall is reported")
    p.add_argument(
        "--mem-limit-gb",
        type=float,
        default=16.0,
        help="address-space cap for each measured child (default 16)",
    )
    p.add_argument("--rebuild", action="store_true", help="rebuild captures found in --keep")
    p.add_argument(
        "--ranks",
        type=int,
        default=0,
        metavar="N",
        help="also measure a directory of N per-rank nsys exports of --kernels each "
        "(hard links to the one capture, named rank-K.sqlite)",
    )
    p.add_argument(
        "--gpu-ranges-only",
        action="store_true",
        help="also measure the nsys capture with `analyze --gpu-ranges-only` (only the NVTX "
        "ranges that enclose GPU work), right after the default run",
    )
    args = p.parse_args(argv)

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="perfguard-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cases = []
    failed = False
    try:
        if not args.skip_nsys:
            suffix = ("-uniq" if args.unique_op_ids else "") + (
                "-owners" if args.nvtx == "owners" else ""
            )
            dest = workdir / f"large_nsys_{args.kernels}{suffix}.sqlite"
            built = _reuse(dest, args, args.kernels) or build_nsys(
                FIXTURES / NSYS_FIXTURE, dest, args.kernels, args.unique_op_ids, args.nvtx
            )
            _describe("nsys SQLite", built)
            m = measure(dest, workdir / "reports_nsys", args.repeat, args.mem_limit_gb)
            cases.append(("nsys SQLite", built, m))
            if args.gpu_ranges_only:  # the same capture, in the same run
                g = measure(dest, workdir / "reports_gpu", args.repeat, args.mem_limit_gb, True)
                cases.append(("--gpu-ranges-only", built, g))
            cli = m["cli"]
            wall_target, rss_target = SQLITE_TARGETS[args.nvtx]
            failed = cli["rc"] != 0 or cli["wall_s"] > wall_target or cli["peak_kb"] > rss_target
            if args.ranks:
                ranks_dir = rank_dir(dest, workdir / f"ranks_{args.ranks}x{dest.stem}", args.ranks)
                m = measure(ranks_dir, workdir / "reports_ranks", args.repeat, args.mem_limit_gb)
                n = args.ranks
                cases.append((f"{n} ranks", {**built, "bytes": built["bytes"] * n}, m))
        if not args.skip_kineto:
            ext = ".json.gz" if args.gzip else ".json"
            k_kernels = args.kineto_kernels or args.kernels
            dest = workdir / f"large_kineto_{k_kernels}{ext}"
            built = _reuse(dest, args, k_kernels) or build_kineto(
                FIXTURES / KINETO_FIXTURE, dest, k_kernels
            )
            _describe("Kineto JSON", built)
            m = measure(dest, workdir / "reports_kineto", args.repeat, args.mem_limit_gb)
            cases.append(("Kineto JSON", built, m))
        print()
        print(report(cases))
        for name, _, m in cases:
            if m["cli"]["rc"]:
                print(f"{name}: perfguard analyze failed: {m['cli']['error']}")
        if not args.skip_nsys:
            verdict = "MISSED" if failed else "met"
            wall_target, rss_target = SQLITE_TARGETS[args.nvtx]
            print(
                f"\nSQLite target at --nvtx {args.nvtx} (<= {wall_target:.0f} s wall, "
                f"<= {rss_target * 1024 / 1e9:.1f} GB ({rss_target / 1024:,.0f} MiB) peak RSS, "
                f"{os.cpu_count()} CPUs): {verdict}"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def rank_dir(capture: Path, dest: Path, ranks: int) -> Path:
    """A directory of ``ranks`` per-rank exports: hard links to ``capture`` (a copy where
    links are refused), so every rank holds the same events."""
    dest.mkdir(parents=True, exist_ok=True)
    for k in range(ranks):
        link = dest / f"rank-{k}.sqlite"
        if not link.exists():
            try:
                os.link(capture, link)
            except OSError:
                shutil.copyfile(capture, link)
    return dest


def _reuse(dest: Path, args: argparse.Namespace, kernels: int) -> dict[str, Any] | None:
    """Figures of a capture already built in ``--keep`` (not rebuilt)."""
    if args.keep is None or args.rebuild or not dest.exists():
        return None
    info: dict[str, Any] = {"path": dest, "bytes": dest.stat().st_size, "build_s": 0.0}
    if dest.suffix == ".sqlite":
        conn = sqlite3.connect(f"file:{dest}?mode=ro", uri=True)
        info["kernels"] = conn.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ).fetchone()[0]
        info["rows"] = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in (*CUPTI_TABLES, NVTX_TABLE)
            if t in _tables(conn)
        }
        conn.close()
    else:
        info["kernels"] = kernels
    print(f"reusing {dest} (pass --rebuild to build it again)")
    return info


def _describe(name: str, built: dict[str, Any]) -> None:
    print(
        f"{name}: {built['path']} ({built['bytes'] / 1e6:,.0f} MB, built in "
        f"{built['build_s']:.1f} s, {built.get('copies', '?')} copies)"
    )
    for table, n in (built.get("rows") or {}).items():
        was = (built.get("rows_before") or {}).get(table)
        print(f"  {table:<40} {n:>12,}" + (f"  (fixture {was:,})" if was else ""))
    for key in ("nvtx_ranges", "events", "kernels", "steps"):
        if key in built:
            print(f"  {key:<40} {built[key]:>12,}")


if __name__ == "__main__":
    sys.exit(main())
