"""Does red mean slower and green not? A varied suite judged across separate sessions.

Issue 55's measurement, on this machine:

* a fresh git project of about 34 tests of varied kinds and step sizes (torch CPU matmuls
  from microseconds to milliseconds, MLP training steps, convolutions, norms, attention,
  a transformer layer, pure Python; TensorFlow and JAX steps when they are installed);
* a main branch: ``--history`` sessions, each on a comment-only commit, saved, every
  second one beside a neighbour (one ``while True`` process);
* pull requests off main, each judged against it in store mode (not saved), every second
  one beside the neighbour: ``--unchanged`` comment-only ones, then ``--changed`` rounds
  of +5 % and of +10 % pure-Python work added to the steps of 8 tests (sized from each
  test's level on main and this interpreter's cost of the added loop);
* per test verdict: false ``regressed`` (unchanged code), caught changes, the share left
  ``noisy``, what the stored comparison alone would have said (the confirmed timing
  keeps it in its message), and each session's wall time and load.

    python benchmarks/suite_trust.py --out /tmp/trust            # everything
    python benchmarks/suite_trust.py --out /tmp/trust --analyse-only

Results: ``OUT/trust.json`` and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from suite_repeat import spin  # noqa: E402  (the series' spinner: one busy core)

#: the tests that get timing-only changes (pure-Python work added to their step)
CHANGED = (
    "test_mm64",
    "test_mm256",
    "test_mlp_small",
    "test_conv_small",
    "test_layernorm",
    "test_attention_small",
    "test_py_loop_small",
    "test_sort",
)

TORCH_TESTS = """
import json
import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
EXTRA = json.loads((Path(__file__).parent / "extra.json").read_text())


def spin(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def extra(name):
    return EXTRA.get(name, 0)


def _mm(n, gp, name):
    a = torch.randn(n, n)
    k = extra(name)
    for _ in gp.iterations():
        a @ a
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_mm16(gpuprofile):
    _mm(16, gpuprofile, "test_mm16")


@pytest.mark.gpuprofile(iterations=20)
def test_mm32(gpuprofile):
    _mm(32, gpuprofile, "test_mm32")


@pytest.mark.gpuprofile(iterations=20)
def test_mm64(gpuprofile):
    _mm(64, gpuprofile, "test_mm64")


@pytest.mark.gpuprofile(iterations=10)
def test_mm128(gpuprofile):
    _mm(128, gpuprofile, "test_mm128")


@pytest.mark.gpuprofile(iterations=5)
def test_mm256(gpuprofile):
    _mm(256, gpuprofile, "test_mm256")


@pytest.mark.gpuprofile(iterations=3)
def test_mm512(gpuprofile):
    _mm(512, gpuprofile, "test_mm512")


def _mlp(width, batch, gp, name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))
    k = extra(name)
    for _ in gp.iterations():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        spin(k)


@pytest.mark.gpuprofile(iterations=10)
def test_mlp_small(gpuprofile):
    _mlp(64, 32, gpuprofile, "test_mlp_small")


@pytest.mark.gpuprofile(iterations=5)
def test_mlp_medium(gpuprofile):
    _mlp(512, 128, gpuprofile, "test_mlp_medium")


def _conv(channels, size, gp, name):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(channels, channels, 3, padding=1)
    x = torch.randn(4, channels, size, size)
    k = extra(name)
    with torch.no_grad():
        for _ in gp.iterations():
            conv(x)
            spin(k)


@pytest.mark.gpuprofile(iterations=10)
def test_conv_small(gpuprofile):
    _conv(8, 16, gpuprofile, "test_conv_small")


@pytest.mark.gpuprofile(iterations=3)
def test_conv_medium(gpuprofile):
    _conv(32, 32, gpuprofile, "test_conv_medium")


@pytest.mark.gpuprofile(iterations=20)
def test_layernorm(gpuprofile):
    norm = torch.nn.LayerNorm(256)
    x = torch.randn(64, 256)
    k = extra("test_layernorm")
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            norm(x)
            spin(k)


@pytest.mark.gpuprofile(iterations=10)
def test_batchnorm(gpuprofile):
    norm = torch.nn.BatchNorm2d(16)
    x = torch.randn(8, 16, 16, 16)
    k = extra("test_batchnorm")
    for _ in gpuprofile.iterations():
        norm(x)
        spin(k)


def _attention(seq, dim, gp, name):
    q = torch.randn(2, 4, seq, dim)
    k_ = extra(name)
    for _ in gp.iterations():
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        spin(k_)


@pytest.mark.gpuprofile(iterations=20)
def test_attention_small(gpuprofile):
    _attention(32, 16, gpuprofile, "test_attention_small")


@pytest.mark.gpuprofile(iterations=5)
def test_attention_medium(gpuprofile):
    _attention(256, 64, gpuprofile, "test_attention_medium")


@pytest.mark.gpuprofile(iterations=3)
def test_transformer_layer(gpuprofile):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    x = torch.randn(4, 32, 64)
    k = extra("test_transformer_layer")
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            layer(x)
            spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_elementwise(gpuprofile):
    x = torch.randn(4096)
    k = extra("test_elementwise")
    for _ in gpuprofile.iterations():
        torch.tanh(x * 2 + 1).sigmoid()
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_softmax(gpuprofile):
    x = torch.randn(64, 512)
    k = extra("test_softmax")
    for _ in gpuprofile.iterations():
        torch.softmax(x, dim=-1)
        spin(k)


@pytest.mark.gpuprofile(iterations=10)
def test_sort(gpuprofile):
    x = torch.randn(20000)
    k = extra("test_sort")
    for _ in gpuprofile.iterations():
        torch.sort(x)
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_cumsum(gpuprofile):
    x = torch.randn(16384)
    k = extra("test_cumsum")
    for _ in gpuprofile.iterations():
        torch.cumsum(x, 0)
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_topk(gpuprofile):
    x = torch.randn(8192)
    k = extra("test_topk")
    for _ in gpuprofile.iterations():
        torch.topk(x, 16)
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_einsum(gpuprofile):
    a, b = torch.randn(8, 32, 32), torch.randn(8, 32, 32)
    k = extra("test_einsum")
    for _ in gpuprofile.iterations():
        torch.einsum("bij,bjk->bik", a, b)
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_cat(gpuprofile):
    parts = [torch.randn(64, 64) for _ in range(8)]
    k = extra("test_cat")
    for _ in gpuprofile.iterations():
        torch.cat(parts)
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_embedding(gpuprofile):
    emb = torch.nn.Embedding(1000, 64)
    idx = torch.randint(0, 1000, (32, 16))
    k = extra("test_embedding")
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            emb(idx).sum(1)
            spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_py_loop_small(gpuprofile):
    k = extra("test_py_loop_small")
    for _ in gpuprofile.iterations():
        spin(2000 + k)


@pytest.mark.gpuprofile(iterations=5)
def test_py_loop_large(gpuprofile):
    k = extra("test_py_loop_large")
    for _ in gpuprofile.iterations():
        spin(100000 + k)


@pytest.mark.gpuprofile(iterations=20)
def test_py_dict(gpuprofile):
    k = extra("test_py_dict")
    for _ in gpuprofile.iterations():
        {i: str(i) for i in range(500)}
        spin(k)


@pytest.mark.gpuprofile(iterations=20)
def test_py_join(gpuprofile):
    words = [str(i) for i in range(2000)]
    k = extra("test_py_join")
    for _ in gpuprofile.iterations():
        ",".join(words).split(",")
        spin(k)
"""

TF_TESTS = """
import json
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")
EXTRA = json.loads((Path(__file__).parent / "extra.json").read_text())


def spin(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


@pytest.mark.gpuprofile(iterations=10)
def test_tf_dense(gpuprofile):
    model = tf.keras.Sequential([tf.keras.layers.Dense(128, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    x = tf.random.normal((32, 64))
    step = tf.function(lambda v: model(v))
    step(x)
    k = EXTRA.get("test_tf_dense", 0)
    for _ in gpuprofile.iterations():
        step(x)
        spin(k)


@pytest.mark.gpuprofile(iterations=10)
def test_tf_matmul(gpuprofile):
    a = tf.random.normal((128, 128))
    k = EXTRA.get("test_tf_matmul", 0)
    for _ in gpuprofile.iterations():
        tf.matmul(a, a)
        spin(k)
"""

JAX_TESTS = """
import json
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
EXTRA = json.loads((Path(__file__).parent / "extra.json").read_text())


def spin(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


@pytest.mark.gpuprofile(iterations=10)
def test_jax_mlp(gpuprofile):
    import jax.numpy as jnp

    w = jnp.ones((128, 128))

    @jax.jit
    def step(x):
        return jnp.tanh(x @ w) @ w

    x = jnp.ones((32, 128))
    step(x).block_until_ready()
    k = EXTRA.get("test_jax_mlp", 0)
    for _ in gpuprofile.iterations():
        step(x).block_until_ready()
        spin(k)


@pytest.mark.gpuprofile(iterations=10)
def test_jax_softmax(gpuprofile):
    import jax.numpy as jnp

    f = jax.jit(jax.nn.softmax)
    x = jnp.ones((64, 256))
    f(x).block_until_ready()
    k = EXTRA.get("test_jax_softmax", 0)
    for _ in gpuprofile.iterations():
        f(x).block_until_ready()
        spin(k)
"""


def git(project: Path, *args: str) -> str:
    """git in the project's own repository, never one around it (``--git-dir``: a project
    whose ``.git`` went missing must fail here, not commit into the repository it lies in)."""
    where = ["--git-dir", str(project / ".git"), "--work-tree", str(project)]
    if args[:1] == ("init",):
        where = []
    done = subprocess.run(
        ["git", *where, "-c", "user.name=b", "-c", "user.email=b@b", *args],
        cwd=project,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def make_project(project: Path, frameworks: bool) -> None:
    project.mkdir(parents=True, exist_ok=True)
    (project / "test_torch_steps.py").write_text(TORCH_TESTS)
    if frameworks:
        (project / "test_tf_steps.py").write_text(TF_TESTS)
        (project / "test_jax_steps.py").write_text(JAX_TESTS)
    (project / "extra.json").write_text("{}\n")
    # the project's own ini: pytest's rootdir is the project even where it lies inside
    # another (this repository's benchmarks/out), as a real project's is
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "notes.py").write_text("# session 0\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "add", ".")
    git(project, "commit", "-qm", "suite")


def comment_commit(project: Path, label: str) -> str:
    """A commit that changes a comment only: code the same, a new sha."""
    # the time too: a session stopped after its commit would otherwise repeat the text
    (project / "notes.py").write_text(f"# {label} ({time.time_ns()})\n")
    git(project, "commit", "-qam", label)
    return git(project, "rev-parse", "HEAD")


def run_session(project: Path, args: list[str], busy: bool) -> dict[str, Any]:
    stop = multiprocessing.Event()
    neighbour = None
    if busy:
        neighbour = multiprocessing.Process(target=spin, args=(stop,), daemon=True)
        neighbour.start()
        time.sleep(0.5)
    load = os.getloadavg()
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--perfguard", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PERFGUARD_CONFIRM_BUDGET"},
    )
    wall = time.monotonic() - t0
    stop.set()
    if neighbour is not None:
        neighbour.join()
    results = json.loads((project / ".perfguard" / "results.json").read_text())
    tests = {}
    for t in results["tests"]:
        timing = t.get("timing") or {}
        message = str(timing.get("message") or "")
        tests[t["nodeid"].split("::")[-1]] = {
            "outcome": t["outcome"],
            "timing": timing.get("outcome"),
            "gates": (t.get("gates") or {}).get("outcome"),
            "mode": timing.get("mode"),
            "delta_pct": timing.get("delta_pct"),
            "ci": [timing.get("ci_low_pct"), timing.get("ci_high_pct")],
            "threshold_pct": timing.get("threshold_pct"),
            "stored_outcome": _stored_outcome(message, timing.get("outcome")),
            "confirm_s": (t.get("phase_s") or {}).get("confirm", 0.0),
            "why": (t.get("explanation") or {}).get("headline", "")[:300],
        }
    return {
        "busy": busy,
        "load": load,
        "wall_s": round(wall, 1),
        "rc": done.returncode,
        "tests": tests,
    }


#: the stored comparison's own outcome, kept in a confirmed timing's message
_STORED = re.compile(r"the stored comparison read [^;]*?\(([a-z-]+)\)")


#: how round 24's first wording of a blind green measured again began (it quoted no outcome)
_MEASURED_AGAIN = "measured again on this machine"


def _stored_outcome(message: str, outcome: str | None) -> str | None:
    """What the stored comparison alone read: quoted in a confirmed timing's message (a
    blind green measured again in round 24's first wording, "measured again on this
    machine … as the stored comparison could not rule out …", quoted no outcome: it was
    ``unchanged``); the timing's own outcome where nothing was measured again."""
    stored = _STORED.search(message)
    if stored:
        return stored.group(1)
    if message.startswith(_MEASURED_AGAIN):
        return "unchanged"
    return outcome


def spin_ns_per_unit() -> float:
    """This interpreter's cost of one unit of the tests' ``spin`` loop (ns)."""

    def spin_n(n: int) -> int:
        s = 0
        for i in range(n):
            s += i * i
        return s

    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter_ns()
        spin_n(200_000)
        best = min(best, (time.perf_counter_ns() - t0) / 200_000)
    return best


def levels_from_store(project: Path) -> dict[str, float]:
    """Each test's level (ns) over the main branch's saved runs: the median of run levels."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from perfguard.baseline.store import DEFAULT_STORE, open_store

    store = open_store(project / DEFAULT_STORE, create=False)
    out = {}
    for nodeid in store.reader.nodeids():
        h = store.reader.history(nodeid)
        out[nodeid.split("::")[-1]] = float(np.median(h["median_ns"]))
    return out


def interleaved(unchanged: int, changed: int) -> list[tuple[str, float]]:
    """The pull requests: the changed ones (+5 % and +10 %, ``changed`` of each) spread
    evenly among the unchanged ones, so that a run cut short still has both kinds."""
    todo = [("changed", 0.05), ("changed", 0.10)] * changed
    every = max(unchanged // max(len(todo), 1), 1)
    plan: list[tuple[str, float]] = []
    for i in range(unchanged):
        plan.append(("unchanged", 0.0))
        if todo and (i + 1) % every == 0:
            plan.append(todo.pop(0))
    return plan + todo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("suite_trust"))
    ap.add_argument("--history", type=int, default=6)
    ap.add_argument("--unchanged", type=int, default=40)
    ap.add_argument("--changed", type=int, default=3, help="sessions at +5 %% and at +10 %% each")
    ap.add_argument("--confirm-budget", default="120")
    ap.add_argument("--no-frameworks", action="store_true")
    ap.add_argument("--analyse-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    project = args.out / "project"
    log = args.out / "sessions.json"
    doc: dict[str, Any] = json.loads(log.read_text()) if log.exists() else {"sessions": []}
    sessions = doc["sessions"]
    if not args.analyse_only:
        if not project.exists():
            make_project(project, not args.no_frameworks)
        plan = [("history", 0.0)] * args.history + interleaved(args.unchanged, args.changed)
        for k, (kind, size) in enumerate(plan):
            if k < len(sessions):
                continue
            busy = k % 2 == 1
            label = f"{kind} {k} +{100 * size:.0f}%"
            if kind == "history":
                git(project, "checkout", "-q", "main")
                comment_commit(project, label)
                s = run_session(
                    project,
                    [
                        "--perfguard-save",
                        "--perfguard-fail-on=never",
                        "--perfguard-confirm-budget=0",
                    ],
                    busy,
                )
            else:
                git(project, "checkout", "-q", "-B", f"pr{k}", "main")
                extra = {}
                if kind == "changed":
                    unit = doc.setdefault("spin_ns", spin_ns_per_unit())
                    levels = doc.setdefault("levels_ns", levels_from_store(project))
                    extra = {n: int(size * levels[n] / unit) for n in CHANGED if n in levels}
                (project / "extra.json").write_text(json.dumps(extra) + "\n")
                comment_commit(project, label)
                s = run_session(
                    project,
                    [
                        "--perfguard-baseline=main",
                        "--perfguard-fail-on=never",
                        f"--perfguard-confirm-budget={args.confirm_budget}",
                    ],
                    busy,
                )
                git(project, "checkout", "-q", "--", ".")
                git(project, "checkout", "-q", "main")
            s.update(kind=kind, size=size, label=label)
            sessions.append(s)
            log.write_text(json.dumps(doc, indent=1))
            outs = [t["outcome"] for t in s["tests"].values()]
            print(
                f"{label}: busy={busy} load={s['load'][0]:.2f} {s['wall_s']:.0f}s "
                f"regressed={outs.count('regressed')} noisy={outs.count('noisy')}",
                flush=True,
            )
    result = analyse(doc)
    (args.out / "trust.json").write_text(json.dumps(result, indent=1))
    print(table(result))


def analyse(doc: dict[str, Any]) -> dict[str, Any]:
    """False alarms, detection and the noisy share, as the product judged and as the
    stored comparison alone would have."""
    for s in doc["sessions"]:  # logs written before _stored_outcome knew blind greens
        for t in s["tests"].values():
            if str(t.get("why", "")).startswith(_MEASURED_AGAIN):
                t["stored_outcome"] = "unchanged"
    unchanged = [s for s in doc["sessions"] if s["kind"] == "unchanged"]
    changed = [s for s in doc["sessions"] if s["kind"] == "changed"]
    out: dict[str, Any] = {"spin_ns": doc.get("spin_ns"), "levels_ns": doc.get("levels_ns")}
    for key, field in (("product", "outcome"), ("stored_only", "stored_outcome")):
        verdicts = [t[field] for s in unchanged for t in s["tests"].values()]
        false = sum(v == "regressed" for v in verdicts)
        red = sum(any(t[field] == "regressed" for t in s["tests"].values()) for s in unchanged)
        caught: dict[str, list[int]] = {}
        for s in changed:
            size = f"+{100 * s['size']:.0f}%"
            for name, t in s["tests"].items():
                if name in CHANGED:
                    caught.setdefault(size, []).append(int(t[field] == "regressed"))
        other_false = sum(
            t[field] == "regressed"
            for s in changed
            for n, t in s["tests"].items()
            if n not in CHANGED
        )
        out[key] = {
            "unchanged_verdicts": len(verdicts),
            "false_regressed": false,
            "red_sessions": red,
            "sessions": len(unchanged),
            "noisy": sum(v == "noisy" for v in verdicts),
            "caught": {k: [sum(v), len(v)] for k, v in caught.items()},
            "false_regressed_in_changed_sessions": other_false,
        }
    walls: dict[str, list[float]] = {}
    for kind in ("history", "unchanged", "changed"):
        for busy in (False, True):
            w = [s["wall_s"] for s in doc["sessions"] if s["kind"] == kind and s["busy"] == busy]
            if w:
                walls[f"{kind} {'busy' if busy else 'quiet'}"] = [
                    min(w),
                    sorted(w)[len(w) // 2],
                    max(w),
                ]
    out["wall_s_min_median_max"] = walls
    out["load_1min"] = [s["load"][0] for s in doc["sessions"]]
    out["thresholds_pct"] = _thresholds(unchanged)
    return out


def _thresholds(sessions: list[dict[str, Any]]) -> dict[str, float]:
    """Per test, the median smallest change its verdicts could see (threshold_pct)."""
    per: dict[str, list[float]] = {}
    for s in sessions:
        for name, t in s["tests"].items():
            if t.get("threshold_pct") is not None:
                per.setdefault(name, []).append(float(t["threshold_pct"]))
    return {n: round(sorted(v)[len(v) // 2], 1) for n, v in sorted(per.items())}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| judged by | false regressed (verdicts) | red sessions | noisy | caught +5% | "
        "caught +10% |",
        "|---|---|---|---|---|---|",
    ]
    for key in ("stored_only", "product"):
        r = result[key]
        c5, c10 = r["caught"].get("+5%", [0, 0]), r["caught"].get("+10%", [0, 0])
        lines.append(
            f"| {key} | {r['false_regressed']} ({r['unchanged_verdicts']}) | "
            f"{r['red_sessions']} of {r['sessions']} | {r['noisy']} | {c5[0]}/{c5[1]} | "
            f"{c10[0]}/{c10[1]} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
