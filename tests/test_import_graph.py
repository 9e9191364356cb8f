"""The import graph: data flows down the layers of docs/design.md, never back up, and no
perfguard module reaches itself again through its imports, counting the imports made inside
functions (a cycle deferred to call time is still a cycle a reader has to hold in their head)
and the modules a module loads by name with ``importlib.import_module`` (the CLI's
subcommands). Every package and top-level module has its layer; the clients (``bisect``,
``commands``, ``cli``, ``__main__``) come last. Read from the source with ``ast``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import perfguard

ROOT = Path(perfguard.__file__).parent
#: every package and top-level module, lowest first: each may import only those before it
LAYERS = (
    "errors",
    "jsonsafe",
    "arrays",
    "environment",
    "memory",
    "forking",
    "trace",
    "capture",
    "analysis",
    "baseline",
    "compare",
    "report",
    "publish",
    "core",
    "plugin",
    "bisect",
    "commands",
    "cli",
    "__main__",
)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every perfguard module ``path`` imports, at the top or in a function, outside
    ``if TYPE_CHECKING:`` blocks; a module that loads modules by name (``import_module``)
    also imports each perfguard module its source names. A package's ``__init__`` naming the
    homes of its lazy attributes (PEP 562) does not: those load only when one is read."""
    found: set[str] = set()
    source = path.read_text(encoding="utf-8")
    by_name = "import_module" in source and path.name != "__init__.py"
    stack: list[ast.AST] = [ast.parse(source)]
    while stack:
        node = stack.pop()
        if _type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif by_name and isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("perfguard."):
                found.add(node.value)
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in modules}


def _function_imports(path: Path) -> int:
    """How many import statements ``path`` makes inside functions."""
    return len(_function_imported(path))


def _function_imported(path: Path) -> set[str]:
    """The modules ``path`` imports inside functions (``if TYPE_CHECKING:`` aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        stack: list[ast.AST] = list(fn.body)
        while stack:
            node = stack.pop()
            if _type_checking(node):
                continue
            if isinstance(node, ast.ImportFrom):
                found.add(node.module or "")
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            stack.extend(ast.iter_child_nodes(node))
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    names = set(files)
    return {m: _imports(p, names) - {m} for m, p in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_every_package_has_a_layer() -> None:
    """A new package or top-level module is placed in the design's order, not left out."""
    assert sorted({_package(m) for m in _graph()} - set(LAYERS)) == [""]  # "": the facade


def test_layers_import_only_downwards() -> None:
    wrong = []
    for module, deps in _graph().items():
        mine = _package(module)
        if not mine:  # perfguard/__init__.py, the facade: errors at the top, the rest lazily
            continue
        allowed = set(LAYERS[: LAYERS.index(mine) + 1])
        for dep in deps:
            theirs = _package(dep)
            if theirs and theirs not in allowed:
                wrong.append(f"{module} -> {dep}")
    assert wrong == []


def test_the_checker_sees_a_cycle_and_a_lazy_import(tmp_path: Path) -> None:
    """The graph reader is not vacuous: a function-level import and a two-module cycle."""
    (tmp_path / "a.py").write_text("def f():\n    from perfguard.compare import b\n")
    deps = _imports(tmp_path / "a.py", {"perfguard.compare.b", "perfguard.compare"})
    assert deps == {"perfguard.compare.b"}
    assert _cycles({"x": {"y"}, "y": {"x"}, "z": set()}) == [["x", "y"]]


def test_the_checker_sees_a_module_loaded_by_name(tmp_path: Path) -> None:
    (tmp_path / "cli.py").write_text(
        "import importlib\nCOMMANDS = ('perfguard.commands.x',)\n"
        "def main():\n    importlib.import_module(COMMANDS[0])\n"
    )
    (tmp_path / "__init__.py").write_text("_LAZY = {'f': 'perfguard.compare.b'}\nimport_module\n")
    names = {"perfguard.commands.x", "perfguard.compare.b"}
    assert _imports(tmp_path / "cli.py", names) == {"perfguard.commands.x"}
    assert _imports(tmp_path / "__init__.py", names) == set()


def test_the_flop_formulas_import_at_the_top() -> None:
    """The FLOP package's modules are plain Python over a parsed record: a dependency hidden
    in a function there would be one a reader of the module's head does not see."""
    found = {p.name: _function_imports(p) for p in (ROOT / "analysis" / "flops").glob("*.py")}
    assert len(found) > 5
    assert {name: n for name, n in found.items() if n} == {}


#: what may still be imported inside a function: optional frameworks and drivers (torch,
#: TensorFlow, JAX, nvtx, psycopg), GitPython (it runs ``git version`` when imported),
#: protobuf (read only for an XSpace) and fcntl (Unix only)
LAZY_ROOTS = ("torch", "tensorflow", "jax", "nvtx", "psycopg", "git", "google", "fcntl")
#: ... and perfguard modules that load numpy and pandas, from modules every pytest run
#: imports through the plugin (tests/test_light_imports.py)
LIGHT_PATH = {
    "capture/capturers.py": {
        "perfguard.capture.nsys",
        "perfguard.capture.sites",
        "perfguard.trace.site_pass",
    },
    "capture/model_facts.py": {"perfguard.trace.call_sites"},
    "capture/torch_profiler.py": {"perfguard.capture.torch_results"},
}
#: the packages whose imports are at the top (plugin, compare, report and publish: not yet)
AT_THE_TOP = (
    "analysis",
    "baseline",
    "capture",
    "commands",
    "trace",
    "bisect.py",
    "cli.py",
    "environment.py",
    "errors.py",
    "arrays.py",
    "forking.py",
)


def test_imports_are_at_the_top() -> None:
    """A dependency hidden in a function is one a reader of the module's head does not see;
    only an optional or costly one is, and the exceptions are named here."""
    found = {}
    for name in AT_THE_TOP:
        for path in (ROOT / name).rglob("*.py") if (ROOT / name).is_dir() else [ROOT / name]:
            rel = path.relative_to(ROOT).as_posix()
            lazy = {m for m in _function_imported(path) if m.split(".")[0] not in LAZY_ROOTS}
            if lazy - LIGHT_PATH.get(rel, set()):
                found[rel] = sorted(lazy - LIGHT_PATH.get(rel, set()))
    assert found == {}


def test_the_top_import_check_sees_an_import_in_a_function(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "def f():\n    import torch\n    if TYPE_CHECKING:\n        import os\n"
        "    from perfguard.compare import b\n"
    )
    assert _function_imported(tmp_path / "m.py") == {"torch", "perfguard.compare"}
