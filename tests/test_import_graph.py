"""The import graph, read from the source with ast: no circle between the top-level packages, none between
the subpackages of runtime/ and cute_kernels/, none among the files of any package, and weights/
(checkpoint formats) imports no other package.

Edges: `import X.Y` depends on module X.Y; `from X import Y` on module X, and on X.Y when that is a
module; relative imports resolve against the importing file. Importing X.Y also runs the __init__ of
X, but that implicit edge is left out (a package's __init__ importing its own modules is no circle).
Imports under `if TYPE_CHECKING:` count too: they never run, but a circle through them is still a
circle for a reader (and for the type checker).

Function-local (lazy) imports count at both levels: a lazy import still ties two modules together,
it only hides the circle from the interpreter. At package level runtime.serve is its own node: it is
the server's composition root, wiring the engine (runtime) to the chat UI (app), so app may import
runtime but must never import the server.

`python tests/test_import_graph.py` prints every circle found.
"""
from __future__ import annotations

import ast
import os
from collections.abc import Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("app", "cute_kernels", "profiling", "runtime", "structured", "weights")
COMPOSITION_ROOTS = ("runtime.serve",)
FILE_LEVEL_PACKAGES = PACKAGES
SECOND_LEVEL = ("runtime", "cute_kernels")  # packages whose direct children are nodes of their own


def modules() -> dict[str, str]:
    """Dotted module name -> file path, for every .py file of the first-party packages."""
    found = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(REPO, pkg)):
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, name), REPO)[:-3].split(os.sep)
                    found[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(dirpath, name)
    return found


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under node: function bodies and `if TYPE_CHECKING:` blocks included."""
    for child in ast.walk(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child


def module_edges(name: str, path: str, known: set[str]) -> set[str]:
    """First-party modules that module `name` imports."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    out: set[str] = set()
    for stmt in _imports(tree):
        if isinstance(stmt, ast.Import):
            targets = [a.name for a in stmt.names]
        else:
            base = stmt.module or ""
            if stmt.level:
                parts = name.split(".")[: len(name.split(".")) - stmt.level + (1 if is_package else 0)]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in stmt.names]
        out.update(t for t in targets if t in known)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def package_of(module: str) -> str:
    return next((r for r in COMPOSITION_ROOTS if module == r or module.startswith(r + ".")), module.split(".")[0])


def subpackage_of(module: str) -> str:
    """runtime.X / cute_kernels.X (a child module or subpackage), else the top-level package."""
    parts = module.split(".")
    root = package_of(module)
    if root in COMPOSITION_ROOTS or parts[0] not in SECOND_LEVEL or len(parts) == 1:
        return root
    return ".".join(parts[:2])


def package_graph(level=package_of) -> dict[str, dict[str, set[str]]]:
    """Package -> package it imports -> the module-level edges behind that (for the failure message)."""
    mods = modules()
    graph: dict[str, dict[str, set[str]]] = {}
    for name, path in mods.items():
        for target in module_edges(name, path, set(mods)):
            a, b = level(name), level(target)
            if a != b:
                graph.setdefault(a, {}).setdefault(b, set()).add(f"{name} -> {target}")
    return graph


def file_graph() -> dict[str, set[str]]:
    mods = {n: p for n, p in modules().items() if n.split(".")[0] in FILE_LEVEL_PACKAGES}
    return {name: module_edges(name, path, set(mods)) for name, path in mods.items()}


def _describe(graph: dict[str, dict[str, set[str]]], scc: list[str]) -> str:
    edges = [e for a in scc for b in scc for e in sorted(graph.get(a, {}).get(b, ()))]
    return f"{' <-> '.join(scc)}: " + "; ".join(edges)


def test_no_cycle_between_packages():
    graph = package_graph()
    found = cycles({a: set(bs) for a, bs in graph.items()})
    assert not found, "package-level import circles:\n" + "\n".join(_describe(graph, c) for c in found)


def test_no_cycle_between_the_subpackages_of_runtime_and_cute_kernels():
    graph = package_graph(subpackage_of)
    found = cycles({a: set(bs) for a, bs in graph.items()})
    assert not found, "subpackage-level import circles:\n" + "\n".join(_describe(graph, c) for c in found)


def test_no_cycle_among_files():
    found = cycles(file_graph())
    assert not found, "file-level import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_weights_imports_no_other_first_party_package():
    deps = package_graph().get("weights", {})
    assert not deps, f"weights/ must stand alone: {sorted(e for es in deps.values() for e in es)}"


def test_nothing_imports_a_composition_root():
    graph = package_graph()
    back = sorted(e for a, bs in graph.items() for b, es in bs.items() if b in COMPOSITION_ROOTS for e in es)
    assert not back, f"imports of the server's composition root: {back}"


if __name__ == "__main__":
    pg = package_graph()
    for a in sorted(pg):
        print(f"{a} -> {', '.join(sorted(pg[a]))}")
    for c in cycles({a: set(bs) for a, bs in pg.items()}):
        print("PACKAGE CIRCLE", _describe(pg, c))
    for c in cycles(file_graph()):
        print("FILE CIRCLE", " <-> ".join(c))
