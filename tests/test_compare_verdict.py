"""Verdicts on records from real captures, perturbed where a known change is needed.

Records come from the Kineto fixtures (resnet50: 6 ProfilerSteps; A100
NCCL training: 3), from a real CPU torch capture made here, and from a real
SQLite store for the CLI. A regression is injected by scaling one op's real
per-iteration samples, and the test-level samples by the same added time,
so the expected figures are known. The p-values are cross-checked against
scipy when it is installed.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfguard.analysis import analyze
from perfguard.baseline.record import Fingerprint, RunInfo, TestRecord, record_from_analysis
from perfguard.compare import Outcome, compare_records, fails
from perfguard.compare.timing import between_run_sd
from perfguard.compare.units import format_ns
from perfguard.errors import CompareError

RESNET = "kineto/v100_resnet50_train_torch1.9_tbplugin.pt.trace.json.gz"
NCCL = "kineto/a100_2rank_nccl_train_rank0.pt.trace.json.gz"
BERT = "kineto/h100_bf16_bert-small_inference_torch2.6.pt.trace.json.gz"


def rounds_record(nodeid: str, analysis) -> TestRecord:
    """A record whose every iteration is a round of its own: the fixtures are one run
    each, and the verdict's replicates are rounds (one iteration each here)."""
    n = int((analysis.iterations["rank"] == analysis.iterations["rank"].min()).sum())
    return record_from_analysis(nodeid, analysis, rounds=np.arange(n))


@pytest.fixture(scope="module")
def resnet(fixture_file, cached_trace) -> TestRecord:
    return rounds_record("test_resnet", analyze(cached_trace(fixture_file(RESNET))))


def _copy(record: TestRecord) -> TestRecord:
    return copy.deepcopy(record)


def _top_gpu_op(record: TestRecord) -> str:
    totals = record.op_samples.groupby("op_id")["gpu_time_ns"].sum()
    return str(totals.idxmax())


def _scale_op(record: TestRecord, op: str, factor: float) -> TestRecord:
    """A copy whose op ``op`` takes ``factor`` times its real time in every iteration."""
    out = _copy(record)
    rows = out.op_samples["op_id"] == op
    old = out.op_samples.loc[rows, "gpu_time_ns"].astype(np.int64)
    extra = (old * (factor - 1.0)).round().astype(np.int64)
    out.op_samples.loc[rows, "gpu_time_ns"] = old + extra
    added = extra.groupby(out.op_samples.loc[rows, "iteration"].to_numpy()).sum()
    out.samples["gpu_time_ns"] += (
        added.reindex(out.samples["iteration"]).fillna(0).to_numpy(np.int64)
    )
    return out


def stats_t_ppf(q: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def _log_change(cur: TestRecord, base: TestRecord) -> float:
    """The change the judge reports, computed here from the rounds: the ratio of the
    rounds' geometric means, in %."""
    rc, rb = np.log(cur.round_values()), np.log(base.round_values())
    return 100 * math.expm1(rc.mean() - rb.mean())


def test_identical_records_are_unchanged(resnet: TestRecord) -> None:
    c = compare_records(resnet, _copy(resnet))
    assert c.outcome is Outcome.UNCHANGED and c.p_value == 1.0
    assert c.delta_pct == 0.0 and c.n_current == c.n_baseline == 6  # rounds
    assert c.ci_low_pct <= 0 <= c.ci_high_pct
    assert (c.ops["status"] == "unchanged").all() and c.kernel_changes.empty
    assert c.timing.mode == "store" and c.gates.outcome is Outcome.UNCHANGED
    assert c.message.startswith("within the threshold") and not fails(c.outcome)
    # no history yet: the prior between-run noise of GPU time (1 %) is assumed and said
    assert "0 of the 5 runs needed" in c.timing.replicated and "1% assumed" in c.message


def test_scaled_op_is_a_regression_named_in_the_message(resnet: TestRecord) -> None:
    op = _top_gpu_op(resnet)
    cur = _scale_op(resnet, op, 1.5)
    c = compare_records(cur, resnet, baseline_commit="0123456789abcdef0123")
    assert c.outcome is Outcome.REGRESSED and fails(c.outcome) and not fails(c.outcome, "never")
    assert c.timing.outcome is Outcome.REGRESSED and c.gates.outcome is Outcome.UNCHANGED
    assert c.delta_pct == pytest.approx(_log_change(cur, resnet))
    assert c.delta_pct > 5 and c.ci_low_pct > 0 and c.p_value < 0.01
    assert c.samples_current == [int(v) for v in cur.values()]
    assert c.rounds_current == [int(v) for v in cur.round_values()]
    # 137 ops, 6 rounds a side: after Benjamini-Hochberg no single op is significant,
    # so the message names the largest mover, the scaled op, with its change
    top = c.ops.iloc[0]
    assert top["op_id"] == op and top["delta_pct"] == pytest.approx(50.0, abs=0.01)
    name = resnet.ops.set_index("op_id").loc[op, "op_name"]
    why = c.explanation
    assert why.decided_by == "timing" and why.first.kind == "timing" and why.first.op == name
    # the op is named with its call site in the user's script (the capture's stacks)
    assert f"{name} at resnet50_profiler_api.py:46: GPU time" in c.message
    assert "(+50.0%; per-op times not judged)" in c.message
    assert c.message.startswith("timing regressed: GPU time")
    assert "slower beyond the threshold" in c.message and "6/6 rounds" in c.message
    # the change is the ratio of the levels it is shown between
    assert c.level_current_ns / c.level_baseline_ns - 1 == pytest.approx(c.delta_pct / 100)


def test_improvement_is_symmetric(resnet: TestRecord) -> None:
    op = _top_gpu_op(resnet)
    c = compare_records(_scale_op(resnet, op, 0.5), resnet)
    assert c.outcome is Outcome.IMPROVED and not fails(c.outcome)
    assert c.ci_high_pct < 0 and c.ops.iloc[0]["op_id"] == op
    assert c.explanation.first.kind == "timing" and "(-50.0%" in c.explanation.first.text
    assert c.message.startswith("timing improved")


def test_a_change_inside_the_noise_is_not_a_regression(resnet: TestRecord) -> None:
    op = _top_gpu_op(resnet)
    cur = _scale_op(resnet, op, 1.1)  # the op is ~24% of the step: about +2.4% in all
    c = compare_records(cur, resnet)
    assert 0 < c.delta_pct < 5 and c.outcome is Outcome.UNCHANGED
    assert c.ci_low_pct < 0 and "within the threshold" in c.message
    tight = compare_records(cur, resnet, tolerance=0.01)
    assert tight.outcome is Outcome.UNCHANGED and tight.timing.threshold_pct > 1
    # a quiet history of this machine (0.2 % between runs) replaces the prior (1 %): the
    # threshold falls to what the rounds themselves allow, the larger standard error
    history = resnet.round_values().mean() * (1 + 0.002 * np.array([0, 1, -1, 1, 0, -1, 1]))
    h = compare_records(cur, resnet, tolerance=0.01, history=history)
    assert h.timing.history_runs == 7 and "from 7 stored runs" in h.timing.replicated
    rc, rb = np.log(cur.round_values()), np.log(resnet.round_values())
    se_rounds = math.sqrt(rc.var(ddof=1) / 6 + rb.var(ddof=1) / 6)
    se = max(se_rounds, between_run_sd(history) * math.sqrt(2.0))
    t = stats_t_ppf(0.995, 6)
    assert h.timing.threshold_pct == pytest.approx(100 * max(0.01, math.expm1(t * se)), rel=1e-6)
    assert h.timing.threshold_pct < tight.timing.threshold_pct


def test_rounds_that_disagree_are_noisy(resnet: TestRecord) -> None:
    cur = _copy(resnet)
    cur.samples["gpu_time_ns"] = (
        cur.samples["gpu_time_ns"] * np.array([1.0, 1.0, 1.0, 1.2, 1.2, 1.2])
    ).astype(np.int64)
    c = compare_records(cur, resnet)
    assert c.delta_pct > 5 and c.ci_low_pct < 0
    assert c.timing.spread_pct > 5
    assert c.outcome is Outcome.NOISY and c.message.startswith("too noisy to resolve")
    assert not fails(c.outcome)


def test_one_round_is_never_judged_on_timing(fixture_file, cached_trace) -> None:
    rec = record_from_analysis("test_nccl", analyze(cached_trace(fixture_file(NCCL))))
    slower = _scale_op(rec, _top_gpu_op(rec), 3.0)
    c = compare_records(slower, rec)
    # three iterations of one run are not three runs: no timing verdict, and the
    # gates (same ops, launches, FLOPs) have nothing to say, so not judged
    assert c.n_current == 1 and c.outcome is Outcome.NOT_JUDGED and not fails(c.outcome)
    assert c.timing.outcome is Outcome.NOT_JUDGED
    assert c.message.startswith("too few rounds to judge timing")
    assert c.gates.outcome is Outcome.UNCHANGED
    assert c.ops["p_value"].isna().all()


def test_no_baseline_new_and_incomparable(resnet: TestRecord, fixture_file, cached_trace) -> None:
    c = compare_records(resnet, None)
    assert c.outcome is Outcome.NO_BASELINE and c.message.startswith("no baseline")
    c = compare_records(resnet, None, baseline_run_exists=True, baseline_commit="abc1234")
    assert c.outcome is Outcome.NEW and "abc1234" in c.message
    reason = Fingerprint(gpu_name="B", backend="nsys").incompatibility(
        Fingerprint(gpu_name="A", backend="nsys")
    )
    c = compare_records(_scale_op(resnet, _top_gpu_op(resnet), 2.0), resnet, incompatibility=reason)
    assert c.outcome is Outcome.INCOMPARABLE and "gpu_name differs" in c.message
    assert not fails(c.outcome)
    cpu = _copy(resnet)
    cpu.metric = "wall_time"
    c = compare_records(cpu, resnet)
    assert c.outcome is Outcome.INCOMPARABLE and "metrics differ" in c.message
    with pytest.raises(CompareError):
        compare_records(resnet, resnet, alpha=1.5)
    with pytest.raises(CompareError):
        fails(c.outcome, "always")


def test_ops_added_removed_and_sorted(resnet: TestRecord) -> None:
    cur = _copy(resnet)
    gone = _top_gpu_op(resnet)
    cur.op_samples = cur.op_samples[cur.op_samples["op_id"] != gone]
    cur.ops = cur.ops[cur.ops["op_id"] != gone]
    extra = resnet.op_samples[resnet.op_samples["op_id"] == gone].assign(op_id="feedfacefeedface")
    cur.op_samples = pd.concat([cur.op_samples, extra.head(3)], ignore_index=True)
    c = compare_records(cur, resnet)
    ops = c.ops.set_index("op_id")
    assert ops.loc[gone, "status"] == "removed" and math.isnan(ops.loc[gone, "current_ns"])
    assert ops.loc["feedfacefeedface", "status"] == "added"
    gap = (c.ops["current_ns"].fillna(0) - c.ops["baseline_ns"].fillna(0)).abs().to_numpy()
    assert (np.diff(gap) <= 0).all() and c.ops.iloc[0]["op_id"] == gone


def test_deterministic_kernel_findings(resnet: TestRecord) -> None:
    base = _copy(resnet)
    op = _top_gpu_op(resnet)
    base.ops["using_tc"] = base.ops["op_id"] == op
    base.kernels["uses_tc"] = base.kernels["op_id"] == op
    base.ops["flops"] = base.ops["calls"].astype(float) * 1e9
    cur = _copy(base)
    cur.ops["using_tc"] = False
    cur.kernels["uses_tc"] = False
    cur.ops.loc[cur.ops["op_id"] == op, "flops"] *= 2
    kernels = cur.kernels[cur.kernels["op_id"] == op]
    victim = kernels.index[0]
    renamed = cur.kernels.loc[victim, "kernel_name"]
    cur.kernels.loc[victim, "kernel_name"] = "brand_new_kernel"
    other = cur.kernels.index[cur.kernels["op_id"] != op][0]
    per_iter = cur.kernels.loc[other, "calls"] / len(cur.samples)
    cur.kernels.loc[other, "calls"] *= 3
    c = compare_records(cur, base)
    kc = c.kernel_changes
    by = {k: g for k, g in kc.groupby("kind")}
    assert set(by) == {"tc_lost", "added", "removed", "count_changed", "flops_changed"}
    assert by["tc_lost"]["baseline"].tolist() == [True] and by["tc_lost"]["current"].tolist() == [
        False
    ]
    assert by["added"]["kernel_name"].tolist() == ["brand_new_kernel"]
    assert by["removed"]["kernel_name"].tolist() == [renamed]
    assert by["count_changed"]["current"].iloc[0] == pytest.approx(
        by["count_changed"]["baseline"].iloc[0] + 2 * per_iter
    )
    assert by["flops_changed"]["current"].iloc[0] == 2 * by["flops_changed"]["baseline"].iloc[0]
    # the gates make them a regression, each named (timing alone is unchanged)
    assert c.outcome is Outcome.REGRESSED and c.timing.outcome is Outcome.UNCHANGED
    gates = {f.gate for f in c.gates.regressions}
    assert {"tc_lost", "kernel_set"} <= gates, c.gates.message
    why = c.explanation
    assert why.decided_by == "gates" and why.first.kind == "tc_lost"
    assert c.message.startswith("gates: ") and "lost Tensor Cores" in c.message
    assert any("launches a new kernel brand_new_kernel" in x.text for x in why.culprits)
    assert all(x.kind != "timing" for x in why.culprits)  # timing did not decide
    gained = compare_records(base, cur).kernel_changes
    assert gained["kind"].tolist().count("tc_gained") == 1


def test_to_dict_is_json_safe(resnet: TestRecord) -> None:
    c = compare_records(_scale_op(resnet, _top_gpu_op(resnet), 1.5), resnet)
    d = json.loads(json.dumps(c.to_dict(), allow_nan=False))
    assert d["outcome"] == "regressed" and d["timing"]["ci_level_pct"] == 99
    assert "delta_pct" not in d and d["timing"]["delta_pct"] == c.delta_pct  # one home
    assert d["timing"]["outcome"] == "regressed" and d["gates"]["outcome"] == "unchanged"
    assert len(d["ops"]) == len(c.ops)
    assert set(d["ops"][0]) == set(c.ops.columns)
    assert d["samples_baseline"] == [int(v) for v in resnet.values()]
    none = compare_records(resnet, None).to_dict()
    assert (
        none["timing"]["p_value"] is None and none["ops"] == [] and none["outcome"] == "no-baseline"
    )


def test_op_p_values_match_scipy(resnet: TestRecord) -> None:
    """Per-op p-values: the exact U test on the rounds, then Benjamini-Hochberg."""
    stats = pytest.importorskip("scipy.stats")
    op = _top_gpu_op(resnet)
    cur = _scale_op(resnet, op, 1.07)
    c = compare_records(cur, resnet)
    ops = c.ops.set_index("op_id")
    shared = [i for i in ops.index if ops.loc[i, "status"] not in ("added", "removed")]
    raw = []
    for i in shared:
        x, y = cur.op_values(i), resnet.op_values(i)
        x = np.pad(x, (0, 6 - len(x))) if len(x) < 6 else x  # absent in an iteration = 0
        y = np.pad(y, (0, 6 - len(y))) if len(y) < 6 else y
        same = np.array_equal(np.sort(x), np.sort(y)) and np.ptp(np.r_[x, y]) == 0
        raw.append(1.0 if same else stats.mannwhitneyu(x, y, method="exact").pvalue)
    adjusted = stats.false_discovery_control(np.array(raw), method="bh")
    got = ops.loc[shared, "p_value"].to_numpy(np.float64)
    assert got == pytest.approx(np.minimum(adjusted, 1.0), rel=1e-6)


# ------------------------------------------------------------------ a real CPU run


def _cpu_capture(path: Path, hidden: int, iterations: int = 8) -> Path:
    torch = pytest.importorskip("torch")
    from perfguard.capture import profile_torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 8)
    )
    x = torch.randn(16, 64)
    with profile_torch(path, device="cpu", with_stack=False, record_shapes=False, with_flops=False):
        for _ in range(iterations):
            with torch.profiler.record_function("perfguard.iteration"):
                model(x).sum().backward()
    return path


@pytest.fixture(scope="module")
def cpu_capture(tmp_path_factory) -> Path:
    return _cpu_capture(tmp_path_factory.mktemp("cpu") / "mlp.json", 32)


def test_real_cpu_run_against_itself_and_a_gpu_capture(cpu_capture: Path, resnet) -> None:
    from perfguard.trace import load_trace

    rec = rounds_record("test_mlp", analyze(load_trace(cpu_capture)))
    assert rec.metric == "wall_time" and len(rec.samples) == 8
    c = compare_records(rec, _copy(rec))
    # one CPU iteration per round: the rounds may spread past 5 %, then it reads noisy
    assert c.outcome in (Outcome.UNCHANGED, Outcome.NOISY) and c.delta_pct == 0
    assert c.p_value == 1.0 and c.n_baseline == 8
    linear = c.ops[c.ops["op_name"] == "aten::linear"]
    assert len(linear) == 1 and linear["calls_current"].iloc[0] == 2  # two Linear layers
    c = compare_records(rec, resnet)
    assert c.outcome is Outcome.INCOMPARABLE and "wall_time" in c.message


# ------------------------------------------------------------------ the CLI


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfguard", "compare", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_cli_two_fixtures(tmp_path: Path, fixture_file) -> None:
    out = tmp_path / "cmp.json"
    p = _cli(str(fixture_file(NCCL)), str(fixture_file(BERT)), "--json", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "incomparable" in p.stdout and "gpu differs" in p.stdout
    (test,) = json.loads(out.read_text())["tests"]
    assert test["outcome"] == "incomparable" and len(test["samples_current"]) == 3


def test_cli_stored_runs(tmp_path: Path, resnet: TestRecord) -> None:
    from perfguard.baseline.store import Store

    fp = Fingerprint(gpu_name="Tesla V100-DGXS-32GB", gpu_count=1, backend="torch")
    a, gone = _copy(resnet), _copy(resnet)
    gone.nodeid = "test_gone"
    cur = _scale_op(resnet, _top_gpu_op(resnet), 1.5)
    fresh = _copy(resnet)
    fresh.nodeid = "test_fresh"
    db = tmp_path / "perfguard.db"
    with Store(db) as store:
        base_id = store.save_run(
            RunInfo("a" * 40, "main", False, "2025-01-01T00:00:00Z", fp), [a, gone]
        )
        cur_id = store.save_run(
            RunInfo("b" * 40, "pr", False, "2025-01-02T00:00:00Z", fp), [cur, fresh]
        )
    out = tmp_path / "cmp.json"
    p = _cli(f"{db}#{cur_id}", f"{db}#{base_id}", "--json", str(out), cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert "REGRESSED test_resnet" in p.stdout and "MISSING test_gone" in p.stdout
    tests = {t["nodeid"]: t for t in json.loads(out.read_text())["tests"]}
    assert tests["test_resnet"]["outcome"] == "regressed"
    assert tests["test_resnet"]["baseline_commit"] == "a" * 40
    assert tests["test_fresh"]["outcome"] == "new"
    p = _cli(f"{db}#{base_id}", f"{db}#{base_id}", "--tolerance", "5%", cwd=tmp_path)
    assert p.returncode == 0 and "unchanged" in p.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["missing.json", "missing.json"], "missing.json"),
        (["--tolerance", "5", "a", "b"], "ambiguous"),
        (["{db}#x", "{db}#1"], "run id must be an integer"),
        (["{db}#7", "{db}#7"], "no run 7"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    from perfguard.baseline.store import Store

    db = tmp_path / "s.db"
    Store(db).close()
    p = _cli(*[a.format(db=db) for a in args], cwd=tmp_path)
    assert p.returncode == 2 and needle in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_message_names_an_added_op_that_moved_more_than_a_regressed_one(resnet) -> None:
    """The plugin's case: a real extra op is the slowdown, while a contended op also
    reads as regressed by less; the message names the op that moved the most."""
    base = resnet
    second = base.op_samples.groupby("op_id")["gpu_time_ns"].sum().sort_values().index[-2]
    cur = _scale_op(base, second, 1.10)  # a small, significant regression
    top = base.op_samples[base.op_samples["op_id"] == _top_gpu_op(base)]
    extra = top.assign(op_id="feedfacefeedface")  # as big as the top op: added
    cur.op_samples = pd.concat([cur.op_samples, extra], ignore_index=True)
    per_it = extra.groupby("iteration")["gpu_time_ns"].sum()
    cur.samples["gpu_time_ns"] += per_it.reindex(cur.samples["iteration"]).to_numpy(np.int64)
    c = compare_records(cur, base)
    assert c.outcome == "regressed"
    ops = c.ops.set_index("op_id")
    assert ops.loc["feedfacefeedface", "status"] == "added"
    assert ops.loc[second, "delta_pct"] == pytest.approx(10.0, abs=0.01)
    # no ops row was made for the new op, so its id stands in for its name
    added = format_ns(float(np.median(per_it)))
    assert c.explanation.first.op == "feedfacefeedface" and c.explanation.first.kind == "added"
    assert "largest mover feedfacefeedface ×" in c.message
    assert f"added ({added} per iteration)" in c.message
