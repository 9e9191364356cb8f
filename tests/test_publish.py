"""``perfguard publish``: the store read in bulk gives what ``perfguard history`` gives per
test, the pages show the real history's change points and counter steps, an unchanged
series is never rebuilt, and the site makes no request outside itself.

The store is real: ``tests/data/history_steps.json`` (30 real ``pytest --perfguard
--perfguard-save`` sessions, a +10 % step with an op added and a -5 % one) replayed onto
a real git repository (:func:`test_history.replay`), in SQLite and PostgreSQL.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_history import RECORDED, replay, store_location  # noqa: F401 - a fixture

from perfguard.baseline.store import Store
from perfguard.cli import main
from perfguard.compare.history import load_history, run_levels
from perfguard.publish import publish
from perfguard.publish.data import load_index, load_records, load_tables
from perfguard.publish.series import analyse, split_series
from perfguard.publish.site import MANIFEST

REPO = Path(__file__).resolve().parents[1]
NODEID = "test_bench.py::test_step"


@pytest.fixture
def replayed(tmp_path, store_location):  # noqa: F811 - the imported fixture
    return replay(RECORDED, tmp_path, store_location)


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html"))


def test_bulk_levels_equal_history_per_test(replayed):
    """One scan of the samples gives each run the level ``run_levels`` computes per test
    (CPU time: the fastest iteration of each unprofiled round, the median of rounds)."""
    location, repo, shas, _ = replayed
    tables = load_tables(location)
    with Store(location) as store:
        want = run_levels(store, NODEID)
    got = tables.tests.set_index("run_id").loc[want["run_id"], "level"].to_numpy()
    assert np.array_equal(got, want["value"].to_numpy())
    assert (tables.tests["n_rounds"] == want["n_rounds"].iloc[0]).all()
    assert {"calls", "flops", "bytes"} <= set(tables.counters["counter"].astype(str))


def test_synthetic_gpu_and_cpu_levels_equal_history(tmp_path, monkeypatch):
    """The scale benchmark's store (GPU time: median of profiled rounds; CPU time with a
    profiled round apart) read in bulk equals ``run_levels`` for every test and machine."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import publish_scale

    shas = publish_scale.make_repo(tmp_path / "repo", 14)
    publish_scale.write_store(tmp_path / "s.db", shas, publish_scale.Plan(4, 14))
    monkeypatch.setattr("perfguard.publish.data.PARALLEL_RECORDS", 0)  # read by 3 workers
    tables = load_tables(tmp_path / "s.db", jobs=3)
    with Store(tmp_path / "s.db") as store:
        for nodeid in store.nodeids():
            want = run_levels(store, nodeid)
            got = tables.tests[tables.tests["nodeid"] == nodeid].set_index("run_id")
            assert np.allclose(got.loc[want["run_id"], "level"], want["value"], rtol=0, atol=0)
    assert len(tables.tests) == 14 * 3 * 4


def test_series_analysis_finds_the_real_steps(replayed):
    """The change points and counter steps a page shows are ``perfguard history``'s."""
    location, repo, shas, steps = replayed
    tables = load_tables(location)
    with Store(location) as store:
        hist = load_history(store, NODEID, repo=repo)
    (series,) = split_series(tables, shas)
    assert series.runs["commit"].tolist() == shas
    a = analyse(series)
    assert [cp.commit for cp in a.change_points] == [cp.commit for cp in hist.change_points]
    assert a.change_points[0].commit == shas[steps["up"]]
    assert a.change_points[0].ops[0].op_name == "extra_work"
    got = {(s.commit, s.counter) for s in a.counter_steps}
    assert got == {(s.commit, s.counter) for s in hist.counter_steps}
    calls = next(s for s in a.counter_steps if s.counter == "calls")
    assert calls.ops and calls.ops[0][1] < calls.ops[0][2]  # the op whose calls went up
    # this recording kept one round per run: too few to judge, as store mode would say
    assert a.outcome == "not-judged" and "round" in a.reason


def test_publish_writes_the_site_and_rebuilds_only_what_changed(replayed, tmp_path):
    location, repo, shas, steps = replayed
    site = tmp_path / "site"
    first = publish(location, site, repo=repo, report_url="https://ci.example/{commit}/r.html")
    assert (first.series, first.rebuilt, first.kept, first.removed) == (1, 1, 0, 0)
    (page,) = [p for p in _pages(site) if p.name != "index.html"]
    html = page.read_text()
    assert shas[steps["up"]][:10] in html and "extra_work" in html  # the step, its op
    assert "Counter change points" in html and "calls" in html
    assert f"https://ci.example/{shas[0]}/r.html" in html  # each run's report
    assert html.count("<svg") >= 4  # level, counters, top ops
    # a machine's index says why each latest outcome is what it is, beside it
    (machine,) = [p for p in _pages(site) if p.name == "index.html" and p.parent != site]
    row = re.search(r"<tr data-test=.*?</tr>", machine.read_text(), re.S)
    assert row and '<td class="why"' in row.group(0), machine.read_text()[:2000]
    why = re.search(r'<td class="why"[^>]*>([^<]+)</td>', row.group(0))
    assert why and len(why.group(1)) > 10, row.group(0)
    assert first.largest_page < 1 << 20
    for p in _pages(site):  # nothing the browser would fetch
        text = p.read_text()
        assert not re.search(r'(src|href)="(https?:)?//', text.replace("https://ci.example", ""))
        assert "Content-Security-Policy" in text
    manifest = json.loads((site / MANIFEST).read_text())
    assert manifest["format"] == "perfguard.publish-manifest/2"
    before = {p: p.stat().st_mtime_ns for p in _pages(site)}

    again = publish(location, site, repo=repo, report_url="https://ci.example/{commit}/r.html")
    assert (again.rebuilt, again.kept) == (0, 1)
    assert {p: p.stat().st_mtime_ns for p in _pages(site)} == before  # not even rewritten

    with Store(location) as store:  # an acceptance changes what the page shows
        store.accept(NODEID, shas[steps["up"]], "intended", time="2030-01-01T00:00:00Z")
    third = publish(location, site, repo=repo, report_url="https://ci.example/{commit}/r.html")
    assert (third.rebuilt, third.kept) == (1, 0)
    assert "accepted at" in page.read_text() and "intended" in page.read_text()

    with Store(location) as store:  # the test's runs go: its page goes
        store.prune(commits=shas)
    gone = publish(location, site, repo=repo)
    assert (gone.series, gone.removed) == (0, 1) and not page.exists()


def _synthetic(tmp_path: Path, location, commits: int = 14, tests: int = 4):
    """The scale benchmark's store (three machines) at ``location``: (repo, shas, plan)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import publish_scale

    shas = publish_scale.make_repo(tmp_path / "repo", commits + 1)
    plan = publish_scale.Plan(tests, commits + 1)
    publish_scale.write_store(location, shas[:-1], plan)
    return publish_scale, shas, plan


def test_a_partial_run_reads_and_rebuilds_its_series_only(
    tmp_path,
    store_location,  # noqa: F811 - the imported fixture
    monkeypatch,
):
    """After a run of 2 tests on one machine, only those 2 series' records are read (by id)
    and their pages rebuilt, and the site is byte for byte the one a publish from scratch
    makes; with nothing new, no record is read at all."""
    bench, shas, plan = _synthetic(tmp_path, store_location)
    site, repo = tmp_path / "site", tmp_path / "repo"
    first = publish(store_location, site, repo=repo)
    assert (first.series, first.rebuilt) == (12, 12)

    def no_read(*args, **kwargs):
        raise AssertionError("an unchanged store's records were read")

    with monkeypatch.context() as m:
        m.setattr("perfguard.publish.site.load_records", no_read)
        again = publish(store_location, site, repo=repo)
    assert (again.rebuilt, again.kept) == (0, 12)

    bench.write_store(store_location, shas, plan, start=len(shas) - 1, partial=2)
    read: list[np.ndarray] = []

    def spy(location, index, ids=None, **kwargs):
        read.append(np.asarray(ids))
        return load_records(location, index, ids, **kwargs)

    monkeypatch.setattr("perfguard.publish.site.load_records", spy)
    third = publish(store_location, site, repo=repo)
    assert (third.rebuilt, third.kept) == (2, 10)
    index = load_index(store_location)
    machine0 = index.runs.loc[index.runs["host"] == "gpu-a", "run_id"]
    last_two = index.tests["nodeid"].iloc[-2:]
    changed = index.tests[
        index.tests["run_id"].isin(machine0) & index.tests["nodeid"].isin(last_two)
    ]
    assert sorted(read[0].tolist()) == sorted(changed["test_id"].tolist())  # 2 x 15 records

    fresh = publish(store_location, tmp_path / "fresh", repo=repo)  # every record, by ranges
    assert fresh.rebuilt == 12
    for page in _pages(tmp_path / "fresh"):
        assert page.read_bytes() == (site / page.relative_to(tmp_path / "fresh")).read_bytes()


def test_records_read_in_shares_equal_those_read_at_once(tmp_path, monkeypatch):
    """Reading some records, by 3 workers in 5 queries per table, gives the same rounds,
    levels, counters and ops as reading every record in one process."""
    _synthetic(tmp_path, tmp_path / "s.db", commits=14, tests=3)
    index = load_index(tmp_path / "s.db")
    whole = load_records(tmp_path / "s.db", index)
    ids = index.tests["test_id"].to_numpy()[1::3]
    monkeypatch.setattr("perfguard.publish.data.PARALLEL_RECORDS", 0)
    monkeypatch.setattr("perfguard.publish.data.IDS_PER_QUERY", len(ids) // 5 + 1)
    some = load_records(tmp_path / "s.db", index, ids, jobs=3)
    assert some.tests["test_id"].tolist() == ids.tolist()
    want = whole.tests.set_index("test_id").loc[ids]
    assert np.array_equal(some.tests[["level", "n_rounds"]], want[["level", "n_rounds"]])
    for name in ("rounds", "counters", "ops"):
        got = getattr(some, name).sort_values(["test_id"], kind="stable").reset_index(drop=True)
        all_rows = getattr(whole, name)
        expected = all_rows[all_rows["test_id"].isin(ids)].sort_values(["test_id"], kind="stable")
        expected = expected.reset_index(drop=True)
        pd.testing.assert_frame_equal(got.astype(str), expected.astype(str))


def test_a_page_rebuilt_for_an_acceptance_reuses_its_change_points(replayed, tmp_path, monkeypatch):
    """An acceptance changes the page, not the levels: the change points kept in the
    manifest (keyed by the levels, the ops and the compare code) are not searched again."""
    location, repo, shas, steps = replayed
    site = tmp_path / "site"
    publish(location, site, repo=repo)
    (page,) = [p for p in _pages(site) if p.name != "index.html"]
    before = page.read_text()
    with Store(location) as store:
        store.accept(NODEID, shas[-1], "fine", time="2030-01-01T00:00:00Z")

    def no_search(*args, **kwargs):
        raise AssertionError("the change points were searched again")

    monkeypatch.setattr("perfguard.publish.series.find_change_points", no_search)
    again = publish(location, site, repo=repo)
    assert again.rebuilt == 1
    after = page.read_text()
    assert after != before and "fine" in after
    assert after.count("timing change points") == before.count("timing change points")
    assert (
        re.findall(r'class="sha" title="(\w+)"', after)[:2]
        == re.findall(r'class="sha" title="(\w+)"', before)[:2]
    )  # the same change points listed


def test_counter_steps_on_the_changed_runs_equal_those_on_every_run():
    """The shortcut (numeric_steps and set_steps on the runs that differ from the run
    before only) finds what the compare layer finds given every run: random series of 60
    runs whose counters, Tensor Core ops and dtypes change now and then, some runs
    without ops or counters."""
    from perfguard.compare.counter_steps import numeric_steps, set_steps
    from perfguard.publish.series import Series, _counter_steps

    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 60
        runs = pd.DataFrame(
            {"run_id": np.arange(100, 100 + n), "commit": [f"c{i}" for i in range(n)]}
        )
        ops, counters = [], []
        names, tc, dtypes, calls = ["mm", "add", "gelu"], {"mm"}, {"mm": "f32", "add": "f32"}, 3.0
        for i in range(n):
            if rng.random() < 0.08:
                tc ^= {str(rng.choice(names))}
            if rng.random() < 0.08:
                dtypes[str(rng.choice(names))] = str(rng.choice(["f32", "bf16", ""]))
            if rng.random() < 0.08:
                calls += 1
            if rng.random() < 0.05:
                continue  # a run without ops or counters
            for name in names:
                ops.append(
                    {
                        "run": i,
                        "op_id": name,
                        "op_name": name,
                        "dtypes": dtypes.get(name, ""),  # as read: coalesced
                        "using_tc": name in tc,
                        "calls": calls,
                        "time_ns": 1.0,
                    }
                )
            counters.append({"run": i, "counter": "calls", "value": calls, "stable_value": calls})
        series = Series(
            "m",
            "m",
            "t",
            "gpu_time",
            runs,
            pd.DataFrame(),
            pd.DataFrame(counters),
            pd.DataFrame(ops),
        )
        got = {(st.index, st.counter, st.before, st.after) for st in _counter_steps(series)}
        ids = runs["run_id"].to_numpy()
        c = series.counters
        rows = pd.DataFrame(
            {
                "run_id": ids[c["run"]],
                "op_id": "",
                "op_name": "",
                "counter": c["counter"],
                "value": c["stable_value"],
                "stable": True,
            }
        )
        o = series.ops
        typed = o[o["dtypes"].astype(str).isin(["", "nan", "None"]) == False]  # noqa: E712
        t = o[o["using_tc"]]
        members = pd.concat(
            [
                pd.DataFrame(
                    {
                        "run_id": ids[t["run"]],
                        "counter": "tc_ops",
                        "member": t["op_name"],
                        "key": t["op_name"],
                    }
                ),
                pd.DataFrame(
                    {
                        "run_id": ids[typed["run"]],
                        "counter": "dtypes",
                        "member": typed["op_name"] + "\x1f" + typed["dtypes"],
                        "key": typed["op_name"],
                    }
                ),
            ],
            ignore_index=True,
        )
        want = numeric_steps(rows, ids, top_ops=0)
        want += set_steps(members, set(ids[o["run"].unique()].tolist()), ids)
        assert got == {(i, counter, before, after) for i, counter, before, after, _ in want}
        assert any(st[1] in ("tc_ops", "dtypes") for st in want)


def test_a_site_of_the_previous_manifest_format_is_rebuilt_and_its_stale_pages_removed(
    replayed, tmp_path
):
    location, repo, shas, steps = replayed
    site = tmp_path / "site"
    (site / "gone").mkdir(parents=True)
    (site / "gone" / "old.html").write_text("<html></html>")
    old = {"format": "perfguard.publish-manifest/1", "pages": {"gone/old.html": {"hash": "x"}}}
    (site / MANIFEST).write_text(json.dumps(old))
    done = publish(location, site, repo=repo)
    assert (done.rebuilt, done.removed) == (1, 1) and not (site / "gone" / "old.html").exists()


def test_publish_without_git_orders_by_time_and_the_cli_says_what_it_did(
    replayed, tmp_path, capsys
):
    location, repo, shas, steps = replayed
    assert main(["publish", str(location), str(tmp_path / "site"), "--by-time"]) == 0
    out = capsys.readouterr().out
    assert "published 1 test series" in out and "ordered by time" in out
    assert main(["publish", str(location), str(tmp_path / "site"), "--by-time"]) == 0
    assert "0 page(s) rebuilt, 1 unchanged" in capsys.readouterr().out
    assert main(["publish", str(tmp_path / "nothing.db"), str(tmp_path / "s2")]) == 2
    assert "nothing.db" in capsys.readouterr().err


def test_a_process_that_loaded_jax_publishes_without_forking(tmp_path: Path) -> None:
    """A fork of a process whose JAX ran copies one of its threads (JAX warns it will likely
    deadlock): publish then reads and builds in its own process, with the same pages."""
    if importlib.util.find_spec("jax") is None:  # not imported here: a fork follows
        pytest.skip("JAX is not installed")
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "import jax.numpy as jnp\n"
        "jnp.ones(3).sum().block_until_ready()\n"
        "from perfguard.forking import can_fork\n"
        "assert not can_fork()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    plain = "from perfguard.forking import can_fork\nassert can_fork()\n"
    done = subprocess.run(
        [sys.executable, "-c", plain], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]  # the CLI's process forks its workers
