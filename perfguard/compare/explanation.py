"""Why a test has its outcome: one typed explanation, made once, rendered by every view.

The judge (:func:`perfguard.compare.culprits.explain`) builds an
:class:`Explanation` for every verdict; the failure message, the terminal
"why", ``summary.md``, ``report.html``, the JUnit properties and
``results.json`` all render *this object* and compute nothing of their own,
so every view names the same culprit with the same figures.

An explanation holds:

* ``headline``: one line, the decisive evidence first (the gates where they
  decided, the timing where only it did; for an outcome that is not a
  regression, the reason, noise excuse included);
* ``culprits``: what changed, ranked (:data:`KIND_ORDER`), each with its
  one-line ``text``;
* ``lines``: the short list a reviewer reads under the headline: grouped
  structural changes ("ops changed under X: A removed; B ×2, C added"),
  then the other culprits, then the counters and the timing in one line each;
* ``environment``: what changed in the environment since the baseline anyway (a
  library version, a driver patch release, a setting compared across on purpose:
  :mod:`perfguard.environment`), said by every view in one line
  (:attr:`Explanation.environment_line`) after the others.

Standard library only: ``results.json`` is read back without numpy; msgspec writes and
reads these dataclasses as they are (:mod:`perfguard.compare.results`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from perfguard.environment import EnvironmentChange

#: a culprit's before/after: a count, FLOPs, bytes, a time in ns, a flag or a dtype's text
Scalar = bool | int | float | str | None


def shorten(text: str, width: int) -> str:
    """``text`` on one line in at most ``width`` characters, cut only between words and
    ended by ``…`` when cut (a single word longer than ``width`` is the one thing cut
    inside): a table cell's shortening; the full line is said elsewhere."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    if space > 0:
        cut = cut[:space].rstrip(" ,;:([")
    return cut + "…"


#: culprit kinds, most telling first: a qualitative change to an op the reviewer can
#: act on (dtype, Tensor Cores, a new sync) before the ops that appeared or vanished,
#: before counters that moved on an op that stayed, before time alone
KIND_ORDER = (
    "dtypes",
    "tc_lost",
    "syncs",
    "host_reads",
    "optimizer",
    "structure",
    "calls",
    "params",
    "flops",
    "bytes",
    "kernels",
    "memcpy",
    "memcpy_bytes",
    "kernel_set",
    "peak_memory",
    "instructions",
    "est_cycles",
    "timing",
)
#: kinds ranked as one: an op added and an op removed are one change of structure
RANKED_AS = {"added": "structure", "removed": "structure"}
#: how many culprits a view lists before "and N more"
SHOWN = 5


@dataclass(frozen=True)
class Culprit:
    """One thing that changed on one op (``op`` "" for the whole test).

    ``baseline``/``current`` are per iteration (counts, FLOPs, bytes), the dtype text,
    or the op's time in ns (``timing``); ``gated``: a gate's budget was exceeded by it
    (decisive evidence); ``impact_ns``: the op's change of time per iteration, current
    minus baseline (NaN when unknown), which ranks culprits of one kind.
    """

    kind: str
    op: str
    text: str
    baseline: Scalar = None
    current: Scalar = None
    budget: str = ""
    gated: bool = False
    impact_ns: float | None = None
    direction: str | None = None
    #: where in the user's code the change happened (``at model.py:21 in
    #: Attention.forward``; ``(base)`` after a line of the base tree), "" when unknown
    site: str = ""
    #: follows from another culprit (the optimizer's per-tensor work after the model's
    #: parameter tensors changed): ranked after every cause
    consequence: bool = False

    @property
    def leaf(self) -> str:
        """The op's own name (the last part of its path)."""
        return self.op.rsplit("/", 1)[-1] if self.op else "the test"


@dataclass(frozen=True)
class Explanation:
    """The explanation of one verdict (module docstring)."""

    outcome: str
    headline: str
    decided_by: str = ""  # "gates" | "timing" | "gates and timing" | ""
    #: ranked, in the order the lines name them (culprits[0] is what every view names first)
    culprits: tuple[Culprit, ...] = field(default_factory=tuple)
    #: the first culprit's line (the headline says it after "gates:"/"timing:")
    lead: str = ""
    #: the lines under the headline (the rest of the culprits, counters, timing)
    lines: tuple[str, ...] = field(default_factory=tuple)
    timing: str = ""  # the timing half in one line, as it bears on the outcome
    #: the environment's changes since the baseline (before → after), in field order
    environment: tuple[EnvironmentChange, ...] = field(default_factory=tuple)

    @property
    def environment_line(self) -> str:
        """``environment since the baseline: cuDNN 9.1.0 → 9.3.0; ...``, or ""."""
        if not self.environment:
            return ""
        return "environment since the baseline: " + "; ".join(c.text for c in self.environment)

    def with_environment(self, changes: tuple[EnvironmentChange, ...]) -> Explanation:
        return replace(self, environment=tuple(changes)) if changes else self

    @property
    def first(self) -> Culprit | None:
        """The culprit every view names first."""
        return self.culprits[0] if self.culprits else None

    def short(self) -> str:
        """The terminal's "why": the lead line (and how many more changes), else the
        headline."""
        if not self.lead:
            return self.headline
        more = sum(
            1
            for line in self.lines
            if line != self.timing and not line.startswith(("counters ", "… and"))
        )
        return self.lead + (f" (+{more} more)" if more > 0 else "")

    def text(self, indent: str = "  ") -> str:
        """The headline and its lines, one per row, the environment's last (the failure
        message)."""
        lines = [*self.lines, self.environment_line] if self.environment else self.lines
        return "\n".join([self.headline, *(f"{indent}- {line}" for line in lines)])

    @classmethod
    def plain(cls, outcome: str, reason: str) -> Explanation:
        """An outcome with a reason and nothing to name (new, error, no baseline, ...)."""
        return cls(outcome=outcome, headline=" ".join(reason.split()))
