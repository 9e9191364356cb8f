"""``perfguard compare CURRENT BASELINE``: the verdict on two captures or two stored runs.

Each side is one of:

* a capture: an nsys ``.sqlite``, a Kineto ``.json[.gz]``, or a folder of
  per-rank traces. It is read, analysed (``--key-node`` sets the
  iterations) and turned into one test record.
* ``STORE.db#RUN_ID``: a run in a baseline store. Every test in it is a
  record.

With ``--against BASE`` the two sides are commits instead: A/B mode
(:mod:`perfguard.plugin.ab`) runs ``pytest --perfguard
--perfguard-against BASE`` in the HEAD commit's tree (a worktree when
``--head`` names another commit) and prints its verdicts; the pytest
arguments (which tests) come from ``--pytest-args``.

Two runs are matched by nodeid. A test that is only in CURRENT is ``new``.
Two stored runs are judged as the session that saved CURRENT judged it: with
what each run's session saw of the machine (kept in each record's ``meta``:
the reference workload's time, the wait for a CPU; read by the judge itself)
and, when both are in one store, the test's stored levels before CURRENT as
its history, so a run saved on a busy machine is as ``noisy`` here as it was
live.
A capture can be compared with a run that holds one test. Machines that
differ give ``incomparable``: for runs, the stored fingerprints; for
captures, the GPU names in the traces. So do environments that differ in a
blocking field (a stored run's recorded environment, or what a capture says of
its driver and clocks: :mod:`perfguard.environment`) unless ``--compare-across``
names its group; every other difference is listed with each verdict. The exit code is 1 when a test
regressed, 0 otherwise, and 2 on bad input (``perfguard.cli.main``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from perfguard.analysis import analyze
from perfguard.baseline.db import is_url
from perfguard.baseline.git import GitError, common_dir, prepare_worktree, toplevel
from perfguard.baseline.record import record_from_analysis
from perfguard.baseline.store import open_store
from perfguard.commands import argtypes
from perfguard.commands.jsonout import add_json_option, to_stdout, write_json
from perfguard.compare import Outcome, compare_records
from perfguard.compare.against import history_levels, settings_for
from perfguard.compare.documents import document
from perfguard.compare.outcomes import fails
from perfguard.compare.results import load_results
from perfguard.compare.tolerance import ALPHA
from perfguard.compare.units import format_ns, interval, p_value, percent
from perfguard.environment import Environment, parse_across
from perfguard.environment import incompatibility as env_incompatibility
from perfguard.errors import AnalysisError, CompareError, ReportError
from perfguard.trace import load_trace


def add_parser(subparsers: Any) -> None:
    """Register ``compare``."""
    p = subparsers.add_parser(
        "compare",
        help="compare two captures or stored runs; exit 1 on a regression",
        description="The judge's verdict of CURRENT against BASELINE, per test and per op: "
        "timing (the change of the rounds' level with its interval against the noise) "
        "and the deterministic gates (op calls, FLOPs, dtypes, syncs, ...), with the "
        "explanation the plugin's reports give.",
    )
    for name in ("current", "baseline"):
        p.add_argument(
            name,
            nargs="?",
            metavar=name.upper(),
            help="capture (.sqlite, .json[.gz], folder of ranks) or STORE.db#RUN_ID",
        )
    p.add_argument(
        "--against",
        metavar="BASE",
        help="A/B mode: measure commit BASE and HEAD (or --head) in alternating "
        "rounds of their benchmark tests on this machine",
    )
    p.add_argument(
        "--head", metavar="REF", help="A/B mode: the commit judged (default: the working tree)"
    )
    p.add_argument(
        "--pytest-args",
        default="",
        metavar="ARGS",
        help='A/B mode: which tests, as pytest arguments (e.g. "examples -k '
        'block"); --perfguard-ab-pairs etc. may be added here',
    )
    p.add_argument(
        "--repo", default=".", metavar="DIR", help="A/B mode: the git repository (default: .)"
    )
    p.add_argument(
        "--tolerance",
        type=argtypes.tolerance,
        default=None,
        metavar="PCT",
        help="smallest slowdown of the level that counts (default: a stored test's "
        "marker, else 5%%)",
    )
    p.add_argument(
        "--alpha",
        type=argtypes.alpha,
        default=ALPHA,
        help=f"significance level of the change's interval (default: {ALPHA:g})",
    )
    p.add_argument(
        "--compare-across",
        action="append",
        default=[],
        metavar="GROUP[,GROUP]",
        help="compare anyway when the environments differ in this group (driver, clocks, "
        "power_limit, ecc, mig, cpu_quota, or all); the difference is listed with the verdict",
    )
    p.add_argument(
        "--key-node",
        "--key_node",
        dest="key_node",
        metavar="NAME",
        help="range that ends each iteration, for captures (DLProf semantics)",
    )
    p.add_argument(
        "--output",
        default=".perfguard/compare",
        metavar="DIR",
        help="A/B mode: where the run's results.json, report.html and summary.md are "
        "written and kept (default: .perfguard/compare)",
    )
    add_json_option(p, "the verdicts (perfguard.compare/2: results.json schema 3 entries)")
    p.add_argument(
        "--ops",
        type=int,
        default=5,
        metavar="N",
        help="ops listed under each regressed/improved test (default: 5)",
    )
    p.set_defaults(func=run)


def _store_spec(text: str) -> tuple[Path | str, str] | None:
    """``(store, run id)`` when ``text`` is ``FILE#RUN`` and FILE exists, or ``URL#RUN``
    with a postgresql:// URL; else None."""
    if "#" not in text or Path(text).exists():
        return None
    path, _, run = text.rpartition("#")
    if is_url(path):
        return path, run
    if not Path(path).is_file():
        return None
    return Path(path), run


class _Side:
    """One side of the comparison: records by nodeid, and what to check machines with."""

    def __init__(self, spec: str, key_node: str | None, nodeid: str) -> None:
        self.spec = spec
        self.commit: str | None = None
        self.fingerprint: Any = None
        self.gpus: tuple[str, ...] = ()
        self.environment = Environment()
        self.store: Path | str | None = None
        self.run_id: int | None = None
        stored = _store_spec(spec)
        if stored is None:
            self.records = {nodeid: self._capture(spec, key_node, nodeid)}
            self.is_run = False
            return
        path, run = stored
        if not run.strip().isdigit():
            raise CompareError(f"{spec}: run id must be an integer (see perfguard baseline list)")
        with open_store(path, create=False) as store:
            info, self.records = store.reader.load_run(int(run))
        self.store, self.run_id = path, int(run)
        self.commit = info.commit
        self.fingerprint = info.fingerprint
        self.environment = info.environment
        self.is_run = True

    def _capture(self, spec: str, key_node: str | None, nodeid: str) -> Any:
        trace = load_trace(spec)
        try:
            analysis = analyze(trace, key_node=key_node)
        except AnalysisError as exc:
            raise AnalysisError(f"{spec}: {exc}") from None
        self.environment = trace.environment
        names: Iterable[object] = trace.devices["name"] if "name" in trace.devices else []
        self.gpus = tuple(sorted({str(n) for n in names if isinstance(n, str) and n}))
        # a capture is one round: its iterations are the samples the timing is judged on
        it = analysis.iterations
        n = int((it["rank"] == it["rank"].min()).sum()) if len(it) else 0
        return record_from_analysis(
            nodeid, analysis, meta={"capture": spec}, rounds=np.arange(n, dtype=np.int64)
        )


def capture_nodeid(spec: str) -> str | None:
    """The test a capture belongs to, from the session's ``results.json`` that names it
    (the capture lies in its ``captures/`` folder); None when no session names it."""
    path = Path(spec).resolve()
    for results in (path.parent.parent / "results.json", path.parent / "results.json"):
        try:
            doc = json.loads(results.read_text())
        except (OSError, ValueError):
            continue
        for test in doc.get("tests") or [] if isinstance(doc, dict) else []:
            capture = test.get("capture") if isinstance(test, dict) else None
            if capture and Path(capture).name == path.name and test.get("nodeid"):
                return str(test["nodeid"])
    return None


def _incompatibility(current: _Side, baseline: _Side) -> str | None:
    if current.fingerprint is not None and baseline.fingerprint is not None:
        return current.fingerprint.incompatibility(baseline.fingerprint)
    if current.gpus and baseline.gpus and current.gpus != baseline.gpus:
        return f"gpu differs: {list(baseline.gpus)} (baseline) vs {list(current.gpus)} (current)"
    return None


def _histories(current: _Side, baseline: _Side) -> dict[str, Any]:
    """Two runs of one store: each test's stored levels before the current run on its
    machine (the between-run noise its session judged with); else none."""
    if current.store is None or current.store != baseline.store or current.run_id is None:
        return {}
    with open_store(current.store, create=False) as store:
        return {
            nodeid: history_levels(
                store, rec, current.fingerprint, None, before_run_id=current.run_id
            )
            for nodeid, rec in current.records.items()
        }


def run(args: argparse.Namespace) -> int:
    if args.against:
        return run_ab(args)
    if not (args.current and args.baseline):
        raise CompareError("compare needs CURRENT and BASELINE, or --against BASE (A/B mode)")

    label = Path(args.current.rpartition("#")[0] or args.current).name or args.current
    if _store_spec(args.current) is None:  # a capture: its test's own name where a session says
        label = capture_nodeid(args.current) or label
    current = _Side(args.current, args.key_node, label)
    baseline = _Side(args.baseline, args.key_node, label)
    if current.is_run != baseline.is_run:  # a capture against a run: match its one test
        run_side, capture_side = (current, baseline) if current.is_run else (baseline, current)
        if len(run_side.records) != 1:
            raise CompareError(
                f"{run_side.spec}: holds {len(run_side.records)} tests; a capture is compared "
                "with a run of exactly one test (or compare two runs)"
            )
        ((only, record),) = run_side.records.items()
        capture_side.records = {only: _renamed(capture_side.records[label], only)}
    if not current.records:
        raise CompareError(f"{current.spec}: no tests recorded")
    try:
        across = parse_across(args.compare_across)
    except ValueError as exc:
        raise CompareError(f"--compare-across: {exc}") from None
    changes = current.environment.changes_since(baseline.environment, across)
    reason = _incompatibility(current, baseline) or env_incompatibility(changes)
    timing_reason = (
        current.fingerprint.timing_incompatibility(baseline.fingerprint)
        if current.fingerprint is not None and baseline.fingerprint is not None
        else None
    )
    histories = _histories(current, baseline)
    results = []
    for nodeid, rec in sorted(current.records.items()):
        settings = settings_for(rec, args.tolerance, args.alpha)  # the marker's, as stored
        results.append(
            compare_records(
                rec,
                baseline.records.get(nodeid),
                tolerance=settings.tolerance,
                alpha=args.alpha,
                incompatibility=reason,
                baseline_commit=baseline.commit,
                baseline_run_exists=baseline.is_run,
                gates=(rec.meta.get("marker") or {}).get("gates"),
                timing_incompatibility=timing_reason,
                environment=changes,
                history=histories.get(nodeid),
            )
        )
    gone = sorted(set(baseline.records) - set(current.records))
    if not to_stdout(args):
        if not (current.is_run or baseline.is_run):
            metric = results[0].metric if results else "time"
            print(
                f"timing: each capture's per-iteration {metric} (a capture is one round: "
                "its iterations are the samples)"
            )
        print(_table(results))
        for r in results:
            print(f"\n{r.outcome.value.upper()} {r.nodeid}\n  {r.explanation.text('    ')}")
            if r.outcome in (Outcome.REGRESSED, Outcome.IMPROVED) and args.ops > 0:
                print(_ops_table(r.ops.head(args.ops)))
        for nodeid in gone:
            print(f"\nMISSING {nodeid}: in the baseline, not in the current run")
    if args.json_out:
        payload = {
            "mode": "records",
            "current": args.current,
            "baseline": args.baseline,
            "tests": [r.to_dict() for r in results],
            "missing": gone,
        }
        write_json(document("compare", payload), args.json_out)
        if not to_stdout(args):
            print(f"\nJSON written: {args.json_out}")
    return 1 if any(fails(r.outcome) for r in results) else 0


def run_ab(args: argparse.Namespace) -> int:
    """A/B mode for two commits: the plugin's A/B run in HEAD's tree, its verdicts printed."""
    repo = Path(args.repo).resolve()
    try:
        root = toplevel(repo)
        common = common_dir(root)
    except GitError:
        raise CompareError(f"{repo}: not a git repository (A/B mode needs one)") from None
    tree = root
    if args.head:
        try:
            tree, _ = prepare_worktree(root, args.head, common / "perfguard-ab")
        except GitError as exc:
            raise CompareError(f"--head {args.head}: cannot check it out: {exc}") from None
    out = Path(args.output).resolve()  # kept: the report it names must still be there
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *shlex.split(args.pytest_args),
        "--perfguard",
        f"--perfguard-against={args.against}",
        f"--perfguard-output={out}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    if args.tolerance is not None:
        argv.append(f"--perfguard-tolerance={args.tolerance}")
    done = subprocess.run(argv, cwd=tree, check=False)
    try:
        results = load_results(out / "results.json")
    except ReportError:
        raise CompareError(
            f"the A/B run in {tree} wrote no results in {out} (pytest exited {done.returncode})"
        ) from None
    doc = results.to_dict()
    tests = doc.get("tests", [])
    if not to_stdout(args):
        for t in results.sorted_tests():
            print(f"\n{t.outcome.value.upper()} {t.nodeid}\n  {t.explained.text('    ')}")
        print(f"\nreport: {out / 'report.html'} (summary.md beside it)")
    if args.json_out:
        payload = {
            "mode": "ab",
            "current": args.head or "working tree",
            "baseline": args.against,
            "tests": tests,
            "missing": [],
            "results": str(out / "results.json"),
        }
        write_json(document("compare", payload), args.json_out)
    return 1 if any(fails(t.outcome) for t in results.tests) else 0


def _renamed(record: Any, nodeid: str) -> Any:
    return replace(record, nodeid=nodeid)


def _table(results: list[Any]) -> str:
    # the levels whose ratio is the change (geometric means of the rounds), not medians
    rows = [("outcome", "test", "baseline", "current", "change", "interval", "p", "n")]
    for r in results:
        ci = interval(r.ci_low_pct, r.ci_high_pct)
        rows.append(
            (
                r.outcome.value,
                r.nodeid,
                format_ns(r.level_baseline_ns),
                format_ns(
                    r.median_current_ns if r.level_current_ns is None else r.level_current_ns
                ),
                percent(r.delta_pct, True),
                ci,
                p_value(r.p_value),
                f"{r.n_current}/{r.n_baseline}",
            )
        )
    return _format(rows)


def _ops_table(ops: Any) -> str:
    rows = [("  op", "dir", "status", "baseline", "current", "change", "p")]
    for o in ops.itertuples(index=False):
        rows.append(
            (
                f"  {o.op_name}",
                str(o.direction),
                o.status,
                format_ns(o.baseline_ns),
                format_ns(o.current_ns),
                percent(o.delta_pct, True),
                p_value(o.p_value),
            )
        )
    return _format(rows)


def _format(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
