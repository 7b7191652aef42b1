"""cute_kernels stands below the runtime: none of its modules imports `runtime`, and its modules do not
import each other in a circle (every import counts, also one inside a function)."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO

PACKAGE = REPO / "cute_kernels"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    """Absolute names of everything the file imports (relative imports resolved; `from pkg import mod`
    counted as pkg.mod too, since a name imported from a package may be a submodule)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def _modules() -> dict[str, set[str]]:
    return {_module_name(p): _imported(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_kernel_module_imports_the_runtime():
    offenders = {mod: sorted(n for n in names if n == "runtime" or n.startswith("runtime."))
                 for mod, names in _modules().items()}
    assert not {mod: names for mod, names in offenders.items() if names}


def test_kernel_modules_import_each_other_without_a_circle():
    modules = _modules()
    graph = {mod: {n for n in names if n in modules and n != mod} for mod, names in modules.items()}
    done, path = set(), []

    def visit(mod: str) -> None:
        if mod in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(mod):] + [mod]))
        if mod in done:
            return
        path.append(mod)
        for dep in sorted(graph[mod]):
            visit(dep)
        path.pop()
        done.add(mod)

    for mod in sorted(graph):
        visit(mod)
    assert len(done) == len(modules) > 20
