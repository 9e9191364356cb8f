"""perfguard.instrument / annotate / the Keras callback: ranges both backends see.

Expected names are written out by hand from the naming rule (DLProf's
hierarchical op names, see ``perfguard/capture/instrument.py``); the torch
profiler is the independent witness for what reached a Kineto trace, and its
own ``cpu_op`` events (shapes, dtypes) for what the NVTX payload must say.
NVTX itself is observed through a recording domain put in place of the real
one (no nsys here); with no tool attached the real ``nvtx`` calls are no-ops.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import perfguard  # noqa: E402
from perfguard.capture import ranges as annotate_mod  # noqa: E402
from perfguard.capture.instrument import (  # noqa: E402
    encode_message,
    instrument,
    kineto_dtype,
)
from perfguard.trace.names import ITERATION_NAMES, parse_range_names  # noqa: E402

keras_mod = importlib.import_module("perfguard.capture.keras")
annotate = annotate_mod.annotate
HERE = Path(__file__).resolve()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    """Calls ``block`` twice: DLProf numbers the second call ``block(2)``."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.conv = nn.Conv2d(1, 2, 3, stride=2, padding=1)
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        y = self.block(y)
        for layer in self.layers:
            y = layer(y)
        z = self.conv(y.reshape(1, 1, 4, 4))
        return z.sum() + y.sum()


class RecordingDomain:
    """Stands in for a live ``nvtx.Domain``: keeps what nsys would have received."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def get_event_attributes(self, message: Any = None, **kwargs: Any) -> dict[str, Any]:
        return {"message": message, **kwargs}

    def push_range(self, attributes: dict[str, Any]) -> None:
        self.events.append(("push", attributes))

    def pop_range(self) -> None:
        self.events.append(("pop", None))

    def messages(self) -> list[str]:
        return [a["message"] for kind, a in self.events if kind == "push"]

    def balanced(self) -> bool:
        depth = 0
        for kind, _ in self.events:
            depth += 1 if kind == "push" else -1
            if depth < 0:
                return False
        return depth == 0


@pytest.fixture
def nvtx_domain(monkeypatch: pytest.MonkeyPatch) -> RecordingDomain:
    """A recording NVTX domain in place of the real one (as if nsys were attached)."""
    domain = RecordingDomain()
    monkeypatch.setattr(annotate_mod, "_nvtx_domain", lambda name: domain)
    return domain


def _train_step(net: nn.Module) -> None:
    torch.manual_seed(0)
    net(torch.randn(4, 4)).backward()


def _kineto(tmp_path: Path, fn: Any) -> perfguard.Trace:
    """Run ``fn`` under the torch profiler (CPU, shapes) and read the export back."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return perfguard.load_trace(path)


def _annotations(trace: perfguard.Trace) -> pd.DataFrame:
    r = trace.ranges
    return r[r["category"] == "user_annotation"]


# names per the rule, written out by hand
FPROP_MODULES = [
    "/Net",
    "/Net/block",
    "/Net/block/fc",
    "/Net/block/act",
    "/Net/block(2)",
    "/Net/block(2)/fc",
    "/Net/block(2)/act",
    "/Net/layers/0",
    "/Net/layers/1",
    "/Net/conv",
]
FPROP_OPS = [
    "/Net/block/fc/aten::t",
    "/Net/block/fc/aten::addmm",
    "/Net/block/act/aten::relu",
    "/Net/block(2)/fc/aten::t",
    "/Net/block(2)/fc/aten::addmm",
    "/Net/block(2)/act/aten::relu",
    "/Net/layers/0/aten::addmm",
    "/Net/layers/1/aten::addmm",
    "/Net/aten::view",
    "/Net/conv/aten::convolution",
    "/Net/aten::sum",
    "/Net/aten::sum(2)",
    "/Net/aten::add",
]
BPROP_OPS = [
    "/Net/block/fc/aten::addmm/aten::mm",
    "/Net/block(2)/fc/aten::addmm/aten::mm",
    "/Net/block(2)/fc/aten::addmm/aten::mm(2)",
    "/Net/block/act/aten::relu/aten::threshold_backward",
    "/Net/block(2)/act/aten::relu/aten::threshold_backward",
    "/Net/conv/aten::convolution/aten::convolution_backward",
    "/Net/layers/1/aten::addmm/aten::mm",
]


def test_torch_profiler_sees_hierarchical_names(tmp_path: Path) -> None:
    net = Net()

    def run() -> None:
        with instrument(net, ops=True):
            _train_step(net)

    ann = _annotations(_kineto(tmp_path, run))
    names = set(ann["name"])
    missing = [n for n in FPROP_MODULES + FPROP_OPS + BPROP_OPS if n not in names]
    assert not missing, f"not in the trace: {missing}; got {sorted(names)}"
    direction = ann.drop_duplicates("name").set_index("name")["direction"]
    assert (direction[FPROP_MODULES + FPROP_OPS] == "fprop").all()
    assert (direction[BPROP_OPS] == "bprop").all()
    # each call of the block is one range; the second one is numbered
    assert (ann["name"] == "/Net/block").sum() == 1
    assert (ann["name"] == "/Net/block(2)").sum() == 1


def test_op_ranges_enclose_the_profilers_op_with_its_shapes(tmp_path: Path) -> None:
    net = Net()

    def run() -> None:
        with instrument(net, ops=True):
            _train_step(net)

    r = _kineto(tmp_path, run).ranges
    for name, op, shapes, dtypes in [
        (
            "/Net/block(2)/fc/aten::addmm",
            "aten::addmm",
            "[[4],[4,4],[4,4],[],[]]",
            '["float","float","float","Scalar","Scalar"]',
        ),
        ("/Net/block(2)/fc/aten::addmm/aten::mm", "aten::mm", "[[4,4],[4,4]]", '["float","float"]'),
    ]:
        (ours,) = r.index[r["name"] == name]
        child = r[(r["parent_id"] == r.at[ours, "range_id"]) & (r["name"] == op)]
        assert len(child) == 1
        assert child["input_shapes"].iloc[0] == shapes
        assert child["dtypes"].iloc[0] == dtypes


def test_nvtx_payload_matches_the_profilers_own_record(
    tmp_path: Path, nvtx_domain: RecordingDomain
) -> None:
    """Our NVTX messages, parsed as the nsys reader parses them, agree with Kineto."""
    net = Net()

    def run() -> None:
        with instrument(net, ops=True):
            _train_step(net)

    r = _kineto(tmp_path, run).ranges
    assert nvtx_domain.balanced()
    parsed = parse_range_names(pd.Series(nvtx_domain.messages()))
    assert set(FPROP_MODULES + FPROP_OPS + BPROP_OPS) <= set(parsed["name"])
    assert list(parsed["name"]) == list(r.loc[r["category"] == "user_annotation", "name"])
    checked = 0
    for row in parsed.itertuples():
        if not row.name.endswith(("aten::addmm", "aten::addmm/aten::mm")):
            continue
        (ours,) = r.index[(r["name"] == row.name) & (r["category"] == "user_annotation")]
        child = r[(r["parent_id"] == r.at[ours, "range_id"]) & (r["category"] == "cpu_op")]
        assert row.input_shapes == child["input_shapes"].iloc[0], row.name
        assert row.dtypes == child["dtypes"].iloc[0], row.name
        assert row.bprop == (r.at[ours, "direction"] == "bprop"), row.name
        checked += 1
    assert checked == 8  # four linear layers, forward and backward
    by_name = parsed.drop_duplicates("name").set_index("name")
    conv = json.loads(by_name.at["/Net/conv/aten::convolution", "concrete_inputs"])
    assert conv[3:6] == ["[2, 2]", "[1, 1]", "[1, 1]"]  # stride, padding, dilation
    assert conv[8] == "1"  # groups
    assert pd.isna(by_name.at["/Net/block/fc/aten::addmm", "concrete_inputs"])
    bwd = "/Net/block/fc/aten::addmm/aten::mm"
    assert by_name.at[bwd, "bprop"]
    assert by_name.at[bwd, "call_site"] == by_name.at["/Net/block/fc/aten::addmm", "call_site"]
    lines = HERE.read_text().splitlines()
    line = next(i for i, t in enumerate(lines, 1) if "y = self.block(x)" in t)
    assert by_name.at["/Net/block", "call_site"] == f"{HERE}:{line}"


def test_ops_false_and_model_scope(nvtx_domain: RecordingDomain) -> None:
    net = Net()
    outsider = nn.Linear(4, 4)
    with instrument(net, ops=False):
        _train_step(net)
        outsider(torch.randn(1, 4))
        net.block.fc(torch.randn(1, 4))  # a member called from outside its parent
    names = list(parse_range_names(pd.Series(nvtx_domain.messages()))["name"])
    assert names == FPROP_MODULES + ["/Net/block/fc"]
    assert nvtx_domain.balanced()


def test_global_scope_names_roots_by_class(nvtx_domain: RecordingDomain) -> None:
    loss_fn = nn.MSELoss()
    lin = nn.Linear(2, 2)
    with instrument(ops=True):
        loss_fn(lin(torch.ones(1, 2)), torch.zeros(1, 2))
        loss_fn(lin(torch.ones(1, 2)), torch.zeros(1, 2))
        torch.ones(1).add_(1)
    names = list(parse_range_names(pd.Series(nvtx_domain.messages()))["name"])
    assert names.count("/Linear") == 2 and "/Linear/aten::addmm" in names
    assert names.count("/MSELoss") == 2 and "/MSELoss/aten::mse_loss" in names
    assert "/aten::add_" in names  # an op outside any module
    assert not any("(" in n.split("/")[1] for n in names)  # roots are never numbered


def test_off_by_default_and_one_at_a_time(nvtx_domain: RecordingDomain) -> None:
    net = Net()
    _train_step(net)
    assert nvtx_domain.events == []
    handle = instrument(net, ops=True)
    assert not handle.enabled
    handle.enable()
    try:
        assert handle.enabled
        with pytest.raises(RuntimeError, match="already enabled"):
            instrument(ops=True).enable()
        _train_step(net)
    finally:
        handle.disable()
    n = len(nvtx_domain.events)
    assert n > 0 and nvtx_domain.balanced()
    _train_step(net)
    assert len(nvtx_domain.events) == n
    handle.disable()  # a second disable is a no-op


def test_ranges_close_when_forward_raises(nvtx_domain: RecordingDomain) -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Boom()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x * 2)

    model = Outer()
    with instrument(model, ops=True), pytest.raises(ValueError, match="boom"):
        model(torch.ones(2))
    assert nvtx_domain.balanced()
    assert nvtx_domain.messages()[-1].startswith("/Outer/inner,")


def test_same_names_every_step(nvtx_domain: RecordingDomain) -> None:
    net = Net()
    with instrument(net, ops=True):
        _train_step(net)
        first = list(nvtx_domain.messages())
        net.zero_grad(set_to_none=True)  # else AccumulateGrad adds instead of storing
        _train_step(net)
    assert nvtx_domain.messages()[len(first) :] == first


# --- the message grammar -------------------------------------------------------------------

TRICKY = [
    "/Net/fc1/aten::addmm",
    "/a,b/c",
    "/x, sizes = [[1]]",
    "/y, dir = bprop",
    "/z, site = f.py:1, seq = 3",
    "/100%2C/p%25q",
    "/weird[0]=1/{a: [b, c]}",
    "/ñ/δ(2)",
    "/trailing,",
    "",
]


@pytest.mark.parametrize("name", TRICKY)
@pytest.mark.parametrize("direction", ["fprop", "bprop"])
def test_message_round_trip(name: str, direction: str) -> None:
    sizes = [[4, 16], [8, 16], [], [[2, 3], [2, 3]]]
    dtypes = ["float", "c10::Half", "Scalar", "TensorList"]
    concrete = ["", "[2, 2]", "a, dir = fprop, site = x", ""]
    site = "/tmp/my, dir/train%.py:42"
    msg = encode_message(
        name, sizes=sizes, dtypes=dtypes, concrete=concrete, direction=direction, site=site
    )
    assert msg.count(", ") == 5  # exactly the five field separators
    (row,) = parse_range_names(pd.Series([msg])).to_dict("records")
    assert row["name"] == name
    assert row["bprop"] is (direction == "bprop")
    assert json.loads(row["input_shapes"]) == sizes
    assert json.loads(row["dtypes"]) == dtypes
    assert json.loads(row["concrete_inputs"]) == concrete
    assert row["concrete_inputs"] == json.dumps(concrete, separators=(",", ":"))
    assert row["call_site"] == site
    assert pd.isna(row["seq"])


def test_message_optional_fields_and_other_names_unchanged() -> None:
    names = pd.Series(
        [
            encode_message("/Net/block"),
            encode_message("/Net/block", site="t.py:3"),
            "aten::mul, seq = 46174, op_id = 993406, sizes = [[2, 3]]",
            "aten::mul, stashed seq = 46174",
            "forward, part 1",
            "MulBackward0",
        ]
    )
    out = parse_range_names(names)
    assert list(out["name"]) == [
        "/Net/block",
        "/Net/block",
        "aten::mul",
        "aten::mul",
        "forward, part 1",
        "MulBackward0",
    ]
    assert list(out["bprop"]) == [False, False, False, True, False, True]
    assert out["seq"].tolist()[2:4] == [46174, 46174]
    assert out.at[2, "input_shapes"] == "[[2, 3]]"
    assert out.at[1, "call_site"] == "t.py:3"
    assert out[["dtypes", "concrete_inputs"]].isna().all().all()
    assert out["call_site"].isna().tolist() == [True, False, True, True, True, True]


def test_encode_rejects_unknown_direction() -> None:
    with pytest.raises(ValueError, match="fprop"):
        encode_message("/a", direction="forward")


def test_dtype_spellings_match_the_torch_profiler(tmp_path: Path) -> None:
    dtypes = [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ]

    def run() -> None:
        for dt in dtypes:
            torch.ops.aten.alias(torch.zeros(2, dtype=dt))

    r = _kineto(tmp_path, run).ranges
    seen = [json.loads(t)[0] for t in r.loc[r["name"] == "aten::alias", "dtypes"]]
    assert seen == [kineto_dtype(dt) for dt in dtypes]


# --- annotate ------------------------------------------------------------------------------


def test_annotate_decorator_and_context_manager_in_torch_profiler(tmp_path: Path) -> None:
    @annotate(color="green")
    def load_batch() -> torch.Tensor:
        return torch.ones(3)

    @annotate("named step", domain="perfguard-test", category="io")
    def step() -> torch.Tensor:
        return load_batch() * 2

    def run() -> None:
        with annotate("outer"):
            step()
        with annotate("outer"):
            pass

    ann = _annotations(_kineto(tmp_path, run))
    assert list(ann["name"]) == [
        "outer",
        "named step",
        "test_annotate_decorator_and_context_manager_in_torch_profiler.<locals>.load_batch",
        "outer",
    ]
    assert list(ann["depth"]) == [0, 1, 2, 0]


def test_annotate_without_a_profiler_or_tool_does_nothing_and_fails_nowhere() -> None:
    @annotate()
    def f(x: int) -> int:
        return x + 1

    region = annotate("region", color="red")
    with region, region:
        assert f(1) == 2


def test_annotate_reaches_nvtx_with_its_attributes(nvtx_domain: RecordingDomain) -> None:
    with annotate("io", color="blue", category="load"):
        pass
    assert nvtx_domain.events == [
        ("push", {"message": "io", "color": "blue", "category": "load", "payload": None}),
        ("pop", None),
    ]


def test_annotate_function_wraps_and_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = types.ModuleType("pg_thirdparty")

    def solve(x: int) -> int:
        return x * 3

    class Solver:
        @staticmethod
        def fast(x: int) -> int:
            return x + 1

        @classmethod
        def build(cls) -> str:
            return cls.__name__

        def run(self, x: int) -> int:
            return x - 1

    mod.solve = solve  # type: ignore[attr-defined]
    mod.Solver = Solver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pg_thirdparty", mod)

    wrapped = annotate_mod.annotate_function("pg_thirdparty:solve")
    assert mod.solve is wrapped and wrapped.__wrapped__ is solve
    assert annotate_mod.annotate_function("pg_thirdparty:solve") is wrapped  # idempotent
    annotate_mod.annotate_function("pg_thirdparty.Solver.fast")
    annotate_mod.annotate_function(Solver, "build")
    annotate_mod.annotate_function(Solver, "run", message="Solver.run!")

    def run() -> None:
        assert mod.solve(2) == 6
        assert Solver.fast(1) == 2 and Solver().fast(1) == 2
        assert Solver.build() == "Solver"
        assert Solver().run(1) == 0

    try:
        names = list(_annotations(_kineto(tmp_path, run))["name"])
    finally:
        annotate_mod.unannotate_function("pg_thirdparty:solve")
        annotate_mod.unannotate_function("pg_thirdparty:Solver.fast")
        annotate_mod.unannotate_function(Solver, "build")
        annotate_mod.unannotate_function(Solver, "run")
    assert names == [
        "pg_thirdparty.solve",
        "pg_thirdparty.Solver.fast",
        "pg_thirdparty.Solver.fast",
        f"{Solver.__qualname__}.build",  # (object, attr): the object's qualified name
        "Solver.run!",
    ]
    assert mod.solve is solve
    assert isinstance(Solver.__dict__["fast"], staticmethod)
    assert isinstance(Solver.__dict__["build"], classmethod)
    assert Solver.fast(1) == 2 and Solver.build() == "Solver"
    with pytest.raises(ValueError, match="not wrapped"):
        annotate_mod.unannotate_function("pg_thirdparty:solve")
    with pytest.raises(ValueError, match="package.module:function"):
        annotate_mod.annotate_function("no_such_module_pg")


def test_name_thread_sets_python_and_os_names() -> None:
    result: dict[str, Any] = {}

    def worker() -> None:
        result["done"] = annotate_mod.name_thread("perfguard-loader-thread")
        result["python"] = threading.current_thread().name
        comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm")
        result["os"] = comm.read_text().strip() if comm.exists() else None

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert result["python"] == "perfguard-loader-thread"
    assert "python" in result["done"]
    if sys.platform.startswith("linux"):
        assert "os" in result["done"]
        assert result["os"] == "perfguard-loader-thread"[:15]


# --- Keras -----------------------------------------------------------------------------------


def _fit_like(cb: Any) -> None:
    """The hook calls ``model.fit(epochs=2)`` over two batches, then ``evaluate``, make."""
    cb.set_model(object())
    cb.on_train_begin()
    for epoch in range(2):
        cb.on_epoch_begin(epoch)
        for batch in range(2):
            cb.on_train_batch_begin(batch)
            torch.ones(2).sum()
            cb.on_train_batch_end(batch)
        cb.on_epoch_end(epoch)
    cb.on_train_end()
    cb.on_test_begin()
    cb.on_test_batch_begin(0)
    cb.on_test_batch_end(0)
    cb.on_test_end()


def test_keras_callback_ranges_without_keras(tmp_path: Path) -> None:
    cb = keras_mod.NvtxCallback()
    r = _kineto(tmp_path, lambda: _fit_like(cb)).ranges
    ann = r[r["category"] == "user_annotation"]
    assert list(ann["name"]) == (
        ["keras.train"]
        + ["keras.epoch", "perfguard.iteration", "perfguard.iteration"] * 2
        + ["keras.test", "keras.test_batch"]
    )
    assert list(ann["depth"]) == [0, 1, 2, 2, 1, 2, 2, 0, 1]
    assert (ann.loc[ann["name"] == "perfguard.iteration", "kind"] == "iteration").all()
    assert keras_mod.ITERATION_RANGE in ITERATION_NAMES


def test_keras_callback_nvtx_payloads(nvtx_domain: RecordingDomain) -> None:
    cb = keras_mod.NvtxCallback(color="orange")
    _fit_like(cb)
    assert nvtx_domain.balanced()
    pushes = [a for kind, a in nvtx_domain.events if kind == "push"]
    batches = [a["payload"] for a in pushes if a["message"] == "perfguard.iteration"]
    assert batches == [0, 1, 0, 1]
    assert [a["payload"] for a in pushes if a["message"] == "keras.epoch"] == [0, 1]
    assert {a["color"] for a in pushes} == {"orange"}
    nvtx_domain.events.clear()
    quiet = keras_mod.NvtxCallback(batches=False)
    _fit_like(quiet)
    quiet.on_epoch_end(5)  # an end without a begin is ignored
    assert nvtx_domain.balanced()
    assert [m for m in nvtx_domain.messages() if "batch" in m or "iteration" in m] == []


def test_public_record_function_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch's private entry points the mirror uses ``record_function``."""
    monkeypatch.delattr(torch._C._autograd, "_record_function_with_args_enter")
    monkeypatch.setattr(annotate_mod, "_RECORD", None)
    net = Net()

    def run() -> None:
        with annotate("step"), instrument(net, ops=True):
            _train_step(net)

    names = set(_annotations(_kineto(tmp_path, run))["name"])
    assert {"step", "/Net/block(2)/fc/aten::addmm", "/Net/conv/aten::convolution"} <= names
    assert not any("profiler::" in n for n in names)


def test_op_type_of_hierarchical_names(tmp_path: Path) -> None:
    net = Net()

    def run() -> None:
        with instrument(net, ops=True):
            _train_step(net)

    ann = _annotations(_kineto(tmp_path, run)).drop_duplicates("name").set_index("name")
    assert ann.at["/Net/block(2)/fc/aten::addmm", "op_type"] == "addmm"
    assert ann.at["/Net/block(2)/fc/aten::addmm/aten::mm(2)", "op_type"] == "mm"
    assert ann.at["/Net/conv/aten::convolution", "op_type"] == "convolution"
