"""What the prefill kernel's SASS must show for its design to be what ptxas built: the checks of
`python -m cute_kernels.check` that can fail (each has a test feeding it stats that lack it).

Pure Python over toolchain.sass.SassStats: no DSL, no GPU.
"""
from __future__ import annotations

from .prefill_spec import PrefillSpec

# 1 producer + 2 MMA warpgroups share the 65536-register file at launch (setmaxnreg moves them later).
MAX_LAUNCH_REGISTERS = 65536 // PrefillSpec("bfloat16", 128, 1).tile.num_threads // 8 * 8


def required_hgmma_shapes(spec: PrefillSpec) -> set[str]:
    """S = Q K^T is m64 x tile_n, O += P V is m64 x head_dim, both k16 into fp32."""
    return {f"64x{spec.tile.tile_n}x16.F32", f"64x{spec.head_dim}x16.F32"}


def prefill_sass_problems(spec: PrefillSpec, stats) -> list[str]:
    """Every way this variant's SASS falls short of the design; empty when it has it all."""
    problems = []
    missing = required_hgmma_shapes(spec) - set(stats.hgmma_shapes)
    if missing:
        problems.append(f"no HGMMA {sorted(missing)}")
    if stats.hmma:
        problems.append(f"{stats.hmma} HMMA (warp-level MMA fallback)")
    if not stats.tma_load:
        problems.append("no UTMALDG (key/value tiles are not loaded by TMA)")
    if not stats.setmaxnreg:
        problems.append("no USETMAXREG (no producer/consumer register split)")
    if not stats.cp_async:
        problems.append("no cp.async (LDGSTS) for the paged prefix")
    if stats.local_load or stats.local_store:
        problems.append(f"local memory: {stats.local_load} LDL / {stats.local_store} STL (spills)")
    if stats.stack_frame:
        problems.append("stack frame")
    if stats.loop_cta_barriers:
        problems.append(f"{stats.loop_cta_barriers} CTA-wide BAR.SYNC inside a loop")
    if stats.registers is not None and stats.registers > MAX_LAUNCH_REGISTERS:
        problems.append(f"{stats.registers} registers at launch > {MAX_LAUNCH_REGISTERS} "
                        f"({spec.tile.num_threads} threads per CTA)")
    return problems
