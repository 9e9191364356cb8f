"""The user's line behind each op, and names as the program wrote them.

Real captures: the PyTorch profiler in this process (its Python frames give the
call sites; its in-memory results the exact names, through the sidecar the
capture writes), and the PyProf/DLProf fixture (trace markers with ``file:line``).
"""

from __future__ import annotations

import inspect
import json

import pyprof_capture as capture
import pytest
from nsys_builder import TEMPLATE

import perfguard
from perfguard.analysis import analyze
from perfguard.report.dlprof import detail_table
from perfguard.report.html.analysis_page import render_analysis_html
from perfguard.trace.call_sites import first_user_frame, frame_site, is_library_file

torch = pytest.importorskip("torch")

EXOTIC = 'attn "q<k>&v" naïve→∑'


def _user_step(model, x):
    with torch.profiler.record_function(EXOTIC):
        return torch.softmax(model(x), -1)


def _line_of(fn) -> int:
    return inspect.getsourcelines(fn)[1]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    from perfguard.capture.torch_profiler import profile_torch

    path = tmp_path_factory.mktemp("sites") / "step.pt.trace.json.gz"
    model = torch.nn.Linear(8, 8)
    with profile_torch(path, device="cpu", with_stack=True):
        for _ in range(3):
            with torch.profiler.record_function("perfguard.iteration"):
                _user_step(model, torch.ones(4, 8))
    return path


def test_an_exotic_record_function_name_comes_through_exactly(profiled) -> None:
    # torch's JSON writer writes the name as "unknown": the sidecar holds the real one
    side = json.loads(profiled.with_name(profiled.name + ".perfguard").read_text("utf-8"))
    assert EXOTIC in side["name"]
    names = set(perfguard.load_trace(profiled).ranges["name"].astype(str))
    assert EXOTIC in names and "unknown" not in names, sorted(names)
    ops = analyze(perfguard.load_trace(profiled)).ops
    assert (ops["op_name"] == EXOTIC).any()
    assert (ops["op_name"] == f"{EXOTIC}/aten::softmax").any()


def test_without_the_sidecar_the_json_name_is_what_torch_wrote(profiled, tmp_path) -> None:
    alone = tmp_path / profiled.name
    alone.write_bytes(profiled.read_bytes())
    trace = perfguard.load_trace(alone)
    assert EXOTIC not in set(trace.ranges["name"].astype(str))
    assert any("unknown" in n for n in trace.notes)


def test_each_op_has_the_user_function_it_ran_in(profiled) -> None:
    ops = analyze(perfguard.load_trace(profiled)).ops.set_index("op_name")
    # torch's Python function events record the def line: the site names the function
    here = f"_user_step() at test_call_sites.py:{_line_of(_user_step)}"
    assert ops.loc[f"{EXOTIC}/aten::softmax", "call_site"] == here
    assert ops.loc[f"{EXOTIC}/aten::linear/aten::addmm", "call_site"] == here
    table = detail_table(analyze(perfguard.load_trace(profiled)))
    assert "Call Site" in table.columns
    assert here in set(table["Call Site"].dropna())


def test_library_frames_are_never_the_call_site() -> None:
    assert is_library_file("torch/nn/modules/linear.py")
    assert is_library_file("enum.py") and is_library_file("<frozen importlib._bootstrap>")
    assert is_library_file(inspect.getsourcefile(pytest))
    assert not is_library_file("model.py")
    assert frame_site("torch/nn/modules/module.py(1782): _call_impl") is None
    assert frame_site("model.py(63): forward") == "model.py:63"
    assert frame_site("model.py(15): forward", entry=True) == "forward() at model.py:15"
    assert frame_site("torch/nn/functional.py(9): relu", entry=True) is None
    stacks = first_user_frame(
        __import__("pandas").Series(
            [
                "torch/nn/functional.py(2140): softmax;model.py(63): forward;train.py(9): step",
                "enum.py(1230): __hash__",
                None,
            ]
        )
    )
    assert stacks.tolist() == ["model.py:63", None, None]


@pytest.fixture(scope="module", params=[False, True], ids=["pyprof", "dlprof"])
def pyprof_analysis(request, fixture_file, tmp_path_factory):
    dest = tmp_path_factory.mktemp("pyprof") / f"capture_{request.param}.sqlite"
    path = capture.build(fixture_file(TEMPLATE), dest, dlprof=request.param)
    return analyze(perfguard.load_trace(path))


def test_pyprof_markers_give_conv_and_linear_their_line_in_the_reports(pyprof_analysis) -> None:
    table = detail_table(pyprof_analysis)
    site = dict(zip(table["Op Name"], table["Call Site"], strict=True))
    conv = next(v for k, v in site.items() if k.endswith("conv2d"))
    linear = next(v for k, v in site.items() if k.endswith("linear"))
    assert conv == "/home/user/project/model.py:12"
    assert linear == "/home/user/project/model.py:15"
    html = render_analysis_html(pyprof_analysis)
    assert "<th>Call site</th>" in html
    assert "<code>/home/user/project/model.py:12</code>" in html


def test_a_real_call_stack_gives_the_user_line_and_backward_ops_their_forward_line(
    fixture_file, cached_trace
) -> None:
    """torch 1.9's ``Call stack`` (ResNet-50 training, V100): the innermost frame is
    torch's own module code; the user's line is the script's forward call, and the
    backward convolution, run by autograd, is tied to it by its sequence number."""
    trace = cached_trace(
        fixture_file("kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz")
    )
    sites = set(trace.ranges["call_site"].dropna().astype(str))
    assert sites and all(s.startswith("resnet50_profiler_api.py:") for s in sites), sites
    ops = analyze(trace).ops.set_index("op_name")["call_site"]
    conv = "aten::conv2d/aten::convolution/aten::_convolution/aten::cudnn_convolution"
    assert ops[conv] == "resnet50_profiler_api.py:46"
    back = ops[[n for n in ops.index if n.endswith("aten::cudnn_convolution_backward_input")]]
    assert back.iloc[0] == "resnet50_profiler_api.py:46"
