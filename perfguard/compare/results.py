"""The typed session document: ``results.json`` declared once, as msgspec Structs (schema 3).

The judge's verdict (:class:`~perfguard.compare.comparison.TestComparison`) becomes a
:class:`TestEntry` (:meth:`TestComparison.entry`) that the session keeps as it is; the
writer serialises the :class:`SessionResults` with ``msgspec.json.encode`` and every report
(terminal table, ``report.html``, ``summary.md``, ``perfguard report``) reads a file back
with :func:`load_results`: ``msgspec.json.decode(..., type=SessionResults)``, msgspec's own
validation, its error said as one :class:`~perfguard.errors.ReportError` line naming the
file and the key. Every optional key has a default, unknown keys are ignored (a newer minor
addition), numbers are None when unknown, never NaN.

The timing figures (the change, its interval, the medians and the levels) live in one place,
the entry's ``timing`` (:class:`~perfguard.compare.timing.TimingVerdict`); the entry's
properties of the same names read them there. An older document is upgraded on reading
(:func:`upgrade`), as the store upgrades its schema: schema 1 (before rounds, the halves and
A/B; an ``unchanged`` it gave a test with too few samples reads ``not-judged``) and schema 2
(the figures written twice: flat on the entry and in ``timing``) become schema 3.

Standard library and msgspec at import (the plugin's summary imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from perfguard.compare.explanation import Explanation, Scalar
from perfguard.compare.halves import BUSY_WAIT, GateVerdict, TimingFigures, TimingVerdict
from perfguard.compare.outcomes import Outcome, fails
from perfguard.compare.profile import TestProfile
from perfguard.errors import ReportError
from perfguard.jsonsafe import finite

#: the ``schema`` this perfguard writes; it reads (and upgrades) every schema up to it
SCHEMA = 3
#: outcome values, worst first (the order every report lists them in)
OUTCOMES = tuple(o.value for o in Outcome)
#: schema 1 judged nothing with fewer samples a side than this, yet said ``unchanged``
_SCHEMA1_MIN_SAMPLES = 5

BADGES = ("FAIL", "ADVISORY", "INCOMPLETE", "NOT JUDGED", "PASS")


class OpRow(msgspec.Struct, kw_only=True):
    """One op of a judged test (:data:`perfguard.compare.comparison.OP_COLUMNS`): per-iteration
    medians, the op's change with its interval and corrected p, calls, Tensor Core use."""

    op_id: str | None = None
    op_name: str | None = None
    direction: str | None = None
    status: str | None = None
    baseline_ns: float | None = None
    current_ns: float | None = None
    delta_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    p_value: float | None = None
    calls_baseline: float | None = None
    calls_current: float | None = None
    tc_util_baseline: float | None = None
    tc_util_current: float | None = None
    flop_eff_baseline: float | None = None
    flop_eff_current: float | None = None
    call_site: str | None = None


class KernelChange(msgspec.Struct, kw_only=True):
    """A change found without statistics (:func:`perfguard.compare.comparison.kernel_changes`)."""

    kind: str | None = None
    op_name: str | None = None
    kernel_name: str | None = None
    baseline: Scalar = None
    current: Scalar = None
    #: the call site a per-site figure is of (``flops_changed``: FLOPs per call there)
    site: str | None = None


class Finding(msgspec.Struct, kw_only=True):
    """An expert-system finding on the test's capture."""

    check: str | None = None
    severity: str | None = None
    problem: str | None = None
    evidence: str | None = None
    recommendation: str | None = None

    @classmethod
    def of(cls, row: dict[str, Any]) -> Finding:
        """A finding from the expert system's row (its texts as text)."""
        return cls(
            **{f: None if row.get(f) is None else str(row[f]) for f in cls.__struct_fields__}
        )


class HistoryRow(msgspec.Struct, kw_only=True):
    """One stored run of the test on this machine (``against.history_rows``)."""

    commit: str | None = None
    time: str | None = None
    median_ns: float | None = None
    change: str | None = None


class Acceptance(msgspec.Struct, kw_only=True):
    """The acceptance a test was judged under (:mod:`perfguard.baseline.accept`)."""

    commit: str
    reason: str
    time: str | None = None
    author: str | None = None


@dataclass(frozen=True)
class HostCount:
    """A test's host instructions per iteration (Callgrind), against the baseline's when both
    sides counted them: the one place every view takes the figure and its change from."""

    current: float
    baseline: float | None = None
    #: the gate's budget where it widened it to the test's heap-layout spread
    #: (:attr:`perfguard.compare.gates.GateVerdict.widened`), else ""
    budget: str = ""

    @property
    def delta_pct(self) -> float | None:
        if self.baseline is None or self.baseline <= 0:
            return None
        return 100.0 * (self.current / self.baseline - 1.0)

    def short(self) -> str:
        """``3.585 M instr`` or ``3.585 M instr, +0.29%`` (for a table cell)."""
        from perfguard.compare.units import human, percent

        d = self.delta_pct
        return human(self.current, "instructions") + (
            "" if d is None else f", {percent(d, True, 2)}"
        )

    def text(self) -> str:
        """A sentence for a test's lines: what was counted, against what."""
        from perfguard.compare.units import human, percent

        now = human(self.current, "instructions")
        if self.baseline is None:
            return f"host instructions per iteration: {now} (Callgrind; no baseline count)"
        budget = f"; budget {self.budget}" if self.budget else ""
        return (
            f"host instructions per iteration: {human(self.baseline, 'instructions')} → {now} "
            f"({percent(self.delta_pct, True, 2)}, Callgrind{budget})"
        )


class TestEntry(msgspec.Struct, TimingFigures):
    """One test of a session: its outcome with the reason, and the evidence.

    ``timing`` and ``gates`` are the two halves of the verdict
    (:mod:`perfguard.compare.judge`), None where nothing was judged; the figures every view
    shows (change, interval, medians, levels) are ``timing``'s, read through the properties
    of the same names. ``ops``, ``kernel_changes``, ``findings`` and ``history`` are tables.
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    message: str = ""
    mode: str = "store"
    #: the significance level the test was judged at (a setting; None where none applied)
    alpha: float | None = None
    baseline_commit: str | None = None
    timing: TimingVerdict | None = None
    gates: GateVerdict | None = None
    #: the judge's explanation (compare.culprits); None for a test nothing judged
    explanation: Explanation | None = None
    ops: list[OpRow] = []
    kernel_changes: list[KernelChange] = []
    findings: list[Finding] = []
    history: list[HistoryRow] = []
    samples_current: list[float] = []
    samples_baseline: list[float] = []
    rounds_current: list[float] = []
    rounds_baseline: list[float] = []
    capture: str | None = None
    backend: str | None = None
    error: str | None = None
    notes: list[str] = []
    worker: str | None = None
    #: a regressed test's capture as a Perfetto/Chrome trace, relative to the report
    timeline: str | None = None
    #: the acceptance this test was judged under
    accepted: Acceptance | None = None
    #: ``--perfguard-changed``: not run, since nothing it executes changed since this
    #: commit; its outcome is the one it had there (``message`` says so)
    carried_from: str | None = None
    #: wall seconds of the measurement's parts (warmup, timing, profiled, analysis,
    #: findings, compare, timeline, history): where a test's time under perfguard went
    phase_s: dict[str, float] = {}
    #: this run's whole-test counts per iteration measured outside the trace (host
    #: ``instructions`` and ``est_cycles`` under Callgrind), whether or not anything compared them
    counted: dict[str, float] = {}
    #: where the step's time goes (:mod:`perfguard.compare.profile`): every measured
    #: test's, whatever its outcome; None for a test nothing was measured of
    profile: TestProfile | None = None

    # ------------------------------------------------------------------ build
    @classmethod
    def not_judged(
        cls, nodeid: str, outcome: Outcome | str, reason: str, **extras: Any
    ) -> TestEntry:
        """A test with no verdict, and why: ``error`` (the capture, its analysis or the test
        failed), ``crashed`` (its process died) or ``not-judged``. ``extras`` fills any field
        (``backend``, ``capture``, ``worker``, ``notes``)."""
        o = Outcome(outcome)
        if o.judged:
            raise ValueError(f"{nodeid}: {o.value} is a verdict; build it with the judge")
        reason = " ".join(str(reason).split()) or o.value
        error = reason if o in (Outcome.ERROR, Outcome.CRASHED) else None
        return cls(**{"nodeid": nodeid, "outcome": o, "message": reason, "error": error, **extras})

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe data: one entry of ``results.json["tests"]``, as a script reads it."""
        return _builtins(self)

    @classmethod
    def from_dict(cls, data: Any, source: str = "results") -> TestEntry:
        """A checked entry of this schema from one decoded ``tests`` object."""
        return _convert(data, cls, source)

    @property
    def ci_level_pct(self) -> float | None:
        return None if self.alpha is None else round(100.0 * (1.0 - self.alpha), 6)

    @property
    def load_high(self) -> bool:
        """The machine was busy enough to stretch a CPU timing (see compare.timing)."""
        return self.wait is not None and self.wait > BUSY_WAIT

    # ------------------------------------------------------------------ read
    @property
    def fails(self) -> bool:
        """Whether this test's outcome fails under the default rule (:func:`fails`)."""
        return fails(self.outcome)

    @property
    def reason(self) -> str:
        """One line on why the test has its outcome (the error for error/crashed)."""
        if self.outcome in (Outcome.ERROR, Outcome.CRASHED) and self.error:
            return self.error
        return self.message or (self.error or "")

    @property
    def explained(self) -> Explanation:
        """The explanation every view renders: the judge's, else the reason alone."""
        if self.explanation is not None:
            return self.explanation
        return Explanation.plain(self.outcome.value, self.reason or self.outcome.value)

    @property
    def accepted_text(self) -> str:
        """``accepted at <sha>: <reason>`` when judged under an acceptance, else ""."""
        a = self.accepted
        return f"accepted at {a.commit[:12]}: {a.reason}" if a else ""

    @property
    def host_count(self) -> HostCount | None:
        """The host instructions of this run and the baseline's, when Callgrind counted them."""
        current = self.counted.get("instructions")
        if current is None:
            return None
        pair = self.gates.totals.get("instructions") if self.gates is not None else None
        widened = self.gates.widened.get("instructions", "") if self.gates is not None else ""
        return HostCount(current, pair[0] if pair else None, widened)


class Machine(msgspec.Struct, kw_only=True):
    """The run's machine (:class:`~perfguard.baseline.record.Fingerprint`) the views name."""

    gpu_name: str | None = None
    gpu_count: int | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    perfguard: str | None = None
    backend: str | None = None
    host: str | None = None
    python: str | None = None
    cpu: str | None = None
    workers: int | None = None


class Run(msgspec.Struct, kw_only=True):
    """What was run (:class:`perfguard.baseline.record.RunInfo`): commit, branch, time, machine."""

    commit: str | None = None
    branch: str | None = None
    dirty: bool = False
    time: str | None = None
    fingerprint: Machine = msgspec.field(default_factory=Machine)
    environment: dict[str, str] = {}
    #: the CI run whose jobs saved into one stored run (``--perfguard-run-group``)
    group: str | None = None


class Baseline(msgspec.Struct, kw_only=True):
    """What the session compared with: a stored run for a ref, or A/B's base tree (``ab``)."""

    ref: str | None = None
    commit: str | None = None
    run_id: int | str | None = None
    ab: bool = False


class Replaced(msgspec.Struct, kw_only=True):
    """Test records of earlier runs of this commit that a save replaced."""

    tests: int = 0
    runs: list[int] = []


class Saved(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The run ``--perfguard-save`` stored, and what it replaced (written only when it did,
    as before schema 3)."""

    run_id: int | None = None
    store: str | None = None
    replaced: Replaced | None = None


class SessionResults(msgspec.Struct, kw_only=True):
    """One session's document: what was run, against what, and every test's entry.

    ``badge`` and ``counts`` are derived (they cannot go stale) and written beside the
    fields for a script's sake (:meth:`to_dict`)."""

    schema: int = SCHEMA
    complete: bool = True  # false while the session runs (rewritten after every test)
    perfguard_version: str | None = None
    mode: str = "store"  # "store" | "ab"
    run: Run = msgspec.field(default_factory=Run)
    baseline: Baseline | None = None
    baseline_status: str | None = None
    saved: Saved | None = None
    save_error: str | None = None
    settings: dict[str, Any] = {}
    notes: list[str] = []
    #: wall seconds of the session's own parts (start-up, A/B measurement, results
    #: written after each test, save): perfguard's cost beyond each test's
    phase_s: dict[str, float] = {}
    tests: list[TestEntry] = []

    def __post_init__(self) -> None:
        for key in ("tolerance", "alpha", "fail_on", "backend"):  # what every view names
            self.settings.setdefault(key, None)

    @property
    def counts(self) -> dict[str, int]:
        """Tests per outcome, every outcome, worst first (derived: it cannot go stale)."""
        out = dict.fromkeys(OUTCOMES, 0)
        for t in self.tests:
            out[t.outcome.value] += 1
        return out

    @property
    def fail_on(self) -> str:
        """The session's ``fail_on`` (``regression`` where the document does not say)."""
        return "never" if self.settings.get("fail_on") == "never" else "regression"

    def badge(self) -> str:
        """The session's verdict: FAIL (a regression fails the run), ADVISORY (one regressed
        under ``fail_on=never``), INCOMPLETE (a test errored or crashed), NOT JUDGED
        (nothing was compared), else PASS: every judged test passed."""
        outcomes = {t.outcome for t in self.tests}
        if any(fails(o, self.fail_on) for o in outcomes):
            return "FAIL"
        if any(fails(o) for o in outcomes):  # would fail the run, were it asked to
            return "ADVISORY"
        if outcomes & {Outcome.ERROR, Outcome.CRASHED}:
            return "INCOMPLETE"
        if not any(o.judged for o in outcomes):
            return "NOT JUDGED"
        return "PASS"

    def resolution(self) -> str:
        """What the session's timing verdicts were worth: the smallest change each test's
        timing could have seen (``threshold_pct``), over the suite, so that a PASS of blind
        tests is not read as a clean bill; the line under the badge in every view ("" when
        no timing was judged)."""
        from perfguard.compare.units import percent

        judged = [
            t.timing
            for t in self.tests
            if t.timing is not None and t.timing.threshold_pct is not None
        ]
        if not judged:
            return ""
        seen = sorted(v.threshold_pct or 0.0 for v in judged)
        mid = seen[len(seen) // 2]
        coarse = sum((v.threshold_pct or 0.0) > (v.tolerance_pct or 0.0) + 1e-9 for v in judged)
        span = "" if len(seen) == 1 else f" ({percent(seen[0])} to {percent(seen[-1])})"
        text = (
            f"smallest timing change this run could see: {percent(mid)} median over "
            f"{len(seen)} test(s){span}"
        )
        if coarse:
            text += f", {coarse} of them coarser than their tolerance"
        return text

    def badge_reason(self) -> str:
        """One line on why the badge is what it is (and how many verdicts were carried
        from the baseline commit by ``--perfguard-changed``, which the counts include)."""
        carried = sum(t.carried_from is not None for t in self.tests)
        said = (
            f" ({carried} not run: nothing they execute changed, verdicts carried)"
            if carried
            else ""
        )
        return self._badge_reason() + said

    def _badge_reason(self) -> str:
        c = self.counts
        badge = self.badge()
        if badge == "FAIL":
            return f"{c['regressed']} regressed"
        if badge == "ADVISORY":
            return f"{c['regressed']} regressed; advisory only (fail on never)"
        if badge == "INCOMPLETE":
            bad = [f"{c[o]} {o}" for o in ("crashed", "error") if c[o]]
            return ", ".join(bad) + ": not every test was measured"
        if badge == "NOT JUDGED":
            return "nothing was compared" + (
                ": " + ", ".join(f"{n} {o}" for o, n in c.items() if n)
                if self.tests
                else ": no test was measured"
            )
        passed = sum(n for o, n in c.items() if Outcome(o).passing)
        text = f"{passed} passed, none regressed"
        if c["noisy"]:
            text += f"; {c['noisy']} too noisy to judge"
        unjudged = [f"{n} {o}" for o, n in c.items() if n and not Outcome(o).judged]
        return text + (f"; not judged: {', '.join(unjudged)}" if unjudged else "")

    def sorted_tests(self) -> list[TestEntry]:
        """Worst outcome first (:attr:`Outcome.severity`), then by node id."""
        return sorted(self.tests, key=lambda t: (t.outcome.severity, t.nodeid))

    def header(self) -> dict[str, Any]:
        """The document less its tests, with the derived ``badge`` and ``counts``."""
        head = _builtins(msgspec.structs.replace(self, tests=[]))
        head.pop("tests")
        head["schema"] = SCHEMA
        head["badge"] = self.badge()
        head["counts"] = {o: n for o, n in self.counts.items() if n}
        return head

    def to_dict(self) -> dict[str, Any]:
        """The ``results.json`` document as JSON-safe builtins."""
        return {**self.header(), "tests": [t.to_dict() for t in self.tests]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "results") -> SessionResults:
        """A checked document from decoded JSON ``data`` (not changed), upgraded to this
        schema; ``source`` names it in errors."""
        if isinstance(data, SessionResults):
            return data
        return _convert(upgrade(data, source), cls, source)


def encode(value: Any) -> bytes:
    """``value`` (the document, an entry) as ``results.json`` writes it (indented UTF-8;
    NaN as null; a lone surrogate from a test's output as U+FFFD, which UTF-8 cannot hold)."""
    try:
        text = msgspec.json.encode(value, enc_hook=_enc_hook)
    except UnicodeEncodeError:
        text = msgspec.json.encode(_utf8(msgspec.to_builtins(value, enc_hook=_enc_hook)))
    return msgspec.json.format(text, indent=1)


def _utf8(value: Any) -> Any:
    """Builtins with every text made encodable (lone surrogates replaced)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_utf8(v) for v in value]
    return value


def load_results(path: str | Path) -> SessionResults:
    """``results.json`` at ``path``, checked (and upgraded from an older schema).

    Raises :class:`ReportError` (``<path>: <problem>``) for a missing or
    unreadable file, invalid JSON, or content that is not perfguard results.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ReportError(f"{path}: is a directory, expected a results.json file") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        head = msgspec.json.decode(raw, type=_Head)
    except msgspec.ValidationError:  # not an object, or a schema that is not a number
        head = _Head(schema=None)
    except msgspec.DecodeError as exc:
        return SessionResults.from_dict(_python_json(raw, exc, path), source=str(path))
    if head.schema == SCHEMA and type(head.schema) is int:
        try:  # this schema: typed straight from the bytes
            return msgspec.json.decode(raw, type=SessionResults)
        except msgspec.ValidationError as exc:
            raise ReportError(f"{path}: {_where(exc, raw)}") from None
    return SessionResults.from_dict(msgspec.json.decode(raw), source=str(path))


# ---------------------------------------------------------------------------- upgrade


class _Head(msgspec.Struct):
    """The one key read before the rest: which schema the document is."""

    schema: Any = None


class _OldFigures(msgspec.Struct, kw_only=True):
    """A schema 1 or 2 entry's flat figures (checked before they move into ``timing``)."""

    nodeid: str
    outcome: Outcome
    metric: str | None = None
    n_current: float | None = None
    n_baseline: float | None = None
    median_current_ns: float | None = None
    median_baseline_ns: float | None = None
    level_current_ns: float | None = None
    level_baseline_ns: float | None = None
    delta_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    ci_level_pct: float | None = None
    p_value: float | None = None
    tolerance_pct: float | None = None
    alpha: float | None = None
    load: float | None = None
    message: str | None = None
    timing: dict[str, Any] | None = None
    accepted: dict[str, Any] | None = None


#: the figures schema 2 wrote flat on an entry as well as in its ``timing``
_FLAT = (
    "metric",
    "n_current",
    "n_baseline",
    "median_current_ns",
    "median_baseline_ns",
    "level_current_ns",
    "level_baseline_ns",
    "delta_pct",
    "ci_low_pct",
    "ci_high_pct",
    "ci_level_pct",
    "p_value",
    "p_exact",
    "tolerance_pct",
    "load",
    "wait",
)


def upgrade(data: Any, source: str = "results") -> dict[str, Any]:
    """A decoded ``results.json`` of any schema this perfguard reads, as schema 3 data (a new
    dict; ``data`` is not changed). Schema 1 and 2 entries' flat figures move into
    ``timing`` (schema 1 had none: it is built from them); schema 1's ``unchanged`` with too
    few samples reads ``not-judged``; a note says an older file was read."""
    if not isinstance(data, dict):
        raise ReportError(f"{source}: not perfguard results (expected a JSON object)")
    if "schema" not in data or "tests" not in data:
        missing = "schema" if "schema" not in data else "tests"
        raise ReportError(f"{source}: not perfguard results (no {missing!r} key)")
    schema = data["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise ReportError(f"{source}: schema must be a positive integer, got {schema!r}")
    if schema > SCHEMA:
        raise ReportError(
            f"{source}: written by a newer perfguard (schema {schema}; this one reads "
            f"up to {SCHEMA}); upgrade perfguard to render it"
        )
    if schema == SCHEMA:
        return data
    tests = data["tests"]
    if not isinstance(tests, list):
        raise ReportError(f"{source}: tests: expected a list, got {_shown(tests)}")
    old = _convert({"tests": tests}, _OldTests, source)
    out = {k: v for k, v in data.items() if k not in ("badge", "counts")}
    out["schema"] = SCHEMA
    out["tests"] = [_upgrade_entry(t, f, schema) for t, f in zip(tests, old.tests, strict=True)]
    notes = data.get("notes") or []
    out["notes"] = [notes] if isinstance(notes, str) else list(notes)
    if schema < 2:  # schema 2 lost nothing: its figures are only moved, and said the same
        out["notes"].append(
            "read from a schema 1 results.json (an older perfguard): per-iteration "
            "samples only, no rounds and no timing/gates evidence"
        )
    if out.get("mode") is None:
        out["mode"] = "ab" if any(t.get("mode") == "ab" for t in out["tests"]) else "store"
    return out


class _OldTests(msgspec.Struct):
    tests: list[_OldFigures]


def _upgrade_entry(test: dict[str, Any], flat: _OldFigures, schema: int) -> dict[str, Any]:
    """One schema 1/2 entry as schema 3: its figures in ``timing`` only."""
    entry = {k: v for k, v in test.items() if k not in _FLAT}
    entry["message"] = " ".join((flat.message or "").split())
    if schema < 2:  # its message is its reason; it had no explanation, rounds or halves
        entry.pop("explanation", None)
    if flat.accepted is not None and flat.accepted.get("commit") is None:
        entry["accepted"] = None
    timing = flat.timing
    if timing is None and (flat.outcome.judged or flat.n_current is not None):
        # schema 1 (or a verdict without its half): the flat figures are the timing's
        timing = {
            "outcome": flat.outcome.value,
            "mode": test.get("mode") or "store",
            "metric": flat.metric or "",
            "message": entry["message"],
            "replicated": "",
            "n_current": int(flat.n_current or 0),
            "n_baseline": int(flat.n_baseline or 0),
            "history_runs": 0,
            "threshold_pct": None,
            "noise_pct": None,
            "spread_pct": None,
            "wait": test.get("wait"),
            **{
                k: getattr(flat, k)
                for k in (
                    "median_current_ns",
                    "median_baseline_ns",
                    "level_current_ns",
                    "level_baseline_ns",
                    "delta_pct",
                    "ci_low_pct",
                    "ci_high_pct",
                    "ci_level_pct",
                    "p_value",
                    "tolerance_pct",
                    "load",
                )
            },
        }
        if timing["ci_level_pct"] is None and flat.alpha is not None:
            timing["ci_level_pct"] = round(100.0 * (1.0 - flat.alpha), 6)
    entry["timing"] = timing
    if schema < 2 and flat.outcome is Outcome.UNCHANGED:
        few = any(
            n is not None and n < _SCHEMA1_MIN_SAMPLES for n in (flat.n_current, flat.n_baseline)
        )
        msg = entry["message"]
        if few or "not judged" in msg or msg.startswith("statistics impossible"):
            entry["outcome"] = Outcome.NOT_JUDGED.value
            if timing is not None:
                entry["timing"] = {**timing, "outcome": Outcome.NOT_JUDGED.value}
            notes = test.get("notes") or []
            entry["notes"] = [
                *([notes] if isinstance(notes, str) else notes),
                "schema 1 called this unchanged; it had too few samples to judge",
            ]
    return entry


# ---------------------------------------------------------------------------- checks


def _builtins(value: Any) -> dict[str, Any]:
    """``value`` as the JSON text holds it (NaN as null): for a script or a ``--json``
    document, never between the session's own steps."""
    out: dict[str, Any] = finite(msgspec.to_builtins(value, enc_hook=_enc_hook))
    return out


def _enc_hook(value: Any) -> Any:
    """numpy's scalars as Python's (a verdict's figures come from numpy)."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        return value.item()
    raise NotImplementedError(f"cannot write {type(value).__name__} into results.json")


def _convert(data: Any, kind: type[Any], source: str) -> Any:
    """``data`` (decoded JSON) as ``kind``, checked by msgspec; one line naming the key."""
    try:
        return msgspec.convert(data, kind, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ReportError(f"{source}: {_where(exc, data)}") from None


def _python_json(raw: bytes, exc: msgspec.DecodeError, path: Path) -> Any:
    """What msgspec refused, read by Python's parser: an older file's lone surrogate escape
    (``\\udc80``, which msgspec does not take); else the JSON error with its line and
    column, as Python's parser says them."""
    import json

    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a text file, expected results.json") from None
    except json.JSONDecodeError as err:
        raise ReportError(
            f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        ) from None
    except ValueError:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None


_TYPE_WORDS = {
    "float | null": "a number or null",
    "float": "a number",
    "int": "an integer",
    "str": "a string",
    "str | null": "a string or null",
    "object": "an object",
    "object | null": "an object or null",
    "array": "a list",
    "bool": "true or false",
    "int | null": "an integer or null",
    "array | null": "a list or null",
}


def _where(exc: msgspec.ValidationError, data: Any) -> str:
    """msgspec's ``Expected `float | null`, got `str` - at `$.tests[0].delta_pct``` as this
    file's words: ``tests[0] (a).delta_pct: expected a number or null, got 'big'``."""
    import re

    text = str(exc)
    text, _, path = text.partition(" - at `")
    path = path.rstrip("`").removeprefix("$").removeprefix(".")
    value: Any = data if not isinstance(data, bytes) else None
    shown_path: list[str] = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        index = part[1:-1] if part.startswith("[") else None
        if isinstance(value, list) and index is not None and int(index) < len(value):
            value = value[int(index)]
        elif isinstance(value, dict) and index is None:
            value = value.get(part)
        else:
            value = None
        shown_path.append(part if index is not None or not shown_path else "." + part)
        if (
            len(shown_path) == 2
            and shown_path[0] == "tests"
            and isinstance(value, dict)
            and isinstance(value.get("nodeid"), str)
        ):
            shown_path.append(f" ({value['nodeid']})")
    where = "".join(shown_path) or "document"
    m = re.match(r"Expected `(.+?)`, got `(.+?)`", text)
    if m:
        expected = _TYPE_WORDS.get(m.group(1), m.group(1))
        got = _shown(value) if value is not None else m.group(2)
        return f"{where}: expected {expected}, got {got}"
    m = re.match(r"Invalid enum value (.+)", text)
    if m and where.endswith("outcome"):
        return f"{where}: unknown outcome {m.group(1)}; expected one of {', '.join(OUTCOMES)}"
    m = re.match(r"Object missing required field `(.+)`", text)
    if m:
        return f"{where}: no {m.group(1)!r} key"
    return f"{where}: {text[:1].lower()}{text[1:]}"


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
