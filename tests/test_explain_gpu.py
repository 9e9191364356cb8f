"""The explanation on the GPU path: a real V100 ResNet-50 training capture (the shared
fixture), changed the way GPU code regresses (a kernel made slower, a kernel added,
Tensor Cores lost, both gates and timing), judged, and rendered by every view.

Also cuDNN's autotuning: with ``torch.backends.cudnn.benchmark`` on, the kernels a
convolution runs are chosen by timing in each process (a real H200 run read three of
five unchanged sessions ``regressed`` on them), so their choice is not gated.
"""

from __future__ import annotations

import html

import pandas as pd
import pytest
from test_compare_verdict import RESNET, _copy, _scale_op, _top_gpu_op, rounds_record

from perfguard.analysis import analyze
from perfguard.baseline.record import TestRecord
from perfguard.compare import Outcome, compare_records
from perfguard.compare.results import Run, SessionResults
from perfguard.plugin.summary import results_lines
from perfguard.report.html import write_session_html
from perfguard.report.markdown import render_markdown


@pytest.fixture(scope="module")
def resnet(fixture_file, cached_trace) -> TestRecord:
    return rounds_record("test_resnet", analyze(cached_trace(fixture_file(RESNET))))


def _name(record: TestRecord, op_id: str) -> str:
    return str(record.ops.set_index("op_id").at[op_id, "op_name"])


def _views(c, tmp_path) -> dict[str, str]:
    """What a reviewer reads of one comparison: terminal, summary.md, report.html."""
    doc = SessionResults(tests=[c.entry()], run=Run(commit="c" * 40))
    doc = SessionResults.from_dict(doc.to_dict())  # as every report reads it: checked
    page = write_session_html(doc, tmp_path / "report.html")
    return {
        "terminal": "\n".join(results_lines(doc)),
        "markdown": render_markdown(doc).replace("\\", ""),
        "html": html.unescape(page.read_text(encoding="utf-8")),
    }


def _cudnn_op(record: TestRecord) -> str:
    """The op whose cuDNN kernels take the most GPU time."""
    k = record.kernels[record.kernels["kernel_name"].str.contains("cudnn", regex=False)]
    return str(k.groupby("op_id")["gpu_time_total"].sum().idxmax())


def test_a_slower_kernel_is_named_by_timing_in_every_view(resnet, tmp_path) -> None:
    op = _top_gpu_op(resnet)
    c = compare_records(_scale_op(resnet, op, 1.3), resnet)
    why = c.explanation
    assert c.outcome is Outcome.REGRESSED and why.decided_by == "timing"
    assert why.first.kind == "timing" and why.first.op == _name(resnet, op)
    for view, text in _views(c, tmp_path).items():
        assert why.lead in text, view
        assert why.headline[:120] in text, view


def test_an_added_kernel_is_named_by_the_gates(resnet, tmp_path) -> None:
    op = _top_gpu_op(resnet)
    cur = _copy(resnet)
    row = cur.kernels[cur.kernels["op_id"] == op].head(1).assign(kernel_name="new_fused_kernel")
    cur.kernels = pd.concat([cur.kernels, row], ignore_index=True)
    c = compare_records(cur, resnet)
    why = c.explanation
    assert c.outcome is Outcome.REGRESSED and why.decided_by == "gates"
    assert why.first.kind == "kernel_set" and why.first.op == _name(resnet, op)
    named = _name(resnet, op).replace("autograd::engine::evaluate_function: ", "")
    # with its call site: the backward op takes its forward op's line in the user's script
    site = "resnet50_profiler_api.py:46"
    assert why.lead == f"{named} at {site} launches a new kernel new_fused_kernel"
    assert c.message == f"gates: {why.lead}"
    for view, text in _views(c, tmp_path).items():
        assert why.lead in text, view


def test_tensor_cores_lost_lead_and_timing_joins_when_it_decided_too(resnet) -> None:
    op = _top_gpu_op(resnet)
    base = _copy(resnet)
    base.ops["using_tc"] = base.ops["op_id"] == op
    base.kernels["uses_tc"] = base.kernels["op_id"] == op
    cur = _scale_op(base, op, 1.4)
    cur.ops["using_tc"] = False
    cur.kernels["uses_tc"] = False
    c = compare_records(cur, base)
    why = c.explanation
    assert why.decided_by == "gates and timing"
    assert why.first.kind == "tc_lost" and why.first.op == _name(resnet, op)
    assert c.message.startswith(f"gates: {why.lead}; timing regressed: GPU time +")
    # the change beside the levels is their ratio, in every figure
    assert c.level_current_ns / c.level_baseline_ns - 1 == pytest.approx(c.delta_pct / 100)


def test_autotuned_kernel_choice_is_listed_not_gated(resnet) -> None:
    op = _cudnn_op(resnet)
    cur = _copy(resnet)
    hit = (cur.kernels["op_id"] == op) & cur.kernels["kernel_name"].str.contains("cudnn")
    first = cur.kernels.index[hit][0]
    cur.kernels.loc[first, "kernel_name"] = "sm90_xmma_fprop_implicit_gemm_other_tile_cudnn"
    strict = compare_records(cur, resnet)
    assert strict.outcome is Outcome.REGRESSED  # without autotuning: a real kernel change
    assert any(f.gate == "kernel_set" for f in strict.gates.regressions)
    base = _copy(resnet)
    for record in (cur, base):  # captured with torch.backends.cudnn.benchmark on
        record.meta["autotuned"] = ["cudnn.benchmark"]
    tuned = compare_records(cur, base)
    assert tuned.outcome is Outcome.UNCHANGED, tuned.message
    assert tuned.gates.outcome is Outcome.UNCHANGED
    assert any("(autotuned)" in u for u in tuned.gates.unstable)
    assert "autotuned" in tuned.gates.message
