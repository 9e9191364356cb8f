"""The Jinja2 environment of the HTML reports, number formatting and the file write.

Autoescape is on for every template: op and kernel names come from user
code and traces (C++ templates are full of ``<``, ``>`` and ``&``), and
they must appear as text. The only markup that bypasses escaping is the
SVG that :mod:`perfguard.report.figures` produced from numbers.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from pathlib import Path
from typing import Any

from perfguard.compare import units
from perfguard.errors import ReportError

_ENV: Any = None


def environment() -> Any:
    """The shared Jinja2 environment over ``perfguard/report/templates`` (built once)."""
    global _ENV
    if _ENV is None:
        import jinja2

        _ENV = jinja2.Environment(
            loader=jinja2.PackageLoader("perfguard.report", "templates"),
            autoescape=True,  # every template, whatever its file name
            undefined=jinja2.StrictUndefined,  # a typo in a template fails loudly in tests
            trim_blocks=True,
            lstrip_blocks=True,
        )
        _ENV.filters.update(ns=fmt_ns, pct=fmt_pct, ci=fmt_ci, pvalue=fmt_p, num=fmt_num)
        _ENV.filters["sortkey"] = sort_key
    return _ENV


def render(template: str, **context: Any) -> str:
    """Render ``template`` with ``context``."""
    return environment().get_template(template).render(**context)


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def badge_class(badge: str) -> str:
    """The CSS class of a verdict badge: ``NOT JUDGED`` -> ``not-judged``."""
    return badge.lower().replace(" ", "-")


def fmt_ns(ns: Any) -> str:
    """A duration in ns with a readable unit: ``1.23 ms`` (:func:`units.format_ns`)."""
    return units.format_ns(ns)


def fmt_pct(x: Any, signed: bool = True, digits: int | None = 1) -> str:
    """A percentage, signed by default: ``+12.3%`` (:func:`units.percent`)."""
    return units.percent(x, signed, digits)


def fmt_ci(lo: Any, hi: Any) -> str:
    """An interval of percentages: ``[+1.2%, +3.4%]`` (:func:`units.interval`)."""
    return units.interval(lo, hi)


def fmt_p(p: Any) -> str:
    """A p-value: ``0.034``, ``< 0.001`` (:func:`units.p_value`)."""
    return units.p_value(p)


def fmt_num(x: Any, digits: int | None = None, counter: str = "") -> str:
    """A number: a count (:func:`units.human`, integers as integers, a ``counter``'s unit),
    or with ``digits`` fixed decimals; ``yes``/``no`` for a flag."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if _missing(x) or not digits:
        return units.human(x, counter)
    return f"{float(x):,.{digits}f}"


def sort_key(x: Any) -> str:
    """The ``data-v`` value the table sorter reads: a number, or empty when missing."""
    if isinstance(x, bool):
        return "1" if x else "0"
    if not isinstance(x, numbers.Real) or _missing(float(x)):
        return ""
    return repr(float(x))


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8 cannot encode; a trace's JSON can hold
    them) replaced by U+FFFD, so a hostile name cannot stop a report being written."""
    return _SURROGATE.sub("\ufffd", text)


def write_text(path: str | Path, text: str, what: str = "report") -> Path:
    """Write ``text`` to ``path`` through a temporary file, so no half file is left."""
    text = clean_text(text)
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"{path}: is a directory; give a file name for the {what}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{path}: cannot write {what} ({exc.strerror})") from None
    return path
