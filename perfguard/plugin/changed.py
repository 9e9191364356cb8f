"""``--perfguard-changed``: only the benchmarks a change can move run; the rest carry their verdict.

A benchmark is skipped when perfguard can rule out that the pull request touches what it
executes, and only then (:func:`plan`):

* **the run as a whole** goes ahead in full on the default branch (a push to main measures
  everything, so the next pull request has verdicts to carry), without a stored baseline
  run, when the environment differs from the baseline run's (installed packages,
  perfguard's version, the probed driver, CUDA and framework versions), when a file that
  defines the environment or pytest's configuration changed (``pyproject.toml``, a lock
  file, ``requirements*.txt``, ``tox.ini``, ...), or when a file changed that is neither
  Python, documentation, nor named by a benchmark's code (a C++ source, a CI script):
  perfguard cannot tell what it moves;
* **a benchmark** runs when its baseline record is missing, lacks what it loaded (an older
  perfguard saved it) or a carriable verdict (regressed, error, crashed and incomparable
  are measured again), when its files (:class:`~perfguard.plugin.footprint.ImportGraph`:
  its test file, conftests, the project modules they import, those its process loaded by
  other means, the files its ops were called from) include a Python file whose code
  changed (a change to docstrings, comments or layout alone is not one), when its code
  names a changed data or config file, or when its code imports by computed names.

A skipped benchmark is deselected (pytest counts it) and its entry carries the verdict the
baseline commit's session gave it, with ``carried_from`` set and the message "not run:
nothing it executes changed since <commit> …", so every view says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from perfguard.baseline.git import changed_since, default_baseline_ref, file_at
from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import TestEntry
from perfguard.compare.units import percent
from perfguard.errors import PerfguardError
from perfguard.plugin.context import SessionContext
from perfguard.plugin.footprint import (
    FOOTPRINT_KEY,
    Closure,
    ImportGraph,
    SessionFootprint,
    code_text,
)

__all__ = ["VERDICT_KEY", "ChangedPlan", "classify", "plan", "select_changed", "verdict_meta"]

#: the record's meta key of the verdict its session gave it (stamped at save)
VERDICT_KEY = "verdict"
#: verdicts a skipped benchmark may carry; any other is measured again
CARRIED = {
    Outcome.UNCHANGED,
    Outcome.IMPROVED,
    Outcome.NOISY,
    Outcome.NO_BASELINE,
    Outcome.NEW,
    Outcome.NOT_JUDGED,
}
#: files that define the environment or pytest's configuration: any change runs everything
_MANIFESTS = re.compile(
    r"(^|/)(pyproject\.toml|setup\.py|setup\.cfg|pytest\.ini|tox\.ini|noxfile\.py|"
    r"requirements[^/]*\.(txt|in)|constraints[^/]*\.txt|Pipfile(\.lock)?|[^/]*\.lock|"
    r"environment[^/]*\.ya?ml|conda-lock\.ya?ml|\.python-version|Dockerfile[^/]*|"
    r"MANIFEST\.in)$"
)
#: what running tests and tools leaves in a work tree: never a change of the code
_LEFT_BY_RUNS = re.compile(
    r"(^|/)(__pycache__|\.pytest_cache|\.mypy_cache|\.ruff_cache|\.hypothesis|\.tox|\.nox|"
    r"\.venv|venv)/|\.py[co]$"
)
_DOC_SUFFIXES = {".md", ".rst", ".adoc", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".ico"}
_DOC_NAMES = re.compile(
    r"^(LICEN[CS]E|COPYING|AUTHORS|CHANGELOG|CHANGES|NOTICE|CITATION|CODEOWNERS)[^/]*$|"
    r"^\.(gitignore|gitattributes|mailmap|pre-commit-config\.yaml)$"
)


def classify(path: str) -> str:
    """``manifest``, ``python``, ``doc`` or ``data`` (anything else a benchmark may read)."""
    p = PurePosixPath(path)
    if _MANIFESTS.search(path):
        return "manifest"
    if p.suffix == ".py":
        return "python"
    if p.suffix.lower() in _DOC_SUFFIXES or _DOC_NAMES.match(p.name) or p.parts[0] == "docs":
        return "doc"
    return "data"


def verdict_meta(entry: TestEntry) -> dict[str, Any]:
    """``meta["verdict"]`` of a saved record: the outcome its session gave it."""
    return {"outcome": entry.outcome.value, "delta_pct": entry.delta_pct}


@dataclass
class ChangedPlan:
    """What ``--perfguard-changed`` decided: the carried entries of the benchmarks it skips,
    why each other one runs, and why everything runs (None: it chose per benchmark)."""

    carried: dict[str, TestEntry] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)
    everything: str | None = None

    def note(self) -> str:
        """The session's note: what was skipped and why the rest ran."""
        if self.everything is not None:
            return f"--perfguard-changed: every benchmark runs: {self.everything}"
        why: dict[str, int] = {}
        for reason in self.runs.values():
            why[reason] = why.get(reason, 0) + 1
        told = "; ".join(f"{r} ({n})" for r, n in sorted(why.items(), key=lambda x: -x[1])[:4])
        return (
            f"--perfguard-changed: {len(self.carried)} of {len(self.carried) + len(self.runs)} "
            "benchmark(s) not run (nothing they execute changed; verdicts carried)"
            + (f"; run: {told}" if told else "")
        )


def _runs_differently(now: str, before: str) -> bool:
    """Whether two versions of a Python file differ in what runs (a file that does not
    parse, before or after, differs wherever its text does)."""
    a, b = code_text(now), code_text(before)
    return a is None or b is None or a != b


def _named(path: str, literals: Iterable[str]) -> bool:
    """Whether a string of the code names the data file ``path``: its file name inside
    one, or one of its folders as a whole path component (``"configs/" + name``)."""
    p = PurePosixPath(path)
    folders = set(p.parts[:-1])
    for lit in literals:
        if p.name in lit or (folders and folders & set(re.split(r"[/\\]", lit))):
            return True
    return False


def _carried(nodeid: str, verdict: dict[str, Any], commit: str) -> TestEntry:
    outcome = Outcome(verdict["outcome"])
    delta = verdict.get("delta_pct")
    there = outcome.value + (f" {percent(delta, True)}" if isinstance(delta, float) else "")
    return TestEntry(
        nodeid=nodeid,
        outcome=outcome,
        message=f"not run: nothing it executes changed since {commit[:12]} (its verdict "
        f"there: {there})",
        baseline_commit=commit,
        carried_from=commit,
    )


def plan(
    tests: Mapping[str, Path],
    *,
    graph: ImportGraph,
    commit: str,
    changes: list[str],
    old_text: Callable[[str], str | None],
    metas: Mapping[str, dict[str, Any]],
    packages: str,
    everything: str | None = None,
    untracked: Sequence[str] = (),
) -> ChangedPlan:
    """Which of ``tests`` (node id -> its file) run (module docstring). ``commit``: the
    baseline run's; ``changes``: paths changed since it (relative to ``graph.root``);
    ``untracked``: files git does not track (a new module counts where it is imported, a
    data file where code names it; anything else is what runs leave: outputs, logs);
    ``old_text(path)``: a file's text at ``commit``; ``metas``: the baseline run's records'
    meta by node id; ``packages``: this environment's digest; ``everything``: a reason found
    by the caller to run them all (the default branch, the environment)."""
    kinds = {p: classify(p) for p in changes}
    manifest = next((p for p, k in kinds.items() if k == "manifest"), None)
    if everything is None and manifest is not None:
        everything = f"{manifest} changed (it defines the environment or pytest's setup)"
    if everything is not None:
        return _all(tests, everything)

    root = graph.root
    moved: set[Path] = set()  # Python files whose code changed
    for p, k in kinds.items():
        if k != "python":
            continue
        new = root / p
        now = new.read_text(encoding="utf-8", errors="replace") if new.is_file() else None
        before = old_text(p)
        if now is None or before is None or now != before and _runs_differently(now, before):
            moved.add(new.resolve())
    data = [p for p, k in kinds.items() if k == "data"]
    for p in untracked:  # new: a module where imported, a data file where named
        if p.endswith(".py"):
            moved.add((root / p).resolve())
        elif classify(p) == "data":
            data.append(p)

    # one closure per test file: a parametrized test's node ids share theirs
    by_file = {f: graph.closure(graph.test_starts(f)) for f in set(tests.values())}
    named_by_any = set()
    for c in by_file.values():
        named_by_any |= {p for p in data if p not in named_by_any and _named(p, c.literals)}
    unread = [p for p in data if p not in named_by_any and p not in untracked]
    if unread:
        return _all(
            tests,
            f"{unread[0]} changed and no benchmark's code names it: it may be read by a "
            "name perfguard cannot see",
        )

    out = ChangedPlan()
    for nodeid, test_file in tests.items():
        meta = metas.get(nodeid)
        why = _why_run(meta, by_file[test_file], moved, data, packages, root, commit)
        if why is None and meta is not None:
            out.carried[nodeid] = _carried(nodeid, meta[VERDICT_KEY], commit)
        else:
            out.runs[nodeid] = why or "no baseline record"
    return out


def _why_run(
    meta: dict[str, Any] | None,
    closure: Closure,
    moved: set[Path],
    data: list[str],
    packages: str,
    root: Path,
    commit: str,
) -> str | None:
    """Why one benchmark must run, or None when nothing it executes changed."""
    if meta is None:
        return f"the baseline run at {commit[:12]} has no record of it"
    verdict = meta.get(VERDICT_KEY)
    if not isinstance(verdict, dict) or verdict.get("outcome") not in {o.value for o in CARRIED}:
        said = verdict.get("outcome") if isinstance(verdict, dict) else "not recorded"
        return f"its verdict at {commit[:12]} was {said}: measured again"
    footprint = meta.get(FOOTPRINT_KEY)
    if not isinstance(footprint, dict):
        return "its baseline record does not say what it loaded (saved by an older perfguard)"
    if footprint.get("packages") != packages:
        return "the installed packages differ from its baseline run's"
    if closure.unknowable:
        return f"perfguard cannot follow its imports: {closure.unknowable[0]}"
    files = set(closure.files)
    files |= {(root / p).resolve() for p in footprint.get("loaded") or []}
    for site in (meta.get("call_sites") or {}).values():
        m = re.match(r"(.+?):\d+", str(site))
        if m:
            files.add((root / m.group(1)).resolve())
    hit = sorted(files & moved)
    if hit:
        return f"its code changed: {hit[0].relative_to(root).as_posix()}"
    for p in data:
        if _named(p, closure.literals):
            return f"{p} changed, which its code names"
    return None


def _everything(ctx: SessionContext) -> str | None:
    """Why every benchmark must run this session, whatever changed; None: decide each."""
    match, git = ctx.match, ctx.git
    if git is None:
        return "no git repository"
    if default_baseline_ref(git.root) == git.commit:
        return "HEAD is on the default branch (a push measures everything)"
    if ctx.store is None or match is None or not match.found or match.run_id is None:
        return "no stored baseline run to carry verdicts from"
    stored = ctx.store.reader.run_info(match.run_id)
    before, now = stored.fingerprint.perfguard, ctx.fingerprint.perfguard
    if before != now:
        return f"perfguard {before or '?'} → {now or '?'} since the baseline run"
    moved = ctx.environment.changes_since(stored.environment)
    if moved:
        return "the environment changed since the baseline run: " + "; ".join(c.text for c in moved)
    return None


def select_changed(
    ctx: SessionContext, tests: Mapping[str, Path], footprint: SessionFootprint
) -> ChangedPlan:
    """:func:`plan` for this session: its baseline run, what changed since it, and the
    environment; a store or git failure runs everything and says why."""
    try:
        everything = _everything(ctx)
        match, git = ctx.match, ctx.git
        if everything is not None or match is None or git is None or ctx.store is None:
            return _all(tests, everything or "no baseline")
        commit = str(match.commit)
        own = [ctx.settings.output]  # perfguard's own files: its output folder and store
        if isinstance(ctx.settings.store, Path):
            own.append(ctx.settings.store)
        tracked, untracked = changed_since(git.root, commit)
        return plan(
            tests,
            graph=footprint.graph,
            commit=commit,
            changes=[p for p in tracked if not _left(git.root, p, own)],
            untracked=[p for p in untracked if not _left(git.root, p, own)],
            old_text=lambda path: file_at(git.root, commit, path),
            metas=ctx.store.reader.metas(int(match.run_id or 0)),
            packages=footprint.packages,
        )
    except PerfguardError as exc:
        return _all(tests, "cannot tell what changed: " + " ".join(str(exc).split()))


def _left(root: Path, path: str, own: list[Path]) -> bool:
    """Whether ``path`` was left by running: caches, byte code, perfguard's output (this
    session's, or an earlier one's folder: its ``results.json`` beside a ``.lock``)."""
    if _LEFT_BY_RUNS.search(path):
        return True
    top = root / PurePosixPath(path).parts[0]
    if top.is_dir() and (top / ".lock").is_file() and (top / "results.json").is_file():
        return True
    full = (root / path).resolve()
    for mine in own:
        mine = (root / mine).resolve()  # relative settings are the rootdir's: close enough
        if full == mine or mine in full.parents or full.name.startswith(mine.name + "-"):
            return True
    return False


def _all(tests: Mapping[str, Path], why: str) -> ChangedPlan:
    return ChangedPlan(runs=dict.fromkeys(tests, why), everything=why)
