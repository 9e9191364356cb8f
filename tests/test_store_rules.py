"""The store's rules about what it keeps: a read-only store is read and never written, one
run per commit and machine unless asked, and an import that says what it did.

Read-only is real: the store's folder is bind-mounted read-only over itself
(root cannot write there either, and SQLite cannot create its WAL or journal
files); as another user, plain permissions do it. Replacement is checked on
a SQLite file and on the session's real PostgreSQL server, with concurrent
writer processes; imports with real export files, good and bad.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_baseline_store as base
from store_writers import run_writers
from test_baseline_store import (
    A100,
    FRAMES,
    assert_same_record,
    cli,
    count,
    rewind_to_v1,
    run,
    sql,
)

from perfguard.baseline.schema import SCHEMA_VERSION
from perfguard.baseline.store import Store
from perfguard.errors import BaselineError

C1, C2 = "c1" * 20, "c2" * 20
# the store tests' fixtures: real records, and each test on SQLite and PostgreSQL
records, backend, new_store = base.records, base.backend, base.new_store


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for this process for real: a read-only bind mount of it over
    itself as root (chmod does not stop root), plain permissions as another user."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.iterdir()]}
        for p in modes:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    mount = shutil.which("mount")
    bound = mount and subprocess.run([mount, "--bind", folder, folder], capture_output=True)
    if not bound or bound.returncode:
        pytest.skip(f"root without a read-only mount ({bound and bound.stderr.strip()!r})")
    try:
        done = subprocess.run(
            [mount, "-o", "remount,bind,ro", folder], capture_output=True, text=True
        )
        if done.returncode or os.access(folder, os.W_OK):
            pytest.skip(f"cannot remount {folder} read-only: {done.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file in ``folder`` and a hash of its bytes: what a reader must leave alone."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def one_line_error(action) -> str:
    with pytest.raises(BaselineError) as err:
        action()
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ------------------------------------------------------------------ read-only


def test_a_read_only_store_is_read_and_every_write_refused(tmp_path, records):
    folder = tmp_path / "baselines"
    path = folder / "perfguard.db"
    bert, a100 = records["bert"], records["a100"]
    with Store(path) as store:
        first = store.save_run(run(C1, "2024-01-01T00:00:00Z"), [bert, a100])
        store.save_run(run(C2, "2024-01-02T00:00:00Z", A100), [a100])
        wanted = store.runs()
    export = tmp_path / "export.json"
    with Store(path) as store:
        store.export_json(export)
    assert sql(path, "PRAGMA journal_mode")[0][0] == "wal"  # the mode perfguard leaves
    before = snapshot(folder)

    with read_only(folder):
        assert not os.access(path, os.W_OK)
        for create in (False, True):  # a save opens with create=True: nothing is made
            with Store(path, create=create) as store:
                assert store.read_only == "on a read-only file system"
                got = store.runs()
                assert got.drop(columns="fingerprint").equals(wanted.drop(columns="fingerprint"))
                _, loaded = store.load_run(first)
                assert_same_record(loaded[bert.nodeid], bert)
                assert len(store.history(a100.nodeid)) == 2
                for action, what in (
                    (lambda: store.save_run(run(C2, "2024-02-01T00:00:00Z"), [bert]), "save"),
                    (lambda: store.prune(keep_last=0), "prune"),
                    (lambda: store.import_json(export), "add"),
                ):
                    msg = one_line_error(action)
                    assert msg == (
                        f"{path}: cannot {what} {'a run' if what == 'save' else 'runs'}: "
                        "the store is read-only (on a read-only file system)"
                    )
        listed = cli("list", "--store", path)
        assert listed.returncode == 0 and listed.stdout.count("NVIDIA") == 2, listed.stderr
        imported = cli("import", export, "--store", path)
        assert imported.returncode == 2 and imported.stdout == ""
        assert imported.stderr.strip().splitlines() == [
            f"perfguard: error: {path}: cannot import: the store is read-only "
            "(on a read-only file system)"
        ]
        new = folder / "new.db"
        msg = one_line_error(lambda: Store(new))
        assert msg == f"{new}: cannot create the store: on a read-only file system"
    assert snapshot(folder) == before  # no -wal, -shm, journal or backup left, no byte changed


def test_a_read_only_store_of_an_older_schema_is_read_through_an_in_memory_upgrade(
    tmp_path, records
):
    folder = tmp_path / "baselines"
    path = folder / "perfguard.db"
    with Store(path) as store:
        first = store.save_run(run(C1, "2024-01-01T00:00:00Z"), [records["a100"]])
    rewind_to_v1(path)
    before = snapshot(folder)
    with read_only(folder), Store(path, create=False) as store:
        assert store.schema_version == SCHEMA_VERSION  # the copy in memory is upgraded
        assert store.runs()["commit"].tolist() == [C1]
        _, loaded = store.load_run(first)
        assert loaded[records["a100"].nodeid].samples["round"].eq(0).all()  # v4's default
        msg = one_line_error(lambda: store.save_run(run(C2, "2024-01-02T00:00:00Z"), []))
        assert "read-only" in msg
    assert snapshot(folder) == before  # still v1 on disk, no .bak beside it
    assert sql(path, "SELECT value FROM meta WHERE key='schema_version'") == [("1",)]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A temp folder other users may enter (pytest's own is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="perfguard-ro-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_an_unprivileged_reader_of_a_folder_it_cannot_write(shared_dir, records):
    """The other way a store is read-only: files of another user. Run as ``nobody``
    (setpriv), the reader sees the runs and leaves no file beside the store."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to read as another user")
    folder = shared_dir / "baselines"
    path = folder / "perfguard.db"
    with Store(path) as store:
        store.save_run(run(C1, "2024-01-01T00:00:00Z"), [records["bert"]])
    for p in (shared_dir, *shared_dir.parents):
        if not os.stat(p).st_mode & 0o001:
            pytest.skip(f"{p} is not searchable by other users")
    before = snapshot(folder)
    code = (
        "import sys\nfrom perfguard.baseline.store import Store\n"
        "with Store(sys.argv[1], create=False) as s:\n"
        "    print(s.read_only, list(s.runs()['commit']))\n"
        "    try:\n        s.prune(keep_last=0)\n"
        "    except Exception as e:\n        print(type(e).__name__, e)\n"
    )
    import sys

    done = subprocess.run(
        [
            setpriv,
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    if "Permission denied" in done.stderr and "perfguard" not in done.stderr:
        pytest.skip(f"nobody cannot run this interpreter: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()
    assert first == f"the file is not writable ['{C1}']"
    assert second == (
        f"BaselineError {path}: cannot prune runs: the store is read-only "
        "(the file is not writable)"
    )
    assert snapshot(folder) == before


# ------------------------------------------------------------------ one run per commit


def test_a_second_save_of_a_commit_on_a_machine_replaces_the_first(records, new_store):
    location = new_store("s.db")
    bert, a100 = records["bert"], records["a100"]
    with Store(location) as store:
        first = store.save(run(C1, "2024-01-01T00:00:00Z"), [bert, a100])
        assert (first.replaced_tests, first.replaced_runs) == (0, ())
        other_machine = store.save_run(run(C1, "2024-01-01T00:00:01Z", A100), [a100])
        other_commit = store.save_run(run(C2, "2024-01-01T00:00:02Z"), [a100])
        # a re-run of one test (``-k``): that test's record moves to the new run
        second = store.save(run(C1, "2024-01-02T00:00:00Z"), [a100])
        assert (second.replaced_tests, second.replaced_runs) == (1, (first.run_id,))
        _, kept = store.load_run(first.run_id)
        assert list(kept) == [bert.nodeid]
        # the rest of it: the first run has nothing left and goes
        third = store.save(run(C1, "2024-01-03T00:00:00Z"), [bert])
        assert (third.replaced_tests, third.replaced_runs) == (1, (first.run_id,))
        # a dirty tree measured other code than the commit's: it replaces no clean run
        dirty = store.save(run(C1, "2024-01-03T12:00:00Z", dirty=True), [bert])
        assert (dirty.replaced_tests, dirty.replaced_runs) == (0, ())
        runs = store.runs()
        assert sorted(runs["run_id"]) == sorted(
            [other_machine, other_commit, second.run_id, third.run_id, dirty.run_id]
        )
        # append keeps both: a baseline measured twice on purpose
        fourth = store.save(run(C1, "2024-01-04T00:00:00Z"), [bert], replace=False)
        assert (fourth.replaced_tests, fourth.replaced_runs) == (0, ())
        assert len(store.runs(C1)) == 5
        for run_id, rec in ((second.run_id, a100), (third.run_id, bert), (fourth.run_id, bert)):
            _, loaded = store.load_run(run_id)
            assert_same_record(loaded[rec.nodeid], rec)
    # nothing orphaned: every frame row belongs to a test that is there (raw SQL)
    assert count(location, "tests") == 6
    for name in FRAMES:
        stray = (
            f"SELECT count(*) FROM {name} x WHERE NOT EXISTS "
            "(SELECT 1 FROM tests t WHERE t.test_id = x.test_id)"
        )
        assert sql(location, stray) == [(0,)], name
        per = {"bert": len(getattr(bert, name)), "a100": len(getattr(a100, name))}
        assert count(location, name) == 3 * per["a100"] + 3 * per["bert"], name


def test_concurrent_saves_of_one_commit_leave_one_run(tmp_path, records, new_store):
    location = new_store("shared.db")
    recs = [records["a100"], records["bert"]]
    n_workers, n_runs = 4, 4
    ids = run_writers(tmp_path, location, recs, n_workers, n_runs, same_commit=C1)
    assert len(set(ids)) == n_workers * n_runs  # every save made its own run ...
    assert sql(location, "SELECT run_id FROM runs") == [(max(ids),)]  # ... the last one stays
    assert count(location, "tests") == len(recs)
    for name in FRAMES:
        assert count(location, name) == sum(len(getattr(r, name)) for r in recs), name
    if isinstance(location, Path):
        assert sql(location, "PRAGMA integrity_check")[0][0] == "ok"
        assert sql(location, "PRAGMA foreign_key_check") == []


# ------------------------------------------------------------------ import


def test_import_says_per_file_what_it_added_and_skipped(tmp_path, records):
    source = tmp_path / "source.db"
    with Store(source) as store:
        store.save_run(run(C1, "2024-01-01T00:00:00Z"), [records["bert"], records["a100"]])
        store.save_run(run(C2, "2024-01-02T00:00:00Z"), [records["a100"]])
        store.export_json(tmp_path / "good.json")
    good = tmp_path / "good.json"
    doc = json.loads(good.read_text())
    files = {
        "corrupt.json": good.read_text()[:-200],
        "newer.json": json.dumps({**doc, "schema_version": SCHEMA_VERSION + 1}),
        "foreign.json": json.dumps({"format": "something else", "runs": []}),
        "badrun.json": json.dumps({**doc, "runs": [{"run": {"commit": C1}}]}),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    bad = [tmp_path / n for n in files]
    target = tmp_path / "target.db"

    done = cli("import", *bad, good, "--store", target)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{good}: imported 2 run(s) (3 test record(s)) into {target}: run ids 1, 2"
    ]
    corrupt, *rest = done.stderr.splitlines()
    assert corrupt.startswith(f"skipped {tmp_path / 'corrupt.json'}: not JSON: "), corrupt
    assert rest == [
        f"skipped {tmp_path / 'newer.json'}: export schema version {SCHEMA_VERSION + 1} is "
        f"not one this perfguard reads (<= {SCHEMA_VERSION})",
        f"skipped {tmp_path / 'foreign.json'}: not a perfguard baseline export",
        f"skipped {tmp_path / 'badrun.json'}: run #1 is malformed: KeyError: 'time'",
    ]
    assert count(target, "runs") == 2 and count(target, "tests") == 3

    again = cli("import", good, "--store", target)  # all present: nothing to do, not a failure
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout.splitlines() == [
        f"{good}: imported 0 run(s) (0 test record(s)) into {target}, 2 already present "
        "(same commit, time and host): run ids 1, 2"
    ]

    nothing = cli("import", *bad, "--store", target)  # only bad files: nothing imported
    assert nothing.returncode == 2 and nothing.stdout == ""
    lines = nothing.stderr.splitlines()
    assert len(lines) == 5 and all(line.startswith("skipped ") for line in lines[:4])
    assert (
        lines[4] == "perfguard: error: nothing imported: 4 of 4 file(s) could not be "
        "read as exports"
    )
    assert count(target, "runs") == 2
