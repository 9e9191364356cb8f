"""The same machine confirms a stored comparison's timing.

A store-mode timing compares this session with runs measured at other moments, so a
slow spell of the machine between them reads as a change: on a shared runner 107 of
108 verdicts of unchanged code read ``noisy`` and +10 % changes were missed, while
A/B mode, both trees measured in turn in one process, resolved ±1.5 % on the same
suite (issue 55). So a test whose timing alone would read ``regressed``, or could not
be resolved (``noisy``), is measured again in the same session against its baseline
commit, A/B (:mod:`perfguard.plugin.confirm` measures; this module judges), and that
measurement decides its timing: a regression fails only when the A/B confirms it.

:class:`Confirmation` is the typed input (the pairs, or why none could be measured);
:func:`confirmed` is the one rule of how it replaces the stored timing half. Pure: no
store, no process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np

from perfguard.compare.halves import TimingVerdict
from perfguard.compare.outcomes import Outcome
from perfguard.compare.timing import judge_ab
from perfguard.compare.units import interval, percent


@dataclass(frozen=True)
class Confirmation:
    """An A/B measurement of one test against its baseline commit on this machine.

    ``base``/``head``: one value per pair (ns), paired by index; ``in_turn``: each pair
    one process stepping both trees in turn. ``unavailable``: why nothing could be
    measured (the stored verdict then stands, with this reason and its fix)."""

    commit: str
    base: np.ndarray = field(default_factory=lambda: np.zeros(0))
    head: np.ndarray = field(default_factory=lambda: np.zeros(0))
    in_turn: bool = True
    unavailable: str = ""


def _said(v: TimingVerdict) -> str:
    ci = interval(v.ci_low_pct, v.ci_high_pct) if v.ci_low_pct is not None else ""
    return f"{percent(v.delta_pct, True)}{f' {ci}' if ci else ''}"


def confirmed(
    stored: TimingVerdict,
    confirmation: Confirmation,
    *,
    tolerance: float,
    alpha: float,
    iterations: int = 0,
) -> TimingVerdict:
    """The timing half once the same machine has measured it again (module docstring)."""
    at = confirmation.commit[:12]
    if confirmation.unavailable:
        return msgspec.structs.replace(
            stored,
            message=f"{stored.message}; not confirmed on this machine against {at}: "
            f"{confirmation.unavailable}",
        )
    ab = judge_ab(
        confirmation.base,
        confirmation.head,
        metric=stored.metric,
        tolerance=tolerance,
        alpha=alpha,
        load=stored.load if stored.load is not None else float("nan"),
        wait=stored.wait if stored.wait is not None else float("nan"),
        iterations=iterations,
        in_turn=confirmation.in_turn,
    )
    # each figure once: the A/B's own message gives its change and interval after the lead
    pairs = f"over {ab.n_current} A/B pairs against {at}"
    stored_read = f"the stored comparison read {_said(stored)} ({stored.outcome.value})"
    blind = blind_green(stored)
    if blind:  # what it measured again: a green that proved nothing
        stored_read += " and could not rule out a slowdown of the tolerance's size"
    if ab.outcome is Outcome.REGRESSED:
        found = "slower on this machine" if blind else "confirmed on this machine"
        lead = f"{found} {pairs}; {stored_read}"
    elif ab.outcome is Outcome.NOISY:
        either = "" if blind else " either"
        lead = f"not resolved on this machine{either} {pairs}; {stored_read}"
    elif ab.outcome is Outcome.NOT_JUDGED:
        return msgspec.structs.replace(
            stored, message=f"{stored.message}; not confirmed on this machine: {ab.message}"
        )
    elif ab.ci_low_pct is not None and ab.ci_low_pct > 0:
        # slower on this machine too, by less than the tolerance: not a regression, and not
        # the machine's either (the addmm -> matmul + add catalogue change: +4.1 % [+1.6, +6.7])
        too = "" if blind else " too"
        lead = f"slower on this machine{too} but within the tolerance {pairs}; {stored_read}"
    elif blind:
        lead = f"measured again on this machine {pairs}: {stored_read}"
    else:
        lead = f"not confirmed on this machine {pairs}: {stored_read}, the machine's"
    return msgspec.structs.replace(
        ab, history_runs=stored.history_runs, message=f"{lead}; {ab.message}"
    )


def blind_green(timing: TimingVerdict) -> bool:
    """An ``unchanged`` timing that cannot rule out a slowdown of the tolerance's size: its
    interval's high end reaches the tolerance (a first comparison judged against an assumed
    between-run noise, a machine whose runs spread). Green must mean not slower (issue 55):
    suite_trust's pull requests of +5 % read ``unchanged`` "within the threshold 15.3 %"
    at intervals such as [-13.5 %, +15.0 %], and no one measured them again."""
    hi, tol = timing.ci_high_pct, timing.tolerance_pct
    return timing.outcome is Outcome.UNCHANGED and hi is not None and tol is not None and hi >= tol


def wants_confirmation(timing: TimingVerdict | None, gates_regressed: bool) -> bool:
    """Whether a verdict's timing should be measured again on this machine: a store-mode
    timing that reads ``regressed``, ``noisy`` or ``improved`` (a speed-up the machine made
    is as false as a slowdown), or ``unchanged`` without ruling out a slowdown
    (:func:`blind_green`), and is not already failed by the gates (their counters do not
    depend on the machine)."""
    if timing is None or timing.mode != "store" or gates_regressed:
        return False
    wanted = (Outcome.REGRESSED, Outcome.NOISY, Outcome.IMPROVED)
    return timing.outcome in wanted or blind_green(timing)
