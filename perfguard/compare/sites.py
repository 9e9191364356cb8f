"""Where an op's change happened: its calls and time compared per call site.

An op's call sites come with each record (``meta["op_sites"]``: calls and time per
iteration for each (op, site); ``meta["site_details"]``: each site's function and
source text, from the call-site pass, :mod:`perfguard.trace.site_pass`). A culprit is
placed at the site whose calls or time changed, not the site where the op spends the
most time: three new ``aten::linear`` calls in ``Attention.forward`` are placed there,
not at the MLP's linear that did not change.

Two records are years of edits apart in line numbers: a line added above a call
moves it without changing it. So a site is matched across the two sides by *what* it
is (its function and its statement's text), and a site whose line alone moved is the
same site. A statement found on one side only, whose twin (same text, same calls) is
on the other side in another function or file, is code that moved: a *move*, not an
add and a remove. Removed work cites the base tree's line, added work the head's,
and :class:`Place` says which.

Plain Python over the tables (a few hundred rows a record): no frame is built for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from perfguard.trace.call_sites import names_function

#: site identities on one side: key -> (label, calls, gpu ns, cpu ns, FLOPs, bytes), per
#: iteration (FLOPs and bytes NaN where the site's instances have no figure)
_Row = tuple[str, float, float, float, float, float]
_Side = dict[tuple[str, str], _Row]
#: a per-site counter's column in a row
_COLUMN = {"calls": 1, "flops": 4, "bytes": 5}


@dataclass(frozen=True)
class Place:
    """Where a culprit's change happened: a site's label (``model.py:21 in
    Attention.forward``) in the head tree, or in the base tree (``base``: the line is
    gone from the head, or the work there shrank and the head has no such site)."""

    label: str
    base: bool = False
    #: ``a.py:10 → b.py:5`` for calls that moved between sites with the change
    moved: str = ""
    #: a counter culprit's (base, head) value at this site, per iteration, where the op
    #: runs at more than one site (the op's totals then differ from what changed here)
    here: tuple[float, float] | None = None

    @property
    def text(self) -> str:
        """``at model.py:21 in Attention.forward`` (``(base)`` after a base-tree line)."""
        # a capture's own site may name only the function it ran in (torch's stacks give
        # its first line: ``forward() at model.py:15``): read "in" it, not "at" it
        where = "in" if names_function(self.label) else "at"
        return f"{where} {self.label}" + (" (base)" if self.base else "")


class SiteTable:
    """One record's (op, site) rows, keyed for matching across commits."""

    def __init__(self, meta: dict[str, Any] | None) -> None:
        meta = meta or {}
        table = meta.get("op_sites") or {}
        details = meta.get("site_details") or {}
        self.by_op: dict[str, _Side] = {}
        self.iterations_known = bool(table)
        cols = ("op", "direction", "site", "calls", "gpu_ns", "cpu_ns")
        try:
            n = len(table["op"]) if table else 0
            work = [table.get(c) or [None] * n for c in ("flops", "bytes")]  # older records
            rows = zip(*(table[c] for c in cols), *work, strict=True) if table else iter(())
            for op, direction, site, calls, gpu, cpu, flops, nbytes in rows:
                d = details.get(site) or {}
                key = _key(str(site), d)
                side = self.by_op.setdefault(f"{op}|{direction}", {})
                row = (
                    str(site),
                    float(calls),
                    float(gpu),
                    float(cpu),
                    _float(flops),
                    _float(nbytes),
                )
                old = side.get(key)
                side[key] = row if old is None else _add(old, row)  # one statement, two ways
        except (KeyError, TypeError, ValueError):
            self.by_op = {}
        #: each site's statements, innermost first: the site, then the user's frames above
        #: it (their text from the step's line counts), as (label, key); and every
        #: statement the step ran, by key
        self.chains: dict[str, list[tuple[str, tuple[str, str] | None]]] = {}
        self.statements: set[tuple[str, str]] = set()
        code_at: dict[str, tuple[str, str]] = {}
        for row in meta.get("line_runs") or []:
            if isinstance(row, list | tuple) and len(row) == 4 and row[2]:
                key = (str(row[1]), str(row[2]))
                code_at[f"{row[0]} in {row[1]}"] = key
                self.statements.add(key)
        for label, d in details.items():
            if not isinstance(d, dict):
                continue
            own = _key(str(label), d)
            if own[1]:
                self.statements.add(own)
            frames = [str(f) for f in d.get("stack") or []]
            self.chains[str(label)] = [
                (str(label), own if own[1] else None),
                *((f, code_at.get(f)) for f in frames),
            ]
        #: op name (any direction) -> op ids, for culprits that carry a name only
        self.ids: dict[str, list[str]] = {}
        for op_id in self.by_op:
            self.ids.setdefault(op_id.rsplit("|", 1)[0], []).append(op_id)

    def side(self, op: str, direction: str | None) -> _Side:
        """The op's sites (both directions' summed when ``direction`` is unknown)."""
        if direction:
            found = self.by_op.get(f"{op}|{direction}")
            if found is not None:
                return found
        merged: _Side = {}
        for op_id in self.ids.get(op, []):
            for key, row in self.by_op[op_id].items():
                old = merged.get(key)
                merged[key] = row if old is None else _add(old, row)
        return merged


def _float(v: Any) -> float:
    return math.nan if v is None else float(v)


def _add(a: _Row, b: _Row) -> _Row:
    """Two rows of one statement summed (a figure unknown on both stays unknown)."""

    def known(x: float, y: float) -> float:
        return x if math.isnan(y) else y if math.isnan(x) else x + y

    return (a[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], known(a[4], b[4]), known(a[5], b[5]))


def _new_statement(label: str, mine: SiteTable, other: SiteTable) -> str:
    """The statement a reviewer should read for work at ``label``: walking up from the site
    through the user's frames above it, the outermost of the statements the other side's
    step never ran, before the first it did run (``logits = model(x, make_mask(n))`` in
    the test rather than the unchanged line inside ``make_mask`` that the new call runs);
    the site itself when it ran on the other side too, or nothing is known."""
    chain = mine.chains.get(label)
    if not chain or not other.statements:
        return label
    pick = label
    for frame, key in chain:
        if key is None or key in other.statements:
            break
        pick = frame
    return pick


def _key(label: str, details: dict[str, Any]) -> tuple[str, str]:
    """A site's identity across commits: its function and statement text where the pass
    gave them, else its label (a site of the capture alone: no text to match by)."""
    code = str(details.get("code") or "")
    function = str(details.get("function") or "")
    return (function, code) if code else (label, "")


def _time(row: _Row, gpu: bool) -> float:
    return row[2] if gpu else row[3]


def place_of(
    kind: str,
    op: str,
    direction: str | None,
    base: SiteTable,
    head: SiteTable,
) -> Place | None:
    """Where culprit ``kind`` on ``op`` happened (module docstring), or None when
    neither record knows the op's sites.

    ``added``: the head site with the most calls; ``removed``: the base site with the
    most; ``calls`` and counters: the site whose calls changed the most the culprit's
    way (the head's line where the head still has that statement); ``timing``,
    ``dtypes`` and the rest: the site whose time changed the most, else the head's
    busiest site."""
    b, h = base.side(op, direction), head.side(op, direction)
    if not b and not h:
        return None
    gpu = any(r[2] > 0 for r in (*b.values(), *h.values()))
    moved = _moves(b, h)
    b_rest = {k: v for k, v in b.items() if k not in moved}
    h_rest = {k: v for k, v in h.items() if k not in moved.values()}
    move_text = "; ".join(f"{b[k][0]} → {h[v][0]}" for k, v in moved.items())
    if kind == "added" or (not b and h):
        pick = _largest(h_rest or h, lambda r: (r[1], _time(r, gpu)))
        return Place(_new_statement((h_rest or h)[pick][0], head, base), moved=move_text)
    if kind == "removed" or (b and not h):
        pick = _largest(b_rest or b, lambda r: (r[1], _time(r, gpu)))
        where = _new_statement((b_rest or b)[pick][0], base, head)
        return Place(where, base=True, moved=move_text)
    keys = set(b_rest) | set(h_rest)

    def value(row: _Row | None, what: int) -> float:
        v = float(row[what]) if row else 0.0
        return 0.0 if math.isnan(v) else v

    def delta(k: tuple[str, str], what: int) -> float:
        return value(h_rest.get(k), what) - value(b_rest.get(k), what)

    def line(k: tuple[str, str]) -> int:  # ties go to the first line (the edit's top)
        row = h_rest.get(k) or b_rest.get(k)
        return -_line(row[0]) if row else 0

    if kind in ("timing", "dtypes", "tc_lost", "kernel_set"):
        what = 2 if gpu else 3
        changed = [k for k in keys if abs(delta(k, what)) > 0]
        if kind == "timing" and changed:
            pick = max(changed, key=lambda k: (abs(delta(k, what)), line(k)))
            return _at(pick, b_rest, h_rest, move_text, (base, head))
        if kind != "timing":  # the statement that runs the op now, the busiest first
            pick = _largest(h, lambda r: (_time(r, gpu), r[1]))
            return Place(h[pick][0], moved=move_text)
        return None
    # a FLOP or byte count is placed by its own column where the sites know it (a shape
    # changed at one site, the calls at none), else by the calls
    what = _COLUMN.get(kind, 1)
    changed = [k for k in keys if abs(delta(k, what)) > 1e-9 * max(1.0, _scale(b, h, what))]
    if what != 1 and not changed:
        what = 1
        changed = [k for k in keys if abs(delta(k, 1)) > 1e-9]
    if not changed:
        return Place(move_text.split(" → ")[-1], moved=move_text) if move_text else None
    total = sum(delta(k, what) for k in changed)
    up = total >= 0
    pick = max(changed, key=lambda k: ((delta(k, what) if up else -delta(k, what)), line(k)))
    place = _at(pick, b_rest, h_rest, move_text, (base, head))
    if kind in _COLUMN and (len(b) > 1 or len(h) > 1) and what == _COLUMN[kind]:
        # the op runs at several sites: say what changed at this one, not the op's totals
        here = (value(b_rest.get(pick), what), value(h_rest.get(pick), what))
        return replace(place, here=here)
    return place


def _scale(b: _Side, h: _Side, what: int) -> float:
    """The largest magnitude of a column over both sides' sites (a relative threshold's
    scale: FLOPs are in the millions where calls are units)."""
    vals = [abs(float(r[what])) for r in (*b.values(), *h.values())]
    vals = [v for v in vals if not math.isnan(v)]
    return max(vals, default=0.0)


def _at(
    key: tuple[str, str], b: _Side, h: _Side, moved: str, tables: tuple[SiteTable, SiteTable]
) -> Place:
    """The head's line of a statement the head has, else the base's (each walked up to the
    statement that is new on its side: :func:`_new_statement`)."""
    base, head = tables
    if key in h:
        return Place(_new_statement(h[key][0], head, base), moved=moved)
    return Place(_new_statement(b[key][0], base, head), base=True, moved=moved)


def _line(label: str) -> int:
    """The line number of ``model.py:21 in f`` (0 when it has none)."""
    head = label.split(" in ", 1)[0]
    tail = head.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _largest(side: _Side, by: Any) -> tuple[str, str]:
    return max(side, key=lambda k: (by(side[k]), k))


def _moves(b: _Side, h: _Side) -> dict[tuple[str, str], tuple[str, str]]:
    """Base keys whose statement (same text, same calls) is in the head under another
    function or file only: code that moved (base key -> head key)."""
    gone = [k for k in b if k not in h and k[1]]
    new = [k for k in h if k not in b and k[1]]
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for k in gone:
        twin = next(
            (
                n
                for n in new
                if n[1] == k[1] and n not in out.values() and math.isclose(h[n][1], b[k][1])
            ),
            None,
        )
        if twin is not None:
            out[k] = twin
    return out


def per_site_flops(
    current: dict[str, Any], baseline: dict[str, Any], ops: dict[str, tuple[float, float]]
) -> tuple[list[tuple[str, dict[str, Any]]], set[str]]:
    """Where the FLOPs per call of ``ops`` (name -> the op's FLOPs per call, base and head)
    moved, per call site, where both records' site tables know the op and agree with those
    figures: ``(op, {"baseline", "current", "site"})`` for each statement on both sides whose
    FLOPs per call differ. An op whose every shared site kept its FLOPs per call changed
    only its mix of sites (its calls say so): nothing, never an average across sites. Also
    returns the op names judged here (the rest are judged per op)."""
    base, head = SiteTable(baseline), SiteTable(current)
    out: list[tuple[str, dict[str, Any]]] = []
    judged: set[str] = set()
    for name, (op_b, op_h) in ops.items():
        b, h = base.side(name, None), head.side(name, None)
        if not b or not h or not (_agrees(b, op_b) and _agrees(h, op_h)):
            continue
        judged.add(name)
        for key in sorted(set(b) & set(h)):
            (_, calls_b, _, _, fb, _), (label, calls_h, _, _, fh, _) = b[key], h[key]
            if calls_b <= 0 or calls_h <= 0 or math.isnan(fb) or math.isnan(fh):
                continue
            pb, ph = fb / calls_b, fh / calls_h
            if abs(ph - pb) > 1e-9 * max(abs(pb), 1.0):
                out.append((name, {"baseline": pb, "current": ph, "site": label}))
    return out, judged


def _agrees(side: _Side, per_call: float) -> bool:
    """Whether a side's sites hold all of the op's FLOPs: their FLOPs per call, over the
    calls, is the op's own (a site table of another analysis, or missing sites, is not
    judged by)."""
    calls = sum(r[1] for r in side.values())
    flops = [r[4] for r in side.values()]
    if calls <= 0 or any(math.isnan(f) for f in flops) or not math.isfinite(per_call):
        return False
    return math.isclose(sum(flops) / calls, per_call, rel_tol=1e-3, abs_tol=1e-6)


def optimizer_changes(base: dict[str, Any], head: dict[str, Any]) -> list[tuple[str, str]]:
    """Per optimizer whose class or settings differ between the two records' model facts
    (:mod:`perfguard.capture.model_facts`), matched by variable name (else by position):
    ``(what changed, where the head builds it)``, e.g. ``("SGD: momentum 0 → 0.9",
    "test_bench.py:88 in test_step")``."""
    a = base.get("optimizers") or []
    b = head.get("optimizers") or []
    out: list[tuple[str, str]] = []
    for i, now in enumerate(b):
        then = next(
            (o for o in a if o.get("name") and o.get("name") == now.get("name")),
            a[i] if i < len(a) else None,
        )
        if not isinstance(then, dict) or not isinstance(now, dict):
            continue
        parts = []
        if then.get("class") != now.get("class"):
            parts.append(f"{then.get('class')} → {now.get('class')}")
        s0, s1 = then.get("settings") or {}, now.get("settings") or {}
        parts += [
            f"{k} {s0.get(k)} → {s1.get(k)}"
            for k in sorted(set(s0) | set(s1))
            if s0.get(k) != s1.get(k)
        ]
        if parts:
            label = now.get("name") or str(now.get("class"))
            what = f"optimizer {label} ({now.get('class')}): {', '.join(parts)}"
            out.append((what, str(now.get("site") or "")))
    return out


def parameter_change(base: dict[str, Any], head: dict[str, Any]) -> tuple[int, int] | None:
    """(base, head) parameter tensors of the test's models and optimizers when they
    differ, else None."""
    a, c = base.get("parameter_tensors"), head.get("parameter_tensors")
    if isinstance(a, int) and isinstance(c, int) and a != c:
        return a, c
    return None


def line_growth(
    base: dict[str, Any], head: dict[str, Any], up: bool = True, top: int = 2
) -> list[tuple[str, float, float]]:
    """The lines of the user's code whose runs per step moved most the given way between
    the two records' ``line_runs`` (the call-site pass's line counts), matched by function
    and source text as sites are: ``(label, base runs, head runs)``, the head's label
    (the base's for a line the head no longer has)."""

    def table(meta: dict[str, Any]) -> dict[tuple[str, str], tuple[str, float]]:
        out: dict[tuple[str, str], tuple[str, float]] = {}
        for row in meta.get("line_runs") or []:
            try:
                where, function, code, n = row
            except (TypeError, ValueError):
                continue
            key = (str(function), str(code)) if code else (str(where), "")
            old = out.get(key)
            out[key] = (f"{where} in {function}", float(n) + (old[1] if old else 0.0))
        return out

    a, b = table(base), table(head)
    if not a or not b:
        return []
    rows = []
    for key in set(a) | set(b):
        then, now = a.get(key, ("", 0.0))[1], b.get(key, ("", 0.0))[1]
        if (now - then > 0) if up else (now - then < 0):
            rows.append(((b.get(key) or a[key])[0], then, now))
    rows.sort(key=lambda r: (-abs(r[2] - r[1]), r[0]))
    return rows[:top]
