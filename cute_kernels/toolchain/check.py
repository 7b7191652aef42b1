"""`python -m cute_kernels.check`: compile every kernel variant the runtime uses for sm_90a (no GPU
needed) and print one row per variant: compile seconds, tensor-core MMA count and shapes, TMA / cp.async
loads, setmaxnreg, registers and spills, and whether it exports ahead of time (aot: the .so it links
to alone, or the .o without a CUDA toolkit). Exits non-zero when a variant fails to compile or export,
touches local memory or has a stack frame, exceeds its family's register budget, its SASS lacks the
instructions its design relies on (the kernel fell off the fast path), its setmaxnreg split overflows
the CTA's register pool, or a named barrier breaks the family's inventory (one count and one role per
id; toolchain/resource_checks.py). --verbose prints each variant's pool and barriers, --json stores
them. Families: hopper/families.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .family import KernelFamily


@dataclass
class VariantReport:
    name: str
    compile_s: float | None
    hgmma: int = 0  # warpgroup MMAs, 16-bit (HGMMA) and fp8 (QGMMA)
    hgmma_shapes: str = ""
    tma_loads: int = 0
    tma_stores: int = 0
    cp_async: int = 0
    hmma: int = 0
    setmaxnreg: int = 0
    fsel: int = 0  # float selects (a mask's cost)
    loop_bar: int = 0  # CTA-wide BAR.SYNC inside loops
    registers: int | None = None
    spills: int = 0
    aot: str = "-"  # "so:NNNK" / "o:NNNK" when the variant exports and links, else "FAIL"
    problems: str = ""
    pool: str = "-"  # setmaxnreg registers asked / the CTA's pool at entry
    register_pool: list = field(default_factory=list)  # per kernel: resource_checks.pool_summary
    barriers: list = field(default_factory=list)  # named-barrier inventory rows: id, role, threads, ops, uses

    @property
    def ok(self) -> bool:
        return not self.problems


def common_problems(family: KernelFamily, stats) -> list[str]:
    """What fails any kernel: spills and stack frames (local memory), registers over the budget."""
    problems = []
    if stats.spills:
        problems.append(f"local memory: {stats.local_load} LDL / {stats.local_store} STL")
    if stats.stack_bytes:
        problems.append(f"{stats.stack_bytes}-byte stack frame")
    if stats.registers is not None and stats.registers > family.max_registers:
        problems.append(f"{stats.registers} registers > budget {family.max_registers}")
    if stats.collective_fallbacks:
        problems.append(f"{stats.collective_fallbacks} WARPSYNC.COLLECTIVE: an election (a TMA load's, or "
                        "elect_one) ptxas could not prove warp-converged; inside a lane-divergent branch it hangs "
                        "(python -m cute_kernels.toolchain.tma_lint)")
    return problems


def resource_report(family: KernelFamily, spec, stats, cubin: bytes) -> tuple[list[str], list[dict], list[dict]]:
    """(problems, pool summaries, barrier rows) over the cubin's kernels. A synthetic stats object with
    no kernels passes only when there is no cubin to read (unit tests)."""
    from . import resource_checks as rc

    if not stats.kernels:
        return (["no kernel read from the cubin: setmaxnreg pool and barriers unchecked"] if cubin else []), [], []
    try:
        split = family.register_split(spec) if family.register_split else None
        roles = family.barriers(spec) if family.barriers else ()
    except Exception as exc:  # noqa: BLE001 - a declaration that no longer matches the kernel fails it
        return [f"resource declaration failed: {type(exc).__name__}: {exc}"[:300]], [], []
    problems, pools, rows = [], [], []
    for k in stats.kernels:
        prefix = f"{k.name}: " if len(stats.kernels) > 1 else ""
        problems += [prefix + p for p in rc.kernel_problems(k, split, roles)]
        if split and k.dealloc and k.alloc and k.entry_registers:
            pools.append(rc.pool_summary(k, split))
        rows += rc.inventory_rows(k, roles)
    return problems, pools, rows


def check_variant(family: KernelFamily, spec) -> VariantReport:
    from . import sass

    try:
        compiled = family.compile(spec, True)
    except Exception as exc:  # report every variant, then fail
        return VariantReport(spec.name, None, problems=f"compile failed: {type(exc).__name__}: {exc}"[:300])
    stats = sass.sass_stats(compiled.artifacts["cubin"])
    problems = family.sass_problems(spec, stats) + common_problems(family, stats)
    resource_problems, pools, barriers = resource_report(family, spec, stats, compiled.artifacts["cubin"])
    problems += resource_problems
    aot = check_aot_export(family, spec, compiled, problems) if family.shim else "-"
    return VariantReport(
        spec.name, compiled.compile_seconds, stats.hgmma + stats.qgmma, ",".join(stats.hgmma_shapes),
        stats.tma_load, stats.tma_store, stats.cp_async, stats.hmma, stats.setmaxnreg, stats.fsel,
        stats.loop_cta_barriers, stats.registers, stats.spills, aot,
        "; ".join(problems), ",".join(f"{p['needed']}/{p['available']}" for p in pools) or "-", pools, barriers,
    )


def check_aot_export(family: KernelFamily, spec, compiled, problems: list[str]) -> str:
    """Export + link this variant alone, as `python -m cute_kernels.aot` would; size or FAIL."""
    from .aot_build import link_one

    try:
        with tempfile.TemporaryDirectory(prefix="cute_aot_check_") as work:
            o_bytes, so_bytes = link_one(family, spec, compiled, Path(work))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        problems.append(f"aot export failed: {type(exc).__name__}: {exc}"[:300])
        return "FAIL"
    return f"so:{so_bytes // 1024}K" if so_bytes is not None else f"o:{o_bytes // 1024}K"


def format_table(reports: list[VariantReport]) -> str:
    header = (f"{'variant':<40} {'compile_s':>9} {'GMMA':>5} {'shapes':<40} {'TMA':>4} {'TMAst':>5} {'cp.async':>8} {'maxnreg':>7} "
              f"{'FSEL':>5} {'loopBAR':>7} {'regs':>4} "
              f"{'spills':>6} {'regpool':>11} {'aot':>8}  status")
    lines = [header, "-" * len(header)]
    for r in reports:
        secs = f"{r.compile_s:.1f}" if r.compile_s is not None else "-"
        regs = str(r.registers) if r.registers is not None else "?"
        status = "ok" if r.ok else f"FAIL: {r.problems}"
        lines.append(f"{r.name:<40} {secs:>9} {r.hgmma:>5} {r.hgmma_shapes:<40} {r.tma_loads:>4} {r.tma_stores:>5} "
                     f"{r.cp_async:>8} {r.setmaxnreg:>7} {r.fsel:>5} {r.loop_bar:>7} {regs:>4} {r.spills:>6} "
                     f"{r.pool:>11} {r.aot:>8}  {status}")
    return "\n".join(lines)


def format_resources(reports: list[VariantReport]) -> str:
    """--verbose: each variant's setmaxnreg pool identity and named-barrier inventory."""
    from .resource_checks import format_inventory

    lines = []
    for r in reports:
        pools = "; ".join(p["text"] for p in r.register_pool) or "no setmaxnreg"
        lines.append(f"{r.name}: pool {pools} | barriers {format_inventory(r.barriers) or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None, select: Callable[[bool, list[str] | None], list]) -> int:
    """select(include_unused, only) -> [(family, spec)]: the kernels' registry (cute_kernels/hopper/families.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="also the variants the runtime does not use today")
    parser.add_argument("--only", nargs="*", help="substrings of variant names to keep")
    parser.add_argument("--json", help="also write the reports as JSON to this path")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print setmaxnreg pools and barriers")
    args = parser.parse_args(argv)

    # The DSL writes its cache under $TMPDIR; keep it out of shared temp dirs.
    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="cute_check_"))
    reports = []
    for family, spec in select(args.all, args.only):
        reports.append(check_variant(family, spec))
        print(f"  compiled {spec.name}", file=sys.stderr, flush=True)
    print(format_table(reports))
    if args.verbose:
        print(format_resources(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) | {"ok": r.ok} for r in reports], f, indent=1)
    failed = [r.name for r in reports if not r.ok]
    if failed or not reports:
        print(f"FAILED: {failed or 'no variants selected'}", file=sys.stderr)
        return 1
    return 0

