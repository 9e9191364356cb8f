"""``perfguard publish``: a static site of a store, rebuilt incrementally and in parallel.

The steps: read the store's index (:func:`.data.load_index`: runs, record
ids, tests, acceptances; no sample), plan one series per machine and test on
the first-parent line of ``ref`` and fingerprint each from the index alone
(:func:`.series.plan_series`: a stored record never changes). The manifest
(``manifest.json`` in the site) keeps each page's fingerprint, its index row
and its change points: a page whose fingerprint is unchanged is neither
read, analysed nor written again, a page no series produces any more is
removed, and the index is rewritten only when a row changed. The series to
rebuild are split into shares of about as many records among forked workers;
each reads its share's records by id, analyses them and writes the pages
(each series is independent; the change-point search dominates), so the
work scales with the cores and with what changed, not with the store.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfguard.compare.tolerance import TOLERANCE
from perfguard.errors import BaselineError, PerfguardError
from perfguard.forking import can_fork
from perfguard.publish.data import load_index, load_records
from perfguard.publish.pages import IndexRow, front_page, index_row, machine_page, test_page
from perfguard.publish.series import (
    Series,
    SeriesPlan,
    analyse,
    cut_series,
    plan_series,
    points_to_json,
)

__all__ = ["MANIFEST", "PAGE_VERSION", "Published", "publish"]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "perfguard.publish-manifest/2"
#: the format before (pages hashed from their data; no change points kept)
OLD_FORMAT = "perfguard.publish-manifest/1"


def _code_version() -> str:
    """A hash of the source a page is made by (this package, the compare layer's detectors
    and verdicts, the report's SVG primitives): a page written by other code (another
    layout, another detector) is rebuilt once, with no version to remember to bump."""
    package = Path(__file__).parents[1]
    h = hashlib.sha256()
    for path in [
        *sorted(Path(__file__).parent.glob("*.py")),
        *sorted((package / "compare").glob("*.py")),
        package / "report" / "svg.py",
    ]:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


#: what every page's hash starts from (see _code_version)
PAGE_VERSION = _code_version()
#: shares of the pages to build per worker (a few: a share that takes longer is balanced by
#: the others; each share reads its records with a query per table)
SHARES_PER_JOB = 4
#: records a share has at least, beyond one share per worker (a share costs a few queries
#: and the store opened once more)
SHARE_RECORDS = 5_000
#: the largest page the site should have (issue 30): reported when exceeded
PAGE_LIMIT = 1 << 20


@dataclass(frozen=True)
class Published:
    """What a publish did."""

    out_dir: Path
    series: int
    rebuilt: int
    kept: int
    removed: int
    largest_page: int  # bytes
    ordered_by: str
    seconds: float

    def describe(self) -> str:
        over = " (over 1 MB)" if self.largest_page > PAGE_LIMIT else ""
        return (
            f"published {self.series} test series to {self.out_dir / 'index.html'}: "
            f"{self.rebuilt} page(s) rebuilt, {self.kept} unchanged, {self.removed} "
            f"removed; largest page {self.largest_page / 1024:.0f} KB{over}; runs "
            f"{self.ordered_by}; {self.seconds:.1f} s"
        )


def _slug(text: str, most: int = 60) -> str:
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[-most:] or "x"
    return f"{clean}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def _walk(repo: str | os.PathLike[str] | None, ref: str) -> tuple[list[str] | None, str]:
    """First-parent shas of ``ref`` oldest first, and how the site orders runs."""
    if repo is None:
        return None, "ordered by time (no git repository given)"
    from perfguard.baseline.git import first_parent_commits

    try:
        walk = first_parent_commits(repo, ref, max_depth=1_000_000)[::-1]
    except PerfguardError as exc:
        return None, f"ordered by time ({' '.join(str(exc).split())})"
    return walk, f"on the first-parent history of {ref}"


# the state a forked worker reads (set before the pool starts; fork shares it)
_WORK: dict[str, Any] = {}


def _build(i: int, s: Series) -> tuple[str, dict[str, Any]]:
    """Analyse series ``i`` of the plan, write its page; (path, manifest entry)."""
    rel = _WORK["paths"][i]
    known = _WORK["old"].get(rel, {}).get("points")
    a = analyse(s, tolerance=_WORK["tolerance"], known=known)
    html = test_page(
        s,
        a,
        a.op_names,
        index_href="index.html",
        report_url=_WORK["report_url"],
        machine_slug=rel.split("/")[0],
    )
    path = _WORK["out"] / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    data = html.encode("utf-8")
    path.write_bytes(data)
    points = {"key": a.points_key, "points": points_to_json(a.change_points)}
    return rel, {
        "hash": _WORK["digests"][i],
        "row": asdict(index_row(s, a, rel)),
        "bytes": len(data),
        "points": points,
    }


def _build_share(which: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """Read the records of series ``which`` (by id, in this process), then build their
    pages; a series without a run with a level gets an entry without a page."""
    plan: SeriesPlan = _WORK["plan"]
    tables = load_records(_WORK["location"], _WORK["index"], plan.ids(which))
    series = cut_series(tables, plan, which)
    del tables
    out = []
    for i in which:
        if i in series:
            out.append(_build(i, series.pop(i)))
        else:
            out.append((_WORK["paths"][i], {"hash": _WORK["digests"][i], "empty": True}))
    return out


def _shares(plan: SeriesPlan, todo: list[int], parts: int) -> list[list[int]]:
    """``todo`` in ``parts`` shares of about as many records each, series in order."""
    sizes = np.diff(plan.bounds)[todo]
    edges = np.searchsorted(np.cumsum(sizes), np.linspace(0, sizes.sum(), parts + 1)[1:-1])
    return [share.tolist() for share in np.split(np.asarray(todo), edges) if len(share)]


def _read_manifest(out: Path) -> dict[str, Any]:
    """The pages the site has (path -> entry). A manifest of the previous format gives
    its paths without their hashes: every page is rebuilt, and those no series makes any
    more are still removed."""
    try:
        doc = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or not isinstance(doc.get("pages"), dict):
        return {}
    if doc.get("format") == OLD_FORMAT:
        return {rel: {} for rel in doc["pages"]}
    return doc["pages"] if doc.get("format") == MANIFEST_FORMAT else {}


def publish(
    store_location: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    repo: str | os.PathLike[str] | None = ".",
    ref: str = "HEAD",
    report_url: str | None = None,
    tolerance: float = TOLERANCE,
    jobs: int | None = None,
) -> Published:
    """Publish the store at ``store_location`` as a static site in ``out_dir``.

    ``repo``/``ref``: the git history whose first-parent line orders the runs
    (None: order by run time). ``report_url``: a link to each run's report,
    ``{commit}``, ``{run_id}`` and ``{machine}`` filled in (e.g. a CI artifact
    URL); the store itself keeps no report. ``jobs``: worker processes
    (default: one per core, at most 8).
    """
    started = time.perf_counter()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BaselineError(f"{out}: cannot write the site there ({exc.strerror or exc})") from None
    jobs = jobs or min(os.cpu_count() or 1, 8)
    index = load_index(store_location)
    walk, ordered_by = _walk(repo, ref)
    plan = plan_series(index.runs, index.tests, index.acceptances, walk)
    if walk is not None and not len(plan) and len(index.tests):
        walk, ordered_by = None, f"ordered by time (no stored commit is on {ref})"
        plan = plan_series(index.runs, index.tests, index.acceptances, None)
    salt = json.dumps([PAGE_VERSION, report_url, tolerance])
    old = _read_manifest(out)
    paths = []
    for i in range(len(plan)):
        machine, label, nodeid = plan.key(i)
        paths.append(f"{_slug(label, 40)}/{_slug(nodeid)}.html")
    digests = plan.fingerprints(salt)
    # unchanged: the same records, acceptances and code made the page there (or found it
    # had no run with a level: no page)
    todo = [
        i
        for i, (rel, d) in enumerate(zip(paths, digests, strict=True))
        if old.get(rel, {}).get("hash") != d or not (old[rel].get("empty") or (out / rel).exists())
    ]
    pages = {
        rel: old[rel]
        for rel, d in zip(paths, digests, strict=True)
        if old.get(rel, {}).get("hash") == d
    }
    # each worker reads the records of its share of the series and builds their pages: no
    # table goes back to this process, and both phases use every core
    _WORK.update(
        location=store_location,
        index=index,
        plan=plan,
        paths=paths,
        digests=digests,
        out=out,
        tolerance=tolerance,
        report_url=report_url,
        old=old,
    )
    try:
        parallel = jobs > 1 and len(todo) > 4 and can_fork()
        records = int(np.diff(plan.bounds)[todo].sum())
        parts = max(jobs, min(jobs * SHARES_PER_JOB, records // SHARE_RECORDS))
        shares = _shares(plan, todo, parts if parallel else 1)
        if parallel:
            with multiprocessing.get_context("fork").Pool(min(jobs, len(shares))) as pool:
                built = [e for part in pool.imap(_build_share, shares) for e in part]
        else:
            built = [e for share in shares for e in _build_share(share)]
    finally:
        _WORK.clear()
    for rel, entry in built:
        pages[rel] = entry
    built = [(rel, entry) for rel, entry in built if not entry.get("empty")]
    removed = 0
    for rel in set(old) - {rel for rel in pages if not pages[rel].get("empty")}:
        stale = out / rel
        if stale.is_file() and stale.resolve().is_relative_to(out.resolve()):
            stale.unlink()
            removed += 1
    shown = [rel for rel in paths if not pages[rel].get("empty")]
    rows = [IndexRow(**pages[rel]["row"]) for rel in shown]
    latest = str(index.runs["time"].max()) if len(index.runs) else "never"
    common = {"store": index.name, "ordered_by": ordered_by, "when": f"latest run {latest}"}
    indexes = {"index.html": front_page(rows, **common)}
    by_folder: dict[str, list[IndexRow]] = {}
    for rel, index_entry in zip(shown, rows, strict=True):
        by_folder.setdefault(rel.split("/", 1)[0], []).append(index_entry)
    for folder, mine in by_folder.items():
        page = machine_page(mine, label=mine[0].machine_label, **common)
        indexes[f"{folder}/index.html"] = page
    for rel, text in indexes.items():  # cheap to render; written only when they changed
        target = out / rel
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    sizes = [int(p.get("bytes", 0)) for p in pages.values()]
    sizes += [len(text.encode()) for text in indexes.values()]
    (out / MANIFEST).write_text(
        json.dumps({"format": MANIFEST_FORMAT, "pages": pages}, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    return Published(
        out,
        len(shown),
        len(built),
        len(shown) - len(built),
        removed,
        max(sizes),
        ordered_by,
        time.perf_counter() - started,
    )
