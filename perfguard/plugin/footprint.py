"""What a benchmark executes, as files of the project: what ``--perfguard-changed`` stands on.

**Static** (:class:`ImportGraph`, read from the tree on disk): the test's file, the
``conftest.py`` files pytest loads for it (from the rootdir down to its folder) and,
transitively, every project module they import: ``import a.b`` (with ``a/__init__.py``),
``from a import b`` (``a`` and ``a/b.py`` when it is a module), relative imports,
``importlib.import_module("a.b")`` / ``__import__("a")`` and ``pytest_plugins`` with
literal names. Names resolve against the project's import roots: the rootdir and every
``sys.path`` entry inside the project (pytest put the test folders there while
collecting), never a virtual environment inside it. With them, each file's string
literals, which name the data and config files the benchmark reads
(``load("configs/small.yaml")``).

**What cannot be ruled out**: an import by a computed name (``import_module(name)``) or a
file Python cannot parse in the closure; the caller runs such a test.

**Runtime** (:func:`runtime_meta`, kept with every saved record as ``meta["footprint"]``):
the project modules loaded in the test's process that no static closure of the session
reaches (an entry point, ``runpy``, ``exec`` of a file), and a digest of the installed
distributions, the project's own editable install left out (its code is the diff's).

Standard library only; every file is parsed once per process.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FOOTPRINT_KEY",
    "ImportGraph",
    "SessionFootprint",
    "Closure",
    "code_text",
    "packages_digest",
    "project_modules",
    "runtime_meta",
]

#: the record's meta key of what a test's process loaded and the packages it ran with
FOOTPRINT_KEY = "footprint"
#: folders whose files are installed packages or tooling, never the project's code
_NOT_PROJECT = {"site-packages", "dist-packages", ".venv", "venv", ".tox", ".nox", ".git"}
_IMPORTERS = {"import_module", "__import__"}


@dataclass(frozen=True)
class SourceFacts:
    """What one file says about what it runs."""

    #: (module name, level, imported names): ``from ..a import b`` is ("a", 2, ("b",))
    imports: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    literals: frozenset[str] = frozenset()
    #: lines of imports by computed names (``import_module(name)``)
    computed: tuple[int, ...] = ()
    parsed: bool = True


@dataclass
class Closure:
    """A test's files (absolute, resolved), their string literals, and why it must run
    whatever changed (empty: nothing)."""

    files: set[Path] = field(default_factory=set)
    literals: set[str] = field(default_factory=set)
    unknowable: list[str] = field(default_factory=list)


def _in_project(path: Path, root: Path) -> bool:
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    return not any(part in _NOT_PROJECT for part in rel.parts)


def _facts(text: str) -> SourceFacts:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return SourceFacts(parsed=False)
    imports: list[tuple[str, int, tuple[str, ...]]] = []
    literals: set[str] = set()
    computed: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(a.name, 0, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names if a.name != "*")
            imports.append((node.module or "", node.level, names))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            literals.add(node.value)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _IMPORTERS and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    imports.append((arg.value, 0, ()))
                else:
                    computed.append(node.lineno)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
        ):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    imports.append((item.value, 0, ()))
    return SourceFacts(tuple(imports), frozenset(literals), tuple(computed))


class ImportGraph:
    """The project's files as an import graph, parsed lazily and once (module docstring)."""

    def __init__(self, root: Path, search: Iterable[str | Path] | None = None) -> None:
        self.root = root.resolve()
        paths = [self.root, *(Path(p) for p in (sys.path if search is None else search) if p)]
        roots: list[Path] = []
        for p in paths:
            try:
                r = p.resolve()
            except OSError:
                continue
            if r not in roots and r.is_dir() and _in_project(r, self.root):
                roots.append(r)
        self.roots = roots
        self._facts: dict[Path, SourceFacts] = {}

    def facts(self, path: Path) -> SourceFacts:
        if path not in self._facts:
            try:
                self._facts[path] = _facts(path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                self._facts[path] = SourceFacts(parsed=False)
        return self._facts[path]

    @staticmethod
    def _module_at(base: Path, parts: list[str]) -> list[Path] | None:
        """The files importing ``parts`` from ``base`` executes: each package's
        ``__init__.py`` on the way and the module (a namespace package has none); None
        when the module is not there."""
        out = []
        here = base
        for i, part in enumerate(parts):
            here = here / part
            init = here / "__init__.py"
            if init.is_file():
                out.append(init)
            elif i == len(parts) - 1 and here.with_suffix(".py").is_file():
                out.append(here.with_suffix(".py"))
            elif not here.is_dir():
                return None
        return out

    def _resolve(self, path: Path, module: str, level: int, names: tuple[str, ...]) -> list[Path]:
        parts = [p for p in module.split(".") if p]
        if level:
            base = path.parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        else:
            bases = self.roots
        for base in bases:
            found = self._module_at(base, parts)
            if found is None:
                continue
            package = base.joinpath(*parts)
            for name in names:  # ``from pkg import mod``: the submodule, where it is one
                found += self._module_at(package, [name]) or []
            return found
        return []

    def closure(self, starts: Iterable[Path]) -> Closure:
        """Every project file ``starts`` import, transitively, with their literals."""
        out = Closure()
        todo = [p.resolve() for p in starts]
        while todo:
            path = todo.pop()
            if path in out.files or not path.is_file() or not _in_project(path, self.root):
                continue
            out.files.add(path)
            facts = self.facts(path)
            rel = self._rel(path)
            if not facts.parsed:
                out.unknowable.append(f"{rel} cannot be parsed")
                continue
            out.literals |= facts.literals
            if facts.computed:
                out.unknowable.append(
                    f"{rel}:{facts.computed[0]} imports a module by a computed name"
                )
            for module, level, names in facts.imports:
                todo += [f for f in self._resolve(path, module, level, names) if f not in out.files]
        return out

    def test_starts(self, test_file: Path) -> list[Path]:
        """The test's file and the conftest.py files pytest loads for it (rootdir down)."""
        test_file = test_file.resolve()
        starts = [test_file]
        folder = test_file.parent
        while _in_project(folder, self.root):
            conftest = folder / "conftest.py"
            if conftest.is_file():
                starts.append(conftest)
            if folder == self.root:
                break
            folder = folder.parent
        return starts

    def _rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


def project_modules(root: Path) -> set[str]:
    """Project files (relative, posix) of the modules loaded in this process."""
    root = root.resolve()
    out = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not name or not name.endswith(".py"):
            continue
        path = Path(name)
        if path.is_absolute() and _in_project(path, root):
            out.add(path.relative_to(root).as_posix())
    return out


def packages_digest(search: Iterable[str] | None = None) -> str:
    """A digest of the installed distributions (``name-version`` of each ``.dist-info`` and
    ``.egg-info`` in the ``site-packages`` folders on ``sys.path``), leaving out those
    installed from a local folder (the project's own editable install: its code is in the
    diff, its version moves per commit)."""
    names: set[str] = set()
    for entry in sys.path if search is None else search:
        if search is None and not {"site-packages", "dist-packages"} & set(Path(entry).parts):
            continue  # a source folder on the path (PYTHONPATH, the rootdir): not installed
        try:
            listing = os.scandir(entry or ".")
        except OSError:
            continue
        with listing:
            for e in listing:
                if not e.name.endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(e.path, "direct_url.json"), encoding="utf-8") as f:
                        if '"dir_info"' in f.read():
                            continue
                except OSError:
                    pass
                names.add(e.name.rsplit(".", 1)[0].lower())
    return hashlib.sha1("\n".join(sorted(names)).encode()).hexdigest()[:16]


def runtime_meta(root: Path, static: set[str], packages: str) -> dict[str, object]:
    """``meta["footprint"]`` of a record made in this process: the project modules loaded
    here that no static closure of the session reaches (``static``: relative paths), and
    the packages' digest."""
    return {"loaded": sorted(project_modules(root) - static), "packages": packages}


def code_text(text: str) -> str | None:
    """Python source as what runs: its syntax tree less docstrings (comments and layout are
    not in it), or None where it does not parse. Two versions with the same text run alike."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


class SessionFootprint:
    """One process's footprint recorder: the static closure of the session's benchmarks,
    computed once at the first record, and the packages' digest."""

    def __init__(self, root: Path, test_files: Iterable[Path]) -> None:
        self.graph = ImportGraph(root)
        self.test_files = sorted({Path(f) for f in test_files})
        self._static: set[str] | None = None
        self._packages: str | None = None

    @property
    def packages(self) -> str:
        if self._packages is None:
            self._packages = packages_digest()
        return self._packages

    def static(self) -> set[str]:
        """Relative paths of every file the session's benchmarks import statically."""
        if self._static is None:
            starts = [s for f in self.test_files for s in self.graph.test_starts(f)]
            files = self.graph.closure(starts).files
            self._static = {p.relative_to(self.graph.root).as_posix() for p in files}
        return self._static

    def meta(self) -> dict[str, object]:
        """``meta["footprint"]`` for a record made now in this process."""
        return runtime_meta(self.graph.root, self.static(), self.packages)
