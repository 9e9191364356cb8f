"""The counters of benchmarks/structure.py (issue 43's before/after figures) on small sources
written here, so a figure in benchmarks/README.md means what its definition says."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _structure() -> ModuleType:
    """``benchmarks/structure.py`` as a module (benchmarks/ is not a package)."""
    name = "perfguard_structure_figures"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "structure.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


S = _structure()

IMPORTS = """
import json
from typing import TYPE_CHECKING
from perfguard.trace import names

if TYPE_CHECKING:
    from perfguard.compare.judge import Verdict


class Holder:
    import os  # a class body is not a function


def read():
    import json  # repeats the top-level one
    from perfguard.trace.names import short  # ``names`` is imported at the top as a module
    from perfguard.compare import judge  # new here
    from . import sibling  # perfguard.pkg: not at the top
    if TYPE_CHECKING:
        import numpy  # not counted

    def inner():
        import os  # counted once, in its own function
    return inner
"""


def test_function_imports_counts_statements_in_functions_and_repeats() -> None:
    found = S.function_imports(IMPORTS, "perfguard.pkg.mod")
    assert (found.count, found.repeated) == (5, 2)
    assert S.function_imports("def f():\n    from .mod import x\n", "perfguard.pkg.mod").count == 1
    # a relative import resolved against the module: ``.mod`` of perfguard.pkg.mod is itself
    top = "from perfguard.pkg.mod import y\ndef f():\n    from .mod import x\n"
    assert S.function_imports(top, "perfguard.pkg.other").repeated == 1
    assert S.function_imports(top, "perfguard.pkg.mod", is_package=True).repeated == 0


ANYS = """
import typing
from typing import Any


def public(a: Any, b: dict[str, Any], c: int, *rest: Any, **kw: int) -> Any:
    def nested(x: Any) -> Any:  # not a seam
        return x
    return a


def _private(a: Any) -> Any:
    return a


class Public:
    x: dict[str, list[Any]]
    y: int
    _hidden: Any

    def __init__(self, a: Any) -> None:
        self.a = a

    def method(self, v: "list[Any]") -> typing.Any:
        return v

    def _helper(self, v: Any) -> None:
        pass

    class Inner:
        z: Any


class _Private:
    w: Any

    def method(self, v: Any) -> Any:
        return v
"""


def test_any_seams_counts_annotation_slots_of_the_public_surface() -> None:
    found = S.any_seams(ANYS)
    # public: a, b, *rest, return (4); Public.method: v (a string), return typing.Any (2)
    assert found.signatures == 6
    # Public.x and Public.Inner.z; not _hidden, not _Private.w
    assert found.fields == 2
    assert not S.mentions_any(S.ast.parse("dict[str, int]", mode="eval").body)


def test_sizes_of_classes_and_definitions() -> None:
    source = (
        "class Base:\n    def a(self): ...\n    def b(self): ...\n\n"
        "class Store(Base):\n    def c(self): ...\n\ndef f(): ...\nX = 1\n"
    )
    assert S.top_level_definitions(source) == 3
    found = S.classes(source, "s.py")
    assert S.store_methods(found) == (1, 3)
    assert S.store_methods(found, "Missing") is None


def test_layers_place_new_packages_below_the_plugin() -> None:
    plugin = S.layer_of("perfguard.plugin.session")
    assert S.layer_of("perfguard.core.verdict") == plugin + 1
    assert S.layer_of("perfguard.somethingnew") == plugin + 1
    assert S.unplaced(["perfguard.somethingnew.x", "perfguard.trace.kineto"]) == ["somethingnew"]
    assert S.layer_of("perfguard.report.html") == S.layer_of("perfguard.publish.site")
    assert S.layer_of("perfguard.compare.judge") < S.layer_of("perfguard.baseline.store")
    assert S.layer_of("perfguard") == S.layer_of("perfguard.errors")


def test_path_figures_on_a_written_event_stream() -> None:
    modules = [
        "perfguard.plugin.session",
        "perfguard.plugin.runner",
        "perfguard.compare.judge",
        "perfguard.trace.names",
        "perfguard.arrays",
    ]
    call, ret, start, end = 1, 0, 2, 3
    body = S.HOOKS.index("pytest_pyfunc_call")
    main, other = 1, 2
    events = [
        (start, main, 0),
        (call, main, 0),
        (call, main, 0),
        (call, main, 1),
        (call, main, 2),
        (call, main, 4),
        (call, main, 3),  # arrays calls trace.names back: upward
        (ret, main, 3),
        (ret, main, 4),
        (ret, main, 2),
        (start, main, body),
        (call, main, 2),
        (ret, main, 2),
        (end, main, body),
        (ret, main, 1),
        (ret, main, 0),
        (ret, main, 0),
        (call, other, 2),
        (call, other, 0),
        (ret, other, 0),
        (ret, other, 2),  # judge -> plugin
        (end, main, 0),
    ]
    out = S.path_figures(events, modules, main, [2, 3])
    assert out["hooks_followed"] == ["pytest_runtest_call", "pytest_pyfunc_call"]
    assert out["threads"] == 2 and out["calls"] == 9 and out["events"] == 18
    assert out["upward_calls"] == 2
    assert out["upward_pairs"] == {
        "perfguard.arrays -> perfguard.trace.names": 1,
        "perfguard.compare.judge -> perfguard.plugin.session": 1,
    }
    assert out["entry_modules"] == ["perfguard.compare.judge", "perfguard.plugin.session"]
    short = [m.rsplit(".", 1)[1] for m in out["depth3"]["sequence"]]
    assert short == ["session", "runner", "judge", "runner", "judge", "runner", "session"]
    d3 = out["depth3"]
    assert (d3["distinct_modules"], d3["max_visits"], d3["returns_to_higher_layer"]) == (3, 3, 2)
    assert d3["modules_over_2_visits"] == {"perfguard.plugin.runner": 3}
    assert [m.rsplit(".", 1)[1] for m in out["depth2"]["sequence"]] == [
        "session",
        "runner",
        "session",
    ]
    assert out["depth2"]["returns_to_higher_layer"] == 0  # one layer: the plugin's
    outside = out["depth3_outside_body"]
    assert [m.rsplit(".", 1)[1] for m in outside["sequence"]] == [
        "session",
        "runner",
        "judge",
        "runner",
        "session",
    ]
    assert outside["returns_to_higher_layer"] == 1
