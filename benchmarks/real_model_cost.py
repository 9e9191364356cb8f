"""What ``pytest --perfguard`` costs on real models, beside plain pytest and torch's bare
profiler, in one run (issue 40's cost table).

A project in a fresh git repository with four tests of the code people train, on the CPU:

* ``test_hf_gpt2_train``: a Hugging Face ``transformers`` GPT-2 built from a config (2
  layers, width 128, random weights: no download), AdamW training step;
* ``test_mingpt_train``: a minGPT-style model (this file's own code in that style: fused
  ``c_attn``, explicit causal mask and softmax, a ``ModuleList`` of blocks), AdamW;
* ``test_resnet_train``: a ResNet-style CNN (basic blocks with batch norm and a skip),
  SGD with momentum;
* ``test_compiled_block``: a ``torch.compile``d MLP block's forward (Inductor's C++
  backend; skipped without ``g++``).

Each test runs 3 warm-up steps, then rounds of 10 steps. Sessions, each in a fresh process,
alternated ``--repeat`` times:

* ``plain``: ``pytest`` (each test's warm-up and one loop of 10);
* ``perfguard@REF`` for each ``--checkout`` (a folder holding a perfguard tree, first on
  ``PYTHONPATH``): ``pytest --perfguard`` against that checkout's saved baseline; its
  ``results.json`` says where each second went (``phase_s``);
* ``bare``: per test, a process that builds the same model, runs the warm-up, then the
  same 10 steps under ``torch.profiler`` with shapes and FLOPs (what perfguard's capture
  records) and exports the trace gzipped: the floor the profiled round is set against.

Targets (issue 40): the profiled round ≤ 1.5x the bare profiler plus export; perfguard's own
time per test ≤ 1 s beyond the test's own timed work plus its profiled round; a session ≤ 2x
plain pytest plus the tests' own rounds.

    python benchmarks/real_model_cost.py --repeat 2 --checkout . --checkout /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = '''"""Real models for the cost benchmark (CPU, one thread, small sizes)."""

import math

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=64)
    return GPT2LMHeadModel(cfg)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        mask = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("bias", mask.view(1, 1, block_size, block_size))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(n_embd, 4 * n_embd), c_proj=nn.Linear(4 * n_embd, n_embd),
            act=nn.GELU()))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.c_proj(m.act(m.c_fc(self.ln_2(x))))


class MinGPT(nn.Module):
    def __init__(self, vocab=512, n_embd=128, n_head=4, n_layer=2, block_size=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNetish(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2),
                                    BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class MLPBlock(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def setup(name):
    """(step function, its inputs) of one benchmark, seeded."""
    torch.manual_seed(0)
    if name == "hf_gpt2":
        model = hf_gpt2()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        idx = torch.randint(0, 512, (2, 64))

        def step():
            loss = model(idx, labels=idx).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif name == "mingpt":
        model = MinGPT()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        idx = torch.randint(0, 512, (2, 64))

        def step():
            loss = model(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif name == "resnet":
        model = ResNetish()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

        def step():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        block = torch.compile(MLPBlock().eval())
        x = torch.randn(16, 256)

        def step():
            with torch.no_grad():
                block(x)
    return step
'''

TESTS = """import shutil

import pytest

import models

ROUNDS = dict(iterations=10, warmup=3)


@pytest.mark.gpuprofile(**ROUNDS)
def test_hf_gpt2_train(gpuprofile):
    step = models.setup("hf_gpt2")
    for _ in gpuprofile.iterations():
        step()


@pytest.mark.gpuprofile(**ROUNDS)
def test_mingpt_train(gpuprofile):
    step = models.setup("mingpt")
    for _ in gpuprofile.iterations():
        step()


@pytest.mark.gpuprofile(**ROUNDS)
def test_resnet_train(gpuprofile):
    step = models.setup("resnet")
    for _ in gpuprofile.iterations():
        step()


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on the CPU needs g++")
@pytest.mark.gpuprofile(**ROUNDS)
def test_compiled_block(gpuprofile):
    step = models.setup("compiled")
    for _ in gpuprofile.iterations():
        step()
"""

BARE = """import sys, time, torch, models
name, out = sys.argv[1], sys.argv[2]
step = models.setup(name)
for _ in range(3):
    step()
t0 = time.perf_counter()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True, with_flops=True) as prof:
    for _ in range(10):
        with torch.profiler.record_function("perfguard.iteration"):
            step()
prof.export_chrome_trace(out)
print(time.perf_counter() - t0)
"""

TEST_NAMES = {
    "test_hf_gpt2_train": "hf_gpt2",
    "test_mingpt_train": "mingpt",
    "test_resnet_train": "resnet",
    "test_compiled_block": "compiled",
}


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=b", "-c", "user.email=b@b", *args],
        check=True,
        capture_output=True,
    )


def make_project(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "models.py").write_text(MODELS)
    (root / "test_real.py").write_text(TESTS)
    (root / "bare.py").write_text(BARE)
    (root / ".gitignore").write_text(".perfguard*/\nbaselines*/\n__pycache__/\n*.json.gz\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "real models")


def env_for(checkout: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")]))
    return env


def run(root: Path, argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the child and its children, exit code, stdout) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out = proc.communicate()[0]
    wall = time.perf_counter() - t0
    usage = os.times()
    return wall, usage.children_user + usage.children_system, proc.returncode, out


def pytest_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_real.py", *args]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--checkout",
        type=Path,
        action="append",
        default=[],
        help="a perfguard tree to time (repeatable; default: this one)",
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/real_model_cost.json"))
    ap.add_argument("-k", default="", help="pytest -k of the tests to time")
    args = ap.parse_args()
    checkouts = [c.resolve() for c in args.checkout] or [Path(__file__).resolve().parents[1]]
    base = Path(tempfile.mkdtemp(prefix="pg-realcost-"))
    root = base / "proj"
    make_project(root)
    sel = ["-k", args.k] if args.k else []
    print(f"load before: {os.getloadavg()} ({os.cpu_count()} cores)", flush=True)
    for i, c in enumerate(checkouts):  # each checkout's own baseline and output folder
        run(
            root,
            pytest_argv(
                "--perfguard",
                "--perfguard-save",
                f"--perfguard-output=.perfguard{i}",
                f"--perfguard-store=baselines{i}/perfguard.db",
                *sel,
            ),
            env_for(c),
        )
    rows: dict[str, list[dict[str, object]]] = {"plain": [], "bare": []}
    for _ in range(args.repeat):
        t0 = os.times()
        wall, _, code, _out = run(root, pytest_argv(*sel), env_for(None))
        cpu = sum(os.times()[2:4]) - sum(t0[2:4])
        rows["plain"].append({"wall": wall, "cpu": cpu, "code": code})
        for i, c in enumerate(checkouts):
            t0 = os.times()
            wall, _, code, out = run(
                root,
                pytest_argv(
                    "--perfguard",
                    f"--perfguard-output=.perfguard{i}",
                    f"--perfguard-store=baselines{i}/perfguard.db",
                    *sel,
                ),
                env_for(c),
            )
            cpu = sum(os.times()[2:4]) - sum(t0[2:4])
            doc = json.loads((root / f".perfguard{i}" / "results.json").read_text())
            tests = {t["nodeid"].split("::")[-1]: t.get("phase_s") or {} for t in doc["tests"]}
            rows.setdefault(str(c), []).append(
                {
                    "wall": wall,
                    "cpu": cpu,
                    "code": code,
                    "tests": tests,
                    "session": doc.get("phase_s"),
                }
            )
        bare: dict[str, float] = {}
        for test, name in TEST_NAMES.items():
            if args.k and args.k not in test:
                continue
            if name == "compiled" and shutil.which("g++") is None:
                continue
            argv = [sys.executable, "bare.py", name, f"bare-{name}.json.gz"]
            done = subprocess.run(argv, cwd=root, env=env_for(None), capture_output=True, text=True)
            try:
                bare[test] = float(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print(f"bare {name} failed: {done.stderr[-800:]}")
        rows["bare"].append(bare)
    print(f"load after: {os.getloadavg()}")
    report(rows, checkouts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"rows": rows, "load_after": os.getloadavg(), "checkouts": [str(c) for c in checkouts]}
    args.out.write_text(json.dumps(doc, indent=1))
    shutil.rmtree(base, ignore_errors=True)
    return 0


def report(rows: dict[str, list[dict[str, object]]], checkouts: list[Path]) -> None:
    med = statistics.median
    plain = med(float(r["wall"]) for r in rows["plain"])  # type: ignore[arg-type]
    print(f"\nplain pytest: {plain:.1f} s wall (median of {len(rows['plain'])})")
    for c in checkouts:
        runs = rows[str(c)]
        wall = med(float(r["wall"]) for r in runs)  # type: ignore[arg-type]
        tests = sorted({t for r in runs for t in r["tests"]})  # type: ignore[union-attr]
        own = sum(
            med(float(r["tests"][t].get(k, 0.0)) for r in runs)  # type: ignore[index]
            for t in tests
            for k in ("warmup", "timing")
        )
        print(
            f"\n{c}: session {wall:.1f} s wall = {wall / plain:.1f}x plain; "
            f"target 2x plain + own rounds = {2 * plain + own:.1f} s"
        )
        print(
            f"{'test':<22} {'timing':>7} {'profiled':>9} {'bare':>6} {'ratio':>6} "
            f"{'sites':>6} {'analysis':>9} {'other':>6} {'perfguard own':>14}"
        )
        for t in tests:
            ph = {
                k: med(float(r["tests"][t].get(k, 0.0)) for r in runs)  # type: ignore[index]
                for k in {k for r in runs for k in r["tests"][t]}
            }  # type: ignore[index]
            bare = [b.get(t) for b in rows["bare"] if b.get(t)]  # type: ignore[union-attr]
            b = med(bare) if bare else float("nan")  # type: ignore[type-var]
            prof = ph.get("profiled", 0.0)
            rest = sum(v for k, v in ph.items() if k not in ("warmup", "timing", "profiled"))
            other = rest - ph.get("sites", 0.0) - ph.get("analysis", 0.0)
            print(
                f"{t:<22} {ph.get('timing', 0):7.2f} {prof:9.2f} {b:6.2f} {prof / b:6.2f} "
                f"{ph.get('sites', 0.0):6.2f} {ph.get('analysis', 0.0):9.2f} {other:6.2f} "
                f"{rest:14.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
