"""The culprit's exact line: the call-site pass on real CPU captures, and culprits placed
per call site in real sessions of a real git repository.

The pass (:mod:`perfguard.capture.sites`) runs one step under a ``TorchFunctionMode``;
every op of the profiled iterations takes the statement that called it, the backward's
ops their forward op's. A regression is then placed where it happened: an added op at the
head's line, a removed op at the base's, a sync said as one, code that moved between
modules not mistaken for the change, and the optimizer's per-tensor work ranked after the
change of the model's parameter tensors that made it.
"""

from __future__ import annotations

import html
import importlib.util
from pathlib import Path

import pytest
import torch
import torch._dynamo  # noqa: F401  (an optimizer's first step imports it: before pytester's snapshot)
from test_plugin import commit, entry, init_repo, results, run  # noqa: F401

import perfguard.plugin.session  # noqa: F401  (before pytester snapshots sys.modules)
from perfguard.analysis import analyze
from perfguard.capture.sites import SitePassRun
from perfguard.capture.torch_profiler import profile_torch
from perfguard.trace import load_trace
from perfguard.trace.site_pass import SitePass, apply_sites, read_sites, sites_path

pytest_plugins = ["pytester"]

NET = """
import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        h = F.softmax(h, dim=-1)
        return h.sum()


def step(net, opt, x):
    loss = net(x)
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def _line(text: str, needle: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if needle in s)


def test_the_pass_gives_every_op_its_statement(tmp_path: Path) -> None:
    """Exact lines on a real capture: the softmax at its own line (not ``def forward``),
    its backward node at the same line through the sequence number, the optimizer's ops
    at the ``opt.step()`` line; the profiled round ran with no Python tracer."""
    (tmp_path / "net.py").write_text(NET)
    spec = importlib.util.spec_from_file_location("net_under_test", tmp_path / "net.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    net = mod.Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    mod.step(net, opt, x)  # warm-up
    capture = tmp_path / "cap.pt.trace.json"
    with SitePassRun(capture) as sp:
        mod.step(net, opt, x)
    assert sp.error is None and sites_path(capture).is_file()
    with profile_torch(capture, device="cpu", with_stack=False):
        for _ in range(3):
            with torch.profiler.record_function("perfguard.iteration"):
                mod.step(net, opt, x)
    trace = load_trace(capture)
    assert not trace.ranges["name"].astype(str).str.startswith("perfguard.site#").any()
    ops = analyze(trace).ops.set_index(["op_name", "direction"])["call_site"].astype(str)
    softmax = _line(NET, "F.softmax")
    where = f"net.py:{softmax} in Net.forward"
    assert ops[("aten::softmax", "fprop")].endswith(where), ops[("aten::softmax", "fprop")]
    backward = "autograd::engine::evaluate_function: SoftmaxBackward0"
    assert ops[(backward, "bprop")].endswith(where), ops[(backward, "bprop")]
    stepping = [s for (n, _), s in ops.items() if str(n).startswith("Optimizer.step#")]
    assert stepping and all(
        s.endswith(f"net.py:{_line(NET, 'opt.step()')} in step") for s in stepping
    ), stepping
    details = trace.meta["site_details"]
    label = next(k for k in details if k.endswith(where))
    assert details[label]["code"] == "h = F.softmax(h, dim=-1)"
    assert details[label]["stack"][0].endswith("in step")  # the user's frames above it
    # each line of the user's code ran once in the pass's step: counted, deterministically
    runs = {(code, n) for _, _, code, n in trace.meta["line_runs"]}
    assert ("h = F.softmax(h, dim=-1)", 1) in runs and ("opt.step()", 1) in runs, runs


def test_python_lines_that_ran_more_are_named() -> None:
    """A pure-Python change (a loop over more items) moves no op: the line whose runs per
    step grew is named, matched across commits by its text (its line number moved)."""
    from perfguard.compare.sites import line_growth

    base = {
        "line_runs": [["m.py:10", "step", "total += x", 1000], ["m.py:8", "step", "y = f(x)", 1]]
    }
    head = {
        "line_runs": [["m.py:12", "step", "total += x", 1020], ["m.py:8", "step", "y = f(x)", 1]]
    }
    assert line_growth(base, head) == [("m.py:12 in step", 1000.0, 1020.0)]
    assert line_growth(base, head, up=False) == []
    assert line_growth(base, {}) == []  # a record without the pass: nothing to say


def test_a_damaged_or_uneven_pass_is_a_note(tmp_path: Path) -> None:
    """A sites file that cannot be read, or an iteration that ran another number of calls
    than the pass's step: a note, never an error, and no site where none is known."""
    import pandas as pd

    cap = tmp_path / "c.json"
    sites_path(cap).write_text("{not json")
    notes: list[str] = []
    assert read_sites(cap, notes) is None and "not read" in notes[0]
    found = SitePass(sites=(), calls={})
    ranges = pd.DataFrame(
        {
            "name": ["perfguard.iteration", "aten::mm", "aten::mm"],
            "start": [0, 1, 5],
            "end": [10, 2, 6],
            "call_site": None,
        }
    )
    assert apply_sites(ranges, found, notes) is ranges
    from perfguard.trace.site_pass import Site

    one = SitePass(sites=(Site("m.py:3", "f", "y = x @ x"),), calls={"aten::mm": [0]})
    out = apply_sites(ranges, one, notes)
    site = out["call_site"]
    assert site.isna().tolist() == [True, False, False]  # the iteration range has no site
    assert site[1:].tolist() == ["m.py:3 in f", "m.py:3 in f"]
    assert "different number of calls" in notes[-1]


MODEL = """
import torch
from torch import nn
from torch.nn import functional as F

from helpers import act

torch.set_num_threads(1)


class Fused(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).split(16, dim=-1)
        return (q * k + v).sum()


class Pool(nn.Module):
    def forward(self, x):
        x = F.layer_norm(x, x.shape[-1:])
        return act(x).mean(0)
"""
MODEL_B = (
    MODEL.replace(
        "        self.qkv = nn.Linear(16, 48)\n",
        "        self.q = nn.Linear(16, 16)\n        self.k = nn.Linear(16, 16)\n"
        "        self.v = nn.Linear(16, 16)\n",
    )
    .replace(
        "        q, k, v = self.qkv(x).split(16, dim=-1)\n",
        "        q, k, v = self.q(x), self.k(x), self.v(x)\n",
    )
    .replace("        x = F.layer_norm(x, x.shape[-1:])\n", "")
    .replace("from helpers import act\n", "from layers import act\n")
    .replace(
        "        return act(x).mean(0)\n",
        "        x = torch.sigmoid(x) * x\n        return act(x).mean(0)\n",
    )
)
HELPERS = """
import torch


def act(x):
    return torch.tanh(x) * 2
"""
TESTS = """
import pytest
import torch

from model import Fused, Pool

torch.manual_seed(0)
X = torch.randn(8, 16)


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1)
def test_train(gpuprofile):
    net = Fused()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in gpuprofile.iterations():
        loss = net(X)
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1)
def test_sgd(gpuprofile):
    net = Pool()
    w = torch.nn.Parameter(torch.ones(16))
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in gpuprofile.iterations():
        loss = (net(X) * w).sum()
        loss.backward()
        opt.step()


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1)
def test_pool(gpuprofile):
    pool = Pool()
    for _ in gpuprofile.iterations():
        y = pool(X)
"""
TESTS_B = TESTS.replace(
    "    opt = torch.optim.SGD([w], lr=0.1)\n",
    "    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)\n",
).replace(
    "        y = pool(X)\n",
    "        y = pool(X)\n        if torch.isnan(y).any():\n            raise FloatingPointError\n",
)


def _summary_line(repo: Path, test: str) -> str:
    md = html.unescape((repo / ".perfguard" / "summary.md").read_text()).replace("\\", "")
    return next(x for x in md.splitlines() if f"::{test}`" in x)


def test_culprits_are_placed_where_the_code_changed(pytester: pytest.Pytester) -> None:
    """One commit of four realistic changes, judged against the saved base in a real
    session: each test's first line names its op at the line that changed."""
    init_repo(pytester)
    pytester.makepyfile(model=MODEL, helpers=HELPERS, test_bench=TESTS)
    commit(pytester.path, "A")
    run(pytester, "--perfguard-save").assert_outcomes(passed=3)
    (pytester.path / "helpers.py").unlink()
    pytester.makepyfile(model=MODEL_B, layers=HELPERS, test_bench=TESTS_B)
    commit(pytester.path, "B: q/k/v split; layer norm dropped; act moved; a NaN check")
    run(pytester).assert_outcomes(failed=3)
    doc = results(pytester)
    model_a, model_b = MODEL.strip("\n"), (pytester.path / "model.py").read_text()
    tests_b = (pytester.path / "test_bench.py").read_text()

    train = entry(doc, "test_bench.py::test_train")["explanation"]
    split_at = _line(model_b, "q, k, v = self.q(x)")
    first = train["culprits"][0]
    split_base = _line(model_a, "q, k, v = self.qkv(x)")
    assert first["site"] in (
        f"at model.py:{split_at} in Fused.forward",
        f"at model.py:{split_base} in Fused.forward (base)",
    ), first
    kinds = [c["kind"] for c in train["culprits"]]
    assert "params" in kinds, kinds
    params = next(c for c in train["culprits"] if c["kind"] == "params")
    assert params["text"].startswith("parameter tensors 2 → 6"), params
    # the optimizer's per-tensor work follows its cause: after it, never first
    steps = [i for i, c in enumerate(train["culprits"]) if c["op"].startswith("Optimizer.")]
    causes = [i for i, c in enumerate(train["culprits"]) if not c["consequence"]]
    assert steps and min(steps) > max(causes), [c["text"] for c in train["culprits"]]
    assert all(train["culprits"][i]["consequence"] for i in steps)

    pool = entry(doc, "test_bench.py::test_pool")["explanation"]
    nan_at = _line(tests_b, "torch.isnan(y)")
    assert pool["lead"].startswith("host sync added at test_bench.py:"), pool["lead"]
    assert f"test_bench.py:{nan_at} in test_pool" in pool["lead"], pool["lead"]
    by_op = {c["op"].rsplit("/", 1)[-1]: c for c in pool["culprits"]}
    # an added op: the head's line; a removed one: the base's, marked as such
    assert (
        f"model.py:{_line(model_b, 'torch.sigmoid')} in Pool.forward"
        in (by_op["aten::sigmoid"]["site"])
    )
    removed = by_op["aten::layer_norm"]
    assert removed["kind"] == "removed"
    assert removed["site"] == f"at model.py:{_line(model_a, 'F.layer_norm')} in Pool.forward (base)"
    # act() moved from helpers.py to layers.py unchanged: its tanh is no culprit
    assert "aten::tanh" not in by_op, sorted(by_op)
    # an optimizer built with momentum: its work changes at opt.step(), the line that
    # changed is where it is built
    sgd = entry(doc, "test_bench.py::test_sgd")["explanation"]
    built = _line(tests_b, "momentum=0.9")
    assert sgd["culprits"][0]["kind"] == "optimizer", sgd["culprits"][0]
    assert sgd["lead"] == (
        f"optimizer opt (SGD): momentum 0 → 0.9 at test_bench.py:{built} in test_sgd"
    ), sgd["lead"]
    line = _summary_line(pytester.path, "test_pool")
    assert f"test_bench.py:{nan_at}" in line, line


def test_new_work_is_placed_at_the_new_statement_above_an_unchanged_helper() -> None:
    """The test now builds the mask inside the loop (``model(x, make_mask(n))``): the ops run
    on the unchanged line inside ``make_mask``, and the reviewer is sent to the test's line
    that changed, the outermost statement the base's step never ran."""
    from perfguard.compare.sites import SiteTable, place_of

    def meta(sites: dict, runs: list, calls: dict) -> dict:
        return {
            "site_details": sites,
            "line_runs": runs,
            "op_sites": {
                "op": list(calls),
                "direction": ["fprop"] * len(calls),
                "site": [calls[k] for k in calls],
                "calls": [1.0] * len(calls),
                "gpu_ns": [0.0] * len(calls),
                "cpu_ns": [5.0] * len(calls),
            },
        }

    mask = "m.py:3 in make_mask"
    base = meta(
        {"t.py:9 in test": {"function": "test", "code": "y = model(x, mask)", "stack": []}},
        [["t.py:9", "test", "y = model(x, mask)", 1]],
        {"aten::mm": "t.py:9 in test"},
    )
    head = meta(
        {
            mask: {
                "function": "make_mask",
                "code": "return torch.arange(n) < k",
                "stack": ["t.py:9 in test"],
            },
            "t.py:9 in test": {
                "function": "test",
                "code": "y = model(x, make_mask(n))",
                "stack": [],
            },
        },
        [
            ["m.py:3", "make_mask", "return torch.arange(n) < k", 1],
            ["t.py:9", "test", "y = model(x, make_mask(n))", 1],
        ],
        {"aten::mm": "t.py:9 in test", "aten::arange": mask},
    )
    place = place_of("added", "aten::arange", "fprop", SiteTable(base), SiteTable(head))
    assert place is not None and place.text == "at t.py:9 in test"
    # a helper line the base ran too is the place itself: nothing new above it to prefer
    base["line_runs"].append(["m.py:3", "make_mask", "return torch.arange(n) < k", 1])
    place = place_of("added", "aten::arange", "fprop", SiteTable(base), SiteTable(head))
    assert place is not None and place.text == f"at {mask}"


SITES_MODEL = """
import torch

W1 = torch.randn(16, 16)
W2 = torch.randn(16, 16)


def step(x):
    a = x @ W1
    for _ in range(3):
        a = a + 1.0
    b = x @ W2
    return a.sum() + b.sum()
"""
SITES_MODEL_B = SITES_MODEL.replace("W2 = torch.randn(16, 16)", "W2 = torch.randn(16, 64)").replace(
    "    b = x @ W2\n", "    b = x @ W2\n    b = torch.add(b, 0.5)\n"
)
SITES_TEST = """
import pytest
import torch

from sites_model import step

X = torch.randn(8, 16)


@pytest.mark.gpuprofile(iterations=3, rounds=3, warmup=1)
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        step(X)
"""


def test_a_count_is_compared_at_its_site_not_over_the_op(pytester: pytest.Pytester) -> None:
    """An op that runs at several statements changes at one: the culprit gives that
    statement's figures (calls 0 → 1 at the new ``torch.add``, FLOPs ×4 at the widened
    matmul) with the op's totals beside them, the kernel-change table its FLOPs per call
    at that site (never an average over sites), and no line says "X → X"."""
    init_repo(pytester)
    pytester.makepyfile(sites_model=SITES_MODEL, test_sites=SITES_TEST)
    commit(pytester.path, "A")
    run(pytester, "--perfguard-save").assert_outcomes(passed=1)
    pytester.makepyfile(sites_model=SITES_MODEL_B)
    commit(pytester.path, "B: a wider second matmul and an add after it")
    run(pytester)
    doc = results(pytester)
    test = entry(doc, "test_sites.py::test_step")
    model_b = (pytester.path / "sites_model.py").read_text()
    texts = [c["text"] for c in test["explanation"]["culprits"]]
    add_at = _line(model_b, "torch.add(b, 0.5)")
    (add,) = [t for t in texts if t.startswith("aten::add") and "op calls" in t]
    assert f"sites_model.py:{add_at} in step" in add, add
    assert "op calls 0 → 1 per iteration there (all its sites 4 → 5 per iteration" in add, add
    mm_at = _line(model_b, "b = x @ W2")
    flops = [t for t in texts if "FLOPs" in t and f"sites_model.py:{mm_at}" in t]
    assert flops, texts
    assert "4.1 kFLOP → 16.4 kFLOP per iteration there" in flops[0], flops
    for t in texts:
        left, _, right = t.partition(" → ")
        assert not right or left.rsplit(" ", 2)[-2:] != right.split(" ")[:2], t
    changed = [k for k in test["kernel_changes"] if k["kind"] == "flops_changed"]
    assert changed and all(k.get("site") for k in changed), changed
    (mm,) = [k for k in changed if f"sites_model.py:{mm_at}" in k["site"]]
    assert (mm["baseline"], mm["current"]) == (4096.0, 16384.0), mm
    page = html.unescape((pytester.path / ".perfguard" / "report.html").read_text())
    assert (
        f"<code>aten::matmul/aten::mm</code> at <code>sites_model.py:{mm_at} in step</code>" in page
    )
