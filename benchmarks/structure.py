"""The structure figures of issue 43: how big the plugin, results, FLOPs and store are, how many
imports hide in functions, how much ``Any`` crosses the public seams, what ``mypy --strict``
says, and the path one measured test takes through perfguard's modules.

Every figure is read from a tree's files (``ast``, no import of its code) except ``mypy`` (run in
the tree) and the path (one real measured test run twice in a subprocess with the tree first on
``PYTHONPATH``: a session that saves a baseline, then one compared with it under a tracer).

    python benchmarks/structure.py --tree /work/wt/before --tree . \\
        --out benchmarks/data/structure_round16.json

The definitions are in benchmarks/README.md ("structure.py").
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: JSON as this script writes it
Json = dict[str, object]

#: the layers a test's path is read against, highest first (docs/design.md's Layers table and
#: tests/test_import_graph.py's LAYERS: the clients last there, so first here). Packages in one
#: row are one layer. "*" places any package not named here (a new one, such as ``core`` or
#: ``session``): just below the plugin. "__init__" is ``perfguard/__init__.py`` itself.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__", "cli", "commands", "bisect"),
    ("plugin",),
    ("core", "session", "*"),
    ("publish", "report"),
    ("compare",),
    ("baseline",),
    ("analysis",),
    ("capture",),
    ("trace",),
    ("forking", "memory", "environment", "arrays", "jsonsafe", "errors", "__init__"),
)

#: the hooks of the measured test the tracer follows, in pytest's order; tracing starts when
#: the first is called and stops when pytest_runtest_protocol returns
HOOKS = (
    "pytest_runtest_call",
    "pytest_pyfunc_call",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_runtest_teardown",
    "pytest_runtest_logfinish",
)
#: each hook's arguments (pluggy passes them by name) and the one that names the item
HOOK_ARGS = {
    "pytest_runtest_call": ("item", "item"),
    "pytest_pyfunc_call": ("pyfuncitem", "pyfuncitem"),
    "pytest_runtest_makereport": ("item, call", "item"),
    "pytest_runtest_logreport": ("report", "report"),
    "pytest_runtest_teardown": ("item, nextitem", "item"),
    "pytest_runtest_logfinish": ("nodeid, location", "None"),
}

# ---------------------------------------------------------------------------------- layers


def package_of(module: str) -> str:
    """``perfguard.plugin.session`` -> ``plugin``; ``perfguard.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(module: str) -> int:
    """Row of ``module``'s package in LAYERS: 0 is the highest."""
    package = package_of(module)
    for rank, row in enumerate(LAYERS):
        if package in row:
            return rank
    return next(rank for rank, row in enumerate(LAYERS) if "*" in row)


def unplaced(modules: Iterable[str]) -> list[str]:
    """Packages LAYERS does not name (placed by its "*")."""
    named = {p for row in LAYERS for p in row}
    return sorted({package_of(m) for m in modules} - named)


def module_name(tree: Path, path: Path) -> str:
    parts = path.relative_to(tree).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(tree: Path) -> Iterator[tuple[str, str]]:
    """(module, source) of every file of the tree's ``perfguard`` package."""
    for path in sorted((tree / "perfguard").rglob("*.py")):
        yield module_name(tree, path), path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------- sizes


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def top_level_definitions(source: str) -> int:
    """Functions and classes at a module's top level."""
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return sum(isinstance(node, kinds) for node in ast.parse(source).body)


@dataclass
class ClassSize:
    name: str
    file: str
    lines: int
    methods: int
    bases: list[str] = field(default_factory=list)


def classes(source: str, file: str) -> list[ClassSize]:
    """Every class of a file (nested ones too), with its own methods."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
            found.append(ClassSize(node.name, file, size, methods, bases))
    return found


def store_methods(found: list[ClassSize], name: str = "Store") -> tuple[int, int] | None:
    """(own methods, with those of its bases defined beside it) of the class ``name``."""
    by_name = {c.name: c for c in found}
    if name not in by_name:
        return None
    seen: set[str] = set()
    todo = [name]
    total = 0
    while todo:
        cls = by_name.get(todo.pop())
        if cls is None or cls.name in seen:
            continue
        seen.add(cls.name)
        total += cls.methods
        todo.extend(cls.bases)
    return by_name[name].methods, total


def sizes(tree: Path) -> Json:
    pkg = tree / "perfguard"
    plugin = sorted((pkg / "plugin").glob("*.py"))
    flops_file = pkg / "analysis" / "flops.py"
    flops = (
        [flops_file] if flops_file.exists() else sorted((pkg / "analysis" / "flops").rglob("*.py"))
    )
    flops_lines = {str(p.relative_to(tree)): lines(p) for p in flops}
    largest_flops = max(flops_lines.items(), key=lambda kv: kv[1])
    baseline = sorted((pkg / "baseline").rglob("*.py"))
    found = [
        c
        for p in baseline
        for c in classes(p.read_text(encoding="utf-8"), str(p.relative_to(tree)))
    ]
    biggest = max(found, key=lambda c: c.lines)
    store = pkg / "baseline" / "store.py"
    results = pkg / "compare" / "results.py"
    methods = store_methods(found)
    flops_defs = sum(top_level_definitions(p.read_text(encoding="utf-8")) for p in flops)
    return {
        "plugin_lines": sum(lines(p) for p in plugin),
        "plugin_files": len(plugin),
        "results_lines": lines(results) if results.exists() else None,
        "flops_files": len(flops),
        "flops_lines": sum(flops_lines.values()),
        "flops_largest": {"file": largest_flops[0], "lines": largest_flops[1]},
        "flops_top_level_definitions": flops_defs,
        "store_lines": lines(store) if store.exists() else None,
        "store_methods": None if methods is None else methods[0],
        "store_methods_with_bases": None if methods is None else methods[1],
        "baseline_largest_class": {
            "name": biggest.name,
            "file": biggest.file,
            "lines": biggest.lines,
            "methods": biggest.methods,
        },
        "baseline_files": {str(p.relative_to(tree)): lines(p) for p in baseline},
    }


# ---------------------------------------------------------------------------------- imports


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> set[str]:
    """The modules an import statement names; ``from a import b`` names ``a`` and ``a.b``
    (``b`` may be a module), a relative one is resolved against ``module``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join([*parts[:keep], *([base] if base else [])])
    return {base} | {f"{base}.{alias.name}" for alias in node.names}


@dataclass
class FunctionImports:
    count: int = 0  # import statements inside a function body
    repeated: int = 0  # ... of a module the file also imports at its top level


def function_imports(source: str, module: str = "m", is_package: bool = False) -> FunctionImports:
    """Import statements inside functions (not under ``if TYPE_CHECKING:``), and those of them
    that import a module the file already imports at module level (outside every function and
    class: a class body's import binds a class attribute, not a global)."""
    top: set[str] = set()
    inner: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, scope: str) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            if scope == "function":
                inner.append(node)
            elif scope == "module":
                top.update(_imported(node, module, is_package))
        if scope != "function" and isinstance(node, ast.ClassDef):
            scope = "class"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            scope = "function"
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(source), "module")
    repeated = 0
    for node in inner:
        named = _imported(node, module, is_package)
        # the statement's own module: ``import a.b`` -> a.b, ``from a import b`` -> a
        own = named if isinstance(node, ast.Import) else {min(named, key=len)}
        repeated += bool(own & top)
    return FunctionImports(len(inner), repeated)


def imports(tree: Path) -> Json:
    total = FunctionImports()
    per: dict[str, list[int]] = {}
    for module, source in sources(tree):
        is_package = (tree / Path(*module.split("."))).is_dir()
        found = function_imports(source, module, is_package)
        total.count += found.count
        total.repeated += found.repeated
        row = per.setdefault(package_of(module), [0, 0])
        row[0] += found.count
        row[1] += found.repeated
    return {
        "in_function": total.count,
        "in_function_repeating_top": total.repeated,
        "per_package": {
            k: {"in_function": v[0], "repeating_top": v[1]} for k, v in sorted(per.items())
        },
    }


# ---------------------------------------------------------------------------------- Any


def mentions_any(annotation: ast.expr | None) -> bool:
    """``Any`` or ``typing.Any`` anywhere in an annotation (a string one is parsed)."""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                inner = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            if mentions_any(inner):
                return True
    return False


@dataclass
class AnySeams:
    signatures: int = 0  # parameters and returns of public functions and methods
    fields: int = 0  # class-level annotated names of public classes


def _signature_any(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    params = [
        *a.posonlyargs,
        *a.args,
        *a.kwonlyargs,
        *([a.vararg] if a.vararg else []),
        *([a.kwarg] if a.kwarg else []),
    ]
    return sum(mentions_any(p.annotation) for p in params) + mentions_any(fn.returns)


def any_seams(source: str) -> AnySeams:
    """Annotation slots (one parameter, one return, one field) that mention ``Any`` on the public
    surface: functions and methods whose name has no leading ``_`` (at module level or in a public
    class) and the public annotated names of public classes (dataclass and msgspec fields)."""
    found = AnySeams()

    def visit_body(body: list[ast.stmt], in_class: bool) -> None:
        for node in body:
            if isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef
            ) and not node.name.startswith("_"):
                found.signatures += _signature_any(node)
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit_body(node.body, True)
            elif in_class and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if not node.target.id.startswith("_"):
                    found.fields += mentions_any(node.annotation)
            elif isinstance(node, ast.If | ast.Try):  # definitions under a version check
                visit_body([*node.body, *node.orelse], in_class)

    visit_body(ast.parse(source).body, False)
    return found


def anys(tree: Path) -> Json:
    per: dict[str, AnySeams] = {}
    for module, source in sources(tree):
        found = any_seams(source)
        row = per.setdefault(package_of(module), AnySeams())
        row.signatures += found.signatures
        row.fields += found.fields
    total = sum(r.signatures + r.fields for r in per.values())
    seams = sum(per[p].signatures + per[p].fields for p in ("compare", "plugin") if p in per)
    return {
        "total": total,
        "signatures": sum(r.signatures for r in per.values()),
        "fields": sum(r.fields for r in per.values()),
        "compare_plugin": seams,
        "per_package": {
            k: {"signatures": v.signatures, "fields": v.fields} for k, v in sorted(per.items())
        },
    }


# ---------------------------------------------------------------------------------- mypy


def mypy(tree: Path) -> Json:
    """``mypy --strict perfguard`` in the tree (its pyproject applies), with a cache of its own."""
    cache = (
        Path(tempfile.gettempdir())
        / "structure-mypy"
        / hashlib.sha1(str(tree).encode()).hexdigest()[:12]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "perfguard", "--cache-dir", str(cache)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = done.stdout + done.stderr
    errors = re.search(r"Found (\d+) errors? in (\d+) files?", out)
    if errors is None and "Success" not in out:
        raise SystemExit(f"{tree}: mypy gave neither 'Found N errors' nor 'Success': {out[-500:]}")
    codes = Counter(re.findall(r": error: .*\[([a-z-]+)\]$", out, flags=re.M))
    return {
        "errors": int(errors.group(1)) if errors else 0,
        "files": int(errors.group(2)) if errors else 0,
        "codes": dict(codes.most_common()),
        "seconds": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------------------------- the path

PROJECT_TEST = '''\
"""One small step, measured by perfguard: the project benchmarks/structure.py follows."""

import pytest
import torch

torch.set_num_threads(1)
W = torch.randn(256, 256)
X = torch.randn(64, 256)


@pytest.mark.gpuprofile(iterations=4, rounds=3, warmup=1, tolerance="60%")
def test_step(gpuprofile):
    for _ in gpuprofile.iterations():
        torch.relu(X @ W).sum()
'''

#: the plugin the measured session loads (``-p structure_tracer``). ``sys.settrace`` rather than
#: ``sys.setprofile``: torch's profiler with ``with_stack=True`` (perfguard's) takes the profile
#: function over while it runs. Only perfguard's frames get a local tracer, with line events off.
TRACER = '''\
"""Records the calls and returns of perfguard's frames along one measured test."""

import json
import os
import sys
import threading

import pytest

ROOT = os.environ["STRUCTURE_TRACE_ROOT"]
OUT = os.environ["STRUCTURE_TRACE_OUT"]
HOOKS = {hooks!r}
codes = {{}}
events = []
state = {{"on": False, "done": False, "item": None}}


def _code(code):
    index = codes.get(code)
    if index is None:
        index = codes[code] = len(codes)
    return index


def _local(frame, event, arg):
    if event == "return":
        events.append((0, threading.get_ident(), _code(frame.f_code)))
    return _local


def _global(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(ROOT):
        events.append((1, threading.get_ident(), _code(frame.f_code)))
        frame.f_trace_lines = False
        return _local
    return None


def _mark(kind, hook):
    events.append((kind, threading.get_ident(), HOOKS.index(hook)))


def _follow(hook, item):
    if state["done"]:
        return False
    if not state["on"]:
        if hook != HOOKS[0] or item.get_closest_marker("gpuprofile") is None:
            return False
        state["on"], state["item"] = True, item.nodeid
        threading.settrace(_global)
        sys.settrace(_global)
    return True


def _wrap(hook, item):
    follow = _follow(hook, item)
    if follow:
        _mark(2, hook)
    yield
    if follow:
        _mark(3, hook)


{wrappers}

@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if state["on"] and not state["done"]:
        sys.settrace(None)
        threading.settrace(None)
        state["done"] = True
        import perfguard

        table = [[c.co_filename, c.co_qualname] for c in codes]  # in index order
        with open(OUT, "w") as f:
            json.dump({{"item": state["item"], "perfguard": perfguard.__file__, "codes": table,
                       "events": events, "main": threading.main_thread().ident}}, f)
'''


WRAPPER = """
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def {hook}({args}):
    yield from _wrap("{hook}", {item})
"""


def tracer_source() -> str:
    """The tracer plugin's source, one hook wrapper per followed hook."""
    wrappers = "\n".join(
        WRAPPER.format(hook=hook, args=HOOK_ARGS[hook][0], item=HOOK_ARGS[hook][1])
        for hook in HOOKS
    )
    return TRACER.format(hooks=HOOKS, wrappers=wrappers)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


def _pytest(
    project: Path, env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--perfguard",
            *args,
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done, time.perf_counter() - started


@dataclass
class Traced:
    """The tracer's dump and the measured test's entry in results.json."""

    item: str
    perfguard: str  # the perfguard/__init__.py the session imported
    codes: list[list[str]]  # (file, qualified name) per code index
    events: list[list[int]]
    main: int  # the main thread's ident
    outcome: str | None
    samples: int  # the per-iteration times the loop kept (the body's figures scale with it)
    baseline: object
    seconds: float  # the traced session's wall time


def trace_test(tree: Path, work: Path) -> Traced:
    """Run the project's test twice against ``tree`` (save, then compare under the tracer) and
    return the tracer's dump and the measured entry of results.json."""
    project = work / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_step.py").write_text(PROJECT_TEST)
    (work / "structure_tracer.py").write_text(tracer_source())
    for args in (
        ("init", "-q", "-b", "main"),
        ("config", "user.email", "ci@example.com"),
        ("config", "user.name", "CI"),
        ("config", "commit.gpgsign", "false"),
    ):
        _git(project, *args)
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "A")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFGUARD", "PYTEST"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(work)])
    saved, _ = _pytest(project, env, "--perfguard-save")
    if saved.returncode != 0:
        raise SystemExit(
            f"{tree}: the saving session failed ({saved.returncode}): {saved.stdout[-1500:]}"
        )
    with (project / "test_step.py").open("a") as f:
        f.write("\n# B: no change to the step\n")
    _git(project, "commit", "-q", "-am", "B")
    env["STRUCTURE_TRACE_ROOT"] = str(tree / "perfguard") + os.sep
    env["STRUCTURE_TRACE_OUT"] = str(work / "events.json")
    measured, seconds = _pytest(project, env, "-p", "structure_tracer")
    if measured.returncode not in (0, 1) or not (work / "events.json").exists():
        tail = measured.stdout[-1500:]
        raise SystemExit(f"{tree}: the measured session failed ({measured.returncode}): {tail}")
    dump = json.loads((work / "events.json").read_text())
    if not str(dump["perfguard"]).startswith(str(tree) + os.sep):
        raise SystemExit(
            f"{tree}: the measured session imported {dump['perfguard']}, not the tree's perfguard"
        )
    doc = json.loads((project / ".perfguard" / "results.json").read_text())
    (entry,) = [t for t in doc["tests"] if t["nodeid"] == dump["item"]]
    return Traced(
        item=dump["item"],
        perfguard=dump["perfguard"],
        codes=dump["codes"],
        events=dump["events"],
        main=int(dump["main"]),
        outcome=entry.get("outcome"),
        samples=len(entry.get("samples_current") or []),
        baseline=doc.get("baseline"),
        seconds=round(seconds, 1),
    )


def collapse(modules: Sequence[str]) -> list[str]:
    """Consecutive repeats dropped: a stack of frames -> a stack of modules, a run -> one visit."""
    out: list[str] = []
    for m in modules:
        if not out or out[-1] != m:
            out.append(m)
    return out


def _visits(seq: Sequence[str]) -> Json:
    visits = Counter(seq)
    return {
        "sequence_length": len(seq),
        "distinct_modules": len(visits),
        "max_visits": max(visits.values(), default=0),
        "modules_over_2_visits": dict(
            sorted(((m, n) for m, n in visits.items() if n > 2), key=lambda kv: -kv[1])
        ),
        "returns_to_higher_layer": sum(
            layer_of(b) < layer_of(a) for a, b in zip(seq, seq[1:], strict=False)
        ),
        "sequence": list(seq),
    }


def path_figures(
    events: Sequence[Sequence[int]], modules: Sequence[str], main: int, depths: Sequence[int]
) -> Json:
    """The figures of one traced test: ``events`` are (kind, thread, code) with kind 1 a call,
    0 a return, 2/3 a followed hook's start/end (code: its index in HOOKS); ``modules[code]``.
    The sequences are read on the main thread, once whole and once without the test function's
    own call (``pytest_pyfunc_call``: the body's loop driving perfguard once per iteration)."""
    stacks: dict[int, list[str]] = {}
    whole: dict[int, list[str]] = {d: [] for d in depths}
    outside: dict[int, list[str]] = {d: [] for d in depths}
    upward: Counter[tuple[str, str]] = Counter()
    hooks_seen: list[str] = []
    body = HOOKS.index("pytest_pyfunc_call")
    in_body = False
    calls = 0
    for kind, thread, code in events:
        if kind >= 2:
            if kind == 2 and HOOKS[code] not in hooks_seen:
                hooks_seen.append(HOOKS[code])
            if code == body and thread == main:
                in_body = kind == 2
            continue
        stack = stacks.setdefault(thread, [])
        if kind == 1:
            calls += 1
            callee = modules[code]
            if stack and layer_of(callee) < layer_of(stack[-1]):
                upward[(stack[-1], callee)] += 1
            stack.append(callee)
        elif stack:
            stack.pop()
        if thread != main or not stack:
            continue
        modstack = collapse(stack)
        for d in depths:
            inner = modstack[:d][-1]
            for seqs in (whole, outside) if not in_body else (whole,):
                seq = seqs[d]
                if not seq or seq[-1] != inner:
                    seq.append(inner)
    out: Json = {
        "hooks_followed": hooks_seen,
        "events": sum(e[0] < 2 for e in events),
        "calls": calls,
        "threads": len(stacks),
        "upward_calls": sum(upward.values()),
        "upward_pairs": {f"{a} -> {b}": n for (a, b), n in upward.most_common(20)},
        "entry_modules": sorted(set(_entries(events, modules))),
    }
    for d in depths:
        out[f"depth{d}"] = _visits(whole[d])
        out[f"depth{d}_outside_body"] = _visits(outside[d])
    return out


def _entries(events: Sequence[Sequence[int]], modules: Sequence[str]) -> Iterator[str]:
    """The modules perfguard is entered at from outside (an empty perfguard stack)."""
    depth: dict[int, int] = {}
    for kind, thread, code in events:
        if kind == 1:
            if depth.get(thread, 0) == 0:
                yield modules[code]
            depth[thread] = depth.get(thread, 0) + 1
        elif kind == 0 and depth.get(thread, 0):
            depth[thread] -= 1


def path(tree: Path, depths: Sequence[int]) -> Json:
    work = Path(tempfile.mkdtemp(prefix="structure-"))
    try:
        dump = trace_test(tree, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    root = tree / "perfguard"
    codes = [Path(f) for f, _ in dump.codes]
    modules = [module_name(tree, p) if p.is_relative_to(root) else "?" for p in codes]
    figures = path_figures(dump.events, modules, dump.main, depths)
    figures.update(
        item=dump.item,
        outcome=dump.outcome,
        samples=dump.samples,
        baseline=dump.baseline,
        traced_session_s=dump.seconds,
        unplaced_packages=unplaced(modules),
    )
    return figures


# ---------------------------------------------------------------------------------- report


def git_label(tree: Path) -> str:
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "?"


def measure(tree: Path, depths: Sequence[int], *, run_mypy: bool, run_path: bool) -> Json:
    if not (tree / "perfguard" / "__init__.py").exists():
        raise SystemExit(f"{tree}: no perfguard/__init__.py: not a perfguard tree")
    started = time.perf_counter()
    doc: Json = {"tree": str(tree), "commit": git_label(tree)}
    doc["sizes"] = sizes(tree)
    doc["imports"] = imports(tree)
    doc["any"] = anys(tree)
    doc["mypy_strict"] = mypy(tree) if run_mypy else None
    doc["path"] = path(tree, depths) if run_path else None
    doc["seconds"] = round(time.perf_counter() - started, 1)
    return doc


def _get(doc: object, keys: str) -> object:
    for key in keys.split("."):
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def rows(depths: Sequence[int]) -> list[tuple[str, str]]:
    out = [
        ("plugin/ lines", "sizes.plugin_lines"),
        ("plugin/ files", "sizes.plugin_files"),
        ("compare/results.py lines", "sizes.results_lines"),
        ("flops lines", "sizes.flops_lines"),
        ("flops files", "sizes.flops_files"),
        ("flops largest file lines", "sizes.flops_largest.lines"),
        ("flops top-level defs", "sizes.flops_top_level_definitions"),
        ("baseline/store.py lines", "sizes.store_lines"),
        ("Store methods (own)", "sizes.store_methods"),
        ("Store methods (+ bases)", "sizes.store_methods_with_bases"),
        ("baseline/ largest class", "sizes.baseline_largest_class.name"),
        ("  its lines", "sizes.baseline_largest_class.lines"),
        ("  its methods", "sizes.baseline_largest_class.methods"),
        ("in-function imports", "imports.in_function"),
        ("  of a module imported at top", "imports.in_function_repeating_top"),
        ("Any at public seams", "any.total"),
        ("  signatures", "any.signatures"),
        ("  fields", "any.fields"),
        ("  in compare/ + plugin/", "any.compare_plugin"),
        ("mypy --strict errors", "mypy_strict.errors"),
        ("path: hooks followed", "path.hooks_followed"),
        ("path: events (call+return)", "path.events"),
        ("path: loop samples kept", "path.samples"),
        ("path: upward calls", "path.upward_calls"),
    ]
    for d in depths:
        for label, key in ((f"d{d} w/o body", f"depth{d}_outside_body"), (f"d{d}", f"depth{d}")):
            out += [
                (f"path {label}: sequence length", f"path.{key}.sequence_length"),
                (f"path {label}: distinct modules", f"path.{key}.distinct_modules"),
                (f"path {label}: max visits", f"path.{key}.max_visits"),
                (f"path {label}: modules >2 visits", f"path.{key}.modules_over_2_visits"),
                (f"path {label}: returns to higher layer", f"path.{key}.returns_to_higher_layer"),
            ]
    return out


def _cell(value: object) -> str:
    if isinstance(value, list):
        return str(len(value))
    if isinstance(value, dict):
        return str(len(value))
    return "-" if value is None else str(value)


def table(docs: Sequence[Json], depths: Sequence[int]) -> str:
    heads = ["figure", *(f"{_get(d, 'commit')}" for d in docs)]
    body = [[name, *(_cell(_get(d, key)) for d in docs)] for name, key in rows(depths)]
    widths = [max(len(r[i]) for r in [heads, *body]) for i in range(len(heads))]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r) for r in [heads, *body])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tree", action="append", type=Path, required=True, help="a perfguard checkout (repeat)"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument(
        "--depth", type=int, default=3, help="module levels of the path read (2..DEPTH reported)"
    )
    parser.add_argument("--no-mypy", action="store_true", help="skip mypy --strict")
    parser.add_argument("--no-path", action="store_true", help="skip the traced test")
    args = parser.parse_args(argv)
    depths = list(range(2, max(args.depth, 2) + 1))
    docs = []
    for tree in args.tree:
        docs.append(
            measure(tree.resolve(), depths, run_mypy=not args.no_mypy, run_path=not args.no_path)
        )
        print(f"{tree}: measured in {docs[-1]['seconds']} s", file=sys.stderr)
    print(table(docs, depths))
    for doc in docs:
        pairs = _get(doc, "path.upward_pairs")
        if pairs:
            print(f"\n{doc['commit']} upward calls: {pairs}")
        for d in depths:
            for key in (f"depth{d}", f"depth{d}_outside_body"):
                over = _get(doc, f"path.{key}.modules_over_2_visits")
                if over:
                    print(f"{doc['commit']} {key}, modules visited more than twice: {over}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"depths": depths, "layers": LAYERS, "trees": docs}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
