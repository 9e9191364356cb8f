"""pytest-benchmark's ``benchmark`` fixture under ``pytest --perfguard``, and its saved runs
imported into the store: real pytest-benchmark, real torch captures, real git repositories.

The project under test is what a pytest-benchmark user has: a small torch model's forward
(``benchmark(fn, *args)``), the same forward with a fresh input made by ``pedantic``'s
``setup``, and a numpy transform that is not marked (pytest-benchmark's, unless
``--perfguard-benchmarks`` selects it). The regression is a real extra op in the forward,
which the gates see whatever the machine's load.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: F401

pytest.importorskip(
    "pytest_benchmark",
    reason="pytest-benchmark is not installed (pip install -e '.[test]' brings it)",
)

# Loaded here, before pytester snapshots sys.modules: an in-process run would otherwise
# drop torch after each run, and importing it again crashes (see tests/test_plugin.py).
from test_plugin import _profiler_loaded, commit, entry, init_repo, results  # noqa: E402,F401

import perfguard.plugin.session  # noqa: E402,F401
from perfguard.baseline.git import match_runs  # noqa: E402
from perfguard.baseline.import_benchmark import (  # noqa: E402
    MAX_ROUNDS,
    SOURCE,
    import_benchmarks,
    read_benchmark_run,
)
from perfguard.baseline.record import Fingerprint  # noqa: E402
from perfguard.baseline.store import open_store  # noqa: E402
from perfguard.cli import main as perfguard_main  # noqa: E402
from perfguard.compare.history import load_history  # noqa: E402
from perfguard.plugin.benchmark_fixture import _Call  # noqa: E402

pytest_plugins = ["pytester"]

DATA = Path(__file__).parent / "data" / "pytest_benchmark"

LIB = """
import numpy as np
import torch

torch.set_num_threads(1)
EXTRA_OP = {extra}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 16)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if EXTRA_OP:
            h = torch.nn.functional.layer_norm(h, h.shape[-1:])
        return self.fc2(h)


def forward(model, x):
    with torch.no_grad():
        return model(x)


def normalise(rows):
    centred = rows - rows.mean(axis=0)
    return centred / (np.linalg.norm(centred, axis=1, keepdims=True) + 1e-9)
"""

TESTS = """
import json

import numpy as np
import pytest
import torch

from mylib import Mlp, forward, normalise


@pytest.mark.gpuprofile(iterations=4, warmup=1, rounds=3, tolerance="50%")
def test_forward(benchmark):
    model, x = Mlp(), torch.randn(8, 64)
    out = benchmark(forward, model, x)
    assert out.shape == (8, 16)


@pytest.mark.gpuprofile(iterations=4, warmup=1, rounds=3, tolerance="50%")
def test_forward_fresh_input(benchmark):
    model, calls = Mlp(), {"setup": 0, "forward": 0}

    def setup():
        calls["setup"] += 1
        return (model, torch.randn(8, 64)), {}

    def counted(model, x):
        calls["forward"] += 1
        return forward(model, x)

    out = benchmark.pedantic(counted, setup=setup, rounds=20, warmup_rounds=2)
    assert out.shape == (8, 16)
    with open("calls.json", "w") as fh:
        json.dump(calls, fh)


def test_normalise(benchmark):
    rows = np.random.default_rng(0).random((64, 32))
    out = benchmark(normalise, rows)
    assert out.shape == rows.shape
"""

FORWARD = "test_bench.py::test_forward"
FRESH = "test_bench.py::test_forward_fresh_input"
NUMPY = "test_bench.py::test_normalise"


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runs are not xdist workers, even when this suite runs under ``-n``:
    pytest-benchmark switches itself off where ``PYTEST_XDIST_WORKER`` is set."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A git repository holding the library and its pytest-benchmark tests (commit A)."""
    init_repo(pytester)
    pytester.makepyfile(mylib=LIB.format(extra=False), test_bench=TESTS)
    pytester.syspathinsert()
    commit(pytester.path, "A")
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def calls(pytester: pytest.Pytester) -> dict[str, int]:
    """How often the pedantic test's setup and function ran (the test writes it down)."""
    return json.loads((pytester.path / "calls.json").read_text())


def stored_ops(pytester: pytest.Pytester, nodeid: str) -> tuple[set[str], set[str]]:
    """The ops of the test's record in the latest stored run: those of its recorded steps
    (with per-iteration samples, which the gates' counters and per-op times come from),
    and those of the whole capture."""
    with open_store(pytester.path / "baselines" / "perfguard.db", create=False) as s:
        _, records = s.load_run(int(s.runs()["run_id"].max()))
    rec = records[nodeid]
    stepped = rec.ops[rec.ops["op_id"].isin(set(rec.op_samples["op_id"]))]
    return set(stepped["op_name"]), set(rec.ops["op_name"])


# ------------------------------------------------------------------------- the fixture


def test_benchmark_tests_measured_judged_and_regressed(project: pytest.Pytester) -> None:
    # commit A saved: the two marked tests are perfguard's; the unmarked one stays
    # pytest-benchmark's, with its own table
    r = run(project, "--perfguard-save")
    r.assert_outcomes(passed=3)
    r.stdout.fnmatch_lines(
        [
            "*= perfguard =*",
            f"{FORWARD}*no-baseline*",
            f"{FRESH}*no-baseline*",
            "*benchmark: 1 tests*",
            "test_normalise*",
        ]
    )
    doc = results(project)
    assert sorted(t["nodeid"] for t in doc["tests"]) == [FORWARD, FRESH]
    fwd, fresh = entry(doc, FORWARD), entry(doc, FRESH)
    assert (
        fwd["timing"]["metric"] == "wall_time" and fwd["timing"]["n_current"] == 3
    )  # the marker's rounds
    assert len(fwd["samples_current"]) == 12  # 3 rounds of 4 timed calls
    ops, _ = stored_ops(project, FORWARD)
    assert any("addmm" in op for op in ops), ops  # the profiled round captured the forward
    notes = " ".join(fresh["notes"])
    assert (
        "benchmark.pedantic(rounds=20, warmup_rounds=2, iterations=1) ran as perfguard's "
        "loop: 1 warm-up call(s), 3 round(s) of 4 timed call(s)" in notes
    ), notes
    # a fresh input before every call: perfguard's warm-up and rounds, 1 + 3 x 4 + 4 (the
    # profiled round), more when a round ran while the machine was slow and ran again
    assert calls(project)["setup"] == calls(project)["forward"] >= 1 + 3 * 4 + 4
    # and outside the iterations: the setup's randn was captured, but is no op of the step
    steps, captured = stored_ops(project, FRESH)
    assert any("addmm" in op for op in steps), steps
    assert any("randn" in op for op in captured), captured
    assert not any("randn" in op or "normal_" in op for op in steps), steps

    # commit B adds a real op to the forward: both tests regress on the gates, each failing
    # with the op named; the unmarked test still passes under pytest-benchmark
    project.makepyfile(mylib=LIB.format(extra=True))
    commit(project.path, "B: layer norm after the hidden layer")
    r = run(project, "--perfguard")
    r.assert_outcomes(passed=1, failed=2)
    r.stdout.fnmatch_lines([f"{FORWARD}*regressed*", f"FAILED {FORWARD} - Failed: perfguard: *"])
    doc = results(project)
    for nodeid in (FORWARD, FRESH):
        e = entry(doc, nodeid)
        assert e["outcome"] == "regressed", e["message"]
        assert e["message"].startswith("gates: "), e["message"]
        assert "layer_norm" in e["explanation"]["culprits"][0]["op"], e["explanation"]
    summary = (project.path / ".perfguard" / "summary.md").read_text().replace("\\_", "_")
    assert "layer_norm" in summary and FORWARD in summary


def test_option_selects_every_benchmark_test(project: pytest.Pytester) -> None:
    r = run(project, "--perfguard", "--perfguard-benchmarks", "--benchmark-disable")
    r.assert_outcomes(passed=3)
    doc = results(project)
    assert sorted(t["nodeid"] for t in doc["tests"]) == [FORWARD, FRESH, NUMPY]
    assert doc["settings"]["benchmarks"] is True
    numpy_test = entry(doc, NUMPY)
    assert numpy_test["timing"]["n_current"] == 5  # no marker: perfguard's default rounds
    assert len(numpy_test["samples_current"]) == 5 * 30  # and iterations
    # a numpy step runs no torch op: said, not judged silently
    assert "captured no ops" in numpy_test["message"], numpy_test["message"]
    # pytest-benchmark measured nothing: no table of its own
    assert not re.search(r"benchmark: \d+ tests", r.stdout.str())


def test_without_perfguard_pytest_benchmark_measures_everything(project: pytest.Pytester) -> None:
    r = run(project, "--benchmark-disable")
    r.assert_outcomes(passed=3)
    assert not (project.path / ".perfguard").exists()
    assert calls(project) == {"setup": 1, "forward": 1}  # disabled: one call
    r = run(project, "--benchmark-min-rounds=3", "--benchmark-max-time=0.01", "-k", "forward")
    r.assert_outcomes(passed=2)
    r.stdout.fnmatch_lines(["*benchmark: 2 tests*"])
    assert calls(project) == {"setup": 22, "forward": 22}  # pedantic's own rounds=20 + 2


def test_without_pytest_benchmark(project: pytest.Pytester) -> None:
    """``-p no:benchmark`` stands for an environment without pytest-benchmark: perfguard
    still measures the marked tests; an unmarked one is a clear failure, not a crash."""
    r = run(project, "--perfguard", "-p", "no:benchmark")
    r.assert_outcomes(passed=2, errors=1)
    r.stdout.fnmatch_lines(
        [f"*{NUMPY} uses the benchmark fixture, which is pytest-benchmark's (not installed here)*"]
    )
    doc = results(project)
    assert sorted(t["nodeid"] for t in doc["tests"]) == [FORWARD, FRESH]


def test_pedantic_arguments_checked_as_pytest_benchmark_does(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_args="""
import pytest

@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=1)
def test_setup_with_iterations(benchmark):
    with pytest.raises(ValueError, match="iterations"):
        benchmark.pedantic(sum, setup=lambda: None, iterations=2)
    with pytest.raises(ValueError, match="rounds"):
        benchmark.pedantic(sum, rounds=0)
    seen = []
    assert benchmark.pedantic(sum, args=([1, 2],), teardown=lambda xs: seen.append(xs)) == 3
    assert len(seen) >= 4 and all(x == [1, 2] for x in seen)  # after each call, with its args

@pytest.mark.gpuprofile(iterations=2, warmup=0, rounds=1)
def test_once(benchmark):
    assert benchmark(sum, [1, 2]) == 3
    with pytest.raises(RuntimeError, match="only be used once"):
        benchmark(sum, [1])
"""
    )
    r = run(project, "--perfguard", "test_args.py", "--perfguard-fail-on=never")
    r.assert_outcomes(passed=2)
    call = _Call(lambda: (([2],), {}), ([1],), {})
    with pytest.raises(TypeError, match="setup` returns the arguments"):
        call.prepare()


# ------------------------------------------------------------------------- the import

SLOW = """
import time


def work():
    time.sleep({pause})
    return sum(range(2000))


def test_work(benchmark):
    assert benchmark(work) == 1999000
"""


def autosave(pytester: pytest.Pytester, *extra: str) -> None:
    r = run(
        pytester,
        "--benchmark-autosave",
        "--benchmark-min-rounds=5",
        "--benchmark-max-time=0.05",
        "--benchmark-warmup=off",
        *extra,
    )
    r.assert_outcomes(passed=1)


def test_import_autosaved_history(pytester: pytest.Pytester, capsys) -> None:
    init_repo(pytester)
    shas = []
    for i, pause in enumerate((0.002, 0.002, 0.030)):  # 15x: a loaded box cannot close it
        pytester.makepyfile(test_slow=SLOW.format(pause=pause) + f"# commit {i}\n")
        shas.append(commit(pytester.path, f"commit {i}"))
        autosave(pytester, *(["--benchmark-save-data"] if i != 1 else []))
    saves = sorted((pytester.path / ".benchmarks").rglob("*.json"))
    assert len(saves) == 3
    store = str(pytester.path / "imported.db")
    capsys.readouterr()
    assert perfguard_main(["baseline", "import", ".benchmarks", "--store", store]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3, out
    assert (
        f"imported 1 pytest-benchmark run of commit {shas[0][:12]} (1 test record(s), "
        "each with its rounds)" in out[0]
    )
    assert "each as its median" in out[1]
    # the same folder again (a CI cache restored): nothing added
    assert perfguard_main(["baseline", "import", ".benchmarks", "--store", store]) == 0
    again = capsys.readouterr().out.splitlines()
    assert all(": already in " in line for line in again), again
    with open_store(store, create=False) as s:
        runs = s.runs()
        assert list(runs["commit"]) == shas
        hist = load_history(s, "test_slow.py::test_work", repo=pytester.path)
    assert hist.fingerprint.backend == SOURCE and hist.metric == "wall_time"
    docs = [json.loads(p.read_text()) for p in saves]
    # each run's level is perfguard's, the geometric mean of its rounds (every view's
    # one figure for a run), near pytest-benchmark's own median, which its meta keeps
    medians = [d["benchmarks"][0]["stats"]["median"] * 1e9 for d in docs]
    with open_store(store, create=False) as s:
        records = [s.reader.load_run(int(i))[1]["test_slow.py::test_work"] for i in runs["run_id"]]
        levels = [float(np.exp(np.mean(np.log(r.round_values())))) for r in records]
    assert list(hist.levels["value"]) == pytest.approx(levels, rel=1e-12)
    assert list(hist.levels["value"]) == pytest.approx(medians, rel=0.1)
    assert list(hist.levels["n_rounds"]) == [
        docs[0]["benchmarks"][0]["stats"]["rounds"],
        1,
        docs[2]["benchmarks"][0]["stats"]["rounds"],
    ]
    # the real slowdown: a 30 ms sleep cannot read faster than 30 ms, and a 2 ms one read
    # 11.8 ms at its slowest (a full suite beside three other jobs)
    assert hist.levels["value"].iloc[2] >= 30e6 > hist.levels["value"].iloc[0]
    # perfguard history prints it
    assert (
        perfguard_main(
            ["history", "test_slow.py::test_work", "--store", store, "--repo", str(pytester.path)]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "3 run(s) on CPU" in text and "[pytest-benchmark]" in text, text


def test_import_committed_save() -> None:
    """A real ``--benchmark-autosave --benchmark-save-data`` file (tests/data/pytest_benchmark,
    made by the demo in the README's section): every figure comes from the file."""
    (path,) = sorted(DATA.glob("*.json"))
    doc = json.loads(path.read_text())
    run_ = read_benchmark_run(path)
    assert run_.run.commit == doc["commit_info"]["id"]
    assert run_.run.branch == doc["commit_info"]["branch"]
    assert run_.run.fingerprint.backend == SOURCE
    assert run_.run.fingerprint.host == doc["machine_info"]["node"]
    assert run_.run.fingerprint.cpu == doc["machine_info"]["cpu"]["brand_raw"]
    by_name = {b["fullname"]: b for b in doc["benchmarks"]}
    assert sorted(r.nodeid for r in run_.records) == sorted(by_name)
    for record in run_.records:
        stats = by_name[record.nodeid]["stats"]
        values = record.values()
        assert len(values) == min(stats["rounds"], MAX_ROUNDS)
        assert min(values) == pytest.approx(stats["min"] * 1e9, abs=1)
        assert max(values) == pytest.approx(stats["max"] * 1e9, abs=1)
        assert record.meta["pytest_benchmark"]["stats"]["median"] == stats["median"]


def test_import_is_idempotent_and_bad_files_are_named(tmp_path: Path, capsys) -> None:
    (path,) = sorted(DATA.glob("*.json"))
    folder = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    folder.mkdir(parents=True)
    (folder / path.name).write_text(path.read_text())
    doc = json.loads(path.read_text())
    doc["commit_info"] = {"id": "unversioned", "error": "not a git repository"}
    (folder / "0007_unversioned.json").write_text(json.dumps(doc))
    (folder / "0008_cut.json").write_text(path.read_text()[:200])
    store = tmp_path / "s.db"
    with open_store(store) as s:
        first = import_benchmarks(s, tmp_path / ".benchmarks")
        second = import_benchmarks(s, tmp_path / ".benchmarks")
        assert len(s.runs()) == 1
    assert [bool(f.imported and f.imported.added) for f in first] == [True, False, False]
    assert [bool(f.imported and f.imported.added) for f in second] == [False, False, False]
    assert "records no git commit (not a git repository)" in str(first[1].error)
    assert "not JSON" in str(first[2].error)
    capsys.readouterr()
    bad = [str(folder / "0007_unversioned.json"), str(folder / "0008_cut.json")]
    assert perfguard_main(["baseline", "import", *bad, "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.count("skipped ") == 2 and "nothing imported" in err, err
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT count(*) FROM tests").fetchone() == (len(doc["benchmarks"]),)
    # imported history is read, never a perfguard session's baseline: its first session
    # over that commit reads no-baseline, not incomparable
    sha = first[0].run.run.commit if first[0].run else ""
    with open_store(store, create=False) as s:
        runs = s.runs()
    assert match_runs(runs, [sha], sha, Fingerprint(backend="cpu"))[0].status == "no-runs"
    imported = match_runs(runs, [sha], sha, first[0].run.run.fingerprint)[0]  # type: ignore[union-attr]
    assert imported.status == "found"
