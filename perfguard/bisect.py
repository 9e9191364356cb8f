"""``perfguard bisect GOOD BAD``: the first commit where the selected tests regressed.

A real ``git bisect`` with perfguard's verdict as the oracle. Each
candidate commit is judged against GOOD, the same way a pull request is:

* **store**: when the store holds a run of every selected test at the
  candidate and at GOOD on comparable machines, the stored records are
  judged (store mode: GOOD's runs pooled, the test's noise from its history
  on that machine), nothing is measured;
* **A/B** otherwise: ``pytest --perfguard --perfguard-against=GOOD`` runs in
  a worktree of the candidate (alternating rounds of both trees, each a
  fresh process: :mod:`perfguard.plugin.ab`), and its ``results.json`` is
  the verdict; each step keeps its ``report.html``.

``--oracle`` picks which half decides: the whole verdict, the deterministic
gates only (exact on any machine: a perfect oracle on a CPU runner), the
timing only, or the host instructions only (Callgrind's counts, gated like
a counter: a pure-Python slowdown no other counter sees, bisected on a
loaded runner; A/B steps then run with ``--perfguard-metric=instructions``).
A candidate is ``bad`` when a test regressed, ``good`` when every test was
judged unchanged or improved, and ``skip`` (``git bisect skip``) when a test
could not be judged (noisy, error, not-judged ...).

The bisection runs in a detached worktree in the repository's git folder
(``perfguard-bisect/``): bisect state is per worktree, so the user's
checkout, index and ``BISECT_*`` files are never touched, and the worktree
is reset and removed whatever happens (error, Ctrl-C, SIGTERM). BAD is
judged first: a BAD that is not regressed against GOOD (unchanged, or
faster: GOOD already regressed, or the two swapped) is a one-line error,
as are refs git cannot resolve and a GOOD that is not an ancestor of BAD.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfguard.baseline import git
from perfguard.baseline.store import open_store, store_location
from perfguard.compare.against import History, against_from_store, settings_for
from perfguard.compare.judge import judge
from perfguard.compare.outcomes import Outcome
from perfguard.compare.units import format_ns, human, interval, percent
from perfguard.errors import BaselineError, CompareError
from perfguard.jsonsafe import finite

if TYPE_CHECKING:
    from perfguard.baseline.record import Fingerprint

__all__ = ["BisectResult", "Settings", "Step", "TestVerdict", "bisect", "mark_of"]

#: which half of the verdict decides a candidate
ORACLES = ("verdict", "gates", "timing", "instructions")
#: the gates the ``instructions`` oracle reads (perfguard.baseline.record.INSTRUCTION_COUNTERS)
_INSTRUCTION_GATES = ("instructions", "est_cycles")
#: how candidates are measured
MODES = ("auto", "store", "ab")
#: gate findings kept per test in the evidence
TOP_FINDINGS = 5


@dataclass(frozen=True)
class Settings:
    """What to bisect and how (the CLI's options)."""

    good: str
    bad: str
    pytest_args: tuple[str, ...] = ()  # the selection (-k, node ids) and any pytest options
    mode: str = "auto"
    oracle: str = "verdict"
    tolerance: float | None = None  # None: the marker's, else perfguard's default
    store: str | os.PathLike[str] | None = None
    repo: Path = Path(".")
    output: Path = Path(".perfguard") / "bisect"
    timeout: float = 3600.0  # per A/B step


@dataclass
class TestVerdict:
    """One test's verdict at one candidate, as the evidence shows it."""

    __test__ = False

    nodeid: str
    outcome: Outcome  # the whole verdict's outcome
    decided_by: Outcome  # the outcome of the half the oracle reads
    message: str = ""
    delta_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    gates: list[dict[str, Any]] = field(default_factory=list)  # the findings that fired
    #: the explanation's first culprit, with the user's line (what changed, and where)
    culprit: str = ""


@dataclass
class Step:
    """One commit the bisection judged."""

    commit: str
    subject: str
    mark: str  # good | bad | skip
    mode: str  # store | ab
    tests: list[TestVerdict] = field(default_factory=list)
    seconds: float = 0.0
    report: str | None = None  # the A/B step's report.html
    note: str = ""


@dataclass
class BisectResult:
    """The first bad commit (or the candidates skips left), and every step's evidence."""

    good: str
    bad: str
    oracle: str
    first_bad: str | None
    subject: str = ""
    candidates: list[str] = field(default_factory=list)  # when skips left several
    steps: list[Step] = field(default_factory=list)
    selected: list[str] = field(default_factory=list)
    log: str = ""  # git bisect log

    def to_dict(self) -> dict[str, Any]:
        return finite(asdict(self))


# --------------------------------------------------------------------------- git


def _resolve(root: Path, ref: str, what: str) -> str:
    if not ref or ref.startswith("-"):
        raise BaselineError(f"{root}: {what} {ref!r} is not a git ref")
    sha = git.try_resolve(root, ref)
    if sha is None:
        raise BaselineError(f"{root}: {what} {ref!r}: git cannot resolve it to a commit")
    return sha


def _check_range(root: Path, good: str, bad: str, names: tuple[str, str]) -> None:
    if good == bad:
        raise BaselineError(f"{root}: GOOD {names[0]} and BAD {names[1]} are the same commit")
    if not git.is_ancestor(root, good, bad):
        swapped = git.is_ancestor(root, bad, good)
        hint = " (it is a descendant: are GOOD and BAD swapped?)" if swapped else ""
        raise BaselineError(f"{root}: GOOD {names[0]} is not an ancestor of BAD {names[1]}{hint}")


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM ends a bisection as Ctrl-C does, so the worktree is always cleaned up."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _bisect_worktree(root: Path, good: str, bad: str) -> Iterator[Path]:
    """A detached worktree at BAD in the git folder; reset and removed on the way out,
    with GOOD's A/B worktree (``perfguard-ab/``) when the bisection made it."""
    common = git.common_dir(root)
    folder = common / "perfguard-bisect"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run-{os.getpid()}-{int(time.time())}"
    base = common / "perfguard-ab" / f"base-{good[:12]}"  # where A/B mode checks GOOD out
    made = [path] + ([] if base.exists() else [base])
    git.run(root, "worktree", "add", "--detach", "--force", str(path), bad)
    try:
        yield path
    finally:
        git.run(path, "bisect", "reset", ok=None)
        for tree in made:
            if tree.exists():
                git.run(root, "worktree", "remove", "--force", str(tree), ok=None)
        git.run(root, "worktree", "prune", ok=None)


# --------------------------------------------------------------------------- the oracle


def mark_of(outcome: Outcome) -> str:
    """How one test's outcome (of the half the oracle reads) marks a commit."""
    if outcome is Outcome.REGRESSED:
        return "bad"
    if outcome in (Outcome.UNCHANGED, Outcome.IMPROVED):
        return "good"
    return "skip"


def _outcome(value: object) -> Outcome:
    """An outcome as a results file or a gate verdict writes it (unknown: not judged)."""
    try:
        return Outcome(str(value))
    except ValueError:
        return Outcome.NOT_JUDGED


def _commit_mark(tests: list[TestVerdict]) -> str:
    marks = {mark_of(t.decided_by) for t in tests}
    if "bad" in marks:
        return "bad"
    if not tests or "skip" in marks:
        return "skip"
    return "good"


def _verdict(entry: dict[str, Any], oracle: str) -> TestVerdict:
    """A results.json entry (or a TestComparison's dict) as evidence, read by ``oracle``."""
    gates = entry.get("gates") or {}
    timing = entry.get("timing") or {}
    decided = _outcome(entry.get("outcome"))
    if oracle == "gates":
        decided = _outcome(gates.get("outcome"))
    elif oracle == "timing":
        decided = _outcome(timing.get("outcome"))
    elif oracle == "instructions":
        decided = _instructions_outcome(gates)
    fired = [
        {
            k: f.get(k)
            for k in (
                "gate",
                "op_name",
                "kernel_name",
                "baseline",
                "current",
                "budget",
                "whole_test",
            )
        }
        for f in (gates.get("regressions") or [])[:TOP_FINDINGS]
    ]
    return TestVerdict(
        nodeid=str(entry.get("nodeid")),
        outcome=_outcome(entry.get("outcome")),
        decided_by=decided,
        message=str(entry.get("message") or ""),
        delta_pct=timing.get("delta_pct"),
        ci_low_pct=timing.get("ci_low_pct"),
        ci_high_pct=timing.get("ci_high_pct"),
        gates=fired,
        culprit=str(
            ((entry.get("explanation") or {}).get("culprits") or [{}])[0].get("text") or ""
        ),
    )


def _instructions_outcome(gates: dict[str, Any]) -> Outcome:
    """The host instructions' own outcome in a gate verdict: regressed or improved when their
    gate fired, unchanged when it was checked and did not, not-judged when nothing counted."""
    for key, outcome in (("regressions", Outcome.REGRESSED), ("improvements", Outcome.IMPROVED)):
        if any(f.get("gate") in _INSTRUCTION_GATES for f in gates.get(key) or []):
            return outcome
    if any(g in _INSTRUCTION_GATES for g in gates.get("checked") or []):
        return Outcome.UNCHANGED
    return Outcome.NOT_JUDGED


class _StoreOracle:
    """Verdicts from stored runs: the candidate's latest comparable run against GOOD's."""

    def __init__(self, location: str | os.PathLike[str], good: str, nodeids: list[str]) -> None:
        self.store = open_store(location, create=False)
        self.nodeids = nodeids
        self.good = good
        runs = self.store.reader.runs()
        self.runs = runs
        self.good_runs = self._runs_with_tests(good, None)
        #: the machine the bisection compares on: GOOD's latest run with every test
        self.fingerprint: Fingerprint | None = (
            runs.set_index("run_id")["fingerprint"][self.good_runs[0]] if self.good_runs else None
        )
        if self.fingerprint is not None:
            self.good_runs = self._runs_with_tests(good, self.fingerprint)

    def close(self) -> None:
        self.store.close()

    def _runs_with_tests(self, commit: str, fingerprint: Fingerprint | None) -> list[int]:
        """Runs of ``commit`` holding every selected test (on ``fingerprint``'s machines),
        latest first."""
        runs = self.runs[self.runs["commit"] == commit].sort_values(
            ["time", "run_id"], ascending=False
        )
        out = []
        for run_id, theirs in zip(runs["run_id"], runs["fingerprint"], strict=True):
            if fingerprint is not None and fingerprint.incompatibility(theirs):
                continue
            have = set(self.store.reader.load_run(int(run_id))[1]) if self.nodeids else set()
            if set(self.nodeids) <= have:
                out.append(int(run_id))
        return out

    def judge(self, sha: str, settings: Settings) -> list[TestVerdict] | None:
        """The verdicts at ``sha``, or None when the store cannot give them all."""
        if self.fingerprint is None or not self.nodeids:
            return None
        mine = self._runs_with_tests(sha, self.fingerprint)
        if not mine:
            return None
        good = History(self.good, [self.good])  # GOOD itself, not an ancestor of it
        out = []
        for nodeid in self.nodeids:
            current = self.store.reader.load_test(mine[0], nodeid)
            assert current is not None
            # the plugin's own path: the same pooling, history, speed and -n rules
            against = against_from_store(
                self.store, good, current, self.fingerprint, exclude_run_id=mine[0]
            )
            verdict = judge(current, against, settings_for(current, settings.tolerance))
            out.append(_verdict(verdict.to_dict(), settings.oracle))
        return out


def _ab_step(tree: Path, good: str, settings: Settings, out: Path) -> tuple[list[TestVerdict], str]:
    """One A/B session in ``tree`` (the candidate) against GOOD; its verdicts and a note."""
    out.mkdir(parents=True, exist_ok=True)
    # every value as --opt=value: pytest takes a bare argument outside the tree as a path
    # when it picks the rootdir, which would put the session outside the git worktree
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *settings.pytest_args,
        "--perfguard",
        f"--perfguard-against={good}",
        f"--perfguard-output={out.resolve()}",
        "--perfguard-fail-on=never",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    if settings.tolerance is not None:
        argv.append(f"--perfguard-tolerance={settings.tolerance}")
    if settings.oracle == "instructions":
        argv.append("--perfguard-metric=instructions")
    try:
        done = subprocess.run(
            argv, cwd=tree, capture_output=True, text=True, timeout=settings.timeout, check=False
        )
        log = (done.stdout or "") + (done.stderr or "")
        code: int | str = done.returncode
    except subprocess.TimeoutExpired:
        log, code = "", f"timed out after {settings.timeout:g} s"
    (out / "pytest.log").write_text(log, encoding="utf-8", errors="replace")
    try:
        doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        last = [ln for ln in log.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        return [], f"the A/B session wrote no results (pytest: {code}; {last[0][:300]})"
    tests = [_verdict(t, settings.oracle) for t in doc.get("tests", [])]
    return tests, ""


# --------------------------------------------------------------------------- the bisection


def _selected(tree: Path, pytest_args: tuple[str, ...]) -> list[str]:
    """The node ids the selection names (pytest's own collection, in BAD's tree)."""
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        *pytest_args,
    ]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False)
    ids = [ln.strip() for ln in done.stdout.splitlines() if "::" in ln and " " not in ln.strip()]
    if not ids:
        tail = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()][-1:]
        raise CompareError(
            f"{tree}: the pytest selection {shlex.join(pytest_args) or '(none)'} selects no "
            f"test at BAD ({tail[0][:200] if tail else 'no output'})"
        )
    return ids


_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.M)


def bisect(settings: Settings, say: Callable[[str], None] = lambda line: None) -> BisectResult:
    """Run the bisection (module docstring); ``say`` gets one progress line per step."""
    if settings.mode not in MODES:
        raise CompareError(f"unknown mode {settings.mode!r}: choose from {', '.join(MODES)}")
    if settings.oracle not in ORACLES:
        raise CompareError(f"unknown oracle {settings.oracle!r}: choose from {', '.join(ORACLES)}")
    repo = Path(settings.repo).resolve()
    top = git.output(repo, "rev-parse", "--show-toplevel")
    if not top:
        raise BaselineError(f"{repo}: not inside a git work tree")
    root = Path(top)
    rel = repo.relative_to(root.resolve()) if repo.is_relative_to(root.resolve()) else Path(".")
    good = _resolve(root, settings.good, "GOOD")
    bad = _resolve(root, settings.bad, "BAD")
    _check_range(root, good, bad, (settings.good, settings.bad))
    result = BisectResult(good=good, bad=bad, oracle=settings.oracle, first_bad=None)
    output = Path(settings.output)
    with _interruptible(), _bisect_worktree(root, good, bad) as wt:
        tree = wt / rel
        result.selected = _selected(tree, settings.pytest_args)
        store = None
        if settings.mode in ("auto", "store") and settings.store is not None:
            location = store_location(settings.store)
            if isinstance(location, Path) and not location.is_absolute():
                location = (repo / location) if not location.exists() else location
            if isinstance(location, str) or location.is_file():
                store = _StoreOracle(location, good, result.selected)
        if settings.mode == "store" and (store is None or store.fingerprint is None):
            raise CompareError(
                f"--mode store: no stored run of {', '.join(result.selected)} at GOOD "
                f"{good[:12]} in {settings.store}"
            )
        try:
            steps: dict[str, Step] = {}

            def judge(sha: str) -> Step:
                if sha in steps:
                    return steps[sha]
                t0 = time.monotonic()
                step = Step(commit=sha, subject=git.subject(root, sha), mark="skip", mode="store")
                tests = store.judge(sha, settings) if store is not None else None
                if tests is None and settings.mode == "store":
                    step.note = "no stored run of every selected test at this commit"
                    tests = []
                elif tests is None:
                    step.mode = "ab"
                    folder = output / f"step-{len(steps) + 1:02d}-{sha[:10]}"
                    tests, step.note = _ab_step(tree, good, settings, folder)
                    if (folder / "report.html").is_file():
                        step.report = str(folder / "report.html")
                step.tests = tests
                step.mark = _commit_mark(tests)
                step.seconds = time.monotonic() - t0
                steps[sha] = step
                result.steps.append(step)
                say(_step_line(step))
                return step

            first = judge(bad)
            if first.mark != "bad":
                raise CompareError(_not_regressed(first, settings))
            started = git.run(wt, "bisect", "start", bad, good).stdout
            text = started
            while not _FIRST_BAD.search(text):
                if "only 'skip'ped commits left" in text:
                    result.candidates = re.findall(r"^([0-9a-f]{40})$", text, re.M)
                    break
                sha = git.output(wt, "rev-parse", "HEAD")
                step = judge(sha)
                done = git.run(wt, "bisect", step.mark, ok=(0, 1, 2))
                text = done.stdout + done.stderr
            found = _FIRST_BAD.search(text)
            if found:
                result.first_bad = found.group(1)
                result.subject = git.subject(root, result.first_bad)
            result.log = git.run(wt, "bisect", "log", ok=(0, 1)).stdout
        finally:
            if store is not None:
                store.close()
    return result


def _not_regressed(step: Step, settings: Settings) -> str:
    why = "; ".join(f"{t.nodeid}: {t.decided_by}" for t in step.tests) or step.note or "no tests"
    if any(t.decided_by is Outcome.IMPROVED for t in step.tests):
        return (
            f"BAD {settings.bad} is faster than GOOD {settings.good} ({why}): is GOOD itself "
            "the regressed one, or are GOOD and BAD swapped?"
        )
    if step.mark == "skip":
        return f"BAD {settings.bad} cannot be judged against GOOD {settings.good} ({why})"
    return (
        f"BAD {settings.bad} is not regressed against GOOD {settings.good} ({why}): "
        "nothing to bisect"
    )


# --------------------------------------------------------------------------- text


def _evidence(t: TestVerdict) -> str:
    parts = [t.outcome.value]
    if t.decided_by is not t.outcome:
        parts.append(f"oracle read {t.decided_by}")
    if t.delta_pct is not None:
        ci = ""
        if t.ci_low_pct is not None and t.ci_high_pct is not None:
            ci = f" {interval(t.ci_low_pct, t.ci_high_pct)}"
        parts.append(f"time {percent(t.delta_pct, True)}{ci}")
    for g in t.gates:
        gate, op = g["gate"], g.get("op_name")
        change = f"{human(g['baseline'], gate)} -> {human(g['current'], gate)}"
        if g.get("whole_test"):  # the test's count, and the op that moved most
            parts.append(f"{gate} per iteration {change}" + (f" (most in {op})" if op else ""))
        else:
            parts.append(f"{gate} of {op or 'the test'}: {change}")
    return ", ".join(parts)


def _step_line(step: Step) -> str:
    tests = "; ".join(f"{t.nodeid}: {_evidence(t)}" for t in step.tests) or step.note
    return (
        f"{step.commit[:10]} {step.mark:<4} [{step.mode}, {format_ns(step.seconds * 1e9)}] "
        f"{step.subject[:50]}: {tests}"
    )


def _culprits(result: BisectResult) -> list[str]:
    """The first bad commit's culprits, one per test it regressed: what changed, at which
    line (the judge's first culprit at that step)."""
    step = next((s for s in result.steps if s.commit == result.first_bad), None)
    if step is None:
        return []
    return [
        f"{t.nodeid}: {t.culprit}"
        for t in step.tests
        if t.culprit and t.decided_by is Outcome.REGRESSED
    ]


def format_text(result: BisectResult) -> str:
    """The terminal report: the answer first, then each step's evidence."""
    lines = []
    if result.first_bad:
        lines.append(f"first bad commit: {result.first_bad} {result.subject}")
        lines += [f"  {c}" for c in _culprits(result)]
    elif result.candidates:
        lines.append(
            "skipped commits hide the first bad one; it is one of: "
            + ", ".join(c[:12] for c in result.candidates)
        )
    else:
        lines.append("no first bad commit found")
    lines.append(
        f"GOOD {result.good[:12]}  BAD {result.bad[:12]}  oracle: {result.oracle}; "
        f"tests: {', '.join(result.selected)}"
    )
    lines.append(f"{len(result.steps)} commit(s) judged:")
    lines += [f"  {_step_line(s)}" for s in result.steps]
    return "\n".join(lines)


def format_markdown(result: BisectResult) -> str:
    """The same as Markdown (a PR comment or an issue)."""
    head = (
        f"**First bad commit:** `{result.first_bad[:12]}` {result.subject}"
        if result.first_bad
        else "**No single first bad commit** (skipped commits): "
        + ", ".join(f"`{c[:12]}`" for c in result.candidates)
    )
    culprits = _culprits(result)
    if culprits:
        head += "\n\n" + "\n".join(f"- {c}" for c in culprits)
    rows = ["| commit | subject | mark | mode | evidence |", "|---|---|---|---|---|"]
    for s in result.steps:
        ev = "<br>".join(f"`{t.nodeid}`: {_evidence(t)}" for t in s.tests) or s.note
        ev = ev.replace("|", "\\|")
        rows.append(
            f"| `{s.commit[:10]}` | {s.subject.replace('|', '/')} | **{s.mark}** | "
            f"{s.mode} | {ev} |"
        )
    return "\n".join(
        [
            "# perfguard bisect",
            "",
            head,
            "",
            f"GOOD `{result.good[:12]}`, BAD `{result.bad[:12]}`, oracle: {result.oracle}; "
            f"tests: {', '.join(f'`{n}`' for n in result.selected)}",
            "",
            *rows,
            "",
        ]
    )
