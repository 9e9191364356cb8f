"""Several sessions' ``results.json`` (a CI run's shards) as one document and one verdict.

A suite split over N jobs (``--perfguard-shard K/N``) leaves N documents. :func:`merge`
reads them and gives one :class:`~perfguard.compare.results.SessionResults` whose tests
are exactly the shards' entries, unchanged (nothing is judged again, so every verdict is
the one its job gave), with the session's facts taken once (the run, the baseline) and
the shards said in ``settings["shards"]`` (which file, which tests, its badge) and a note
per shard. A shard expected but absent (``expect``, else the N its siblings recorded), or
one whose document is incomplete (its session was killed mid-run), is a ``crashed`` entry
named ``shard K/N`` in every view, so the merged badge is never PASS without it, and
:attr:`Merged.problems` says why the merge must fail. Documents that cannot be one run
(two commits, two modes, one test in two files, one shard given twice) are one
:class:`~perfguard.errors.ReportError` line naming the files.

Standard library and msgspec, as :mod:`.results`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from perfguard.compare.outcomes import Outcome, fails
from perfguard.compare.results import SessionResults, TestEntry, load_results
from perfguard.environment import machine_key
from perfguard.errors import ReportError

__all__ = ["Matrix", "MachineRun", "Merged", "Shard", "merge", "merge_matrix"]


@dataclass(frozen=True)
class Shard:
    """One document merged: its file, what it says, and the part it ran (``K/N``)."""

    path: Path
    results: SessionResults
    #: ``K/N`` from ``settings.shard``; None for a session that was not sharded
    label: str | None

    @property
    def name(self) -> str:
        """How the views name it: ``shard K/N``, else its file."""
        return f"shard {self.label}" if self.label else str(self.path)

    @property
    def machine(self) -> tuple[str, str]:
        """(key, label) of the machine kind that measured it (:func:`machine_key`)."""
        return machine_key(msgspec.structs.asdict(self.results.run.fingerprint))

    @property
    def plan(self) -> str | None:
        """The digest of the split this shard belonged to (``settings.shard_plan.plan``)."""
        plan = self.results.settings.get("shard_plan")
        return str(plan["plan"]) if isinstance(plan, dict) and plan.get("plan") else None


@dataclass(frozen=True)
class Merged:
    """The merged document, the shards it came from, and why it must fail if it must."""

    results: SessionResults
    shards: list[Shard]
    #: node id -> the shard that measured it (``shard K/N`` or the file)
    measured_by: dict[str, str]
    #: shards expected and absent (``K/N``)
    missing: list[str] = field(default_factory=list)
    #: every reason the merge is incomplete (missing or killed shards, another split)
    problems: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """1 when a test fails the run (the one fail rule, ``compare.outcomes.fails``, as a
        session's exit) or a shard is missing or incomplete; else 0."""
        doc = self.results
        if self.problems or any(fails(t.outcome, doc.fail_on) for t in doc.tests):
            return 1
        return 0


def _label(results: SessionResults) -> tuple[int, int] | None:
    text = results.settings.get("shard")
    if not isinstance(text, str) or "/" not in text:
        return None
    k, _, n = text.partition("/")
    return (int(k), int(n)) if k.isdigit() and n.isdigit() else None


def _missing_entry(nodeid: str, message: str) -> TestEntry:
    return TestEntry(nodeid=nodeid, outcome=Outcome.CRASHED, message=message, error=message)


def _load(paths: Sequence[str | Path]) -> list[Shard]:
    if not paths:
        raise ReportError("nothing to merge: give one results.json per shard")
    shards = []
    for p in paths:
        doc = load_results(p)  # a file it cannot read is one line naming it
        part = _label(doc)
        shards.append(Shard(Path(p), doc, None if part is None else f"{part[0]}/{part[1]}"))
    _check_one_run(shards)
    return shards


def merge(paths: Sequence[str | Path], expect: int | None = None) -> Merged:
    """The documents at ``paths`` as one (module docstring). ``expect``: how many shards
    the run had (else the N the documents recorded)."""
    return _merge(_load(paths), expect)


def _merge(shards: list[Shard], expect: int | None) -> Merged:
    """One machine kind's shards as one document."""
    counts = {int(s.label.split("/")[1]) for s in shards if s.label}
    if len(counts) > 1:
        raise ReportError(
            "the shards were cut into different numbers of parts: "
            + ", ".join(f"{s.path} ({s.label})" for s in shards if s.label)
        )
    if expect is not None and counts and expect not in counts:
        raise ReportError(f"--expect-shards {expect}, but the files are shards of {counts.pop()}")
    total = expect if expect is not None else (next(iter(counts)) if counts else None)

    tests: list[TestEntry] = []
    measured_by: dict[str, str] = {}
    problems: list[str] = []
    for s in shards:
        for t in s.results.tests:
            if t.nodeid in measured_by:
                raise ReportError(
                    f"{t.nodeid} is in two files ({measured_by[t.nodeid]} and {s.name}, "
                    f"{s.path}): shards measure each test once"
                )
            measured_by[t.nodeid] = s.name
            tests.append(t)
        if not s.results.complete:
            why = (
                f"{s.name} ({s.path}) is incomplete: its session stopped after "
                f"{len(s.results.tests)} test(s) (killed or cancelled mid-run)"
            )
            problems.append(why)
            tests.append(_missing_entry(f"{s.name} (incomplete)", why))

    seen = {s.label for s in shards if s.label}
    missing = [] if total is None else [f"{k}/{total}" for k in range(1, total + 1)]
    missing = [m for m in missing if m not in seen]
    if total is not None and not seen and len(shards) < total:  # unsharded files
        missing = [f"{len(shards) + i + 1}/{total}" for i in range(total - len(shards))]
    for label in missing:
        why = (
            f"shard {label} is missing: no results.json from it (its job crashed, was "
            "cancelled or never uploaded); its tests were not measured"
        )
        problems.append(why)
        tests.append(_missing_entry(f"shard {label}", why))
    plans = {s.plan for s in shards if s.plan}
    unlisted = []  # a problem no row says
    if len(plans) > 1:
        unlisted.append(
            "the shards split the tests differently (the store's durations changed between "
            "their starts): a test may have run in two shards or in none"
        )
    problems += unlisted
    doc = _document(shards, tests, total, not problems, unlisted)
    return Merged(doc, shards, measured_by, missing, problems)


def _check_one_run(shards: list[Shard]) -> None:
    """One commit, one mode, each shard once: else no single verdict can be made."""
    for what, get in (
        ("commits", lambda r: r.run.commit),
        ("modes", lambda r: r.mode),
    ):
        values = {get(s.results) for s in shards}
        if len(values) > 1:
            raise ReportError(
                f"the files measured different {what}: "
                + ", ".join(f"{s.path} ({get(s.results)})" for s in shards)
            )
    by_label: dict[tuple[str, str], Path] = {}
    for s in shards:
        if s.label is None:
            continue
        key = (s.machine[0], s.label)
        if key in by_label:
            raise ReportError(f"shard {s.label} given twice: {by_label[key]} and {s.path}")
        by_label[key] = s.path


def _document(
    shards: list[Shard],
    tests: list[TestEntry],
    total: int | None,
    complete: bool,
    problems: list[str],
) -> SessionResults:
    """One session's document from the shards': the first one's facts, every test."""
    first = shards[0].results
    settings: dict[str, Any] = {
        k: v for k, v in first.settings.items() if k not in ("shard", "shard_plan")
    }
    settings["shards"] = {
        s.name: {
            "file": str(s.path),
            "tests": sorted(t.nodeid for t in s.results.tests),
            "badge": s.results.badge(),
            "complete": s.results.complete,
        }
        for s in shards
    }
    if total is not None:
        settings["expected_shards"] = total
    notes: list[str] = []
    for s in shards:
        n = len(s.results.tests)
        notes.append(f"{s.name}: {n} test(s) from {s.path} ({s.results.badge()})")
    common = set.intersection(*(set(s.results.notes) for s in shards))
    notes += [n for n in first.notes if n in common]
    for s in shards:
        notes += [f"{s.name}: {n}" for n in s.results.notes if n not in common]
    notes += problems
    phase_s: dict[str, float] = {}
    for s in shards:
        for k, v in s.results.phase_s.items():
            phase_s[k] = phase_s.get(k, 0.0) + v
    saved = next((s.results.saved for s in shards if s.results.saved is not None), None)
    run_ids = {
        s.results.saved.run_id
        for s in shards
        if s.results.saved is not None and s.results.saved.run_id is not None
    }
    if len(run_ids) > 1:
        notes.append(
            f"the shards saved separate runs ({', '.join(map(str, sorted(run_ids)))}): "
            "give their jobs one --perfguard-run-group to store them as one run"
        )
    errors = [f"{s.name}: {s.results.save_error}" for s in shards if s.results.save_error]
    return msgspec.structs.replace(
        first,
        complete=complete,
        saved=saved,
        save_error="; ".join(errors) or None,
        settings=settings,
        notes=notes,
        phase_s=phase_s,
        tests=sorted(tests, key=lambda t: t.nodeid),
    )


@dataclass(frozen=True)
class MachineRun:
    """One machine kind's part of a matrix: its label and its shards merged."""

    key: str
    label: str
    merged: Merged

    @property
    def fingerprint(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self.merged.results.run.fingerprint)


#: fingerprint fields said when machines differ (the host is a runner's name, not a kind)
_KIND_FIELDS = ("gpu_name", "gpu_count", "backend", "cpu", "workers", "driver", "cuda", "torch")


@dataclass(frozen=True)
class Matrix:
    """A CI run measured on several machine kinds: each kind merged and judged apart
    (against its own kind's baseline, as its jobs judged it), never against each other."""

    machines: list[MachineRun]

    @property
    def exit_status(self) -> int:
        """The worst of the machines' (:attr:`Merged.exit_status`)."""
        return max(m.merged.exit_status for m in self.machines)

    @property
    def nodeids(self) -> list[str]:
        """Every test any machine reported, sorted."""
        return sorted({t.nodeid for m in self.machines for t in m.merged.results.tests})

    def entry(self, machine: MachineRun, nodeid: str) -> TestEntry | None:
        """``nodeid``'s entry on ``machine`` (None: that machine did not report it)."""
        return next((t for t in machine.merged.results.tests if t.nodeid == nodeid), None)

    def differences(self) -> list[str]:
        """How the machines differ (fingerprint and environment), one ``field: a | b`` each:
        said, never judged, since no test is compared across machines."""
        out = []
        prints = [m.fingerprint for m in self.machines]
        for name in _KIND_FIELDS:
            values = [str(fp.get(name) or "?") for fp in prints]
            if len(set(values)) > 1:
                out.append(f"{name.replace('_', ' ')}: {' | '.join(values)}")
        envs = [m.merged.results.run.environment for m in self.machines]
        for name in sorted(set().union(*envs)):
            values = [str(env.get(name) or "?") for env in envs]
            if len(set(values)) > 1 and name not in _KIND_FIELDS:
                out.append(f"{name.replace('_', ' ')}: {' | '.join(values)}")
        return out


def merge_matrix(paths: Sequence[str | Path], expect: int | None = None) -> Matrix:
    """The documents at ``paths`` grouped by the machine kind that measured them
    (:func:`machine_key`: GPU model and count, backend, CPU without a GPU, workers), each
    group merged as :func:`merge` merges one (``expect`` shards each). One commit and one
    mode over all of them; a machine kind listed in the order its first file was given."""
    shards = _load(paths)
    groups: dict[str, list[Shard]] = {}
    for s in shards:
        groups.setdefault(s.machine[0], []).append(s)
    return Matrix(
        [
            MachineRun(key, group[0].machine[1], _merge(group, expect))
            for key, group in groups.items()
        ]
    )
