"""Calibrate perfguard's verdict on separate, real ``pytest --perfguard`` sessions.

Round 1 of this benchmark resampled one pool of timings; that hides what
actually moves a verdict: a new process, a new memory layout, a neighbour
on the machine, the baseline's own luck. This version runs every judged
session as its own ``pytest --perfguard`` process on this machine (issue
13, "What it must show"):

* **The project.** A fresh git repository in ``OUT/project`` with one CPU
  test: a training step of a 2-layer MLP (``torch.set_num_threads(1)``)
  under ``@pytest.mark.gpuprofile``, plus a small side op (a 16x32 @ 32x16
  matmul) where the deterministic changes go. Commit ``c0`` is the base; one
  commit per condition on top of it:

  - ``aa``: only a comment changes (A/A: the measured code is the same);
  - ``slow2|5|10|25``: extra real work inside the measured step, sized by
    measurement to +2/5/10/25 % of the step: a loop of numpy ops, so the
    torch op counters do not change and only the timing can see it;
  - ``item``: a ``loss.item()`` host read per step (gate ``host_reads``);
  - ``copy``: the input is copied before the forward (``x.clone()``: gates
    ``calls``/``bytes``);
  - ``float64``: the side matmul in float64 (gate ``dtypes``, and ``calls``
    for the two casts);
  - ``flops2``: the side matmul with twice the FLOPs (gate ``flops``).

  The deterministic changes cost well under 1 % of the step: their time
  change hides in the noise, only the gates can see them. A second test,
  ``test_control_step``, is the same step and no commit changes it: every
  session (of any condition) also judges unchanged code, an A/A observation
  of its own (the ``control`` rows).
* **Store mode.** ``--seeds`` sessions on ``c0`` with ``--perfguard-save
  --perfguard-save-mode=append`` (a plain save replaces the last) fill the
  store (history for the between-run noise needs 5), then each
  judged session runs on its condition's commit with
  ``--perfguard-baseline c0`` (not saving, so every judged session sees
  the same history).
* **A/B mode.** On each condition's commit, ``--perfguard-against c0
  --perfguard-ab-pairs P``: ``2 P`` fresh child processes in ABBA order.
* **Loads.** ``idle``: nothing of ours runs beside the sessions (the load
  average is recorded; the machine may be shared). ``busy``: one
  ``while True: pass`` process per core for the duration of the busy
  sessions, killed after. ``shared``: nothing of ours beside the sessions,
  on a machine that other people's jobs load (a shared CI runner).

Sessions are interleaved (session ``i`` of every condition and mode before
session ``i + 1`` of any), so a drift of the machine spreads over all
conditions. Every session's outcome goes to ``OUT/sessions.jsonl`` as it
finishes; a second run with the same ``--out`` skips what is done
(resumable). ``OUT/calibration.json`` and ``OUT/calibration.md`` hold the
tables: false alarms (``regressed`` or ``improved`` on A/A), detections
(``regressed``; for the deterministic conditions also the expected gate
named in ``gates.regressions``), and for +2 % how often the interval
excludes 0.

**The GPU path** (``--gpu-sim``; no GPU needed) is judged by the same
:func:`perfguard.compare.judge.judge`: simulated records built from the
real per-kernel durations of a fixture capture (see :func:`gpu_simulation`
for the model, which is also written in the output).

Run::

    python benchmarks/calibration.py --quick --out benchmarks/out/quick
    python benchmarks/calibration.py --out benchmarks/out/full --loads idle
    python benchmarks/calibration.py --out benchmarks/out/full --loads busy
    python benchmarks/calibration.py --out benchmarks/out/full --gpu-sim-only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("store", "ab")
#: idle: nothing of ours beside the sessions; busy: one spinning process per core;
#: shared: nothing of ours either, on a machine other people's jobs are loading
LOADS = ("idle", "busy", "shared")
TEST_FILE = "test_calib.py"
NODEID = f"{TEST_FILE}::test_mlp_train_step"
#: a second test that no commit changes: every session also judges unchanged code
CONTROL = f"{TEST_FILE}::test_control_step"
FALSE_ALARMS = ("regressed", "improved")


@dataclass(frozen=True)
class Condition:
    """One change to the measured code: ``kind`` aa | slow | det."""

    name: str
    kind: str
    what: str
    size: float = 0.0  # slow: the intended slowdown (fraction of the step)
    gates: tuple[str, ...] = ()  # det: a regression must name one of these gates


CONDITIONS = {
    c.name: c
    for c in (
        Condition("aa", "aa", "a comment changes (the measured code does not)"),
        Condition("slow2", "slow", "extra numpy work in the step, +2 %", 0.02),
        Condition("slow5", "slow", "extra numpy work in the step, +5 %", 0.05),
        Condition("slow10", "slow", "extra numpy work in the step, +10 %", 0.10),
        Condition("slow25", "slow", "extra numpy work in the step, +25 %", 0.25),
        Condition(
            "item",
            "det",
            "loss.item() in the step (a host read / sync)",
            gates=("host_reads", "syncs"),
        ),
        Condition(
            "copy",
            "det",
            "x.clone() before the forward (an extra copy)",
            gates=("calls", "bytes", "memcpy", "memcpy_bytes"),
        ),
        Condition(
            "float64", "det", "side matmul in float64 instead of float32", gates=("dtypes", "calls")
        ),
        Condition(
            "flops2",
            "det",
            "side matmul with doubled FLOPs (32x32 instead of 32x16)",
            gates=("flops",),
        ),
    )
}

# The test file: the places a condition changes are the ``{...}`` fields.
TEST_TEMPLATE = '''"""perfguard calibration: one training step of a 2-layer MLP on the CPU.

Generated by perfguard's benchmarks/calibration.py: commit c0 is the base,
every other commit changes one thing on top of it.
"""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

torch.set_num_threads(1)
{header}

def _mlp(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear({d_in}, {hidden}), torch.nn.ReLU(), torch.nn.Linear({hidden}, 10)
    )
    x = torch.randn({batch}, {d_in})
    y = torch.randint(0, 10, ({batch},))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), x, y


@pytest.mark.gpuprofile(
    iterations={iterations}, warmup={warmup}, rounds={rounds}, tolerance="{tolerance}"
)
def test_mlp_train_step(gpuprofile):
    model, opt, x, y = _mlp(0)
    w = torch.randn(16, 32)
    v = torch.randn(32, {side_n})
    for _ in gpuprofile.iterations():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model({x_in}), y)
        loss.backward()
        opt.step()
        side = {side}  # a small side statistic of the step
{extra}
    assert torch.isfinite(loss) and side.shape[0] == 16


@pytest.mark.gpuprofile(
    iterations={iterations}, warmup={warmup}, rounds={rounds}, tolerance="{tolerance}"
)
def test_control_step(gpuprofile):
    """Never changed by any commit: an A/A observation in every session."""
    model, opt, x, y = _mlp(1)
    for _ in gpuprofile.iterations():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
'''

# real work that the torch profiler's op counters do not see: only timing can
EXTRA_WORK = '''
_BUF = np.linspace(0.0, 1.0, {unit_elems})


def _extra_work(units):
    """Injected slowdown: real numpy work, invisible to the torch op counters."""
    acc = 0.0
    for _ in range(units):
        acc += float(np.sin(_BUF).sum())
    return acc
'''


@dataclass(frozen=True)
class Workload:
    """The test's sizes and marker settings (one place, recorded in the output)."""

    d_in: int = 512
    hidden: int = 1024
    batch: int = 128
    iterations: int = 30  # a round of about 0.17 s
    warmup: int = 20  # a fresh A/B child process needs ~0.1 s before its step is steady
    rounds: int = 5
    tolerance: str = "2%"
    unit_elems: int = 1024  # ~10 us a unit: +2 % of a 2.4 ms step is 5 units


def render_test(w: Workload, cond: str | None, units: int = 0) -> str:
    """The test file of commit ``c0`` (``cond`` None) or of a condition's commit."""
    parts = dict(header="", x_in="x", side="w @ v", side_n=16, extra="")
    if cond == "aa":
        parts["header"] = "\n# calibration A/A: this comment is the commit's only change\n"
    elif cond is not None and CONDITIONS[cond].kind == "slow":
        parts["header"] = EXTRA_WORK.format(unit_elems=w.unit_elems)
        parts["extra"] = f"        _extra_work({units})"
    elif cond == "item":
        parts["extra"] = "        seen = loss.item()  # a host read of a device value"
    elif cond == "copy":
        parts["x_in"] = "x.clone()"
    elif cond == "float64":
        parts["side"] = "w.double() @ v.double()"
    elif cond == "flops2":
        parts["side_n"] = 32
    fields = {k: getattr(w, k) for k in Workload.__dataclass_fields__}
    return TEST_TEMPLATE.format(**fields, **parts)


# --------------------------------------------------------------------------- plumbing
def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (``uptime``)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return [float(x) for x in os.getloadavg()]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=calibration",
            "-c",
            "user.email=calibration@perfguard.invalid",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"calibration: git {' '.join(args)} failed in {repo}: {done.stderr}")
    return done.stdout.strip()


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # perfguard comes from this interpreter's install
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


@contextmanager
def busy_load(load: str) -> Iterator[list[int]]:
    """``busy``: one spinning process per core while the block runs (killed after)."""
    procs: list[subprocess.Popen[bytes]] = []
    if load == "busy":
        for _ in range(os.cpu_count() or 1):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(2.0)
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


class Project:
    """The temp git project, its commits and its store (state in ``OUT/state.json``)."""

    def __init__(self, out: Path, workload: Workload) -> None:
        self.out = out
        self.dir = out / "project"
        self.store = out / "store.db"
        self.state_path = out / "state.json"
        self.workload = workload
        self.state: dict[str, Any] = {}
        if self.state_path.is_file():
            self.state = json.loads(self.state_path.read_text())

    def save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.state_path)

    def build_base(self) -> None:
        """``c0`` and the A/A commit ``c1`` (sizes of the slowdowns come later)."""
        if "c0" in self.state:
            return
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        git(self.dir, "init", "-q", "-b", "main")
        (self.dir / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        (self.dir / TEST_FILE).write_text(render_test(self.workload, None))
        (self.dir / ".gitignore").write_text(".perfguard/\n__pycache__/\n")
        git(self.dir, "add", "-A")
        git(self.dir, "commit", "-q", "-m", "c0: the base")
        self.state["c0"] = git(self.dir, "rev-parse", "HEAD")
        self.state["workload"] = self.workload.__dict__
        self.state["commits"] = {}
        self.save()
        self.commit("aa", 0)

    def commit(self, cond: str, units: int) -> str:
        """The condition's commit on top of ``c0`` (made once)."""
        if cond in self.state["commits"]:
            return self.state["commits"][cond]
        git(self.dir, "checkout", "-q", "--detach", self.state["c0"])
        (self.dir / TEST_FILE).write_text(render_test(self.workload, cond, units))
        git(self.dir, "commit", "-q", "-am", f"{cond}: {CONDITIONS[cond].what}")
        sha = git(self.dir, "rev-parse", "HEAD")
        self.state["commits"][cond] = sha
        self.save()
        return sha

    def checkout(self, sha: str) -> None:
        git(self.dir, "checkout", "-q", "--detach", sha)


def run_session(project: Project, args: list[str], folder: Path, timeout: float) -> dict:
    """One ``pytest --perfguard`` session in the project; its results.json and timings."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    # "--opt=PATH", not "--opt PATH": pytest takes the rootdir from every existing path
    # among its arguments, option values included, and an absolute output folder would
    # move the rootdir (and the git state perfguard reads) out of the project
    argv = [
        sys.executable,
        "-m",
        "pytest",
        TEST_FILE,
        "-q",
        "--perfguard",
        f"--perfguard-output={folder}",
        f"--perfguard-store={project.store}",
        "--perfguard-fail-on=never",
        f"--rootdir={project.dir}",
        *args,
    ]
    before, t0 = loadavg(), time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=project.dir,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        code, tail = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        code, tail = -1, f"timed out after {timeout:g} s"
    wall = time.monotonic() - t0
    (folder / "pytest.log").write_text(tail)
    for junk in ("captures", "ab", "report.html"):
        target = folder / junk
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()
    results = None
    path = folder / "results.json"
    if path.is_file():
        results = json.loads(path.read_text())
    return {
        "argv": argv[3:],
        "returncode": code,
        "wall_s": round(wall, 2),
        "loadavg_before": before,
        "loadavg_after": loadavg(),
        "results": results,
        "log_tail": tail[-600:] if results is None or code not in (0, 1) else "",
    }


def summarize(cond: str, raw: dict, nodeid: str = NODEID) -> dict[str, Any]:
    """The figures of one judged session that the tables count (for test ``nodeid``)."""
    res = raw.get("results") or {}
    tests = [t for t in res.get("tests", []) if t.get("nodeid") == nodeid]
    row: dict[str, Any] = {
        k: raw[k] for k in ("returncode", "wall_s", "loadavg_before", "loadavg_after")
    }
    if not tests:
        row.update(outcome="crashed", message=(raw.get("log_tail") or "no results.json")[-400:])
        return row
    t = tests[0]
    timing = t.get("timing") or {}
    gates = t.get("gates") or {}
    named = sorted({r.get("gate") for r in gates.get("regressions") or []})
    row.update(
        outcome=t.get("outcome"),
        message=(t.get("message") or "")[:400],
        delta_pct=timing.get("delta_pct"),
        ci_low_pct=timing.get("ci_low_pct"),
        ci_high_pct=timing.get("ci_high_pct"),
        timing_outcome=timing.get("outcome"),
        threshold_pct=timing.get("threshold_pct"),
        noise_pct=timing.get("noise_pct"),
        spread_pct=timing.get("spread_pct"),
        cpu_load=timing.get("load"),
        cpu_wait=timing.get("wait"),
        history_runs=timing.get("history_runs"),
        n_current=timing.get("n_current"),
        gates_outcome=gates.get("outcome"),
        gates_named=named,
        median_current_ns=timing.get("median_current_ns"),
        median_baseline_ns=timing.get("median_baseline_ns"),
    )
    c = CONDITIONS[cond]
    if c.kind == "det":
        row["expected_gate"] = bool(set(named) & set(c.gates))
    return row


# --------------------------------------------------------------------------- planning
def default_plan(n: int, quick: bool) -> dict[tuple[str, str, str], int]:
    """Sessions per (mode, load, condition): the issue's counts for ``n`` = 20."""
    plan: dict[tuple[str, str, str], int] = {}
    for mode in MODES:
        for load in LOADS:
            for name, c in CONDITIONS.items():
                if quick:
                    k = 2
                elif name == "aa":
                    k = n
                elif name == "slow5" and load == "idle":
                    k = n if mode == "ab" else max(n // 2, 3)
                elif name == "slow2":
                    k = max(n // 2, 3) if load == "idle" else max(n // 4, 3)
                elif c.kind == "slow":
                    k = max(n // 4, 3)
                else:
                    k = 3
                plan[(mode, load, name)] = k
    return plan


def parse_plan(text: str | None, plan: dict[tuple[str, str, str], int]) -> None:
    """``mode:load:cond=n`` entries (``*`` for any part) override the plan."""
    for entry in filter(None, (text or "").split(",")):
        key, _, count = entry.partition("=")
        parts = key.split(":")
        if len(parts) != 3 or not count.strip().isdigit():
            raise SystemExit(f"calibration: --plan entry {entry!r}: want mode:load:cond=N")
        for k in plan:
            if all(p in ("*", have) for p, have in zip(parts, k, strict=True)):
                plan[k] = int(count)


def done_keys(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}


def append(path: Path, row: dict) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------- phases
def seed_store(project: Project, n: int, timeout: float, log: Path) -> None:
    """``n`` saved sessions on ``c0``: the baseline runs and the history."""
    have = project.state.setdefault("seeds", [])
    project.checkout(project.state["c0"])
    while len(have) < n:
        i = len(have)
        # append: the seeds are one commit measured n times on purpose (a plain save
        # would replace the last one: one run per commit and machine)
        raw = run_session(
            project,
            ["--perfguard-save", "--perfguard-save-mode=append"],
            project.out / "runs" / f"seed-{i}",
            timeout,
        )
        res = raw.get("results") or {}
        tests = [t for t in res.get("tests", []) if t.get("nodeid") == NODEID]
        if not res.get("saved") or not tests:
            raise SystemExit(f"calibration: seed session {i} saved nothing: {raw['log_tail']}")
        median = float(tests[0]["median_current_ns"])
        have.append(
            {
                "median_ns": median,
                "wall_s": raw["wall_s"],
                "time": now(),
                "loadavg": raw["loadavg_before"],
                "load": tests[0].get("load"),
            }
        )
        project.save()
        say(
            log,
            f"seed {i + 1}/{n}: median {median / 1e6:.2f} ms per step, "
            f"{raw['wall_s']:.1f} s, load avg {raw['loadavg_before'][0]:.2f}",
        )


def unit_seconds(workload: Workload, reps: int = 3000) -> float:
    """Median time of one unit of the injected work, in a fresh interpreter like the test's."""
    code = (
        "import time, numpy as np\n"
        + EXTRA_WORK.format(unit_elems=workload.unit_elems)
        + f"\nts = []\nfor _ in range({reps}):\n"
        "    t0 = time.perf_counter_ns(); _extra_work(1); ts.append(time.perf_counter_ns() - t0)\n"
        "ts.sort(); print(ts[len(ts) // 2])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), check=True
    ).stdout
    return int(out.strip().splitlines()[-1]) / 1e9


def unit_seconds_in_step(workload: Workload, units: int = 40, blocks: int = 12) -> float:
    """What one unit of the injected work adds to the test's step *inside* the step, s.

    A unit timed alone in a loop runs with warm caches and costs less than it adds
    to a training step (round 4 measured +8.6 % for a "+5 %" sized that way), so it
    is measured where it runs: alternating blocks of the MLP step with and without
    ``units`` units, each block's fastest step, in a fresh interpreter.
    """
    w = workload
    code = (
        "import time, numpy as np, torch\nfrom torch.nn import functional as F\n"
        "torch.set_num_threads(1)\n"
        + EXTRA_WORK.format(unit_elems=w.unit_elems)
        + f"""
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear({w.d_in}, {w.hidden}), torch.nn.ReLU(),
                            torch.nn.Linear({w.hidden}, 10))
x, y = torch.randn({w.batch}, {w.d_in}), torch.randint(0, 10, ({w.batch},))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
def step(u):
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    _extra_work(u)
for _ in range({w.warmup}):
    step(0)
plain, extra = [], []
for b in range({blocks}):
    for u, out in ((0, plain), ({units}, extra)) if b % 2 == 0 else (({units}, extra), (0, plain)):
        ts = []
        for _ in range({w.iterations}):
            t0 = time.perf_counter_ns(); step(u); ts.append(time.perf_counter_ns() - t0)
        out.append(min(ts))
print((np.median(extra) - np.median(plain)) / {units})
"""
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), check=True
    ).stdout
    return float(out.strip().splitlines()[-1]) / 1e9


def size_slowdowns(project: Project, log: Path) -> None:
    """Units of extra work for each +s %: s x the step (the seeds' median) / one unit's
    cost inside the step (:func:`unit_seconds_in_step`)."""
    if "sizing" in project.state:
        return
    step = float(np.median([s["median_ns"] for s in project.state["seeds"]])) / 1e9
    unit = float(np.median([unit_seconds_in_step(project.workload) for _ in range(3)]))
    sizing = {"step_s": step, "unit_s": unit, "units": {}}
    for name, c in CONDITIONS.items():
        if c.kind == "slow":
            sizing["units"][name] = max(1, round(c.size * step / unit))
    project.state["sizing"] = sizing
    project.save()
    say(log, f"sizing: step {step * 1e3:.2f} ms, unit {unit * 1e6:.1f} us, units {sizing['units']}")


def schedule(
    plan: dict[tuple[str, str, str], int], modes: list[str], load: str, conds: list[str]
) -> list[tuple[str, str, int]]:
    """(mode, cond, i) interleaved: session i of everything before session i + 1."""
    top = max([plan[(m, load, c)] for m in modes for c in conds] or [0])
    return [(m, c, i) for i in range(top) for c in conds for m in modes if i < plan[(m, load, c)]]


def run_judged(
    project: Project,
    plan: dict,
    modes: list[str],
    loads: list[str],
    conds: list[str],
    pairs: int,
    timeout: float,
    deadline: float | None,
    log: Path,
) -> None:
    """Every planned judged session not yet in ``sessions.jsonl``."""
    sessions = project.out / "sessions.jsonl"
    done = done_keys(sessions)
    c0 = project.state["c0"]
    for load in loads:
        todo = [
            (m, c, i)
            for m, c, i in schedule(plan, modes, load, conds)
            if f"{load}/{m}/{c}/{i}" not in done
        ]
        if not todo:
            continue
        with busy_load(load) as spinners:
            say(log, f"{load}: {len(todo)} sessions, spinners {spinners}, load avg {loadavg()}")
            for k, (mode, cond, i) in enumerate(todo):
                if deadline is not None and time.time() > deadline:
                    say(log, "deadline reached: stopping (rerun with the same --out to resume)")
                    return
                units = project.state.get("sizing", {}).get("units", {}).get(cond, 0)
                project.checkout(project.commit(cond, units))
                if mode == "store":
                    args = [f"--perfguard-baseline={c0}"]
                else:
                    args = [f"--perfguard-against={c0}", f"--perfguard-ab-pairs={pairs}"]
                key = f"{load}/{mode}/{cond}/{i}"
                raw = run_session(
                    project, args, project.out / "runs" / key.replace("/", "-"), timeout
                )
                row = {
                    "key": key,
                    "load": load,
                    "mode": mode,
                    "cond": cond,
                    "i": i,
                    "time": now(),
                    "spinners": len(spinners),
                    **summarize(cond, raw),
                    "control": summarize("aa", raw, CONTROL),
                    "pairs": pairs if mode == "ab" else None,
                }
                append(sessions, row)
                say(
                    log,
                    f"[{k + 1}/{len(todo)}] {key}: {row['outcome']} "
                    f"delta {fmt(row.get('delta_pct'))}% "
                    f"[{fmt(row.get('ci_low_pct'))}, {fmt(row.get('ci_high_pct'))}] "
                    f"gates {row.get('gates_named')} {row['wall_s']:.1f} s "
                    f"load avg {row['loadavg_before'][0]:.2f}",
                )


def fmt(v: Any, digits: int = 1) -> str:
    return (
        "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:+.{digits}f}"
    )


def say(log: Path, line: str) -> None:
    text = f"{datetime.now(timezone.utc):%H:%M:%S} {line}"
    print(text, flush=True)
    with log.open("a") as fh:
        fh.write(text + "\n")


# --------------------------------------------------------------------------- tables
#: an "idle" session in which other processes used at least this share of the CPU
#: (perfguard's own measure, over the test's rounds) had a neighbour: counted apart
QUIET_SHARE = 0.15


def stratum(load: str, row: dict) -> str:
    """``idle`` split by what perfguard measured: ``idle`` or ``idle+neighbour``."""
    share = row.get("cpu_load")
    if load == "idle" and share is not None and share >= QUIET_SHARE:
        return "idle+neighbour"
    return load


def tally(rows: list[dict]) -> list[dict[str, Any]]:
    """One line per (mode, load, condition): outcome counts and the rates they give."""
    cells: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        cells.setdefault((r["mode"], stratum(r["load"], r), r["cond"]), []).append(r)
        c = r.get("control")
        if c:  # the unchanged test of the same session
            cells.setdefault((r["mode"], stratum(r["load"], c), "control"), []).append(c)
    out = []
    order = {c: k for k, c in enumerate(CONDITIONS)}
    for (mode, load, cond), rs in sorted(
        cells.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 99))
    ):
        c = CONDITIONS.get(cond, CONDITIONS["aa"])
        counts: dict[str, int] = {}
        for r in rs:
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        n = len(rs)
        line: dict[str, Any] = {
            "mode": mode,
            "load": load,
            "cond": cond,
            "n": n,
            "counts": dict(sorted(counts.items())),
        }
        if c.kind == "aa":
            hits = sum(counts.get(o, 0) for o in FALSE_ALARMS)
            line.update(metric="false alarms", hits=hits)
        elif c.kind == "slow":
            line.update(metric="detected", hits=counts.get("regressed", 0))
            line["ci_excludes_0"] = sum(
                1 for r in rs if r.get("ci_low_pct") is not None and r["ci_low_pct"] > 0
            )
        else:
            line.update(
                metric="detected (expected gate)",
                hits=sum(1 for r in rs if r["outcome"] == "regressed" and r.get("expected_gate")),
            )
            named: dict[str, int] = {}
            for r in rs:
                for g in r.get("gates_named") or []:
                    named[g] = named.get(g, 0) + 1
            line["gates_named"] = named
        deltas = [r["delta_pct"] for r in rs if r.get("delta_pct") is not None]
        line["delta_pct_median"] = float(np.median(deltas)) if deltas else None
        line["delta_pct_range"] = [min(deltas), max(deltas)] if deltas else None
        loads = [r["loadavg_before"][0] for r in rs if r.get("loadavg_before")]
        line["loadavg_1m_range"] = [min(loads), max(loads)] if loads else None
        shares = [r["cpu_load"] for r in rs if r.get("cpu_load") is not None]
        line["cpu_load_range"] = [min(shares), max(shares)] if shares else None
        waits = [r["cpu_wait"] for r in rs if r.get("cpu_wait") is not None]
        line["cpu_wait_range"] = [min(waits), max(waits)] if waits else None
        th = [r["threshold_pct"] for r in rs if r.get("threshold_pct") is not None]
        line["threshold_pct_median"] = float(np.median(th)) if th else None
        nz = [r["noise_pct"] for r in rs if r.get("noise_pct") is not None]
        line["noise_pct_median"] = float(np.median(nz)) if nz else None
        line["wall_s_median"] = float(np.median([r["wall_s"] for r in rs]))
        out.append(line)
    return out


def _fmt1(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _range(values: list[Any]) -> str:
    v = [x for x in values if x is not None]
    return f"{min(v):.2f}-{max(v):.2f}" if v else "-"


def markdown(lines: list[dict], state: dict, settings: dict) -> str:
    """The Markdown table of the real sessions."""
    w = state.get("workload", {})
    sizing = state.get("sizing", {})
    seeds = state.get("seeds", [])
    head = [
        f"Real sessions: test `{NODEID}` (2-layer MLP training step "
        f"{w.get('batch')}x{w.get('d_in')} -> {w.get('hidden')} -> 10, 1 thread), marker "
        f"iterations={w.get('iterations')}, warmup={w.get('warmup')}, "
        f"rounds={w.get('rounds')}, tolerance={w.get('tolerance')}; "
        f"A/B: {settings.get('pairs')} ABBA pairs per session; store: "
        f"{len(seeds)} seed runs on c0 (history and pooled baseline), others' CPU share "
        f"during the seeds {_range([x.get('load') for x in seeds])}.",
    ]
    if sizing:
        units = ", ".join(f"{k} {v}" for k, v in sizing.get("units", {}).items())
        head.append(
            f"Step (seeds' median) {sizing['step_s'] * 1e3:.2f} ms; one unit of injected "
            f"work {sizing['unit_s'] * 1e6:.1f} us; units per step: {units}."
        )
    rows = [
        "| mode | load | condition | sessions | outcomes | rate | interval > 0 | "
        "median delta % [min, max] | median threshold % | median noise % | load avg 1 min | "
        "others' CPU share | test's CPU wait | s/session |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ln in lines:
        counts = ", ".join(f"{k} {v}" for k, v in ln["counts"].items())
        rate = f"{ln['metric']} {ln['hits']}/{ln['n']} ({100 * ln['hits'] / ln['n']:.0f} %)"
        if "gates_named" in ln:
            rate += " gates: " + ", ".join(f"{k} {v}" for k, v in ln["gates_named"].items())
        excl = f"{ln['ci_excludes_0']}/{ln['n']}" if "ci_excludes_0" in ln else ""
        d = ln["delta_pct_median"]
        dr = ln["delta_pct_range"]
        delta = f"{d:+.2f} [{dr[0]:+.1f}, {dr[1]:+.1f}]" if d is not None else "-"
        th = ln["threshold_pct_median"]
        la = ln["loadavg_1m_range"]
        cl = ln["cpu_load_range"]
        rows.append(
            f"| {ln['mode']} | {ln['load']} | {ln['cond']} | {ln['n']} | {counts} | {rate} "
            f"| {excl} | {delta} | {'-' if th is None else f'{th:.1f}'} | "
            f"{_fmt1(ln['noise_pct_median'])} | "
            f"{'-' if not la else f'{la[0]:.1f}-{la[1]:.1f}'} | "
            f"{'-' if not cl else f'{cl[0]:.2f}-{cl[1]:.2f}'} | "
            f"{_range(ln['cpu_wait_range'] or [])} | {ln['wall_s_median']:.0f} |"
        )
    return "\n".join(head) + "\n\n" + "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- A/B judges
def ab_pairs_of(out: Path, row: dict, nodeid: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The (base, head) child values of one A/B session's test, in pair order, from the
    session's own results.json (the judge's inputs, as measured)."""
    path = out / "runs" / row["key"].replace("/", "-") / "results.json"
    if not path.is_file():
        return None
    tests = [t for t in json.loads(path.read_text()).get("tests", []) if t.get("nodeid") == nodeid]
    if not tests or not tests[0].get("rounds_baseline") or not tests[0].get("rounds_current"):
        return None
    a = np.asarray(tests[0]["rounds_baseline"], dtype=np.float64)
    b = np.asarray(tests[0]["rounds_current"], dtype=np.float64)
    n = min(len(a), len(b))
    return a[:n], b[:n]


def rejudge_ab(
    out: Path, rows: list[dict], tolerance: float, alpha: float, first: tuple[int, ...] = (4, 6, 8)
) -> list[dict[str, Any]]:
    """Every idle/busy A/B session's test and control pairs judged again by each candidate
    judge on its first k pairs: the same measured sessions, only the statistic differs.

    ``t``: the mean of the paired log ratios with a t interval (judge_ab);
    ``trim20``: Yuen's 20 % trimmed mean (timing.trimmed_interval).
    """
    from perfguard.compare.timing import trimmed_interval

    tol = math.log1p(tolerance)
    cells: dict[tuple[str, str, str, int], list[tuple[bool, bool, bool]]] = {}
    for r in rows:
        if r.get("mode") != "ab":
            continue
        for nodeid, cond in ((NODEID, r["cond"]), (CONTROL, "control")):
            pairs = ab_pairs_of(out, r, nodeid)
            if pairs is None:
                continue
            d = np.log(pairs[1]) - np.log(pairs[0])
            for k in first:
                if len(d) < k:
                    continue
                dk = d[:k]
                mean, sd = float(dk.mean()), float(dk.std(ddof=1))
                half = float(sps.t.ppf(1 - alpha / 2, k - 1)) * sd / math.sqrt(k)
                est, lo, hi, _ = trimmed_interval(dk, alpha)
                for name, (e, low, high) in (
                    ("t", (mean, mean - half, mean + half)),
                    ("trim20", (est, lo, hi)),
                ):
                    up = math.isfinite(low) and low > 0 and e > tol
                    down = math.isfinite(high) and high < 0 and e < -tol
                    cells.setdefault((stratum(r["load"], r), cond, name, k), []).append(
                        (up, down, math.isfinite(low) and low > 0)
                    )
    lines = []
    for (load, cond, name, k), v in sorted(cells.items()):
        lines.append(
            {
                "load": load,
                "cond": cond,
                "judge": name,
                "pairs": k,
                "n": len(v),
                "regressed": sum(x[0] for x in v),
                "improved": sum(x[1] for x in v),
                "ci_excludes_0": sum(x[2] for x in v),
            }
        )
    return lines


def rejudge_markdown(lines: list[dict[str, Any]]) -> str:
    rows = [
        "| load | condition | judge | first pairs | sessions | regressed | improved | "
        "interval > 0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ln in lines:
        rows.append(
            f"| {ln['load']} | {ln['cond']} | {ln['judge']} | {ln['pairs']} | "
            f"{ln['n']} | {ln['regressed']} | {ln['improved']} | "
            f"{ln['ci_excludes_0']} |"
        )
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- GPU simulation
GPU_FIXTURE = "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz"


def fixtures_dir() -> Path | None:
    for cand in (
        ROOT.parent / "shared" / "fixtures",
        Path(os.environ.get("PERFGUARD_FIXTURES", "-")),
    ):
        if cand.is_dir():
            return cand
    return None


def gpu_simulation(
    trials: int,
    seed: int,
    sigma_session: float,
    sigma_round: float,
    pairs: int,
    seeds: int,
    tolerance: float,
    conds: list[str],
    log: Path,
) -> dict[str, Any]:
    """GPU sessions simulated from a real capture and judged by ``judge``.

    The model (also written to the output):

    * an iteration's GPU time is the sum of its kernels' and memops'
      durations, each launch slot's duration drawn from that slot in one of
      the capture's iterations (every iteration launches the same 1,516
      activities in the same order), so the within-run noise is the
      capture's own;
    * every session (a process on a GPU runner) is shifted by a factor
      ``exp(N(0, sigma_session))``; every round within it by
      ``exp(N(0, sigma_round))``;
    * A/B: base and head rounds alternate in one session (one session shift
      for both sides); each round is a fresh process: ``exp(N(0,
      sigma_round))`` per round;
    * store: ``seeds`` baseline runs (each its own session) form the history
      and the pooled baseline, as after ``seeds`` ``--perfguard-save`` runs
      on the base commit; the history level of a run is the median of its
      iteration values, as the store computes it;
    * a slowdown multiplies the head's values; a deterministic condition
      changes the head record's counters (or an op's dtypes) as the real
      change would, with a 0.3 % time change.
    """
    from dataclasses import replace

    import pandas as pd

    from perfguard.analysis import analyze
    from perfguard.baseline.record import record_from_analysis
    from perfguard.compare.gates import parse_gates
    from perfguard.compare.judge import Against, JudgeSettings, judge
    from perfguard.trace import load_trace

    fixtures = fixtures_dir()
    if fixtures is None:
        raise SystemExit("calibration: --gpu-sim needs ../shared/fixtures or PERFGUARD_FIXTURES")
    path = fixtures / GPU_FIXTURE
    analysis = analyze(load_trace(path))
    real = record_from_analysis("sim::resnet50_train_step", analysis, metric="gpu_time")
    acts = analysis.activities
    acts = acts[acts["iteration"].notna()].sort_values(["iteration", "start"])
    iters = sorted(acts["iteration"].unique())
    dur = np.stack(
        [
            (
                acts.loc[acts["iteration"] == it, "end"]
                - acts.loc[acts["iteration"] == it, "start"]
            ).to_numpy(np.float64)
            for it in iters
        ]
    )  # (iterations x launch slots)
    # cross-check: the slots' sums are the analysis's per-iteration GPU time
    check = np.abs(dur.sum(axis=1) - analysis.iterations["gpu_time"].to_numpy()).max()
    rng = np.random.default_rng(seed)
    n_it = int(real.meta.get("iterations") or 20)
    rounds = 5

    def run_values(n_rounds: int, session: float) -> np.ndarray:
        """(rounds x iterations) per-iteration GPU times of one process, ns."""
        pick = rng.integers(0, len(iters), size=(n_rounds, n_it, dur.shape[1]))
        base = dur[pick, np.arange(dur.shape[1])].sum(axis=2)
        shift = session * np.exp(rng.normal(0.0, sigma_round, size=(n_rounds, 1)))
        return base * shift

    def record(values: np.ndarray, template: Any) -> Any:
        r, i = values.shape
        samples = pd.DataFrame(
            {
                "iteration": np.arange(r * i),
                "gpu_time_ns": values.ravel().astype(np.int64),
                "wall_time_ns": values.ravel().astype(np.int64),
                "cpu_time_ns": pd.array([pd.NA] * (r * i), dtype="Int64"),
                "round": np.repeat(np.arange(r), i),
            }
        )
        return replace(template, samples=samples)

    def changed(cond: str) -> tuple[Any, float]:
        """The head's record template and time factor of a condition."""
        c = CONDITIONS[cond]
        if c.kind == "aa":
            return real, 1.0
        if c.kind == "slow":
            return real, 1.0 + c.size
        counters = real.counters.copy()
        ops = real.ops.copy()
        busiest = str(real.ops.sort_values("gpu_time_total").iloc[-1]["op_id"])
        name = str(real.ops.set_index("op_id").at[busiest, "op_name"])
        if cond == "item":
            extra = [(busiest, name, "host_reads", 1.0, True), (busiest, name, "syncs", 1.0, True)]
            counters = pd.concat([counters, pd.DataFrame(extra, columns=counters.columns)])
        elif cond == "copy":
            extra = [
                (busiest, name, "memcpy", 1.0, True),
                (busiest, name, "memcpy_bytes", 4.0 * 2**20, True),
            ]
            counters = pd.concat([counters, pd.DataFrame(extra, columns=counters.columns)])
        elif cond == "flops2":
            fl = counters[counters["counter"] == "flops"]
            small = fl.sort_values("value").index[0]
            counters.loc[small, "value"] *= 2
        elif cond == "float64":
            has = ops["dtypes"].astype(str).str.contains("fp32")
            k = ops.index[has][0]
            ops.loc[k, "dtypes"] = str(ops.loc[k, "dtypes"]).replace("fp32", "fp64")
        return replace(real, counters=counters.reset_index(drop=True), ops=ops), 1.003

    settings = JudgeSettings(tolerance=tolerance, gates=parse_gates(None))
    rows = []
    t0 = time.monotonic()
    for cond in conds:
        template, factor = changed(cond)
        n_trials = trials if CONDITIONS[cond].kind != "det" else max(trials // 10, 10)
        for mode in MODES:
            for k in range(n_trials):
                if mode == "store":
                    base_runs = [
                        run_values(rounds, math.exp(rng.normal(0, sigma_session)))
                        for _ in range(seeds)
                    ]
                    history = np.array([np.median(v) for v in base_runs])
                    head = run_values(rounds, math.exp(rng.normal(0, sigma_session))) * factor
                    against = Against(
                        records=[record(v, real) for v in base_runs],
                        mode="store",
                        commit="c0",
                        run_found=True,
                        history=history,
                    )
                else:
                    session = math.exp(rng.normal(0, sigma_session))
                    base_v = run_values(pairs, session)
                    head = run_values(pairs, session) * factor
                    against = Against(
                        records=[record(base_v, real)], mode="ab", commit="c0", run_found=True
                    )
                verdict = judge(record(head, template), against, settings)
                gates = verdict.gates
                named = sorted({f.gate for f in gates.regressions}) if gates else []
                rows.append(
                    {
                        "mode": mode,
                        "load": "sim",
                        "cond": cond,
                        "i": k,
                        "outcome": verdict.outcome.value,
                        "delta_pct": _num(verdict.delta_pct),
                        "ci_low_pct": _num(verdict.ci_low_pct),
                        "ci_high_pct": _num(verdict.ci_high_pct),
                        "threshold_pct": _num(verdict.timing.threshold_pct),
                        "gates_named": named,
                        "wall_s": 0.0,
                        "loadavg_before": None,
                        "expected_gate": bool(set(named) & set(CONDITIONS[cond].gates)),
                    }
                )
            say(
                log,
                f"gpu-sim {cond} {mode}: {n_trials} trials ({time.monotonic() - t0:.0f} s so far)",
            )
    model = {
        "fixture": GPU_FIXTURE,
        "activities_per_iteration": int(dur.shape[1]),
        "captured_iterations": len(iters),
        "iteration_gpu_ms": [round(float(x) / 1e6, 3) for x in dur.sum(axis=1)],
        "slot_sum_vs_analysis_max_abs_ns": float(check),
        "sigma_session": sigma_session,
        "sigma_round": sigma_round,
        "iterations_per_round": n_it,
        "rounds_store": rounds,
        "pairs_ab": pairs,
        "seed_runs_store": seeds,
        "tolerance": tolerance,
        "trials": trials,
        "seed": seed,
        "description": (gpu_simulation.__doc__ or "")
        .split("The model (also written to the output):")[-1]
        .strip(),
    }
    return {"model": model, "rows": rows}


def _num(v: Any) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def gpu_markdown(sim: dict, lines: list[dict]) -> str:
    m = sim["model"]
    head = (
        f"Simulated GPU sessions from `{m['fixture']}` ({m['activities_per_iteration']} kernels "
        f"and memops per iteration, {m['captured_iterations']} captured iterations of "
        f"{min(m['iteration_gpu_ms']):.2f}-{max(m['iteration_gpu_ms']):.2f} ms): "
        f"between-session shift lognormal sigma {100 * m['sigma_session']:g} %, "
        f"between-round (process) lognormal sigma {100 * m['sigma_round']:g} %; "
        f"{m['iterations_per_round']} iterations per round, store: {m['rounds_store']} rounds "
        f"vs {m['seed_runs_store']} seed runs, A/B: {m['pairs_ab']} pairs; tolerance "
        f"{100 * m['tolerance']:g} %; judged by `perfguard.compare.judge.judge`."
    )
    rows = [
        "| mode | condition | trials | outcomes | rate | interval > 0 | median delta % |",
        "|---|---|---|---|---|---|---|",
    ]
    for ln in lines:
        counts = ", ".join(f"{k} {v}" for k, v in ln["counts"].items())
        rate = f"{ln['metric']} {ln['hits']}/{ln['n']} ({100 * ln['hits'] / ln['n']:.0f} %)"
        excl = f"{ln['ci_excludes_0']}/{ln['n']}" if "ci_excludes_0" in ln else ""
        d = ln["delta_pct_median"]
        rows.append(
            f"| {ln['mode']} | {ln['cond']} | {ln['n']} | {counts} | {rate} | {excl} | "
            f"{'-' if d is None else f'{d:+.2f}'} |"
        )
    return head + "\n\n" + "\n".join(rows) + "\n"


def write_outputs(out: Path, state: dict, settings: dict, sim: dict | None) -> None:
    rows = []
    sessions = out / "sessions.jsonl"
    if sessions.is_file():
        rows = [json.loads(x) for x in sessions.read_text().splitlines() if x.strip()]
    lines = tally(rows)
    seen = sorted({r["pairs"] for r in rows if r.get("pairs")})
    # what the sessions ran with, not this invocation's --pairs
    settings = {**settings, "pairs": "/".join(str(x) for x in seen) or "-"}
    doc: dict[str, Any] = {
        "written": now(),
        "settings": settings,
        "state": state,
        "table": lines,
        "sessions": rows,
    }
    md = "## Real sessions\n\n" + markdown(lines, state, settings) if rows else ""
    if any(r.get("mode") == "ab" for r in rows):
        from perfguard.compare.judge import ALPHA
        from perfguard.compare.tolerance import parse_tolerance

        tol = parse_tolerance(state.get("workload", {}).get("tolerance", "2%"), "tolerance")
        again = rejudge_ab(out, rows, tol, ALPHA)
        doc["ab_judges"] = again
        md += "\n## A/B sessions judged again on their first k pairs\n\n" + rejudge_markdown(again)
    if sim is not None:
        sim_lines = tally(sim["rows"])
        doc["gpu_simulation"] = {"model": sim["model"], "table": sim_lines, "trials": sim["rows"]}
        md += "\n## GPU path, simulated\n\n" + gpu_markdown(sim, sim_lines)
    (out / "calibration.json").write_text(json.dumps(doc, indent=1))
    (out / "calibration.md").write_text(md)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "out" / "calibration",
        help="folder for the project, the store, every session and the tables "
        "(rerun with the same folder to resume)",
    )
    p.add_argument(
        "--sessions",
        type=int,
        default=20,
        help="A/A sessions per mode and load, and +5%% A/B idle; the other "
        "conditions get fewer (see default_plan)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 2 sessions per cell")
    p.add_argument("--modes", default="store,ab")
    p.add_argument("--loads", default="idle,busy")
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--plan", help="overrides, e.g. 'ab:busy:slow5=5,*:*:item=4'")
    p.add_argument("--pairs", type=int, default=4, help="--perfguard-ab-pairs (default 4)")
    p.add_argument(
        "--seeds",
        type=int,
        default=8,
        help="saved c0 sessions that seed the store (>= 5 for history noise)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per session")
    p.add_argument("--stop-at", help="UTC time HH:MM after which no new session starts")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite the tables from what OUT already holds",
    )
    p.add_argument("--gpu-sim", action="store_true", help="also run the GPU simulation")
    p.add_argument("--gpu-sim-only", action="store_true", help="only the GPU simulation")
    p.add_argument(
        "--gpu-trials",
        type=int,
        default=100,
        help="simulated sessions per timing condition and mode",
    )
    p.add_argument("--gpu-sigma-session", type=float, default=0.01)
    p.add_argument("--gpu-sigma-round", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    modes = [m for m in a.modes.split(",") if m]
    loads = [x for x in a.loads.split(",") if x]
    conds = [c for c in a.conditions.split(",") if c]
    for vals, known, what in (
        (modes, MODES, "mode"),
        (loads, LOADS, "load"),
        (conds, tuple(CONDITIONS), "condition"),
    ):
        bad = [v for v in vals if v not in known]
        if bad:
            p.error(f"unknown {what}(s) {bad}; known: {', '.join(known)}")
    plan = default_plan(a.sessions, a.quick)
    parse_plan(a.plan, plan)
    if a.dry_run:
        for load in loads:
            for mode, cond, i in schedule(plan, modes, load, conds):
                print(load, mode, cond, i)
        return 0
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "calibration.log"
    workload = Workload()
    settings = {
        "pairs": a.pairs,
        "seeds": a.seeds,
        "modes": modes,
        "loads": loads,
        "conditions": conds,
        "plan": {":".join(k): v for k, v in plan.items()},
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "nice": os.nice(0),
    }
    deadline = None
    if a.stop_at:
        hh, mm = (int(x) for x in a.stop_at.split(":"))
        t = datetime.now(timezone.utc).replace(hour=hh, minute=mm, second=0, microsecond=0)
        deadline = t.timestamp()
    project = Project(a.out, workload)
    sim = None
    sim_path = a.out / "gpu_sim.json"
    if sim_path.is_file():
        sim = json.loads(sim_path.read_text())
    if not (a.gpu_sim_only or a.report_only):
        project.build_base()
        seed_store(project, a.seeds, a.timeout, log)
        size_slowdowns(project, log)
        run_judged(project, plan, modes, loads, conds, a.pairs, a.timeout, deadline, log)
    if (a.gpu_sim or a.gpu_sim_only) and not a.report_only:
        from perfguard.compare.tolerance import parse_tolerance

        tolerance = parse_tolerance(workload.tolerance, "tolerance")
        sim = gpu_simulation(
            a.gpu_trials,
            a.seed,
            a.gpu_sigma_session,
            a.gpu_sigma_round,
            max(a.pairs, 3),
            a.seeds,
            tolerance,
            conds,
            log,
        )
        sim_path.write_text(json.dumps(sim))
    write_outputs(a.out, project.state, settings, sim)
    print((a.out / "calibration.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
