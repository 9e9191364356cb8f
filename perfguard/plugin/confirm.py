"""Store mode's timing confirmed by the same machine: an A/B of the suspect test.

A test whose stored comparison reads its timing ``regressed`` or ``noisy`` (and whose
gates did not already fail it) is measured again against its baseline commit (a
``regressed`` one right after its verdict, before its outcome is reported, so that a
confirmed failure is its own test's; the ``noisy`` ones together at the session's end,
one A/B run for all of them, each pair child running every one): that commit checked out into a
worktree in the git folder (``.git/perfguard-confirm/``), the test run in A/B pair
children (:class:`~perfguard.plugin.ab.ABRunner`, both trees stepping in turn in one
process, timing only), :data:`CONFIRM_PAIRS` pairs and more while its change is not
resolved. The judge then decides the timing on those pairs
(:func:`perfguard.compare.confirm.confirmed`), so a regression fails only when the
same machine confirms it, and a ``noisy`` stored comparison gets the A/B's answer.

Within ``--perfguard-confirm-budget`` seconds a session (each xdist worker its own);
past the budget, and where the baseline
commit cannot be checked out (a shallow clone), the stored verdict stands and says why
and how to fix it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from perfguard.baseline.git import common_dir, prepare_worktree
from perfguard.compare.comparison import TestComparison
from perfguard.compare.confirm import Confirmation, wants_confirmation
from perfguard.compare.outcomes import Outcome
from perfguard.compare.results import TestEntry
from perfguard.compare.tolerance import ALPHA
from perfguard.errors import PerfguardError
from perfguard.plugin.ab import ABRunner, TestAB, pair_values, pairs_verdict
from perfguard.plugin.context import SessionContext
from perfguard.plugin.options import AB_CHILD_ROUNDS, plugin_args

#: pairs measured first for a suspect test; then more, up to CONFIRM_MAX_PAIRS, while its
#: timing reads ``noisy`` and the budget lasts, looking every AB_LOOK_EVERY pairs (8, 11,
#: 14, 17, 20). Not 6: on unchanged code (suite_trust, round 21) the confirmations that
#: stopped at 6 pairs had z-scores spread 1.9-2.9 times what their intervals claimed (their
#: trimmed interval has 3 degrees of freedom, and stopping when it came out narrow picked
#: the pairs that happened to agree); those at 9 and 12 pairs, 1.0-1.3. Up to 20, as A/B
#: mode (MAX_AB_PAIRS): at 14, 5 of 31 unchanged tests of a quiet session stayed ``noisy``
#: (round 24), where A/B mode's 20 left 1
CONFIRM_PAIRS = 8
CONFIRM_MAX_PAIRS = 20
#: how to get the baseline's commit where a clone lacks it
_FETCH = (
    "fetch the history so the baseline commit is here (actions/checkout with "
    "'fetch-depth: 0', or 'git fetch --unshallow'), or set --perfguard-confirm-budget=0"
)


class Confirmer:
    """Confirms suspect timings of one session on this machine (module docstring)."""

    def __init__(self, context: SessionContext, say: Callable[[str], None]) -> None:
        self.context = context
        self.say = say
        self.budget = context.settings.confirm_budget
        self.spent = 0.0
        self.tests = 0
        #: per baseline commit: its runner, or why it cannot be checked out
        self._runners: dict[str, ABRunner | str] = {}
        #: noisy timings kept for the session's end: nodeid -> (verdict, its re-judgement)
        self._later: dict[str, tuple[TestComparison, Callable[[Confirmation], TestEntry]]] = {}

    def close(self) -> None:
        for runner in self._runners.values():
            if isinstance(runner, ABRunner):
                runner.close()

    def note(self) -> None:
        """The session's note of what confirming cost (before its results are written)."""
        if self.tests:
            self.context.notes.append(
                f"timing confirmed on this machine: {self.tests} test(s) measured again A/B "
                f"against their baseline commit, {self.spent:.1f} s of the "
                f"{self.budget:g} s budget (--perfguard-confirm-budget)"
            )

    def _wanted(self, comparison: TestComparison) -> str | None:
        """The baseline commit to confirm ``comparison``'s timing against, or None."""
        gates = comparison.gates
        regressed = gates is not None and gates.outcome is Outcome.REGRESSED
        commit = comparison.baseline_commit
        if self.budget <= 0 or not commit or not wants_confirmation(comparison.timing, regressed):
            return None
        git = self.context.git
        if git is not None and commit == git.commit and not git.dirty:
            return None  # the same code: an A/A by construction (judge.same_code)
        return commit

    def _spent(self, commit: str) -> Confirmation | None:
        if self.spent < self.budget:
            return None
        return Confirmation(
            commit,
            unavailable=f"the session's confirmation budget ({self.budget:g} s, "
            "--perfguard-confirm-budget) was spent on earlier tests",
        )

    def now(self, comparison: TestComparison) -> Confirmation | None:
        """A timing that reads ``regressed`` is confirmed at once, so that its failure, if
        confirmed, is its own test's; a ``noisy`` one waits for the session's end."""
        commit = self._wanted(comparison)
        if commit is None or comparison.timing.outcome is not Outcome.REGRESSED:
            return None
        spent = self._spent(commit)
        if spent is not None:
            return spent
        measured = self._measure(commit, [comparison])
        return measured[comparison.nodeid]

    def later(
        self, comparison: TestComparison, rejudge: Callable[[Confirmation], TestEntry]
    ) -> None:
        """Keep a ``noisy``, ``improved`` or blind ``unchanged`` timing
        (:func:`~perfguard.compare.confirm.blind_green`) for :meth:`finish` (one A/B run
        for all of them)."""
        if (
            self._wanted(comparison) is not None
            and comparison.timing.outcome is not Outcome.REGRESSED
        ):
            self._later[comparison.nodeid] = (comparison, rejudge)

    def finish(self) -> list[TestEntry]:
        """The noisy timings kept, confirmed together against each baseline commit (one
        A/B run each: a pair child runs all of them, so a suite pays for its children once,
        not once per test): their new entries, in the order they ran."""
        kept, self._later = self._later, {}
        by_commit: dict[str, list[TestComparison]] = {}
        for comparison, _ in kept.values():
            by_commit.setdefault(str(comparison.baseline_commit), []).append(comparison)
        measured: dict[str, Confirmation] = {}
        for commit, comparisons in by_commit.items():
            found = self._spent(commit)
            if found is not None:
                measured.update((c.nodeid, found) for c in comparisons)
                continue
            fits, left_out = self._fitting(comparisons)
            measured.update(self._measure(commit, fits) if fits else {})
            for c in left_out:
                need = CONFIRM_PAIRS * pair_cost_s(c)
                measured[c.nodeid] = Confirmation(
                    commit,
                    unavailable=f"the session's confirmation budget ({self.budget:g} s, "
                    f"--perfguard-confirm-budget) had no room for its {CONFIRM_PAIRS} A/B "
                    f"pairs (about {need:.0f} s) after {len(fits)} more suspect test(s); "
                    "raise it to measure this test again",
                )
        return [rejudge(measured[nodeid]) for nodeid, (_, rejudge) in kept.items()]

    def _fitting(
        self, comparisons: list[TestComparison]
    ) -> tuple[list[TestComparison], list[TestComparison]]:
        """The suspects whose first :data:`CONFIRM_PAIRS` pairs fit the budget left, most
        suspect first, and the rest. A pair child runs every test it is given, and its first
        pairs are not cut short, so a suite of 200 first comparisons would otherwise spend
        8 pairs x 200 tests whatever the budget said."""
        order = sorted(comparisons, key=_suspicion, reverse=True)
        left = max(self.budget - self.spent, 0.0)
        fits: list[TestComparison] = []
        cost = 0.0
        for c in order:
            more = CONFIRM_PAIRS * pair_cost_s(c)
            if cost + more <= left:
                fits.append(c)
                cost += more
        chosen = {c.nodeid for c in fits}
        return fits, [c for c in order if c.nodeid not in chosen]

    def _measure(self, commit: str, comparisons: list[TestComparison]) -> dict[str, Confirmation]:
        """Each test's pairs against ``commit``, or why there are none."""
        runner = self._runner(commit)
        if isinstance(runner, str):
            return {c.nodeid: Confirmation(commit, unavailable=runner) for c in comparisons}
        nodeids = [c.nodeid for c in comparisons]
        by_id = {c.nodeid: c for c in comparisons}
        names = ", ".join(n.rsplit("::", 1)[-1] for n in nodeids[:4])
        more = f" and {len(nodeids) - 4} more" if len(nodeids) > 4 else ""
        self.say(
            f"perfguard: confirming the timing of {names}{more} on this machine, A/B "
            f"against {commit[:12]}"
        )
        t0 = time.monotonic()
        left = max(self.budget - self.spent, 0.0)
        try:
            results = dict(
                runner.measure(  # a copy: the runner's own is emptied below
                    nodeids,
                    CONFIRM_PAIRS,
                    budget=left,
                    max_pairs=CONFIRM_MAX_PAIRS,
                    unresolved=lambda n, sides: self._unresolved(sides, by_id[n]),
                )
            )
        finally:
            for n in nodeids:
                runner.results.pop(n, None)
            self.spent += time.monotonic() - t0
            self.tests += len(nodeids)
        out = {}
        for n in nodeids:
            ab = results.get(n, TestAB())
            why = _lost(ab)
            if why:
                out[n] = Confirmation(commit, unavailable=why)
            else:
                base, head = pair_values(ab) or (np.zeros(0), np.zeros(0))
                out[n] = Confirmation(commit, base=base, head=head, in_turn=True)
        return out

    def _unresolved(self, sides: TestAB, comparison: TestComparison) -> bool:
        """More pairs while the timing so far reads ``noisy``: a confirmation needs an
        outcome, not a narrow interval (one whose high end is already under the tolerance
        has ruled the slowdown out, however wide it is on the fast side)."""
        tol = (comparison.timing.tolerance_pct or 5.0) / 100.0
        so_far = None if _lost(sides) else pairs_verdict(sides, tol, comparison.alpha or ALPHA)
        return so_far is not None and so_far.outcome is Outcome.NOISY

    def _runner(self, commit: str) -> ABRunner | str:
        if commit in self._runners:
            return self._runners[commit]
        ctx, settings = self.context, self.context.settings
        git = ctx.git
        if git is None:
            return "no git repository"
        worker = ctx.worker_id or "main"
        folder = common_dir(git.root) / "perfguard-confirm" / worker
        try:
            base_root, _ = prepare_worktree(git.root, commit, folder)
        except (PerfguardError, OSError) as exc:
            first = " ".join(str(exc).split())[:200]
            found: ABRunner | str = (
                f"the baseline commit {commit[:12]} cannot be checked out here ({first}); {_FETCH}"
            )
        else:
            rootdir = ctx.config.rootpath.resolve()
            if not rootdir.is_relative_to(git.root.resolve()):
                found = f"pytest's rootdir {rootdir} is outside the git repository {git.root}"
            else:
                found = ABRunner(
                    head_root=git.root,
                    base_root=base_root,
                    head_rel=rootdir.relative_to(git.root.resolve()),
                    output=Path(settings.output) / "confirm" / worker,
                    backend=settings.backend,
                    xdist=ctx.config.pluginmanager.hasplugin("xdist"),
                    timeout=settings.timeout,
                    children=settings.children,
                    interleave=True,
                    plugin_args=plugin_args(ctx.config),
                )
                found.timing_only = True
        self._runners[commit] = found
        return found


#: seconds a pair child spends on a test beyond its timed steps (its setup, warm-up and
#: hand-offs, both sides): a quiet 31-test confirmation took 71.8 s for 261 test-pairs of
#: steps mostly under a millisecond (0.28 s each, the worktree and fork server included).
#: A test that builds a real model each time costs more: x-transformers' four decoder
#: tests took about 4.5 s a pair where this estimate says 3.0 s
PAIR_FIXED_S = 0.25


def pair_cost_s(comparison: TestComparison) -> float:
    """Seconds one A/B pair of ``comparison``'s test should take: both sides'
    :data:`~perfguard.plugin.options.AB_CHILD_ROUNDS` rounds of the steps this session
    timed, and :data:`PAIR_FIXED_S`."""
    rounds = max(len(comparison.rounds_current), 1)
    per_round = sum(comparison.samples_current) / rounds / 1e9
    return PAIR_FIXED_S + 2 * AB_CHILD_ROUNDS * per_round


def _suspicion(comparison: TestComparison) -> tuple[int, float]:
    """Which suspects a short budget confirms first: a timing read as changed or unresolved
    before a green that could not rule out a slowdown, and among each, the one whose
    interval reaches furthest past the tolerance."""
    t = comparison.timing
    reach = (t.ci_high_pct or 0.0) - (t.tolerance_pct or 0.0)
    return (0 if t.outcome is Outcome.UNCHANGED else 1, reach)


def _lost(ab: TestAB) -> str:
    """Why the pairs cannot judge the test (a side failed or reported nothing), or ""."""
    for side, label in ((ab.base, "the baseline's tree"), (ab.head, "this tree")):
        if side.failure:
            return f"in {label} the test failed: {side.failure}"
        if not side.records:
            return f"no A/B pair reported the test in {label} ({side.crash or 'lost'})"
    return ""
