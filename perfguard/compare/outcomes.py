"""The one list of outcomes a test can have, with their order of severity.

Standard library only: the plugin and the reports import it without numpy.
"""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    """A test's verdict (DESIGN.md "Verdicts"). Only ``regressed`` can fail a test.

    ``judged`` outcomes compared something; the rest say why nothing was
    compared, and none of them is ever shown as passing.
    """

    REGRESSED = "regressed"
    CRASHED = "crashed"  # the test's process died (segfault, os._exit, OOM kill, timeout)
    ERROR = "error"  # the capture or its analysis failed, or the test raised
    NOISY = "noisy"  # too noisy to resolve a change of the tolerance's size
    INCOMPARABLE = "incomparable"  # the baseline was measured on another machine or backend
    NOT_JUDGED = "not-judged"  # too few samples, nothing captured
    NO_BASELINE = "no-baseline"
    NEW = "new"  # the baseline run exists but lacks this test
    IMPROVED = "improved"
    UNCHANGED = "unchanged"

    def __str__(self) -> str:
        return self.value

    @property
    def severity(self) -> int:
        """Sort key: the reports list the worst first."""
        return _ORDER.index(self)

    @property
    def judged(self) -> bool:
        """A comparison was made and decided something."""
        return self in (Outcome.REGRESSED, Outcome.IMPROVED, Outcome.UNCHANGED, Outcome.NOISY)

    @property
    def passing(self) -> bool:
        """Shown as passing: judged, and not a regression."""
        return self in (Outcome.IMPROVED, Outcome.UNCHANGED)


_ORDER = list(Outcome)

#: what may fail a run: ``regression`` (the default) or ``never`` (advisory only)
FAIL_ON = ("regression", "never")


def fails(outcome: Outcome, fail_on: str = "regression") -> bool:
    """The one fail rule: whether ``outcome`` fails its test and the run. Only a regression
    does, and only under ``fail_on=regression``; the verdict's pytest failure, the session's
    badge and exit status, and ``perfguard compare``'s exit status all ask this."""
    if fail_on not in FAIL_ON:
        from perfguard.errors import CompareError

        raise CompareError(f"fail_on must be 'regression' or 'never', got {fail_on!r}")
    return fail_on == "regression" and outcome is Outcome.REGRESSED
