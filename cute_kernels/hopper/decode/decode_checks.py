"""What the decode kernels' SASS must show for their design to hold (python -m cute_kernels.check
fails a variant on any of these, on top of the checks every kernel gets: compile, local memory,
registers over DECODE_MAX_REGISTERS, AOT export)."""
from __future__ import annotations

from typing import Any

from cute_kernels.toolchain.sass_resources import BarrierRole

from .decode_spec import KEYS_PER_TILE, QUERY_ROWS, DecodeSpec

DEQUANT_THREADS = 128  # the consumer warpgroup converts each e4m3 tile (decode_attention.CONSUMER_THREADS)


def required_hgmma_shapes(spec: DecodeSpec) -> set[str]:
    """S = Q K^T is m64 x 64 keys, O += P V is m64 x head_dim, both k16 into fp32."""
    return {f"{QUERY_ROWS}x{KEYS_PER_TILE}x16.F32", f"{QUERY_ROWS}x{spec.head_dim}x16.F32"}


def decode_sass_problems(spec: Any, stats: Any) -> list[str]:
    """Design rules of the decode kernel (the merge kernel is plain loads and shuffles: none)."""
    if not isinstance(spec, DecodeSpec):
        return []
    problems = []
    if not stats.tma_load:
        problems.append("no UTMALDG: the cache blocks are not bulk tensor copies")
    if not stats.mbarrier_waits:
        problems.append("no mbarrier waits (SYNCS.PHASECHK): loads are not completed on the pipeline's mbarriers")
    missing = required_hgmma_shapes(spec) - set(stats.hgmma_shapes)
    if missing:
        problems.append(f"no HGMMA {sorted(missing)}")
    if stats.hmma:
        problems.append(f"{stats.hmma} HMMA (warp-level MMA fallback)")
    if stats.first_tma_offset is None or any(o > stats.first_tma_offset for o in stats.cta_barrier_offsets):
        problems.append("a CTA-wide BAR.SYNC after the first TMA: the main loop must sync on mbarriers only")
    return problems + dequant_problems(spec, stats)


def dequant_problems(spec: DecodeSpec, stats: Any) -> list[str]:
    """An e4m3 cache's tile (K and V, 2 x 64 keys x d bytes over the warpgroup) must be converted in
    registers (F2FP unpacks, two values each) after 16-byte shared loads, and stored back as 16-byte
    vectors; a 16-bit cache's kernel must not convert at all."""
    if not spec.fp8_kv:
        return [f"{stats.fp8_unpack} e4m3 conversions in a 16-bit-cache kernel"] if stats.fp8_unpack else []
    values = 2 * KEYS_PER_TILE * spec.head_dim // DEQUANT_THREADS  # per thread and tile
    problems = []
    if stats.fp8_unpack < values // 2:
        problems.append(f"{stats.fp8_unpack} F2FP.F16.E4M3.UNPACK_B < {values // 2}: the e4m3 tile is not dequantized")
    if stats.shared_load_128 < values // 16:
        problems.append(f"{stats.shared_load_128} LDS.128 < {values // 16}: e4m3 tiles not read in 16-byte vectors")
    if stats.shared_store_128 < values // 8:
        problems.append(f"{stats.shared_store_128} STS.128 < {values // 8}: dequantized tiles not stored in 16-byte "
                        "vectors")
    return problems


def decode_barriers(spec: Any) -> tuple[BarrierRole, ...]:
    """The consumer warpgroup's barrier (the producer warp is not in it); the merge kernel has none.
    No setmaxnreg: one warpgroup and one warp, two CTAs per SM."""
    if not isinstance(spec, DecodeSpec):
        return ()
    from .decode_attention import CONSUMER_BARRIER, CONSUMER_THREADS  # the DSL: only when checking

    return (BarrierRole("consumers", (CONSUMER_BARRIER,), CONSUMER_THREADS),)
