"""Fuzz every command that reads a baseline store, and a plugin session, with damaged real stores.

    python benchmarks/store_fuzz.py --cases 60                  # a quick run, seed 0
    nice -n 10 python benchmarks/store_fuzz.py --cases 400 --log store_fuzz.jsonl
    python benchmarks/store_fuzz.py --replay 17 23              # these cases again
    python benchmarks/store_fuzz.py --summarize store_fuzz.jsonl

Seeds (built once into ``--seeds DIR``, reused after): ``session``, a store
written by three real ``pytest --perfguard --perfguard-save`` sessions of a
three-test torch project in a git repository (one commit each), and
``history``, ``tests/data/history_steps.json`` (30 real sessions of one test)
imported into a store over a git repository with one commit per run. Each
case copies one seed and damages it one way (:data:`MUTATIONS`): bytes
flipped in random pages, a page overwritten with garbage, the file cut at a
random offset, a table dropped, and rows with impossible values (negative
times, NaN and infinite numbers, a future schema number, a 10 MB test id, a
fingerprint that is not JSON, an unknown metric). Every read command then
runs on it (:data:`COMMANDS`: ``history`` with and without ``--json`` and for
one test, ``baseline list/show/check``, ``compare``, ``report --run``,
``publish`` and, for the session seed, ``bisect --mode store``) in a forked
child of this process (perfguard imported once), each in both ways the store
layer finds damage: with the check at open, as every store under
``CHECK_ON_OPEN_BYTES`` gets, and without it, as a larger store is read. Every
``--plugin-every``-th case also runs a real pytest session of the session
seed's project against the damaged store, with ``--perfguard-save``.

Each run is classified:

* ``result`` (fine): exit 0 (1 for a regression where the command says so),
  with everything the undamaged seed gave: as many tests, runs or pages;
* ``error`` (fine): exit 2, the last line of stderr ``perfguard: error: ...``
  and no traceback;
* ``partial`` (bug): exit 0 with fewer tests, runs or pages than the seed;
* ``untyped`` (bug): exit 3, an exception perfguard did not type;
* ``crash`` (bug): any other exit, or a signal.

A plugin session is fine when it reports every test (an entry each in
``results.json``), exits 0 or 1 with no internal error, and, where it met the
damage, fails its save (exit 1) and leaves the file unchanged: a test judged
before the damage was met read whole records, every test after it says
"not judged: ... the store is damaged".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

BUGS = ("partial", "untyped", "crash")
RECORDED = REPO / "tests" / "data" / "history_steps.json"

SESSION_TEST = """
import pytest
import torch

torch.set_num_threads(1)
A = torch.randn(64, 64)


@pytest.mark.gpuprofile(iterations=4, warmup=1)
def test_mm(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.mm(A, A)


@pytest.mark.gpuprofile(iterations=4, warmup=1)
def test_add(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.add(A, A)


@pytest.mark.gpuprofile(iterations=4, warmup=1)
def test_relu(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.relu(A)
"""
SESSION_TESTS = 3


# --------------------------------------------------------------------------- seeds


def _git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def _new_repo(root: Path) -> Path | None:
    """``root``/repo emptied for a seed to be built in; None when its store is built."""
    repo = root / "repo"
    if (repo / "baselines" / "perfguard.db").exists():
        return None
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    return repo


def session_seed(root: Path, sessions: int = 3) -> Path:
    """A store of ``sessions`` real plugin sessions, one commit each, in ``root``/repo."""
    from history_repo import init_project

    repo = _new_repo(root)
    if repo is None:
        return root / "repo"
    init_project(repo)
    for i in range(sessions):
        (repo / "test_three.py").write_text(SESSION_TEST + f"# commit {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "--perfguard",
            "--perfguard-save",
            "--perfguard-fail-on",
            "never",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
        ]
        done = subprocess.run(cmd, cwd=repo, env=_env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"seed session {i} failed: {done.stdout[-1500:]}{done.stderr}")
    return repo


def history_seed(root: Path) -> Path:
    """``tests/data/history_steps.json`` in a store over a repository of one commit per run."""
    from history_repo import commit_per_run

    from perfguard.baseline.store import Store

    repo = _new_repo(root)
    if repo is None:
        return root / "repo"
    doc = json.loads(RECORDED.read_text())
    commit_per_run(doc, repo)
    (root / "replayed.json").write_text(json.dumps(doc))
    with Store(repo / "baselines" / "perfguard.db") as store:
        store.import_json(root / "replayed.json")
    return repo


def build_seeds(where: Path, only: list[str] | None = None) -> dict[str, Path]:
    """Seed name -> its git repository (the store is ``baselines/perfguard.db`` in it)."""
    makers = {"session": session_seed, "history": history_seed}
    return {name: make(where / name) for name, make in makers.items() if not only or name in only}


# --------------------------------------------------------------------------- mutations


def _page_size(data: bytes) -> int:
    size = int.from_bytes(data[16:18], "big") if len(data) >= 100 else 4096
    return 65536 if size == 1 else (size or 4096)


def flip_bytes(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    size = _page_size(data)
    pages = rng.sample(range(1, max(len(data) // size, 2)), k=min(3, max(len(data) // size - 1, 1)))
    flips = 0
    for page in pages:
        for _ in range(rng.randint(1, 16)):
            at = page * size + rng.randrange(size)
            if at < len(data):
                data[at] ^= 1 << rng.randrange(8)
                flips += 1
    path.write_bytes(bytes(data))
    return f"{flips} bits flipped in pages {', '.join(str(p + 1) for p in pages)}"


def garbage_page(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    size = _page_size(data)
    page = rng.randrange(1, max(len(data) // size, 2))
    count = rng.choice((1, 2))
    end = min((page + count) * size, len(data))
    data[page * size : end] = rng.randbytes(end - page * size)
    path.write_bytes(bytes(data))
    return f"page {page + 1} (+{count - 1}) overwritten with random bytes"


def truncate(path: Path, rng: random.Random) -> str:
    data = path.read_bytes()
    cut = rng.randrange(0, len(data))
    path.write_bytes(data[:cut])
    return f"cut at byte {cut} of {len(data)}"


def _sql(path: Path, sql: str, params: tuple = ()) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute(sql, params)
    finally:
        conn.close()


def drop_table(path: Path, rng: random.Random) -> str:
    table = rng.choice(
        (
            "runs",
            "tests",
            "samples",
            "ops",
            "counters",
            "kernels",
            "acceptances",
            "op_samples",
            "functions",
        )
    )
    _sql(path, f"DROP TABLE {table}")
    return f"table {table} dropped"


def negative_time(path: Path, rng: random.Random) -> str:
    col = rng.choice(("wall_time_ns", "cpu_time_ns", "gpu_time_ns"))
    _sql(
        path,
        f"UPDATE samples SET {col} = -{rng.randint(1, 10**9)} "
        "WHERE rowid IN (SELECT rowid FROM samples ORDER BY random() LIMIT 3)",
    )
    return f"negative samples.{col}"


def nan_value(path: Path, rng: random.Random) -> str:
    table, col = rng.choice(
        (
            ("samples", "wall_time_ns"),
            ("samples", "cpu_time_ns"),
            ("ops", "flops"),
            ("counters", "value"),
        )
    )
    _sql(
        path,
        f"UPDATE {table} SET {col} = 'NaN' "
        f"WHERE rowid IN (SELECT rowid FROM {table} ORDER BY random() LIMIT 2)",
    )
    return f"{table}.{col} = 'NaN'"


def inf_value(path: Path, rng: random.Random) -> str:
    table, col = rng.choice((("counters", "value"), ("ops", "flops")))
    _sql(
        path,
        f"UPDATE {table} SET {col} = 1e999 "
        f"WHERE rowid IN (SELECT rowid FROM {table} ORDER BY random() LIMIT 2)",
    )
    return f"{table}.{col} = inf"


def future_schema(path: Path, rng: random.Random) -> str:
    from perfguard.baseline.schema import SCHEMA_VERSION

    _sql(
        path,
        "UPDATE meta SET value = ? WHERE key = 'schema_version'",
        (str(SCHEMA_VERSION + rng.randint(1, 5)),),
    )
    return "schema_version from a newer perfguard"


def huge_test_id(path: Path, rng: random.Random) -> str:
    """One more test record in the last run (a copy of one of its records' samples) whose
    id is 10 MB long: every other record stays as it was."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        (src,) = conn.execute("SELECT max(test_id) FROM tests").fetchone()
        (new,) = conn.execute(
            "INSERT INTO tests (run_id, nodeid, metric, meta) SELECT run_id, ?, metric, meta "
            "FROM tests WHERE test_id = ? RETURNING test_id",
            ("test_x.py::test_" + "x" * 10_000_000, src),
        ).fetchone()
        cols = [r[1] for r in conn.execute("PRAGMA table_info(samples)") if r[1] != "test_id"]
        names = ", ".join(f'"{c}"' for c in cols)
        conn.execute(
            f"INSERT INTO samples (test_id, {names}) SELECT ?, {names} FROM samples "
            "WHERE test_id = ?",
            (new, src),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return "a test record with a 10 MB test id added"


def bad_json(path: Path, rng: random.Random) -> str:
    table, col = rng.choice((("runs", "fingerprint"), ("tests", "meta"), ("runs", "environment")))
    _sql(
        path,
        f"UPDATE {table} SET {col} = '{{not json' "
        f"WHERE rowid IN (SELECT rowid FROM {table} ORDER BY random() LIMIT 1)",
    )
    return f"{table}.{col} is not JSON"


def bad_metric(path: Path, rng: random.Random) -> str:
    _sql(path, "UPDATE tests SET metric = 'bogus' WHERE rowid = (SELECT max(rowid) FROM tests)")
    return "tests.metric unknown"


MUTATIONS: dict[str, Callable[[Path, random.Random], str]] = {
    "flip": flip_bytes,
    "garbage": garbage_page,
    "truncate": truncate,
    "drop_table": drop_table,
    "negative": negative_time,
    "nan": nan_value,
    "inf": inf_value,
    "future_schema": future_schema,
    "huge_test_id": huge_test_id,
    "bad_json": bad_json,
    "bad_metric": bad_metric,
}
#: byte-level mutations are drawn this much more often: they are what a disk does
WEIGHTS = {"flip": 4, "garbage": 4, "truncate": 2}


# --------------------------------------------------------------------------- commands


def commands(seed: str, store: Path, repo: Path, out: Path) -> dict[str, list[str]]:
    """Name -> argv of every read command on ``store`` (run with ``repo`` as the cwd)."""
    s = str(store)
    test = "test_three.py::test_add" if seed == "session" else "test_bench.py::test_step"
    last = 3 if seed == "session" else 30
    cmds = {
        "history": ["history", "--store", s],
        "history-json": ["history", "--store", s, "--json", "-"],
        "history-test": ["history", test, "--store", s],
        "list": ["baseline", "list", "--store", s],
        "list-json": ["baseline", "list", "--store", s, "--json", "-"],
        "show": ["baseline", "show", "1", "--store", s],
        "check": ["baseline", "check", "--store", s],
        "compare": ["compare", f"{s}#{last}", f"{s}#1"],
        "report": ["report", s, "--run", str(last), "-o", str(out / "report.html")],
        "publish": ["publish", s, str(out / "site"), "-j", "1"],
    }
    if seed == "session":
        first, bad = _git(repo, "rev-list", "--reverse", "HEAD").split()[0], "HEAD"
        cmds["bisect"] = [
            "bisect",
            "--mode",
            "store",
            "--store",
            s,
            "--output",
            str(out / "bisect"),
            first,
            bad,
        ]
    return cmds


def count(name: str, stdout: str, out: Path) -> int | None:
    """How many tests, runs or pages a command's clean output shows (None: not counted)."""
    if name == "history":
        return len(re.findall(r"^\S.*: \d+ run\(s\), latest", stdout, re.M))
    if name == "history-json":
        return len(json.loads(stdout)["tests"])
    if name == "history-test":
        found = re.search(r": (\d+) run\(s\) on ", stdout)
        return int(found.group(1)) if found else 0
    if name == "list":
        return len(re.findall(r"^\s*\d+ [0-9a-f]{12} ", stdout, re.M))
    if name == "list-json":
        return len(json.loads(stdout)["runs"])
    if name == "show":
        return len(re.findall(r"^\s*test\S*\.py::", stdout, re.M))
    if name == "publish":
        return len(list((out / "site").rglob("*.html")))
    return None


def _child(argv: list[str], cwd: Path, stdout: Path, stderr: Path, open_check: bool) -> None:
    try:
        os.chdir(cwd)
        for fd, path in ((1, stdout), (2, stderr)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        import perfguard.baseline.db as db
        from perfguard.cli import main

        if not open_check:
            db.CHECK_ON_OPEN_BYTES = 0  # as a store too large to check at open is read
        rc = main(argv)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    except BaseException:  # noqa: BLE001 - whatever escaped main is a crash to report
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(99)


def run_command(
    argv: list[str], cwd: Path, work: Path, open_check: bool, timeout: float
) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``perfguard argv`` in a fork (-signal if killed)."""
    out, err = work / "stdout.txt", work / "stderr.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(argv, cwd, out, err, open_check)
    t0 = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > timeout:
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return rc, out.read_text(errors="replace"), err.read_text(errors="replace")


def classify(name: str, rc: int, stdout: str, stderr: str, out: Path, want: int | None) -> str:
    if rc == 3:
        return "untyped"
    if rc == 2:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        fine = lines and lines[-1].startswith("perfguard: error:") and "Traceback" not in stderr
        return "error" if fine else "crash"
    if rc == 0 or (rc == 1 and name == "compare"):
        try:
            got = count(name, stdout, out)
        except (ValueError, KeyError, TypeError):
            return "partial"  # exit 0 with output that is not what the command writes
        return "partial" if want is not None and got is not None and got < want else "result"
    return "crash"


def plugin_session(repo: Path, store: Path, work: Path, timeout: float) -> tuple[str, str]:
    """A real pytest session of the seed's project against ``store``, saving: (outcome, why)."""
    before = store.read_bytes() if store.exists() else None
    out = work / "pg-out"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--perfguard",
        f"--perfguard-store={store}",
        "--perfguard-save",
        f"--perfguard-output={out}",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "-q",
    ]
    try:
        done = subprocess.run(
            cmd, cwd=repo, env=_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return "crash", "timed out"
    text = done.stdout + done.stderr
    if done.returncode not in (0, 1) or "INTERNALERROR" in text or "internal error" in text:
        return "crash", f"exit {done.returncode}: {text[-300:]}"
    try:
        entries = json.loads((out / "results.json").read_text())["tests"]
    except (OSError, ValueError, KeyError):
        return "crash", "no results.json"
    if len(entries) != SESSION_TESTS:
        return "partial", f"{len(entries)} of {SESSION_TESTS} tests reported"
    reasons = [str(e.get("message") or e.get("error") or "") for e in entries]
    damaged = sum("the store is damaged" in r for r in reasons)
    if damaged or "the store is damaged" in text:
        # a test judged before the damage was met read whole records; none after it is
        if done.returncode != 1 or (store.read_bytes() if store.exists() else None) != before:
            return "crash", "a damaged store was written, or the failed save passed"
        return "error", f"{damaged} of {len(entries)} test(s) not judged: damaged; not saved"
    return "result", f"exit {done.returncode}"


# --------------------------------------------------------------------------- cases


@dataclass
class Run:
    case: int
    seed: str
    kind: str
    what: str
    command: str
    open_check: bool
    rc: int
    outcome: str
    message: str


def plan(
    index: int, seed: int, names: list[str], kinds: list[str] | None = None
) -> tuple[str, str, random.Random]:
    """Case ``index``'s seed store, mutation and random source (the same every run); with
    ``kinds``, those mutations in turn."""
    rng = random.Random(f"{seed}:{index}")
    if kinds:
        kind = kinds[index % len(kinds)]
    else:
        every = list(MUTATIONS)
        kind = rng.choices(every, weights=[WEIGHTS.get(k, 1) for k in every])[0]
    return rng.choice(names), kind, rng


def baseline_counts(
    seeds: dict[str, Path], work: Path, timeout: float, only: list[str] | None = None
) -> dict[str, dict]:
    """Per seed, what each command shows of the undamaged store: the bar for ``result``."""
    out: dict[str, dict] = {}
    for name, repo in seeds.items():
        store = repo / "baselines" / "perfguard.db"
        out[name] = {}
        for cmd, argv in commands(name, store, repo, work).items():
            if only and cmd not in only:
                continue
            shutil.rmtree(work / "site", ignore_errors=True)
            rc, stdout, stderr = run_command(argv, repo, work, True, timeout)
            if rc not in (0, 1, 2) or (rc == 2 and cmd not in ("bisect",)):
                raise RuntimeError(f"{name} {cmd} fails on the undamaged seed: {stderr[-500:]}")
            out[name][cmd] = count(cmd, stdout, work) if rc in (0, 1) else None
    return out


def run_case(
    index: int, opts: argparse.Namespace, seeds: dict[str, Path], want: dict, work: Path
) -> list[Run]:
    name, kind, rng = plan(index, opts.seed, sorted(seeds), opts.kinds)
    repo = seeds[name]
    case_dir = work / f"case{index}"
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir()
    store = case_dir / "damaged.db"
    shutil.copy(repo / "baselines" / "perfguard.db", store)
    what = MUTATIONS[kind](store, rng)
    pristine = store.read_bytes()
    runs = []
    for open_check in (True, False):
        for cmd, argv in commands(name, store, repo, case_dir).items():
            if opts.commands and cmd not in opts.commands:
                continue
            shutil.rmtree(case_dir / "site", ignore_errors=True)
            rc, stdout, stderr = run_command(argv, repo, case_dir, open_check, opts.timeout)
            outcome = classify(cmd, rc, stdout, stderr, case_dir, want[name].get(cmd))
            lines = [ln for ln in (stderr if rc else stdout).splitlines() if ln.strip()]
            message = (lines[-1] if lines else "")[:300]
            if store.read_bytes() != pristine:
                outcome, message = "crash", "a read command changed the store"
            runs.append(Run(index, name, kind, what, cmd, open_check, rc, outcome, message))
    if name == "session" and opts.plugin_every and index % opts.plugin_every == 0:
        outcome, message = plugin_session(repo, store, case_dir, opts.timeout)
        runs.append(Run(index, name, kind, what, "plugin", True, 0, outcome, message))
    shutil.rmtree(case_dir, ignore_errors=True)
    return runs


def summarize(runs: list[Run]) -> str:
    """Counts per outcome, per mutation and command, and one example of each bug."""
    lines = []
    cases = {r.case for r in runs}
    by = collections.Counter(r.outcome for r in runs)
    lines.append(
        f"{len(cases)} cases, {len(runs)} command runs: "
        + ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
    )
    lines.append(f"bugs: {sum(by[b] for b in BUGS)}")
    for label, key in (("per mutation", "kind"), ("per command", "command")):
        lines.append(f"{label}:")
        table = collections.defaultdict(collections.Counter)
        for r in runs:
            table[getattr(r, key)][r.outcome] += 1
        for k, counts in sorted(table.items()):
            lines.append(f"  {k:14} " + ", ".join(f"{o} {n}" for o, n in sorted(counts.items())))
    examples: dict[tuple[str, str, str], Run] = {}
    for r in runs:
        if r.outcome in BUGS:
            examples.setdefault((r.outcome, r.kind, r.command), r)
    if examples:
        lines.append("examples:")
        for (outcome, kind, cmd), r in sorted(examples.items()):
            check = "open check" if r.open_check else "no open check"
            lines.append(
                f"  [{outcome}] case {r.case} {r.seed} {kind} ({r.what}) {cmd} "
                f"({check}): exit {r.rc}: {r.message}"
            )
    return "\n".join(lines)


def _progress(index: int, done: list[Run]) -> str:
    tally = collections.Counter(r.outcome for r in done)
    line = f"case {index} {done[0].seed} {done[0].kind} ({done[0].what[:60]}): " + ", ".join(
        f"{k} {v}" for k, v in sorted(tally.items())
    )
    for r in done:
        if r.outcome in BUGS:
            line += f"\n  BUG [{r.outcome}] {r.command} (open check {r.open_check}): {r.message}"
    return line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=60)
    p.add_argument("--start", type=int, default=0, help="first case index (for chunks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replay", type=int, nargs="*", help="run only these case indices")
    p.add_argument("--seeds", type=Path, help="build (or reuse) the seed stores here")
    p.add_argument("--only", type=lambda t: t.split(","), help="only these seeds (a,b)")
    p.add_argument(
        "--kinds",
        type=lambda t: t.split(","),
        help="only these mutations, in turn (a,b): a quick run of each",
    )
    p.add_argument("--commands", type=lambda t: t.split(","), help="only these commands (a,b)")
    p.add_argument(
        "--plugin-every",
        type=int,
        default=5,
        help="a plugin session every N-th session-seed case (0: never)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="wall seconds a command may take")
    p.add_argument("--log", help="append one JSON line per command run here")
    p.add_argument("--summarize", nargs="*", help="summarize these JSONL logs and exit")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    if opts.summarize:
        runs = [
            Run(**json.loads(line))
            for f in opts.summarize
            for line in Path(f).read_text().splitlines()
            if line.strip()
        ]
        print(summarize(runs))
        return 0
    with tempfile.TemporaryDirectory(prefix="store-fuzz-") as tmp:
        work = Path(tmp)
        seeds = build_seeds(opts.seeds or work / "seeds", opts.only)
        want = baseline_counts(seeds, work, opts.timeout, opts.commands)
        indices = opts.replay or range(opts.start, opts.start + opts.cases)
        runs: list[Run] = []
        for index in indices:
            done = run_case(index, opts, seeds, want, work)
            runs += done
            if opts.log:
                with open(opts.log, "a") as f:
                    for r in done:
                        f.write(json.dumps(asdict(r)) + "\n")
            if not opts.quiet:
                print(_progress(index, done), flush=True)
    print(summarize(runs))
    return 1 if any(r.outcome in BUGS for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
