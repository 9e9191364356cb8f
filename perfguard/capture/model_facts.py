"""What a test's models and optimizers are when its loop starts, to explain their work.

An optimizer's work is per parameter tensor: a model that splits a fused layer in three
gives AdamW more tensors to update, and its ``aten::item``/``_foreach_*`` calls grow with
no change to the optimizer. And an optimizer built with other settings (``momentum``,
``foreach``, ``fused``) changes its work at the ``opt.step()`` line while the line that
changed is where it was built. So the loop records, from the test's own variables:

* ``parameter_tensors``: the distinct parameter tensors of the ``torch.nn.Module`` and
  ``torch.optim.Optimizer`` objects it holds;
* ``optimizers``: per optimizer variable, its class, its first parameter group's settings
  and the line of the test that assigned it (found in the test function's source).

:mod:`perfguard.compare.culprits` turns a difference into a culprit of its own and ranks
the optimizer's per-tensor work after it. Reads ``torch`` only when the test loaded it.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Iterable
from types import FrameType
from typing import Any


def model_facts(values: Iterable[object], frame: FrameType | None = None) -> dict[str, Any]:
    """``{"parameter_tensors": n, "optimizers": [...]}`` of the models and optimizers among
    ``values`` (the test's variables; ``frame`` the test's frame, where an optimizer's
    variable name and line are read), ``{}`` without torch or any of them."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    seen: set[int] = set()
    found = False
    optimizers: list[dict[str, Any]] = []
    names = {id(v): k for k, v in (frame.f_locals.items() if frame is not None else ())}
    for v in values:
        if isinstance(v, torch.nn.Module):
            found = True
            seen.update(id(p) for p in v.parameters())
        elif isinstance(v, torch.optim.Optimizer):
            found = True
            seen.update(id(p) for g in v.param_groups for p in g["params"])
            name = names.get(id(v), "")
            optimizers.append(
                {
                    "name": name,
                    "class": type(v).__name__,
                    "settings": _settings(v),
                    "site": _assigned_at(frame, name) if frame is not None and name else "",
                }
            )
    if not found:
        return {}
    return {"parameter_tensors": len(seen), "optimizers": optimizers}


def _settings(opt: Any) -> dict[str, Any]:
    """The first parameter group's settings, as JSON values (a tuple as a list, anything
    else as its text)."""
    group = opt.param_groups[0] if opt.param_groups else {}
    out: dict[str, Any] = {}
    for k, v in sorted(group.items()):
        if k == "params":
            continue
        if hasattr(v, "item") and getattr(v, "numel", lambda: 2)() == 1:  # a tensor lr
            v = v.item()
        out[k] = (
            v
            if isinstance(v, bool | int | float | str | type(None))
            else (list(v) if isinstance(v, tuple) else str(v))
        )
    return out


def _assigned_at(frame: FrameType, name: str) -> str:
    """``test_bench.py:88 in test_step``: the first line of the frame's function that
    assigns ``name`` (``name = ...``), "" when its source is not to be had."""
    from perfguard.trace.call_sites import site_text  # numpy and pandas: not at the loop's import

    code = frame.f_code
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return ""
    assign = re.compile(
        rf"^\s*(?:{re.escape(name)}\s*(?:,[^=]*)?|[^=#]*,\s*{re.escape(name)})\s*=[^=]"
    )
    last = max((ln for _, _, ln in code.co_lines() if ln is not None), default=code.co_firstlineno)
    for n in range(code.co_firstlineno, min(last, len(lines)) + 1):
        if assign.match(lines[n - 1]):
            return f"{site_text(code.co_filename, n)} in {code.co_name}"
    return ""
