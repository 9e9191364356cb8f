"""The typed session document: ``results.json`` as dataclasses (schema 2).

The plugin builds it (:class:`SessionResults` of :class:`TestEntry`), writes
it with :meth:`SessionResults.to_dict`, and every report (terminal table,
``report.html``, ``summary.md``, ``perfguard report``) reads it back through
:meth:`SessionResults.from_dict`, the one place a results document is
checked. A file may come from another perfguard version months later, so
loading is strict about what a report needs (a schema it knows, tests with
a ``nodeid`` and one of :class:`Outcome`'s values, numbers where numbers
belong) and lenient about the rest: every optional key gets a default.
Schema 1 files (before rounds, the timing/gates halves and A/B mode) still
load; an ``unchanged`` that schema 1 gave a test it could not judge (too few
samples) becomes ``not-judged``. A bad file is one
:class:`~perfguard.errors.ReportError` line naming the file and the key.

Standard library only at import (the plugin's summary imports it); the
timing and gates halves are built when a document holds them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfguard.compare.explanation import Explanation
from perfguard.compare.outcomes import Outcome
from perfguard.compare.profile import TestProfile
from perfguard.errors import ReportError

if TYPE_CHECKING:
    from perfguard.compare.comparison import TestComparison
    from perfguard.compare.gates import GateVerdict
    from perfguard.compare.timing import TimingVerdict

#: the ``schema`` this perfguard writes; it reads every schema up to it
SCHEMA = 2
#: outcome values, worst first (the order every report lists them in)
OUTCOMES = tuple(o.value for o in Outcome)
#: schema 1 judged nothing with fewer samples a side than this, yet said ``unchanged``
_SCHEMA1_MIN_SAMPLES = 5

BADGES = ("FAIL", "ADVISORY", "INCOMPLETE", "NOT JUDGED", "PASS")

_FIGURES = (
    "median_current_ns", "median_baseline_ns", "level_current_ns", "level_baseline_ns",
    "delta_pct", "ci_low_pct", "ci_high_pct",
    "ci_level_pct", "p_value", "tolerance_pct", "alpha", "load",
)  # fmt: skip
_COUNTS = ("n_current", "n_baseline")
_TEXTS = ("metric", "capture", "backend", "error", "worker", "baseline_commit", "timeline")
_SERIES = ("samples_current", "samples_baseline", "rounds_current", "rounds_baseline")
_OP_NUMBERS = (
    "baseline_ns", "current_ns", "delta_pct", "ci_low_pct", "ci_high_pct", "p_value",
    "calls_baseline", "calls_current", "tc_util_baseline", "tc_util_current",
    "flop_eff_baseline", "flop_eff_current",
)  # fmt: skip
_OP_TEXTS = ("op_id", "op_name", "direction", "status", "call_site")
_KERNEL_CHANGE_TEXTS = ("kind", "op_name", "kernel_name")
_FINDING_TEXTS = ("check", "severity", "problem", "evidence", "recommendation")
_GATE_FINDING_TEXTS = ("gate", "op_name", "kernel_name", "budget", "message")
_FINGERPRINT_KEYS = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "perfguard", "backend",
                     "host", "python", "cpu")  # fmt: skip


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


@dataclass
class TestEntry:
    """One test of a session: its outcome with the reason, and the evidence.

    The flat figures (medians, change, interval) come from the timing half;
    ``timing`` and ``gates`` are the two halves of the verdict
    (:mod:`perfguard.compare.judge`), None where nothing was judged. ``ops``,
    ``kernel_changes``, ``findings`` and ``history`` are tables: lists of
    row objects. Numbers are None when unknown, never NaN.
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    message: str = ""
    metric: str | None = None
    n_current: int | None = None
    n_baseline: int | None = None
    median_current_ns: float | None = None
    median_baseline_ns: float | None = None
    #: the levels ``delta_pct`` is the change between (compare.timing.TimingVerdict)
    level_current_ns: float | None = None
    level_baseline_ns: float | None = None
    delta_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    ci_level_pct: float | None = None
    p_value: float | None = None
    p_exact: bool = False
    tolerance_pct: float | None = None
    alpha: float | None = None
    mode: str = "store"
    timing: TimingVerdict | None = None
    gates: GateVerdict | None = None
    ops: list[dict[str, Any]] = field(default_factory=list)
    kernel_changes: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    samples_current: list[float] = field(default_factory=list)
    samples_baseline: list[float] = field(default_factory=list)
    rounds_current: list[float] = field(default_factory=list)
    rounds_baseline: list[float] = field(default_factory=list)
    capture: str | None = None
    backend: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    worker: str | None = None
    load: float | None = None
    baseline_commit: str | None = None
    #: a regressed test's capture as a Perfetto/Chrome trace, relative to the report
    timeline: str | None = None
    #: the acceptance this test was judged under: commit, reason, time, author
    accepted: dict[str, Any] | None = None
    #: the judge's explanation (compare.culprits); None for a test nothing judged
    explanation: Explanation | None = None
    #: wall seconds of the measurement's parts (warmup, timing, profiled, analysis,
    #: findings, compare, timeline, history): where a test's time under perfguard went
    phase_s: dict[str, float] = field(default_factory=dict)
    #: this run's whole-test counts per iteration measured outside the trace (host
    #: ``instructions`` and ``est_cycles`` under Callgrind), whether or not anything compared them
    counted: dict[str, float] = field(default_factory=dict)
    #: where the step's time goes (:mod:`perfguard.compare.profile`): every measured
    #: test's, whatever its outcome; None for a test nothing was measured of
    profile: TestProfile | None = None

    # ------------------------------------------------------------------ build
    @classmethod
    def from_comparison(cls, c: TestComparison, **extras: Any) -> TestEntry:
        """The entry of a judged test: ``c``'s figures and halves plus the plugin's extras
        (``findings``, ``history``, ``capture``, ``backend``, ``notes``, ``worker``, ``load``)."""
        return cls.from_dict({**c.to_dict(), **extras})

    @classmethod
    def not_judged(
        cls, nodeid: str, outcome: Outcome | str, reason: str, **extras: Any
    ) -> TestEntry:
        """A test with no verdict, and why: ``error`` (the capture, its analysis or the test
        failed), ``crashed`` (its process died) or ``not-judged``. ``extras`` fills any field
        (``backend``, ``capture``, ``worker``, ``notes``)."""
        o = Outcome(outcome)
        if o.judged:
            raise ValueError(f"{nodeid}: {o.value} is a verdict; build it with from_comparison")
        reason = " ".join(str(reason).split()) or o.value
        error = reason if o in (Outcome.ERROR, Outcome.CRASHED) else None
        return cls(**{"nodeid": nodeid, "outcome": o, "message": reason, "error": error, **extras})

    # ------------------------------------------------------------------ read
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
        return f"accepted at {(a.get('commit') or '')[:12]}: {a.get('reason')}" if a else ""

    @property
    def host_count(self) -> HostCount | None:
        """The host instructions of this run and the baseline's, when Callgrind counted them."""
        current = self.counted.get("instructions")
        if current is None:
            return None
        pair = self.gates.totals.get("instructions") if self.gates is not None else None
        widened = self.gates.widened.get("instructions", "") if self.gates is not None else ""
        return HostCount(current, pair[0] if pair else None, widened)

    @property
    def wait(self) -> float | None:
        """Share of the rounds' time the test's thread waited for a CPU (busy machine)."""
        value = getattr(self.timing, "wait", None)
        return None if value is None or value != value else float(value)

    @property
    def load_high(self) -> bool:
        """The machine was busy enough to stretch a CPU timing (see compare.timing)."""
        from perfguard.compare.timing import BUSY_WAIT

        return self.wait is not None and self.wait > BUSY_WAIT

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe data: one entry of ``results.json["tests"]``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "outcome":
                v = v.value
            elif f.name in ("timing", "gates", "explanation", "profile"):
                v = v.to_dict() if v is not None else None
            elif isinstance(v, float) and not math.isfinite(v):
                v = None
            elif isinstance(v, (list, dict)):
                v = type(v)(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(
        cls, test: Any, source: str = "results", where: str = "test", schema: int = SCHEMA
    ) -> TestEntry:
        """A checked entry from one ``tests`` object; :class:`ReportError` names the key."""
        _need(isinstance(test, dict), source, where, "an object", test)
        nodeid = test.get("nodeid")
        _need(isinstance(nodeid, str) and bool(nodeid), source, f"{where}.nodeid", "a string",
              nodeid)  # fmt: skip
        where = f"{where} ({nodeid})"
        raw = test.get("outcome")
        try:
            outcome = Outcome(raw)
        except ValueError:
            raise ReportError(
                f"{source}: {where}: unknown outcome {raw!r}; expected one of {', '.join(OUTCOMES)}"
            ) from None
        vals: dict[str, Any] = {"nodeid": nodeid, "outcome": outcome}
        vals["message"] = " ".join((_text(test.get("message"), source, f"{where}.message")
                                    or "").split())  # fmt: skip
        for key in _FIGURES:
            vals[key] = _number(test.get(key), source, f"{where}.{key}")
        for key in _COUNTS:
            n = _number(test.get(key), source, f"{where}.{key}")
            vals[key] = None if n is None else int(n)
        for key in _TEXTS:
            vals[key] = _text(test.get(key), source, f"{where}.{key}")
        vals["p_exact"] = bool(test.get("p_exact", False))
        vals["mode"] = _text(test.get("mode"), source, f"{where}.mode") or "store"
        vals["ops"] = _rows(test.get("ops"), source, f"{where}.ops", _OP_TEXTS, _OP_NUMBERS)
        changes = _rows(
            test.get("kernel_changes"), source, f"{where}.kernel_changes", _KERNEL_CHANGE_TEXTS, ()
        )
        for row in changes:  # before/after: a count, a flag or a name, shown as text
            row.setdefault("baseline", None)
            row.setdefault("current", None)
        vals["kernel_changes"] = changes
        vals["findings"] = _rows(test.get("findings"), source, f"{where}.findings",
                                 _FINDING_TEXTS, ())  # fmt: skip
        vals["history"] = _rows(
            test.get("history"),
            source,
            f"{where}.history",
            ("commit", "time", "change"),
            ("median_ns",),
        )
        for key in _SERIES:
            vals[key] = _series(test.get(key), source, f"{where}.{key}")
        vals["notes"] = _notes(test.get("notes"), source, f"{where}.notes")
        vals["phase_s"] = _phases(test.get("phase_s"), source, f"{where}.phase_s")
        vals["counted"] = _phases(test.get("counted"), source, f"{where}.counted", "a count")
        vals["timing"] = _timing(test.get("timing"), source, f"{where}.timing")
        vals["gates"] = _gates(test.get("gates"), source, f"{where}.gates")
        vals["accepted"] = _accepted(test.get("accepted"), source, f"{where}.accepted")
        vals["explanation"] = (  # schema 1 had none: its message is its reason
            _explanation(test.get("explanation"), source, f"{where}.explanation")
            if schema >= 2
            else None
        )
        vals["profile"] = _profile(test.get("profile"), source, f"{where}.profile")
        entry = cls(**vals)
        if schema < 2:
            _from_schema1(entry)
        return entry


def _explanation(value: Any, source: str, where: str) -> Explanation | None:
    if value is None:
        return None
    _need(isinstance(value, dict), source, where, "an object or null", value)
    _need(isinstance(value.get("headline"), str), source, f"{where}.headline", "a string",
          value.get("headline"))  # fmt: skip
    culprits = value.get("culprits") or []
    _need(isinstance(culprits, list) and all(isinstance(c, dict) for c in culprits), source,
          f"{where}.culprits", "a list of objects", culprits)  # fmt: skip
    return Explanation.from_dict(value)


def _profile(value: Any, source: str, where: str) -> TestProfile | None:
    if value is None:
        return None
    _need(isinstance(value, dict), source, where, "an object or null", value)
    try:
        return TestProfile.from_dict(value)
    except (TypeError, ValueError) as exc:
        raise ReportError(f"{source}: {where}: {exc}") from None


def _accepted(value: Any, source: str, where: str) -> dict[str, Any] | None:
    """An acceptance: ``commit`` and ``reason`` (text), ``time`` and ``author`` (text or null)."""
    if value is None:
        return None
    _need(isinstance(value, dict), source, where, "an object", value)
    out = {}
    for key in ("commit", "reason", "time", "author"):
        text = _text(value.get(key), source, f"{where}.{key}")
        _need(key not in ("commit", "reason") or bool(text), source, f"{where}.{key}",
              "a string", value.get(key))  # fmt: skip
        out[key] = text
    return out


def _from_schema1(entry: TestEntry) -> None:
    """Schema 1 said ``unchanged`` for a test it could not judge (fewer than 5 samples a
    side): that is ``not-judged``. Its per-iteration samples stay; it had no rounds."""
    if entry.outcome is not Outcome.UNCHANGED:
        return
    few = any(n is not None and n < _SCHEMA1_MIN_SAMPLES for n in (entry.n_current,
                                                                    entry.n_baseline))  # fmt: skip
    if few or "not judged" in entry.message or entry.message.startswith("statistics impossible"):
        entry.outcome = Outcome.NOT_JUDGED
        entry.notes.append("schema 1 called this unchanged; it had too few samples to judge")


@dataclass
class SessionResults:
    """One session's document: what was run, against what, and every test's entry."""

    tests: list[TestEntry] = field(default_factory=list)
    schema: int = SCHEMA
    perfguard_version: str | None = None
    run: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    baseline_status: str | None = None
    saved: dict[str, Any] | None = None
    save_error: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    mode: str = "store"  # "store" | "ab"
    complete: bool = True  # false while the session runs (rewritten after every test)
    #: wall seconds of the session's own parts (start-up, A/B measurement, results
    #: written after each test, save): perfguard's cost beyond each test's
    phase_s: dict[str, float] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        """Tests per outcome, every outcome, worst first (derived: it cannot go stale)."""
        out = dict.fromkeys(OUTCOMES, 0)
        for t in self.tests:
            out[t.outcome.value] += 1
        return out

    @property
    def fail_on(self) -> str:
        return str(self.settings.get("fail_on") or "regression")

    def badge(self) -> str:
        """The session's verdict: FAIL (a regression fails the run), ADVISORY (one regressed
        under ``fail_on=never``), INCOMPLETE (a test errored or crashed), NOT JUDGED
        (nothing was compared), else PASS: every judged test passed."""
        outcomes = {t.outcome for t in self.tests}
        if Outcome.REGRESSED in outcomes:
            return "ADVISORY" if self.fail_on == "never" else "FAIL"
        if outcomes & {Outcome.ERROR, Outcome.CRASHED}:
            return "INCOMPLETE"
        if not any(o.judged for o in outcomes):
            return "NOT JUDGED"
        return "PASS"

    def badge_reason(self) -> str:
        """One line on why the badge is what it is."""
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
                ": " + ", ".join(f"{n} {o}" for o, n in c.items() if n) if self.tests else
                ": no test was measured"
            )  # fmt: skip
        passed = sum(n for o, n in c.items() if Outcome(o).passing)
        text = f"{passed} passed, none regressed"
        if c["noisy"]:
            text += f"; {c['noisy']} too noisy to judge"
        unjudged = [f"{n} {o}" for o, n in c.items() if n and not Outcome(o).judged]
        return text + (f"; not judged: {', '.join(unjudged)}" if unjudged else "")

    def sorted_tests(self) -> list[TestEntry]:
        """Worst outcome first (:attr:`Outcome.severity`), then by node id."""
        return sorted(self.tests, key=lambda t: (t.outcome.severity, t.nodeid))

    def to_dict(self) -> dict[str, Any]:
        """The ``results.json`` document (JSON-safe; counts list the outcomes present)."""
        return {
            "schema": SCHEMA,
            "complete": self.complete,
            "perfguard_version": self.perfguard_version,
            "mode": self.mode,
            "run": self.run,
            "baseline": self.baseline,
            "baseline_status": self.baseline_status,
            "saved": self.saved,
            "save_error": self.save_error,
            "settings": self.settings,
            "badge": self.badge(),
            "counts": {o: n for o, n in self.counts.items() if n},
            "notes": list(self.notes),
            "phase_s": dict(self.phase_s),
            "tests": [t.to_dict() for t in self.tests],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "results") -> SessionResults:
        """A checked document from ``data`` (not changed); ``source`` names it in errors."""
        if isinstance(data, SessionResults):
            return data
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
        tests = data["tests"]
        _need(isinstance(tests, list), source, "tests", "a list", tests)
        entries = [
            TestEntry.from_dict(t, source, f"tests[{i}]", schema) for i, t in enumerate(tests)
        ]
        baseline = data.get("baseline")
        if baseline is not None:
            _need(isinstance(baseline, dict), source, "baseline", "an object or null", baseline)
            baseline = dict(baseline)
            for key in ("ref", "commit", "run_id"):
                value = baseline.get(key)
                baseline[key] = None if value is None else str(value)
            baseline["ab"] = bool(baseline.get("ab"))  # A/B's base tree, not a stored run
        settings = data.get("settings") or {}
        _need(isinstance(settings, dict), source, "settings", "an object", settings)
        settings = dict(settings)
        for key in ("tolerance", "alpha"):
            settings[key] = _number(settings.get(key), source, f"settings.{key}")
        for key in ("fail_on", "backend"):
            value = settings.get(key)
            settings[key] = None if value is None else str(value)
        saved = data.get("saved")
        _need(saved is None or isinstance(saved, dict), source, "saved", "an object or null",
              saved)  # fmt: skip
        counts = data.get("counts")
        _need(counts is None or isinstance(counts, dict), source, "counts", "an object", counts)
        notes = _notes(data.get("notes"), source, "notes")
        if schema < SCHEMA:
            notes.append(
                f"read from a schema {schema} results.json (an older perfguard): per-iteration "
                "samples only, no rounds and no timing/gates evidence"
            )
        mode = _text(data.get("mode"), source, "mode")
        if mode is None:
            mode = "ab" if any(t.mode == "ab" for t in entries) else "store"
        return cls(
            tests=entries,
            schema=SCHEMA,
            perfguard_version=_text(data.get("perfguard_version"), source, "perfguard_version"),
            run=_run(data.get("run"), source, "run"),
            baseline=baseline,
            baseline_status=_text(data.get("baseline_status"), source, "baseline_status"),
            saved=dict(saved) if saved else None,
            save_error=_text(data.get("save_error"), source, "save_error"),
            settings=settings,
            notes=notes,
            mode=mode,
            complete=bool(data.get("complete", True)),
            phase_s=_phases(data.get("phase_s"), source, "phase_s"),
        )


def load_results(path: str | Path) -> SessionResults:
    """``results.json`` at ``path``, checked.

    Raises :class:`ReportError` (``<path>: <problem>``) for a missing or
    unreadable file, invalid JSON, or content that is not perfguard results.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ReportError(f"{path}: is a directory, expected a results.json file") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a text file, expected results.json") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    return SessionResults.from_dict(data, source=str(path))


# ---------------------------------------------------------------------------- checks


def _need(ok: bool, source: str, where: str, expected: str, value: Any) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ReportError(f"{source}: {where}: expected {expected}, got {shown}")


def _number(value: Any, source: str, where: str) -> float | None:
    """A finite float, or None for null/NaN; anything else is an error."""
    if value is None:
        return None
    if type(value) is float:  # the common case, checked first: reports have 10^5 numbers
        return value if math.isfinite(value) else None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    _need(ok, source, where, "a number or null", value)
    value = float(value)
    return value if math.isfinite(value) else None


def _text(value: Any, source: str, where: str) -> str | None:
    if value is None:
        return None
    _need(isinstance(value, str | int | float), source, where, "a string", value)
    return str(value)


def _phases(value: Any, source: str, where: str, unit: str = "seconds") -> dict[str, float]:
    """Amounts by name (seconds of a part, counts of a counter): finite, not negative."""
    if value is None:
        return {}
    _need(isinstance(value, dict), source, where, "an object", value)
    out = {}
    for key, seconds in value.items():
        n = _number(seconds, source, f"{where}.{key}")
        _need(n is not None and n >= 0, source, f"{where}.{key}", f"{unit} (>= 0)", seconds)
        out[str(key)] = float(n)  # type: ignore[arg-type]
    return out


def _notes(notes: Any, source: str, where: str) -> list[str]:
    notes = notes or []
    notes = [notes] if isinstance(notes, str) else notes
    _need(isinstance(notes, list), source, where, "a list of strings", notes)
    return [str(n) for n in notes if n]


def _series(values: Any, source: str, where: str) -> list[float]:
    values = values or []
    _need(isinstance(values, list), source, where, "a list", values)
    if not all(type(x) is float or type(x) is int for x in values):
        for i, x in enumerate(values):
            _number(x, source, f"{where}[{i}]")  # raises on the first bad one
    return [float(x) for x in values if x is not None and math.isfinite(x)]


def _run(run: Any, source: str, where: str) -> dict[str, Any]:
    run = {} if run is None else run
    _need(isinstance(run, dict), source, where, "an object", run)
    run = dict(run)
    for key in ("commit", "branch", "time"):
        run[key] = _text(run.get(key), source, f"{where}.{key}")
    run["dirty"] = bool(run.get("dirty", False))
    fp = run.get("fingerprint") or {}
    _need(isinstance(fp, dict), source, f"{where}.fingerprint", "an object", fp)
    fp = {k: fp.get(k) for k in _FINGERPRINT_KEYS} | fp
    run["fingerprint"] = {
        k: (v if k == "gpu_count" else _text(v, source, f"{where}.fingerprint.{k}"))
        for k, v in fp.items()
    }
    return run


def _rows(
    rows: Any, source: str, where: str, texts: tuple[str, ...], numbers: tuple[str, ...]
) -> list[dict[str, Any]]:
    rows = [] if rows is None else rows
    _need(isinstance(rows, list), source, where, "a list", rows)
    out = []
    for i, row in enumerate(rows):
        _need(isinstance(row, dict), source, f"{where}[{i}]", "an object", row)
        row = dict(row)
        for key in texts:
            value = row.get(key)
            if value is not None and type(value) is not str:  # the location is built on error only
                row[key] = _text(value, source, f"{where}[{i}].{key}")
            else:
                row[key] = value
        for key in numbers:
            value = row.get(key)
            if value is not None and (type(value) is not float or not math.isfinite(value)):
                value = _number(value, source, f"{where}[{i}].{key}")
            row[key] = value
        out.append(row)
    return out


def _outcome(value: Any, source: str, where: str) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        raise ReportError(f"{source}: {where}: unknown outcome {value!r}") from None


def _timing(d: Any, source: str, where: str) -> TimingVerdict | None:
    if d is None:
        return None
    from perfguard.compare.timing import _FIELDS, _FLOATS, TimingVerdict

    _need(isinstance(d, dict), source, where, "an object or null", d)
    _outcome(d.get("outcome"), source, f"{where}.outcome")
    vals = dict(d)
    for key in _FIELDS:
        if key in _FLOATS or key in ("n_current", "n_baseline", "history_runs"):
            vals[key] = _number(d.get(key), source, f"{where}.{key}")
        elif key != "outcome":
            vals[key] = _text(d.get(key), source, f"{where}.{key}")
    return TimingVerdict.from_dict(vals)


def _gates(d: Any, source: str, where: str) -> GateVerdict | None:
    if d is None:
        return None
    from perfguard.compare.gates import GateFinding, GateVerdict

    _need(isinstance(d, dict), source, where, "an object or null", d)
    outcome = _outcome(d.get("outcome"), source, f"{where}.outcome")

    def findings(key: str) -> list[GateFinding]:
        rows = _rows(d.get(key), source, f"{where}.{key}", _GATE_FINDING_TEXTS, ())
        return [
            GateFinding(
                gate=r["gate"] or "",
                op_name=r["op_name"] or "",
                kernel_name=r["kernel_name"] or "",
                baseline=_scalar(r.get("baseline")),
                current=_scalar(r.get("current")),
                budget=r["budget"] or "",
                message=r["message"] or "",
            )  # fmt: skip
            for r in rows
        ]

    return GateVerdict(
        outcome=outcome,
        regressions=findings("regressions"),
        improvements=findings("improvements"),
        unstable=_notes(d.get("unstable"), source, f"{where}.unstable"),
        checked=_notes(d.get("checked"), source, f"{where}.checked"),
        message=_text(d.get("message"), source, f"{where}.message") or "",
        totals=_totals(d.get("totals"), source, f"{where}.totals"),
        widened=_widened(d.get("widened"), source, f"{where}.widened"),
    )


def _widened(value: Any, source: str, where: str) -> dict[str, str]:
    """A gate's widened budgets: ``{counter: text}``."""
    if value is None:
        return {}
    _need(isinstance(value, dict), source, where, "an object", value)
    for k, v in value.items():
        _need(isinstance(v, str), source, f"{where}.{k}", "a string", v)
    return {str(k): str(v) for k, v in value.items()}


def _totals(value: Any, source: str, where: str) -> dict[str, list[float]]:
    """A gate's whole-test counters: ``{counter: [baseline, current]}``, counts >= 0."""
    if value is None:
        return {}
    _need(isinstance(value, dict), source, where, "an object", value)
    out = {}
    for key, pair in value.items():
        ok = isinstance(pair, list) and len(pair) == 2
        _need(ok, source, f"{where}.{key}", "[baseline, current]", pair)
        nums = [_number(x, source, f"{where}.{key}") for x in pair]
        _need(all(n is not None and n >= 0 for n in nums), source, f"{where}.{key}",
              "two counts (>= 0)", pair)  # fmt: skip
        out[str(key)] = [float(n) for n in nums if n is not None]
    return out


def _scalar(v: Any) -> Any:
    """A gate's before/after: a number, a flag or a name; anything else as text."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return json.dumps(v)
