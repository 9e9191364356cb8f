"""``perfguard history [TEST]``: a test's level and counters across commits, and where it moved.

A thin client of :func:`perfguard.compare.history.load_history`: the runs
of the test on the first-parent history of ``--ref`` on one machine, one
line per run (the run-level median and the counters, per iteration), then
each timing change point (step, drift or change of spread) with its commit,
size and the ops that moved most, then each counter change point (exact:
counter, before -> after, the ops that changed). Without TEST, one line per
stored test.
"""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from perfguard.baseline.accept import Acceptance, since
from perfguard.baseline.store import Store, open_store
from perfguard.commands import argtypes
from perfguard.commands.baseline import store_option
from perfguard.commands.jsonout import add_json_option, to_stdout, write_json
from perfguard.compare.documents import document, history_document, history_summary
from perfguard.compare.history import load_history
from perfguard.compare.units import figure, format_ns, human, percent, signed
from perfguard.errors import BaselineError, DamagedStoreError

#: counters shown as columns when the records carry them, in this order
SHOWN_COUNTERS = ("calls", "kernels", "flops", "syncs", "bytes")


def add_parser(subparsers: Any) -> None:
    """Register ``history``."""
    p = subparsers.add_parser(
        "history",
        parents=[store_option()],
        help="a test's stored level and counters across commits, with change points",
        description="The primary metric (median over each run's rounds) and counters of a "
        "test across the stored commits of the first-parent history of --ref on one machine, "
        "with the timing change points (steps, drifts, changes of spread) and the exact "
        "counter change points, each with the ops that moved most.",
    )
    p.add_argument("test", nargs="?", metavar="TEST", help="test node id; default: every test")
    p.add_argument("--repo", default=".", metavar="DIR", help="git repository (default: .)")
    p.add_argument("--ref", default="HEAD", metavar="REF", help="history of (default: HEAD)")
    p.add_argument(
        "--metric",
        choices=("gpu_time", "wall_time", "cpu_time", "instructions", "est_cycles"),
        help="default: each record's primary metric",
    )
    p.add_argument("--limit", type=argtypes.integer(2), metavar="N", help="only the latest N runs")
    p.add_argument(
        "--ops",
        type=argtypes.integer(0),
        default=3,
        metavar="N",
        help="ops listed under each change point (default: 3)",
    )
    add_json_option(p, "the history (perfguard.history/1; without TEST perfguard.history-list/1)")
    p.set_defaults(func=run)


def _accepted_on(store: Store, nodeid: str, repo: str, ref: str) -> list[Any]:
    """The test's acceptances whose commit is on the history of ``ref``, oldest first."""
    out = []
    for a in store.accepted.table(nodeid).itertuples(index=False):
        commits = since(repo, str(a.commit), ref)
        if commits is not None:
            author = a.author if isinstance(a.author, str) else None
            out.append(
                Acceptance(
                    str(a.nodeid), str(a.commit), str(a.reason), str(a.time), author, commits
                )
            )
    return out


def _level(metric: str, value: float) -> str:
    """A run's level: a time, or a count per iteration (host instructions)."""
    return figure(value, metric if metric in ("instructions", "est_cycles") else "ns")


def _print_history(hist: Any, accepted: list[Any] = ()) -> None:  # type: ignore[assignment]
    levels, counters = hist.levels, hist.counters.set_index("run_id")
    shown = [c for c in SHOWN_COUNTERS if c in counters.columns]
    shown += sorted(c for c in counters.columns if c not in shown)[: max(0, 6 - len(shown))]
    cps = {cp.index: cp for cp in hist.change_points}
    steps = {s.index for s in hist.counter_steps}
    marks = {a.commit for a in accepted}
    # what the sessions saw of the machine: a run measured unusually is no change point
    unusual = "machine" in levels.columns and bool(levels["machine"].astype(bool).any())
    rows = []
    for i, r in enumerate(levels.itertuples(index=False)):
        row = {
            "": ("*" if i in cps else "")
            + ("c" if i in steps else "")
            + ("A" if r.commit in marks else ""),
            "run": r.run_id,
            "commit": r.commit[:10],
            "time": str(r.time)[:19],
            hist.metric: _level(hist.metric, float(r.value)),
            "rounds": r.n_rounds,
        }
        for c in shown:
            value = float(counters.at[r.run_id, c])
            row[c] = human(value, c) if value == value else "-"
        if unusual:
            row["machine"] = r.machine or "-"
        rows.append(row)
    fp = hist.fingerprint
    machine = (fp.gpu_name or f"CPU {fp.cpu}".strip()) + f" [{fp.backend or '?'}] @ {fp.host}"
    print(f"{hist.nodeid}: {len(levels)} run(s) on {machine}")
    print(pd.DataFrame(rows).to_string(index=False))
    for a in accepted:
        print(f"{a.describe()} ({a.time}{', ' + a.author if a.author else ''}; A above)")
    _print_timing_points(hist)
    _print_counter_steps(hist)


def _print_timing_points(hist: Any) -> None:
    if len(hist.levels) < hist.runs_needed:
        print(f"timing change points: needs {hist.runs_needed} runs (has {len(hist.levels)})")
        return
    if not hist.change_points:
        print("no timing change points")
        return
    print(f"{len(hist.change_points)} timing change point(s) (* above):")
    for cp in hist.change_points:
        print(
            f"  {cp.commit[:10]} (run {cp.run_id}): {cp.what} {percent(cp.change_pct, True)} "
            f"({_level(hist.metric, cp.before_ns)} -> {_level(hist.metric, cp.after_ns)}, "
            f"{cp.z:.1f} standard errors)"
        )
        for op in cp.ops:
            pct = f" ({percent(op.change_pct, True)})" if op.before_ns else ""
            print(f"      {op.op_name}: {format_ns(op.before_ns)} -> {format_ns(op.after_ns)}{pct}")


def _print_counter_steps(hist: Any) -> None:
    if not hist.counter_steps:
        print("no counter change points")
        return
    print(f"{len(hist.counter_steps)} counter change point(s) (c above, exact):")
    for s in hist.counter_steps:
        per = "" if s.counter in ("kernel_set", "tc_ops", "dtypes", "peak_memory") else "/iter"
        # 67.4 MB -> 67.4 MB/iter says nothing: the change itself, in the counter's unit
        delta = f" ({signed(s.after - s.before, s.counter)})" if per else ""
        moved = f"{human(s.before, s.counter)} -> {human(s.after, s.counter)}{per}{delta}"
        print(f"  {s.commit[:10]} (run {s.run_id}): {s.counter} {moved}")
        for name, before, after in s.ops:
            if s.counter in ("kernel_set", "tc_ops", "dtypes"):
                print(f"      {'+' if after else '-'} {name}")
            else:
                print(f"      {name}: {human(before, s.counter)} -> {human(after, s.counter)}")


def run(args: argparse.Namespace) -> int:
    quiet = to_stdout(args)
    summaries = []

    with open_store(args.store, create=False) as store:
        tests = [args.test] if args.test else store.reader.nodeids()
        if not tests and not args.json_out:
            print(f"no runs in {store.name}")
            return 0
        for nodeid in tests:
            try:
                hist = load_history(
                    store,
                    nodeid,
                    repo=args.repo,
                    ref=args.ref,
                    metric=args.metric,
                    limit=args.limit,
                    top_ops=args.ops,
                )
            except DamagedStoreError:
                raise  # never a list with the damaged tests left out
            except BaselineError:
                if args.test:
                    raise
                continue  # a test with no run on this history: not listed
            accepted = _accepted_on(store, nodeid, args.repo, args.ref)
            if args.test:
                if args.json_out:
                    write_json(history_document(hist, accepted), args.json_out)
                if not quiet:
                    _print_history(hist, accepted)
                continue
            summaries.append(history_summary(hist, accepted))
            if quiet:
                continue
            last = hist.change_points[-1] if hist.change_points else None
            moved = (
                f"; last change {last.commit[:10]} {percent(last.change_pct, True)}" if last else ""
            )
            if hist.counter_steps:
                c = hist.counter_steps[-1]
                moved += (
                    f"; {len(hist.counter_steps)} counter change point(s), last "
                    f"{c.commit[:10]} {c.counter}"
                )
            last_ok = accepted[-1] if accepted else None
            shown = f"; {last_ok.describe()}" if last_ok else ""
            print(
                f"{nodeid}: {len(hist.levels)} run(s), latest "
                f"{_level(hist.metric, float(hist.levels['value'].iloc[-1]))}, "
                f"{len(hist.change_points)} timing change point(s){moved}{shown}"
            )
    if args.json_out and not args.test:
        write_json(
            document("history-list", {"store": store.name, "ref": args.ref, "tests": summaries}),
            args.json_out,
        )
    return 0
