"""A lint over the Hopper kernels' source: no TMA load may be issued from a lane-divergent branch or an
`elect_one` region.

Why: in the DSL (4.8.1) a TMA tensor load, `cute.copy(atom, ..., tma_bar_ptr=...)`, elects its issuing
lane itself with a warp-collective `elect.sync`. Inside `if tidx == 0:` or `with elect_one():` that
election waits for 31 lanes that wait for it at the branch's reconvergence: the kernel hangs (SASS:
BRA.DIV -> WARPSYNC.COLLECTIVE -> ELECT). Issue it from a whole warp (`if warp_idx == 0:` on a
warp-uniform index); put the single-lane work (mbarrier expect-tx) under its own `elect_one`.
TMA stores are not elected by the DSL (their SASS has no ELECT), so one thread may issue them.

What it reads: every function of the given files; a TMA load is a `cute.copy` call with a
`tma_bar_ptr=` keyword; a function that contains one (directly or through calls, by name) is checked
at every call site too. A test is lane-divergent when it reads a lane-varying name: one of LANE_NAMES,
a call to thread_idx()/lane_idx(), or a local computed from those without make_warp_uniform().
`python -m cute_kernels.toolchain.tma_lint [FILES]` prints each violation (default: cute_kernels/hopper).
"""
from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HOPPER = Path(__file__).resolve().parents[1] / "hopper"
LANE_NAMES = frozenset({"tidx", "tid", "ptid", "ctid", "lane", "lane_id", "lane_idx", "consumer_tidx", "thread_idx"})
LANE_CALLS = frozenset({"thread_idx", "lane_idx"})
UNIFORM_CALLS = frozenset({"make_warp_uniform"})


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    function: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.function}: {self.reason}"


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return None


def _reads_lane(expr: ast.AST, lane_vars: set[str]) -> bool:
    """Whether expr depends on the lane, looking through everything but make_warp_uniform(...)."""
    if _call_name(expr) in UNIFORM_CALLS:
        return False
    if _call_name(expr) in LANE_CALLS:
        return True
    if isinstance(expr, ast.Name) and expr.id in lane_vars:
        return True
    return any(_reads_lane(child, lane_vars) for child in ast.iter_child_nodes(expr))


def _lane_vars(func: ast.FunctionDef) -> set[str]:
    """Parameters and locals that hold lane-varying values (simple forward data flow, to a fixed point)."""
    found = {a.arg for a in func.args.args if a.arg in LANE_NAMES}
    assigns = [n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
    changed = True
    while changed:
        changed = False
        for node in assigns:
            if node.value is None or not _reads_lane(node.value, found | LANE_NAMES):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    if name not in found:
                        found.add(name)
                        changed = True
    return found | (LANE_NAMES & {n.id for n in ast.walk(func) if isinstance(n, ast.Name)})


def _is_tma_load(node: ast.AST) -> bool:
    return _call_name(node) == "copy" and any(k.arg == "tma_bar_ptr" for k in node.keywords)


def _guards(func: ast.FunctionDef, target: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """The if-tests and with-items enclosing `target` inside func, innermost last."""
    def visit(node: ast.AST, stack: list[tuple[ast.AST, str]]) -> Iterator[tuple[ast.AST, str]]:
        if node is target:
            yield from stack
            return
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if not isinstance(child, ast.AST):
                    continue
                guard = stack
                if isinstance(node, ast.If) and field in ("body", "orelse"):
                    guard = [*stack, (node.test, "if")]
                elif isinstance(node, ast.With) and field == "body":
                    guard = [*stack, *((item.context_expr, "with") for item in node.items)]
                yield from visit(child, guard)
    yield from visit(func, [])


def _problem(func: ast.FunctionDef, site: ast.AST, lane_vars: set[str]) -> str | None:
    for expr, kind in _guards(func, site):
        if kind == "with" and _call_name(expr) == "elect_one":
            return "inside `with elect_one()`"
        if kind == "if" and _reads_lane(expr, lane_vars):
            return f"inside the lane-divergent branch `if {ast.unparse(expr)}:`"
    return None


def lint(paths: list[Path]) -> list[Violation]:
    functions: list[tuple[str, ast.FunctionDef]] = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        functions += [(str(path), n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    issuers = {f.name for _, f in functions if any(_is_tma_load(n) for n in ast.walk(f))}
    while True:  # functions that issue a TMA load through a call
        more = {f.name for _, f in functions if f.name not in issuers
                and any(_call_name(n) in issuers for n in ast.walk(f))}
        if not more:
            break
        issuers |= more
    found = []
    for path, func in functions:
        lane_vars = _lane_vars(func)
        for site in ast.walk(func):
            if _is_tma_load(site) or (_call_name(site) in issuers and site is not func):
                what = "TMA load" if _is_tma_load(site) else f"call of {_call_name(site)}() (issues a TMA load)"
                if (why := _problem(func, site, lane_vars)) is not None:
                    found.append(Violation(path, site.lineno, func.name, f"{what} {why}"))
    return found


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    paths = [Path(a) for a in args] or sorted(HOPPER.rglob("*.py"))
    found = lint(paths)
    for v in found:
        print(v)
    print(f"tma_lint: {len(found)} violation(s) in {len(paths)} files")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
