"""A suite split over CI jobs: ``--perfguard-shard K/N``, ``perfguard merge`` and
``perfguard baseline merge`` (the store's run groups: ``test_run_groups.py``).

The split's rule is pinned on plain data (:mod:`perfguard.plugin.shards`), and the whole
path on real pytest sessions in a temp git repository (``pytester``
subprocesses): two commits, each run as two shards, saved into one store and into one
store per shard merged afterwards, their results merged into one verdict, and a shard
missing or killed mid-run named as such with a non-zero exit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfguard.baseline.store import Store
from perfguard.compare.merged import merge
from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import Run, SessionResults, TestEntry, encode, load_results
from perfguard.errors import ReportError
from perfguard.plugin.shards import ci_run_group, parse_shard, plan_digest, split, weights_of
from perfguard.report.markdown import plain

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- the split
@pytest.mark.parametrize(
    ("text", "want"), [("1/1", (1, 1)), ("2/4", (2, 4)), (" 4/4 ", (4, 4)), ("10/12", (10, 12))]
)
def test_parse_shard_reads_k_of_n(text, want):
    assert parse_shard(text) == want


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0/4", "between 1 and N"),
        ("5/4", "between 1 and N"),
        ("2", "is not K/N"),
        ("a/b", "is not K/N"),
        ("1/0", "between 1 and N"),
        ("", "is not K/N"),
    ],
)
def test_parse_shard_refuses_what_is_not_a_part(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_shard(text)


def test_a_bad_shard_option_is_one_usage_error_naming_it(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    r = pytester.runpytest_subprocess("--perfguard-shard=5/4", "-p", "no:cacheprovider")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    (line,) = [e for e in r.errlines if "perfguard-shard" in e]
    assert "'5/4': K must be between 1 and N" in line


def test_split_is_greedy_longest_first_into_the_lightest_part():
    weights = {"a": 5.0, "b": 4.0, "c": 3.0, "d": 3.0, "e": 1.0}
    # a -> 0 (5); b -> 1 (4); c -> 1 (7); d -> 0 (8); e -> 1 (8)
    assert split(weights, 2) == [["a", "d"], ["b", "c", "e"]]
    assert split(dict(reversed(weights.items())), 2) == split(weights, 2)  # order-free


def test_split_by_count_and_ties_by_nodeid_puts_every_test_in_one_part():
    names = [f"t{i:02d}" for i in range(11)]
    parts = split(weights_of(names, {}), 4)
    assert [len(p) for p in parts] == [3, 3, 3, 2]
    assert sorted(n for p in parts for n in p) == names
    assert parts[0] == ["t00", "t04", "t08"]  # equal weights: dealt in node id order
    assert plan_digest(parts) == plan_digest(split(weights_of(names[::-1], {}), 4))
    assert split(weights_of(names, {}), 20)[15] == []  # more parts than tests: some empty


def test_unknown_tests_weigh_the_median_of_the_known():
    assert weights_of(["a", "b", "c", "d"], {"a": 1.0, "b": 3.0, "c": 10.0}) == {
        "a": 1.0,
        "b": 3.0,
        "c": 10.0,
        "d": 3.0,
    }


def test_run_group_comes_from_the_ci_run_id_and_is_none_outside_ci():
    assert ci_run_group({"GITHUB_RUN_ID": "77", "GITHUB_RUN_ATTEMPT": "2"}) == "github:77"
    assert ci_run_group({"CI_PIPELINE_ID": "5"}) == "gitlab:5"
    assert ci_run_group({"HOME": "/root"}) is None


# ---------------------------------------------------------------------------- merging
def write_doc(path: Path, shard: str | None, tests: dict[str, str], **kw) -> Path:
    """A results.json of a session that ran ``shard`` with ``tests`` (node id -> outcome)."""
    settings = {"fail_on": kw.pop("fail_on", "regression")}
    if shard:
        settings["shard"] = shard
    if "plan" in kw:
        settings["shard_plan"] = {"shard": shard, "plan": kw.pop("plan")}
    doc = SessionResults(
        run=Run(commit=kw.pop("commit", "c" * 40)),
        settings=settings,
        tests=[TestEntry(nodeid=n, outcome=Outcome(o)) for n, o in tests.items()],
        **kw,
    )
    path.write_bytes(encode(doc))
    return path


def test_merge_keeps_the_entries_and_fails_on_a_regression_as_a_session_does(tmp_path):
    a = write_doc(tmp_path / "a.json", "1/2", {"t1": "unchanged"}, plan="p")
    b = write_doc(tmp_path / "b.json", "2/2", {"t2": "regressed", "t3": "noisy"}, plan="p")
    merged = merge([a, b])
    assert [(t.nodeid, t.outcome.value) for t in merged.results.tests] == [
        ("t1", "unchanged"),
        ("t2", "regressed"),
        ("t3", "noisy"),
    ]
    assert merged.measured_by == {"t1": "shard 1/2", "t2": "shard 2/2", "t3": "shard 2/2"}
    assert merged.exit_status == 1 and merged.results.badge() == "FAIL"
    never = [
        write_doc(tmp_path / f"{k}.json", f"{k}/2", t, fail_on="never")
        for k, t in ((1, {"t1": "unchanged"}), (2, {"t2": "regressed"}))
    ]
    assert merge(never).exit_status == 0 and merge(never).results.badge() == "ADVISORY"


def test_merge_says_when_the_shards_split_differently(tmp_path):
    a = write_doc(tmp_path / "a.json", "1/2", {"t1": "unchanged"}, plan="p1")
    b = write_doc(tmp_path / "b.json", "2/2", {"t2": "unchanged"}, plan="p2")
    merged = merge([a, b])
    assert merged.exit_status == 1 and "split the tests differently" in merged.results.notes[-1]


@pytest.mark.parametrize(
    ("docs", "problem"),
    [
        ([("1/2", {"t1": "unchanged"}, {}), ("1/2", {"t2": "unchanged"}, {})], "given twice"),
        ([("1/2", {"t1": "unchanged"}, {}), ("2/2", {"t1": "noisy"}, {})], "is in two files"),
        ([("1/2", {"t1": "unchanged"}, {}), ("2/3", {"t2": "noisy"}, {})], "different numbers"),
        (
            [("1/2", {"t1": "unchanged"}, {}), ("2/2", {"t2": "noisy"}, {"commit": "d" * 40})],
            "different commits",
        ),
    ],
)
def test_documents_that_are_not_one_run_are_one_line_naming_them(tmp_path, docs, problem):
    paths = [write_doc(tmp_path / f"{i}.json", s, t, **kw) for i, (s, t, kw) in enumerate(docs)]
    with pytest.raises(ReportError, match=problem) as info:
        merge(paths)
    assert "\n" not in str(info.value)


def test_expecting_more_shards_than_the_files_recorded_is_refused(tmp_path):
    a = write_doc(tmp_path / "a.json", "1/2", {"t1": "unchanged"})
    with pytest.raises(ReportError, match="--expect-shards 3, but the files are shards of 2"):
        merge([a], expect=3)
    assert merge([a], expect=2).missing == ["2/2"]


# ---------------------------------------------------------------------------- sessions
BENCH = """
import os

import pytest
import torch


@pytest.mark.gpuprofile(iterations=3, warmup=1)
@pytest.mark.parametrize("n", range(6))
def test_step(gpuprofile, n):
    if os.environ.get("KILL_AT") == str(n):  # a job killed mid-run (the OOM killer, a cancel)
        os.kill(os.getpid(), 9)
    a = torch.randn(8 + 8 * n, 8 + 8 * n)
    for _ in gpuprofile.iterations():
        a @ a


def test_plain():
    assert True
"""
MARKED = [f"test_bench.py::test_step[{n}]" for n in range(6)]


def git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def repo_with(pytester, bench: str) -> Path:
    """A git repository holding ``test_bench.py`` = ``bench``, committed once (``c0``)."""
    pytester.makeini("[pytest]\n")
    root = pytester.path
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "ci@example.com")
    git(root, "config", "user.name", "CI")
    pytester.makepyfile(test_bench=bench)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "c0")
    return root


def perfguard(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_STEP_SUMMARY": ""}
    return subprocess.run(
        [sys.executable, "-m", "perfguard", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def shard(pytester, k: int, n: int, store: Path, out: str, group: str):
    return pytester.runpytest_subprocess(
        "--perfguard",
        "--perfguard-save",
        "--perfguard-backend=cpu",
        "-p",
        "no:cacheprovider",
        "--perfguard-fail-on=never",
        f"--perfguard-store={store}",
        f"--perfguard-output={pytester.path / out}",
        f"--perfguard-shard={k}/{n}",
        f"--perfguard-run-group={group}",
    )


def test_two_commits_in_two_shards_are_one_run_each_and_one_merged_verdict(pytester, monkeypatch):
    root = repo_with(pytester, BENCH)
    shared = root / "shared.db"

    # commit 0: both shards save into one store, one after the other (no durations yet)
    ones = [shard(pytester, k, 2, shared, f"c0s{k}", "ci:100") for k in (1, 2)]
    ones[0].assert_outcomes(passed=4, deselected=3)  # 3 marked + the unmarked test
    ones[1].assert_outcomes(passed=3, deselected=4)
    docs = [load_results(root / f"c0s{k}" / "results.json") for k in (1, 2)]
    assert sorted(t.nodeid for d in docs for t in d.tests) == MARKED
    assert [d.settings["shard_plan"]["balanced_by"] for d in docs] == ["count", "count"]
    with Store(shared) as store:
        runs = store.reader.runs()
        assert len(runs) == 1 and runs["n_tests"].tolist() == [6]
        assert store.reader.run_info(int(runs["run_id"][0])).group == "ci:100"
    assert docs[0].saved.run_id == docs[1].saved.run_id

    # commit 1: each shard on a copy of the store (a job's cache), balanced by the durations
    git(root, "commit", "-q", "--allow-empty", "-m", "c1")
    stores = [root / f"s{k}.db" for k in (1, 2)]
    for s in stores:
        shutil.copy(shared, s)
    twos = [shard(pytester, k, 2, stores[k - 1], f"c1s{k}", "ci:101") for k in (1, 2)]
    docs = [load_results(root / f"c1s{k}" / "results.json") for k in (1, 2)]
    plans = [d.settings["shard_plan"] for d in docs]
    assert [p["balanced_by"] for p in plans] == ["stored durations"] * 2
    assert plans[0]["plan"] == plans[1]["plan"] and plans[0]["durations_known"] == 6
    by_shard = {
        t.nodeid: f"shard {k}/2" for k, d in zip((1, 2), docs, strict=True) for t in d.tests
    }
    assert sorted(by_shard) == MARKED
    assert [r.ret for r in twos] == [0, 0]

    # one verdict: the shards' entries exactly, each test once, said by which shard
    merged = perfguard("merge", "c1s1/results.json", "c1s2/results.json", "-o", "merged", cwd=root)
    assert merged.returncode == 0, merged.stderr
    one = load_results(root / "merged" / "results.json")
    entries = {t.nodeid: t for d in docs for t in d.tests}
    assert [t.nodeid for t in one.tests] == MARKED
    assert all(t == entries[t.nodeid] for t in one.tests)  # not judged again
    assert one.complete and one.settings["expected_shards"] == 2
    summary = (root / "merged" / "summary.md").read_text()
    for nodeid, name in by_shard.items():
        assert summary.count(f"| `{nodeid}` | {name} |") == 1
    assert summary.rstrip().splitlines()[-1].startswith("Full HTML report")
    assert (root / "merged" / "report.html").stat().st_size > 0

    # the shard stores merged into one: one run per commit, every record once
    for _ in range(2):  # again: nothing more
        done = perfguard("baseline", "merge", "m.db", *stores, cwd=root)
        assert done.returncode == 0, done.stderr
    assert (
        "1 joined their run group's run"
        in perfguard("baseline", "merge", "again.db", *stores, cwd=root).stdout
    )
    with Store(root / "m.db") as m:
        runs = m.reader.runs()
        assert runs["commit"].is_unique and runs["n_tests"].tolist() == [6, 6]
        counts = {t: m.db.query(f"SELECT count(*) AS n FROM {t}")["n"][0] for t in ("samples",)}
    parts = 0
    for s in stores:
        with Store(s) as one_store:
            latest = int(one_store.reader.runs()["run_id"].max())
            _, records = one_store.reader.load_run(latest)
            parts += sum(len(r.samples) for r in records.values())
    with Store(shared) as base:
        parts += int(base.db.query("SELECT count(*) AS n FROM samples")["n"][0])
    assert counts["samples"] == parts
    hist = json.loads(perfguard("history", "--store", "m.db", "--json", cwd=root).stdout)
    assert {t["nodeid"]: t["runs"] for t in hist["tests"]} == dict.fromkeys(MARKED, 2)

    # a shard that never reported: named missing, and the merge fails
    alone = perfguard("merge", "c1s1/results.json", "-o", "alone", "--expect-shards", "2", cwd=root)
    assert alone.returncode == 1
    assert "shard 2/2 is missing" in alone.stderr
    text = (root / "alone" / "summary.md").read_text()
    assert "shard 2/2 is missing" in text and "INCOMPLETE" in text

    # a shard killed in its last test (the larger shard: one test was written before it):
    # its document says incomplete; named, and the merge fails
    k = 1 if len(docs[0].tests) >= len(docs[1].tests) else 2
    monkeypatch.setenv("KILL_AT", docs[k - 1].tests[-1].nodeid[-2])
    killed = shard(pytester, k, 2, stores[k - 1], "killed", "ci:101")
    monkeypatch.delenv("KILL_AT")
    assert killed.ret != 0
    partial = load_results(root / "killed" / "results.json")
    assert not partial.complete and len(partial.tests) == len(docs[k - 1].tests) - 1
    other = f"c1s{3 - k}/results.json"
    done = perfguard("merge", other, "killed/results.json", "-o", "k", cwd=root)
    assert done.returncode == 1
    assert f"shard {k}/2 (killed/results.json) is incomplete" in done.stderr
    assert f"shard {k}/2 (incomplete)" in (root / "k" / "summary.md").read_text()

    # an unreadable file: one line naming it
    (root / "bad.json").write_text("{")
    bad = perfguard("merge", "c1s1/results.json", "bad.json", "-o", "b", cwd=root)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "bad.json" in bad.stderr


def test_under_xdist_the_workers_split_alike_and_the_controller_records_it(pytester):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_bench=BENCH)
    out = pytester.path / "out"
    r = pytester.runpytest_subprocess(
        "-n",
        "2",
        "--perfguard",
        "--perfguard-backend=cpu",
        "-p",
        "no:cacheprovider",
        "--perfguard-fail-on=never",
        f"--perfguard-output={out}",
        "--perfguard-shard=2/2",
    )
    r.assert_outcomes(passed=3)  # the unmarked test runs in shard 1 only
    doc = load_results(out / "results.json")
    assert [t.nodeid for t in doc.tests] == [MARKED[1], MARKED[3], MARKED[5]]  # dealt by count
    plan = doc.settings["shard_plan"]
    assert (plan["shard"], plan["measured"], plan["of"], plan["balanced_by"]) == (
        "2/2",
        3,
        6,
        "count",
    )


def test_the_ci_example_is_a_sharded_matrix_with_one_merge_job():
    yaml = pytest.importorskip("yaml")
    flow = yaml.safe_load((REPO / "examples" / "github-actions.yml").read_text())
    bench, merge_job = flow["jobs"]["benchmarks"], flow["jobs"]["merge"]
    shards = bench["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, int(flow["env"]["SHARDS"]) + 1))
    assert not bench["strategy"]["fail-fast"]
    runs = " ".join(s.get("run", "") for s in bench["steps"])
    assert "--perfguard-shard ${{ matrix.shard }}/${{ env.SHARDS }}" in runs
    assert merge_job["needs"] == "benchmarks" and merge_job["if"] == "always()"
    steps = " ".join(s.get("run", "") for s in merge_job["steps"])
    assert "perfguard merge shards/*/results.json" in steps and "--expect-shards" in steps
    assert "perfguard baseline merge" in steps and "--body-file merged/summary.md" in steps


# ---------------------------------------------------------------------------- machines
MATRIX_BENCH = """
import pytest
import torch


@pytest.mark.gpuprofile(iterations=3, warmup=1)
@pytest.mark.parametrize("n", range(3))
def test_step(gpuprofile, n):
    a = torch.randn(32 + 16 * n, 32 + 16 * n)
    for _ in gpuprofile.iterations():
        b = a @ a
        b = b.relu()
"""


def kind_session(pytester, kind: str, store: Path, out: str, save: bool):
    """One job of a matrix. A machine kind is its fingerprint; on one machine, the number of
    test processes measuring at once (``-n 2``) makes another kind, as a GPU model would."""
    return pytester.runpytest_subprocess(
        "--perfguard",
        *(["--perfguard-save"] if save else []),
        *(["-n", "2"] if kind == "x2" else ["-p", "no:xdist"]),
        "--perfguard-backend=cpu",
        "-p",
        "no:cacheprovider",
        f"--perfguard-store={store}",
        f"--perfguard-output={pytester.path / out}",
    )


def test_two_machine_kinds_merge_into_one_comment_with_a_column_each(pytester):
    root = repo_with(pytester, MATRIX_BENCH)
    store = root / "store.db"
    for kind in ("x1", "x2"):  # two kinds saved into one store
        kind_session(pytester, kind, store, f"base-{kind}", save=True)

    # the pull request: step 1 multiplies twice (its op calls double on both kinds)
    (root / "test_bench.py").write_text(
        MATRIX_BENCH.replace("b = a @ a\n", "b = a @ a\n        b = b @ a if n == 1 else b\n")
    )
    git(root, "commit", "-q", "-am", "c1")
    for kind in ("x1", "x2"):
        kind_session(pytester, kind, store, f"pr-{kind}", save=False)
    alone = {b: load_results(root / f"pr-{b}" / "results.json") for b in ("x1", "x2")}
    for doc in alone.values():  # each kind judged against its own kind's baseline
        assert all(t.outcome.judged for t in doc.tests), [(t.nodeid, t.message) for t in doc.tests]
        assert [t.nodeid for t in doc.tests if t.outcome is Outcome.REGRESSED] == [
            "test_bench.py::test_step[1]"
        ]

    done = perfguard("merge", "pr-x1/results.json", "pr-x2/results.json", "-o", "merged", cwd=root)
    assert done.returncode == 1, done.stderr  # the worst kind's exit
    index = json.loads((root / "merged" / "matrix.json").read_text())
    labels = [m["label"] for m in index["machines"]]
    assert len(labels) == 2 and labels[1].endswith("[cpu], 2 workers")
    # each kind's merged document holds exactly its job's entries: the verdicts one job gave
    for m, kind in zip(index["machines"], ("x1", "x2"), strict=True):
        one = load_results(root / "merged" / m["folder"] / "results.json")
        assert one.tests == alone[kind].tests
        assert (root / "merged" / m["folder"] / "report.html").stat().st_size > 0

    summary = (root / "merged" / "summary.md").read_text()
    assert summary.startswith("## perfguard :x: FAIL: 3 tests on 2 machine kinds")
    shown = [plain(label) for label in labels]  # Markdown-escaped: `[cpu]` reads \[cpu\]
    assert f"| Test | {shown[0]} | {shown[1]} |" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| `test_bench.py::")]
    regressed = next(r for r in rows if "test_step[1]" in r)
    assert regressed.count(":red_circle: regressed") == 2
    # what changed, at its line, per machine where their words differ, else once
    changed = summary.split("### What changed", 1)[1]
    heads = {
        b: next(t for t in d.tests if t.outcome is Outcome.REGRESSED) for b, d in alone.items()
    }
    # the added matmul's line: its calls there, the op's over all its sites beside them
    assert "test\\_bench.py:12 in test\\_step: op calls 0 → 1 per iteration there" in changed
    assert "(all its sites 1 → 2 per iteration" in changed
    from perfguard.compare.listing import headline

    if headline(heads["x1"]) == headline(heads["x2"]):
        assert "on every machine" in changed
    else:
        assert all(f"**{label}**" in changed for label in shown)
    assert "workers: 1 \\| 2" in summary and "said, not judged" in summary
    assert "incomparable" not in summary

    html = (root / "merged" / "report.html").read_text()
    for m in index["machines"]:
        assert f'href="{m["folder"]}/report.html#test-' in html
    assert html.count('<span class="badge o-regressed">regressed</span>') == 2

    # one kind's shard missing: named under that kind, the merge still fails
    partial = perfguard(
        "merge",
        "pr-x1/results.json",
        "pr-x2/results.json",
        "-o",
        "two",
        "--expect-shards",
        "2",
        cwd=root,
    )
    assert partial.returncode == 1
    assert partial.stderr.count("is missing") == 2  # shard 2/2 of each kind
