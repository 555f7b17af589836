"""Layering of the source tree, read from every module's imports with ``ast`` (nothing is imported).

Rules (issue 16, item 5):

- the reference backend is the oracle: ``dsahal.reference`` imports nothing it judges, i.e. nothing
  from ``dsahal.distributed``, ``dsahal.ops`` (bar ``dsahal.ops.catalog``, the op names and specs),
  ``dsahal.backends``, ``dsahal.engine`` or ``dsahal.model``;
- no module of one hardware backend (nvidia, amd, tpu, ppu) imports another one (the shared
  ``backends/triton_kernels`` and modules at ``backends/`` top level are for everyone);
- nothing in ``core/`` (``dsahal`` minus ``dsahal.backends`` and ``dsahal.conformance``) imports
  ``dsahal.backends``;
- the contract (``dsahal.ops``, ``registry``, ``reference``, ``formats``, ``cache``: README, "Reading the
  code") imports none of its consumers (``model``, ``engine``, ``distributed``, ``cli``, ``bench``, the
  backends, the suite); ``dsahal.config``, the model dimensions the cache is laid out from, is shared;
- no import cycle among dsahal modules, counting module-level imports (``if TYPE_CHECKING:`` blocks
  never run); nor, separately, counting function-level imports too (the two circles found in review,
  ``triton_kernels.topk`` <-> ``topk_split`` and ``bench.cases`` <-> ``bench.model_step``, were lazy).

The first four count function-level imports too: a lazy import is still a dependency.
Strings naming a module (the plugins' ``"pkg.mod:fn"`` entries) are not imports: resolving them is
the registry's job, on selection.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = {"dsahal": REPO / "core", "dsahal.backends": REPO / "backends", "dsahal.conformance": REPO / "conformance"}
HARDWARE_BACKENDS = ("nvidia", "amd", "tpu", "ppu")
REFERENCE_MAY_NOT_IMPORT = ("dsahal.distributed", "dsahal.ops", "dsahal.backends", "dsahal.engine", "dsahal.model")
REFERENCE_MAY_IMPORT = ("dsahal.ops.catalog",)
CONTRACT = ("dsahal.ops", "dsahal.registry", "dsahal.reference", "dsahal.formats", "dsahal.cache")
CONSUMERS = ("dsahal.model", "dsahal.engine", "dsahal.distributed", "dsahal.cli", "dsahal.bench", "dsahal.backends",
             "dsahal.conformance")



@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (the longest dotted name that is a module of ours, else as written)
    line: int
    module_level: bool  # False inside a function (or a method)


def _module_name(root_package: str, root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([root_package, *parts])


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    """Every module of the three source folders by its import name (``backends/`` and ``conformance/``
    are ``dsahal.backends`` and ``dsahal.conformance``, as setup.py maps them)."""
    found = {}
    for package, root in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__")) and d != "templates"]
            if "__init__.py" not in filenames:
                dirnames[:] = []  # a data folder (reports, templates): no package below
                continue
            for name in filenames:
                if name.endswith(".py"):
                    path = Path(dirpath) / name
                    found[_module_name(package, root, path)] = path
    return found


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def _resolve(source: str, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``source``."""
    if level == 0:
        return module or ""
    base = source.split(".")
    if not _is_package(source):
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _ours(name: str) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (None: not ours)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules():
            return candidate
    return None


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _walk(node: ast.AST, in_function: bool):
    """(node, in_function) for every node below ``node``, leaving out ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if _type_checking_block(child):
            for other in child.orelse:
                yield other, in_function
                yield from _walk(other, in_function)
            continue
        inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield child, inside
        yield from _walk(child, inside)


@lru_cache(maxsize=None)
def imports_of(source: str) -> tuple[Import, ...]:
    """Every import statement of module ``source`` that names a dsahal module."""
    path = modules()[source]
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node, in_function in _walk(tree, False):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(source, node.level, node.module)
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base for alias in node.names]
        else:
            continue
        for name in dict.fromkeys(names):
            target = _ours(name) if name.startswith("dsahal") else None
            if target is not None and target != source:
                found.append(Import(source, target, node.lineno, not in_function))
    return tuple(found)


def all_imports() -> list[Import]:
    return [imp for source in sorted(modules()) for imp in imports_of(source)]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _describe(imports) -> list[str]:
    return [f"{imp.source} (line {imp.line}{'' if imp.module_level else ', in a function'}) imports {imp.target}"
            for imp in imports]


def _unexpected(imports) -> list[str]:
    return _describe(imports)


def reference_violations() -> list[Import]:
    return [imp for imp in all_imports() if _within(imp.source, "dsahal.reference")
            and any(_within(imp.target, bad) for bad in REFERENCE_MAY_NOT_IMPORT)
            and not any(_within(imp.target, ok) for ok in REFERENCE_MAY_IMPORT)]


def _hardware_backend(name: str) -> str | None:
    for backend in HARDWARE_BACKENDS:
        if _within(name, f"dsahal.backends.{backend}"):
            return backend
    return None


def cross_backend_violations() -> list[Import]:
    return [imp for imp in all_imports() if _hardware_backend(imp.source) and _hardware_backend(imp.target)
            and _hardware_backend(imp.source) != _hardware_backend(imp.target)]


def _in_core(name: str) -> bool:
    return _within(name, "dsahal") and not _within(name, "dsahal.backends") and not _within(name, "dsahal.conformance")


def core_to_backend_violations() -> list[Import]:
    return [imp for imp in all_imports() if _in_core(imp.source) and _within(imp.target, "dsahal.backends")]


def contract_to_consumer_violations() -> list[Import]:
    return [imp for imp in all_imports() if any(_within(imp.source, part) for part in CONTRACT)
            and any(_within(imp.target, user) for user in CONSUMERS)]


def import_cycles(module_level_only: bool = True) -> list[list[str]]:
    """Every strongly connected component of more than one module (or a module importing itself) in the
    graph of module-level imports (or of every import), each as one cycle through it: ``[a, b, ..., a]``."""
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for imp in all_imports():
        if imp.module_level or not module_level_only:
            graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(start: str) -> None:  # Tarjan's algorithm, iterative (the graph is a few hundred nodes deep)
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return [_cycle_through(component, graph) for component in components]


def _cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle inside a strongly connected component, from its first module back to it (breadth-first)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if succ not in previous:
                    previous[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle in strongly connected component {component}")


# ----------------------------------------------------------------------------- the scanner itself

def test_the_scan_sees_every_source_folder_and_both_kinds_of_import():
    names = modules()
    for expected in ("dsahal", "dsahal.ops.topk_merge", "dsahal.reference.topk", "dsahal.backends.nvidia.plugin",
                     "dsahal.backends.triton_kernels.topk", "dsahal.conformance.report", "dsahal.cli.conformance"):
        assert expected in names, expected
    assert not any(".templates" in name for name in names)  # data, not code
    # relative `from .. import ops` resolves to the module dsahal.ops; a function-level import is kept as such
    ops_imports = [imp for imp in imports_of("dsahal.ops.composite") if imp.target.startswith("dsahal.ops")]
    assert ops_imports and all(imp.module_level for imp in ops_imports)
    lazy = [imp for imp in imports_of("dsahal.cli.conformance") if imp.target == "dsahal.conformance.jobs"]
    assert lazy and not any(imp.module_level for imp in lazy)


def test_the_cycle_finder_reports_a_cycle_it_is_given(monkeypatch):
    fake = {"dsahal.a": Path("a.py"), "dsahal.b": Path("b.py"), "dsahal.c": Path("c.py")}
    edges = {"dsahal.a": ("dsahal.b",), "dsahal.b": ("dsahal.c",), "dsahal.c": ("dsahal.a",)}
    monkeypatch.setitem(globals(), "modules", lambda: fake)
    monkeypatch.setitem(globals(), "all_imports",
                        lambda: [Import(s, t, 1, s != "dsahal.c") for s, ts in edges.items() for t in ts])
    assert import_cycles(module_level_only=False) == [["dsahal.a", "dsahal.b", "dsahal.c", "dsahal.a"]]
    assert import_cycles() == []  # c imports a inside a function: no cycle at load time


# ----------------------------------------------------------------------------- the rules

def test_the_reference_imports_nothing_it_judges():
    assert _unexpected(reference_violations()) == []


def test_no_hardware_backend_imports_another():
    assert _unexpected(cross_backend_violations()) == []


def test_nothing_in_core_imports_a_backend():
    assert _unexpected(core_to_backend_violations()) == []


def test_the_contract_imports_none_of_its_consumers():
    assert _unexpected(contract_to_consumer_violations()) == []


def test_no_import_cycle_among_module_level_imports():
    assert import_cycles() == []


def test_no_import_cycle_even_through_function_level_imports():
    """A lazy import that closes a circle (``topk`` -> ``topk_split`` -> ``topk``, ``bench.cases`` ->
    ``bench.model_step`` -> ``bench.cases``, both in review) still ties two modules into one: what they
    share belongs in a third."""
    assert import_cycles(module_level_only=False) == []
