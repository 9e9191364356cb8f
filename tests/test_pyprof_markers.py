"""PyProf / DLProf NVTX markers: parsed into ops with shapes, dtypes, call site and seq.

The captures are nsys SQLite files written with a real export's schema
(``nsys_builder``) holding the markers exactly as ``pyprof.init()`` and
DLProf's ``nvidia_dlprof_pytorch_nvtx`` write them (``pyprof_capture``).
Every expected value is written out by hand from the model in
``pyprof_capture``'s docstring; FLOPs follow
``shared/reference/tensor_cores_flops.md`` §3.1-3.2.
"""

from __future__ import annotations

import json

import pandas as pd
import pyprof_capture as capture
import pytest
from nsys_builder import TEMPLATE

import perfguard
from perfguard.analysis.flops import op_cost
from perfguard.analysis.tensor_cores import op_tc_eligible
from perfguard.trace import pyprof
from perfguard.trace.names import op_type_of, parse_range_names
from perfguard.trace.pyprof import apply_markers, parse_markers

H200_FP16_TC_PEAK = 989.4e12  # reference §4, dense


@pytest.fixture(scope="module", params=[False, True], ids=["pyprof", "dlprof"])
def built(request, fixture_file, tmp_path_factory):
    dest = tmp_path_factory.mktemp("pyprof") / f"capture_{request.param}.sqlite"
    path = capture.build(fixture_file(TEMPLATE), dest, dlprof=request.param)
    return request.param, perfguard.load_trace(path)


def _op_names(dlprof: bool) -> dict[str, str]:
    if dlprof:  # funcStack, with Class::method written Class.method
        return {
            "conv2d": "/Net.forward/Conv2d.forward/conv2d",
            "relu": "/Net.forward/relu",
            "linear": "/Net.forward/Linear.forward/linear",
        }
    return {op: f"torch.nn.functional.{op}" for op in ("conv2d", "relu", "linear")}


def test_markers_become_ops_with_shapes_dtypes_site_and_seq(built) -> None:
    dlprof, trace = built
    r = trace.ranges.set_index("name")
    names = _op_names(dlprof)
    conv = r.loc[names["conv2d"]]
    assert conv["op_type"] == "conv2d"
    assert json.loads(conv["input_shapes"]) == [
        [32, 3, 32, 32],
        [16, 3, 3, 3],
        [16],
        [],
        [],
        [],
        [],
    ]
    assert json.loads(conv["dtypes"]) == ["c10::Half"] * 3 + ["ScalarList"] * 3 + ["Scalar"]
    assert json.loads(conv["concrete_inputs"]) == ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]
    assert conv["call_site"] == "/home/user/project/model.py:12"  # innermost frame outside torch
    assert conv["seq"] == 12 and conv["direction"] == "fprop"
    relu = r.loc[names["relu"]]  # a kwarg keeps its place after the positional arguments
    assert json.loads(relu["dtypes"]) == ["c10::Half", "Scalar"]
    assert json.loads(relu["concrete_inputs"]) == ["", "False"]
    linear = r.loc[names["linear"]]
    assert (linear["op_type"], linear["seq"]) == ("linear", 15)
    assert json.loads(linear["input_shapes"]) == [[32, 16384], [10, 16384], [10]]
    assert linear["call_site"] == "/home/user/project/model.py:15"


def test_wrappers_and_autograd_forward_ranges_fold_into_the_op(built) -> None:
    dlprof, trace = built
    r = trace.ranges
    assert not r["name"].str.startswith(("{", "pyprof.")).any()
    # forward: the three ops only, roots (the trace markers were their parents)
    fwd = r[r["direction"] == "fprop"]
    assert sorted(fwd["name"]) == sorted(_op_names(dlprof).values())
    assert (fwd["parent_id"] == -1).all()
    # backward: the autograd nodes and their aten ops, untouched
    bwd = r[r["direction"] == "bprop"].set_index("range_id")
    assert sorted(bwd["name"]) == sorted(
        [
            "AddmmBackward0",
            "aten::mm",
            "ReluBackward0",
            "aten::threshold_backward",
            "ConvolutionBackward0",
            "aten::convolution_backward",
        ]
    )
    mm = bwd[bwd["name"] == "aten::mm"].iloc[0]
    assert bwd.loc[mm["parent_id"], "name"] == "AddmmBackward0"


def test_backward_nodes_are_tied_to_their_forward_op_by_seq(built) -> None:
    dlprof, trace = built
    r = trace.ranges.set_index("name")
    names = _op_names(dlprof)
    for node, op in (
        ("ConvolutionBackward0", "conv2d"),
        ("AddmmBackward0", "linear"),
        ("ReluBackward0", "relu"),
    ):
        b, f = r.loc[node], r.loc[names[op]]
        assert b["direction"] == "bprop" and f["direction"] == "fprop"
        assert b["seq"] == f["seq"]
        for col in ("call_site", "dtypes", "input_shapes", "concrete_inputs"):
            assert b[col] == f[col], (node, col)
    # the backward aten ops keep their own (empty) records: no forward formula on backward work
    assert r.loc["aten::convolution_backward", "input_shapes"] is None or pd.isna(
        r.loc["aten::convolution_backward", "input_shapes"]
    )


def test_kernels_belong_to_the_op_and_flops_match_the_formulas(built) -> None:
    dlprof, trace = built
    ops = perfguard.analyze(trace).ops.set_index(["op_name", "direction"])
    names = _op_names(dlprof)
    # conv2d: 2 * N * C_out * H_out * W_out * (C_in / g) * kh * kw, H_out = (32 + 2 - 2 - 1) + 1
    conv_flops = 2 * 32 * 16 * 32 * 32 * 3 * 3 * 3
    assert conv_flops == 28_311_552
    # linear: 2 * numel(x) * out_features
    linear_flops = 2 * (32 * 16384) * 10
    assert linear_flops == 10_485_760
    for op, flops, kernel_ns in (("conv2d", conv_flops, 21_000), ("linear", linear_flops, 9_000)):
        row = ops.loc[(names[op], "fprop")]
        assert row["gpu_time_total"] == kernel_ns  # the op owns its kernel
        assert row["flops"] == flops
        assert bool(row["tc_eligible"]) and bool(row["using_tc"])
        expected = 100 * flops / (kernel_ns * 1e-9) / H200_FP16_TC_PEAK
        assert row["flop_efficiency_pct"] == pytest.approx(expected, rel=1e-9)


def test_kwargs_are_put_in_schema_order_with_defaults() -> None:
    # F.conv2d(x, w, stride=2): PyProf records the kwarg after the positional arguments
    marker = str(
        {
            "mod": "torch.nn.functional",
            "op": "conv2d",
            "args": [
                {"name": "", "type": "tensor", "shape": (8, 4, 10, 10), "dtype": "float32"},
                {"name": "", "type": "tensor", "shape": (6, 4, 3, 3), "dtype": "float32"},
                {"name": "stride", "type": "int", "value": 2},
            ],
        }
    )
    got = parse_markers(pd.Series([marker])).iloc[0]
    assert json.loads(got["concrete_inputs"]) == ["", "", "", "2", "0", "1", "1"]
    cost = op_cost("conv2d", got["input_shapes"], got["dtypes"], got["concrete_inputs"])
    # H_out = floor((10 - 2 - 1) / 2) + 1 = 4; 2 * 8 * 6 * 4 * 4 * 4 * 3 * 3
    assert cost.flops == 2 * 8 * 6 * 4 * 4 * 4 * 3 * 3


def test_each_distinct_name_is_parsed_once(monkeypatch) -> None:
    calls = []
    real = pyprof._parse_one
    monkeypatch.setattr(pyprof, "_parse_one", lambda text: calls.append(text) or real(text))
    distinct = [
        str({"traceMarker": ["/a/train.py:3"]}),
        str(
            {
                "mod": "Tensor",
                "op": "__matmul__",
                "args": [
                    {"name": "", "type": "tensor", "shape": (4, 8), "dtype": "float16"},
                    {"name": "", "type": "tensor", "shape": (8, 2), "dtype": "float16"},
                ],
            }
        ),
        "aten::mm, seq = 3",
        "user range",
    ]
    names = pd.Series(distinct * 50_000)
    parsed = parse_range_names(names)
    assert sorted(calls) == sorted(distinct[:2])  # markers only, once each
    assert parsed["name"].iloc[1] == "Tensor.__matmul__"
    assert op_type_of(parsed["name"].iloc[[1]]).iloc[0] == "matmul"
    assert op_tc_eligible(parsed["name"].iloc[[1]]).iloc[0]
    assert parsed["call_site"].iloc[0] == "/a/train.py:3"
    assert parsed["seq"].iloc[2] == 3 and pd.isna(parsed["seq"].iloc[1])


@pytest.mark.parametrize(
    "text",
    [
        "{'mod': 'torch.nn.functional', 'op': 'conv2d', 'args': [{'name': '', 'typ",  # truncated
        "{'mod': 'torch', 'op': 'cat'}",  # no args
        "{'traceMarker': 'not a list'}",
        "{'mod': 1, 'op': 'x', 'args': []}",
    ],
)
def test_a_marker_that_does_not_parse_stays_a_plain_name(text: str) -> None:
    parsed = parse_range_names(pd.Series([text]))
    assert parsed["name"].iloc[0] == text
    assert pd.isna(parsed["input_shapes"].iloc[0])


def test_ranges_without_markers_are_returned_as_they_are(fixture_file, cached_trace) -> None:
    trace = cached_trace(fixture_file("nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite"))
    assert apply_markers(trace.ranges) is trace.ranges
