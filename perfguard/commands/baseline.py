"""``perfguard baseline list|show|export|import|prune|migrate|merge``: look after the store.

A thin client of :class:`perfguard.baseline.store.Store`; every error it
raises is one line naming the store or file (exit 2 via ``perfguard.cli``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import pandas as pd

from perfguard.baseline.git import resolve
from perfguard.baseline.git import run as git
from perfguard.baseline.import_benchmark import import_benchmarks, is_benchmark_path
from perfguard.baseline.repair import SHOWN, check, recover
from perfguard.baseline.schema import SCHEMA_VERSION
from perfguard.baseline.store import Store, open_store
from perfguard.baseline.writer import Imported
from perfguard.commands import argtypes
from perfguard.commands.jsonout import add_json_option, to_stdout, write_json
from perfguard.compare.documents import run_document, runs_document
from perfguard.compare.units import format_ns
from perfguard.errors import BaselineError, DamagedStoreError

DEFAULT_STORE = "baselines/perfguard.db"


def store_option() -> argparse.ArgumentParser:
    """A parent parser with ``--store PATH_OR_URL`` (shared by the commands that read it)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--store",
        default=DEFAULT_STORE,
        metavar="PATH_OR_URL",
        help=f"baseline store: a SQLite file (default: {DEFAULT_STORE}) or a postgresql:// URL",
    )
    return parent


def add_parser(subparsers: Any) -> None:
    """Register ``baseline`` and its subcommands."""
    parser = subparsers.add_parser(
        "baseline",
        help="list, show, export, import, prune, check or recover the runs in a baseline store",
        description="Look after the store of baseline runs (one run per pytest session, "
        "keyed by git commit and machine): a SQLite file, or a PostgreSQL server given as "
        "postgresql://user@host/dbname.",
    )
    store_opt = store_option()
    sub = parser.add_subparsers(dest="baseline_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("list", parents=[store_opt], help="print the runs in the store")
    p.add_argument("--commit", metavar="SHA", help="only runs of this (abbreviated) commit")
    add_json_option(p, "the runs and acceptances (perfguard.baseline-list/1)")
    p.set_defaults(func=run_list)

    p = sub.add_parser("show", parents=[store_opt], help="print one run's tests and medians")
    p.add_argument("run_id", type=int, metavar="RUN_ID")
    add_json_option(p, "the run and its tests (perfguard.baseline-show/1)")
    p.set_defaults(func=run_show)

    p = sub.add_parser("export", parents=[store_opt], help="write runs to one JSON file")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="JSON file to write")
    p.add_argument("run_ids", type=int, nargs="*", metavar="RUN_ID", help="default: all runs")
    p.set_defaults(func=run_export)

    p = sub.add_parser(
        "import",
        parents=[store_opt],
        help="add the runs of exports or of pytest-benchmark's saves (skips ones present)",
        description="Add the runs of export files, each in one transaction. A folder (such "
        "as .benchmarks/) or a JSON file saved by pytest-benchmark (--benchmark-autosave) "
        "adds one wall-time run per saved session, under its commit. Says per file "
        "what it added and what it skipped and why; exits 2 when no run could be added "
        "because files were bad (a run already present is not a failure).",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=run_import)

    p = sub.add_parser("prune", parents=[store_opt], help="delete old runs")
    p.add_argument(
        "--keep-last",
        type=argtypes.integer(0),
        metavar="N",
        help="keep the N latest runs of each machine (host, GPU, backend)",
    )
    p.add_argument(
        "--older-than", type=argtypes.days, metavar="DAYS", help="delete runs older than DAYS"
    )
    p.add_argument(
        "--commit",
        action="append",
        default=[],
        metavar="SHA",
        help="delete the runs of this commit (repeatable)",
    )
    p.set_defaults(func=run_prune, _parser=p)

    p = sub.add_parser(
        "accept",
        parents=[store_opt],
        help="record that a test's new level at a commit is intended (later runs compare with it)",
        description="Record in the store that TEST's level at --at is intended: runs of that "
        "commit and of every commit descending from it are compared with stored runs since "
        "it only (baseline and noise), and reports show 'accepted at <sha>: <reason>'.",
    )
    p.add_argument("test", metavar="TEST", help="the test's node id, as perfguard history lists it")
    p.add_argument(
        "--at",
        default="HEAD",
        metavar="COMMIT",
        help="the commit whose level is accepted (default: HEAD)",
    )
    p.add_argument("--reason", required=True, metavar="TEXT", help="why the change is intended")
    p.add_argument("--repo", default=".", metavar="DIR", help="git repository (default: .)")
    p.add_argument("--author", metavar="NAME", help="who accepts (default: git's user.email)")
    p.set_defaults(func=run_accept)

    p = sub.add_parser(
        "check",
        parents=[store_opt],
        help="check the whole store: SQLite's integrity check and perfguard's values",
        description="Read every page of the store (SQLite's integrity_check: each table and "
        "index, and each index against its table) and look for values no perfguard writes "
        "(a number column holding text, a negative time, a fingerprint that is not JSON). "
        "Says what it found; exits 2 when the store is damaged.",
    )
    p.set_defaults(func=run_check)

    p = sub.add_parser(
        "recover",
        help="copy what can still be read of a damaged SQLite store into a new one",
        description="Copy every run and every whole test record that can still be read of "
        "the SQLite store SRC into a new store DEST (SRC is only read), and say per table "
        "how many rows were kept and lost. A test record that lost a row, or holds a "
        "value no perfguard writes, is left out whole.",
    )
    p.add_argument("source", metavar="SRC", help="the damaged store (a SQLite file)")
    p.add_argument("dest", metavar="DEST", help="the new store to write (must not exist)")
    p.set_defaults(func=run_recover)

    p = sub.add_parser(
        "migrate",
        parents=[store_opt],
        help="copy every run of the store into another one (e.g. a PostgreSQL server)",
    )
    p.add_argument(
        "--to",
        required=True,
        metavar="PATH_OR_URL",
        help="the store to copy into (created when empty); runs already there are skipped",
    )
    p.set_defaults(func=run_migrate)

    p = sub.add_parser(
        "merge",
        help="merge stores (a CI run's shards) into one: a run group's runs become one run",
        description="Copy every run of each SRC store into DEST (created when missing). The "
        "runs that shards of one CI run saved (same commit, machine kind and run group: "
        "--perfguard-run-group) become one run in DEST, each test once; a run already in "
        "DEST is skipped, so merging again adds nothing.",
    )
    p.add_argument("dest", metavar="DEST", help="the store to merge into (path or URL)")
    p.add_argument("sources", nargs="+", metavar="SRC", help="stores to merge from")
    p.set_defaults(func=run_merge)


def _machine(row: Any) -> str:
    if row.gpu_name:
        gpus = f"{row.gpu_count}x {row.gpu_name}" if row.gpu_count > 1 else row.gpu_name
    else:
        gpus = f"CPU {row.cpu}".strip()
    return f"{gpus} [{row.backend or '?'}] @ {row.host}"


def run_list(args: argparse.Namespace) -> int:
    with open_store(args.store, create=False) as store:
        runs = store.reader.runs(commit=args.commit)
        accepted = store.accepted.table()
    if args.commit:
        accepted = accepted[accepted["commit"].str.startswith(args.commit)]
    if args.json_out:
        write_json(runs_document(runs, accepted), args.json_out)
        if to_stdout(args):
            return 0
    if runs.empty:
        print(f"no runs in {args.store}" + (f" for commit {args.commit}" if args.commit else ""))
        return 0
    table = runs.assign(
        commit=runs["commit"].str[:12],
        branch=runs["branch"].fillna("(detached)"),
        dirty=runs["dirty"].map({True: "yes", False: ""}),
        machine=[_machine(r) for r in runs.itertuples()],
    )[["run_id", "commit", "branch", "dirty", "time", "n_tests", "machine"]]
    print(table.rename(columns={"n_tests": "tests"}).to_string(index=False))
    if not accepted.empty:
        print(f"\n{len(accepted)} acceptance(s):")
        print(accepted_table(accepted))
    return 0


def accepted_table(accepted: Any) -> str:
    """Acceptances as a table: id, test, commit, time, author, reason."""
    table = accepted.assign(
        commit=accepted["commit"].str[:12], author=accepted["author"].fillna("")
    )
    cols = ["acceptance_id", "nodeid", "commit", "time", "author", "reason"]
    return str(
        table[cols].rename(columns={"acceptance_id": "id", "nodeid": "test"}).to_string(index=False)
    )


def run_accept(args: argparse.Namespace) -> int:
    commit = resolve(args.repo, args.at)
    author = args.author
    if author is None:  # git exits 1 when no email is set: no author, not an error
        author = git(args.repo, "config", "user.email", ok=None).stdout.strip() or None
    with open_store(args.store, create=False) as store:
        if args.test not in store.reader.nodeids():
            raise BaselineError(
                f"{store.name}: no stored run of {args.test!r} (perfguard history lists the "
                "stored tests)"
            )
        new = store.accepted.record(args.test, commit, args.reason, author=author)
    reason = " ".join(args.reason.split())
    print(f"accepted {args.test} at {commit[:12]} (acceptance {new}): {reason}")
    print(f"runs of {commit[:12]} and its descendants are compared with runs since it only")
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_store(args.store, create=False) as store:
        info, records = store.reader.load_run(args.run_id)
        row = store.reader.runs(commit=info.commit)
    row = row[row["run_id"] == args.run_id].iloc[0]
    if args.json_out:
        write_json(run_document(args.run_id, info, records), args.json_out)
        if to_stdout(args):
            return 0
    print(f"run {args.run_id}: commit {info.commit}" + (" (dirty)" if info.dirty else ""))
    print(f"  branch  {info.branch or '(detached)'}")
    print(f"  time    {info.time}")
    print(f"  machine {_machine(row)}")
    if not records:
        print("  no tests recorded")
        return 0
    rows = []
    for nodeid, rec in sorted(records.items()):
        values = rec.values()
        rows.append(
            {
                "test": nodeid,
                "metric": rec.metric,
                "n": len(values),
                "median": format_ns(float(np.median(values))) if len(values) else "-",
                "min": format_ns(float(values.min())) if len(values) else "-",
                "ops": len(rec.ops),
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


def run_export(args: argparse.Namespace) -> int:
    with open_store(args.store, create=False) as store:
        count = store.export_json(args.output, args.run_ids or None)
    print(f"exported {count} run(s) to {args.output}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    """One line per file: what it added, or why it was skipped; 2 if bad files left
    nothing imported."""
    added = failed = 0
    files, kinds = len(args.files), set()
    with open_store(args.store, create=True) as store:
        if store.read_only is not None:
            raise BaselineError(
                f"{store.name}: cannot import: the store is read-only ({store.read_only})"
            )
        for name in args.files:
            if is_benchmark_path(name):
                new, bad, seen = _import_benchmarks(store, name, args.store)
                added, failed, files = added + new, failed + bad, files + seen - 1
                kinds.add("pytest-benchmark saves")
                continue
            kinds.add("exports")
            try:
                done = store.writer.import_file(name)
            except DamagedStoreError:
                raise  # the store's fault, not the file's: nothing more goes in
            except BaselineError as exc:  # one bad file does not stop the others
                failed += 1
                print(f"skipped {' '.join(str(exc).split())}", file=sys.stderr)
                continue
            added += len(done.added)
            present = f", {done.present} already present (same commit, time and host)"
            print(
                f"{name}: imported {len(done.added)} run(s) ({done.tests} test record(s)) "
                f"into {args.store}"
                + (present if done.present else "")
                + (f": run ids {', '.join(map(str, done.run_ids))}" if done.run_ids else "")
            )
    if failed and not added:
        print(
            f"perfguard: error: nothing imported: {failed} of {files} file(s) "
            f"could not be read as {' or '.join(sorted(kinds))}",
            file=sys.stderr,
        )
        return 2
    return 0


def _import_benchmarks(store: Store, name: str, label: str) -> tuple[int, int, int]:
    """pytest-benchmark's saves at ``name``, a line per file: (runs added, files skipped,
    files read)."""
    added = failed = 0
    done = import_benchmarks(store, name)
    if not done:
        print(f"skipped {name}: no pytest-benchmark save (*.json) in it", file=sys.stderr)
        return 0, 1, 1
    for f in done:
        if f.imported is None or f.run is None:
            failed += 1
            print(f"skipped {' '.join(str(f.error).split())}", file=sys.stderr)
            continue
        added += len(f.imported.added)
        run, n = f.run, len(f.run.records)
        commit, run_id = run.run.commit[:12], f.imported.run_ids[0]
        if not f.imported.added:
            print(f"{f.path}: already in {label} (run {run_id}, commit {commit}, {run.run.time})")
            continue
        kept = "as its median" if not run.with_data else "with its rounds"
        if 0 < run.with_data < n:
            kept = f"{run.with_data} with their rounds, the others as their median"
        print(
            f"{f.path}: imported 1 pytest-benchmark run of commit {commit} ({n} test "
            f"record(s), each {kept}) into {label}: run id {run_id}"
        )
    return added, failed, len(done)


def run_prune(args: argparse.Namespace) -> int:
    if args.keep_last is None and args.older_than is None and not args.commit:
        args._parser.error("give at least one of --keep-last, --older-than, --commit")
    with open_store(args.store, create=False) as store:
        removed = store.writer.prune(
            keep_last=args.keep_last, older_than_days=args.older_than, commits=args.commit
        )
        left = len(store.reader.runs())
    print(f"pruned {removed} run(s) from {args.store}; {left} left")
    return 0


def run_migrate(args: argparse.Namespace) -> int:
    with open_store(args.store, create=False) as source, open_store(args.to, create=True) as dest:
        done = dest.copy_from(source)
        name = dest.name
    print(f"copied {len(done.added)} run(s) from {args.store} to {name}" + _joined(done))
    return 0


def _joined(done: Imported) -> str:
    """The tail of a copy's line: shard runs joined, runs already there."""
    out = ""
    if done.joined:
        out += f"; {len(done.joined)} joined their run group's run"
    if done.present:
        out += f"; {done.present} already there"
    return out


def run_merge(args: argparse.Namespace) -> int:
    """One line per SRC: runs added, shard runs joined, test records, runs already there."""
    with open_store(args.dest, create=True) as dest:
        for src in args.sources:
            with open_store(src, create=False) as source:
                done = dest.copy_from(source)
            print(
                f"{src}: {len(done.added)} run(s) added, {done.tests} test record(s) "
                f"into {dest.name}" + _joined(done)
            )
        runs = dest.reader.runs()
    print(f"{dest.name}: {len(runs)} run(s), {int(runs['n_tests'].sum())} test record(s)")
    return 0


def run_check(args: argparse.Namespace) -> int:
    """What the checks found; DamagedStoreError (exit 2) when anything."""
    found = check(args.store)
    counted = {t: n for t, n in found.rows.items() if n is not None}
    runs, tests = counted.get("runs"), counted.get("tests")
    size = (
        f"{runs if runs is not None else '?'} run(s), "
        f"{tests if tests is not None else '?'} test record(s), {sum(counted.values()):,} "
        f"rows in {len(counted)} of {len(found.rows)} tables"
    )
    schema = f"schema v{found.schema}" if found.schema is not None else "schema unreadable"
    if found.ok and (found.schema or 0) > SCHEMA_VERSION:
        print(
            f"{found.name}: structure ok ({size}, {schema}, newer than this "
            f"perfguard's v{SCHEMA_VERSION}: values not checked; upgrade perfguard)"
        )
        return 0
    if found.ok:
        print(
            f"{found.name}: ok ({size}, {schema}; structure and values checked "
            f"in {found.seconds:.2f} s)"
        )
        return 0
    print(f"{found.name}: damaged ({size}, {schema})")
    if found.structure:
        print(
            f"SQLite's check: {len(found.structure)} problem(s)"
            + (" (the first 100)" if len(found.structure) >= 100 else "")
        )
        for line in found.structure[:SHOWN]:
            print(f"  {line}")
        if len(found.structure) > SHOWN:
            print(f"  ... {len(found.structure) - SHOWN} more")
    for table, n in found.values.items():
        print(f"{table}: {n} row(s) holding a value no perfguard writes")
    unread = [t for t, n in found.rows.items() if n is None]
    if unread:
        print(f"cannot be counted: {', '.join(unread)}")
    first = (
        found.structure[0]
        if found.structure
        else next(f"{n} row(s) of {t} hold impossible values" for t, n in found.values.items())
    )
    more = len(found.structure) + len(found.values) - 1
    detail = first[:200] + (f", and {more} more problem(s)" if more > 0 else "")
    raise DamagedStoreError(
        f"{found.name}: the store is damaged ({detail}); 'perfguard baseline recover "
        f"{found.name} NEW.db' copies what can still be read into a new store"
    )


def run_recover(args: argparse.Namespace) -> int:
    done = recover(args.source, args.dest)
    print(f"recovered {done.source} into {done.dest}:")
    width = max(len(t) for t in done.kept) if done.kept else 0
    for table, kept in done.kept.items():
        before, lost = done.before.get(table), done.lost(table)
        if before is None:
            print(f"  {table:<{width}}  {kept:,} row(s) kept; how many it held cannot be read")
        else:
            print(
                f"  {table:<{width}}  {kept:,} of {before:,} row(s) kept"
                + (f", {lost:,} lost" if lost else "")
            )
    for table, ranges in done.unreadable.items():
        if ranges:
            spans = ", ".join(
                f"after rowid {'(start)' if a is None else a} up to {'(end)' if b is None else b}"
                for a, b in ranges[:5]
            )
            print(f"  unreadable in {table}: {spans}" + (" ..." if len(ranges) > 5 else ""))
    for table, n in done.impossible.items():
        print(f"  {table}: {n} row(s) with a value no perfguard writes left out")
    if done.incomplete_tests:
        print(
            f"  {done.incomplete_tests} test record(s) left out whole: a row of theirs "
            "could not be read or held an impossible value"
        )
    print(
        "nothing was lost"
        if done.complete
        else f"{done.dest} holds every whole record that could be read; check it with "
        f"'perfguard baseline check --store {done.dest}'"
    )
    return 0
