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


def fmt_ns(ns: Any) -> str:
    """A duration in ns with a readable unit: ``1.234 ms``; ``n/a`` when missing."""
    if _missing(ns):
        return "n/a"
    ns = float(ns)
    mag = abs(ns)
    if mag >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if mag >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if mag >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def fmt_pct(x: Any, signed: bool = True) -> str:
    """A percentage with one decimal, signed by default: ``+12.3 %``."""
    if _missing(x):
        return "n/a"
    return f"{float(x):+.1f} %" if signed else f"{float(x):.1f} %"


def fmt_ci(lo: Any, hi: Any) -> str:
    """An interval of percentages: ``[+1.2, +3.4] %``."""
    if _missing(lo) or _missing(hi):
        return "n/a"
    return f"[{float(lo):+.1f}, {float(hi):+.1f}] %"


def fmt_p(p: Any) -> str:
    """A p-value with three significant digits; tiny ones as ``< 1e-4``."""
    if _missing(p):
        return "n/a"
    return "< 1e-4" if float(p) < 1e-4 else f"{float(p):.3g}"


def fmt_num(x: Any, digits: int = 0) -> str:
    """A plain number with thousands separators; ``n/a`` when missing."""
    if _missing(x):
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
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
