"""The prefill-attention kernel as a KernelFamily: its variants and the SASS its design relies on."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from cute_kernels.toolchain.family import KernelFamily, sources_in
from cute_kernels.toolchain.sass_resources import WARPGROUP, BarrierRole, RegisterSplit

from .prefill_spec import PrefillSpec, runtime_variants

# What csrc/prefill_aot_shim.c packs for each tensor argument: (dynamic shape modes, dynamic stride modes).
_ROWS = ((1, 1, 0), (1, 0, 0))  # q, k, v, out: [tokens, heads, d]
_CACHE = ((1, 0, 1, 0), (1, 1, 0, 0))  # [num_blocks, 16, kv_heads, d]
_TABLE = ((1, 1), (1, 0))  # block_tables [batch, max_blocks], lse [total_q, heads]
_VECTOR = ((1,), (0,))  # prefix_lens, cu_seqlens_q, cu_seqlens_k
SHIM_ABI = (_ROWS, _ROWS, _ROWS, _CACHE, _CACHE, _TABLE, _VECTOR, _VECTOR, _VECTOR, _ROWS, _TABLE, _VECTOR,
            _VECTOR, _VECTOR)  # ..., tile_order, then k_scale and v_scale [kv_heads]


def prefill_specs(include_unused: bool) -> list:
    """The runtime's variants; include_unused adds the non-causal ones (of a 16-bit cache: the GPU tests
    run those; the e4m3 prefix only ever meets the runtime's causal chunks)."""
    specs = runtime_variants()
    if include_unused:
        specs += [replace(s, causal=False) for s in specs if not s.fp8_kv]
    return specs


def required_hgmma_shapes(spec) -> set[str]:
    """S = Q K^T is m64 x tile_n, O += P V is m64 x head_dim, both k16 into fp32."""
    return {f"64x{spec.tile.tile_n}x16.F32", f"64x{spec.head_dim}x16.F32"}


def prefill_sass_problems(spec, stats) -> list[str]:
    """Every way this variant's SASS falls short of the warp-specialized design (spills, stack frames
    and registers over budget fail every family in toolchain/check.py)."""
    problems = []
    missing = required_hgmma_shapes(spec) - set(stats.hgmma_shapes)
    if missing:
        problems.append(f"no HGMMA {sorted(missing)}")
    if stats.hmma:
        problems.append(f"{stats.hmma} HMMA (warp-level MMA fallback)")
    if not stats.tma_load:
        problems.append("no UTMALDG (key/value tiles are not loaded by TMA)")
    if not stats.tma_store:
        problems.append("no UTMASTG (the output tile does not leave through shared memory by TMA)")
    if not stats.setmaxnreg:
        problems.append("no USETMAXREG (no producer/consumer register split)")
    if not stats.cp_async:
        problems.append("no cp.async (LDGSTS) for the paged prefix")
    if stats.loop_cta_barriers:
        problems.append(f"{stats.loop_cta_barriers} CTA-wide BAR.SYNC inside a loop")
    if not stats.exp2_after_overlapped:
        problems.append("no MUFU.EX2 after a PV wgmma left in flight (no softmax / PV GEMM overlap)")
    elif 2 * stats.overlapped_exp2 < stats.exp2_after_overlapped:
        problems.append(f"{stats.overlapped_exp2} of {stats.exp2_after_overlapped} MUFU.EX2 after a PV wgmma "
                        "issue run before its wait (the softmax does not overlap the PV GEMM)")
    tile = spec.tile
    if stats.registers is not None and stats.registers > tile.launch_registers:
        problems.append(f"{stats.registers} registers at launch > {tile.launch_registers} "
                        f"({tile.num_threads} threads share the register file)")
    return problems + prefix_dequant_problems(spec, stats)


PRODUCER_THREADS = 128  # the producer warpgroup gathers the paged prefix (prefill_attention.producer_threads)


def prefix_dequant_problems(spec, stats) -> list[str]:
    """An e4m3 prefix is converted by the producer as it is gathered: per thread and key tile (K and V)
    tile_n x d / 8 / 128 chunks of 8 values, 4 F2FP unpacks each; a 16-bit variant converts nothing."""
    if not spec.fp8_kv:
        return [f"{stats.fp8_unpack} e4m3 conversions in a 16-bit-cache kernel"] if stats.fp8_unpack else []
    unpacks = 2 * 4 * spec.tile.tile_n * spec.head_dim // 8 // PRODUCER_THREADS
    if stats.fp8_unpack < unpacks:
        return [f"{stats.fp8_unpack} F2FP.F16.E4M3.UNPACK_B < {unpacks}: the e4m3 prefix is not dequantized"]
    return []


# The largest launch share over the tile shapes (the producer and MMA warpgroups' setmaxnreg move
# registers between them later); each variant is held to its own shape's share above.
LAUNCH_REGISTERS = max(PrefillSpec("bfloat16", d, 1).tile.launch_registers for d in (64, 128))


def prefill_register_split(spec) -> RegisterSplit:
    """Warpgroup 0 (the producer) lowers, the MMA warpgroups raise: what the kernel object is built with."""
    from .prefill_attention import PrefillAttentionSm90  # the DSL: only when checking

    k = PrefillAttentionSm90(spec)
    return RegisterSplit(k.producer_threads // WARPGROUP, k.num_wg, k.producer_regs, k.mma_regs)


def prefill_barriers(spec) -> tuple[BarrierRole, ...]:
    """The ids are the kernel's constants; the counts what its barrier calls pass (the producer and MMA
    thread counts have no named constant: the kernel object's producer_threads / mma_threads)."""
    from .prefill_attention import PrefillAttentionSm90
    from .prefill_epilogue import EPILOGUE_BARRIER_ID
    from .prefill_loads import PRODUCER_BARRIER_ID
    from .prefill_mma import PAIR, SCHEDULER_BARRIER_ID

    k = PrefillAttentionSm90(spec)
    turns = tuple(SCHEDULER_BARRIER_ID + wg for wg in range(k.num_wg))  # SCHEDULER_BARRIER_ID + wg at run time
    return (BarrierRole("producer", (PRODUCER_BARRIER_ID,), k.producer_threads),
            BarrierRole("scheduler", turns, PAIR, computed=True),
            BarrierRole("epilogue", (EPILOGUE_BARRIER_ID,), k.mma_threads))


def _compile(spec, keep_artifacts: bool) -> Any:
    from . import prefill_compile  # the DSL, only when compiling

    return prefill_compile.compile_prefill(spec, keep_artifacts=keep_artifacts)


def _fake_args(spec) -> tuple:
    from .prefill_compile import fake_prefill_arguments

    return fake_prefill_arguments(spec)


PREFILL = KernelFamily(
    name="prefill", specs=prefill_specs, compile=_compile, sass_problems=prefill_sass_problems,
    max_registers=LAUNCH_REGISTERS, fake_args=_fake_args, shim_abi=SHIM_ABI, shim="prefill_aot_shim.c",
    register_split=prefill_register_split, barriers=prefill_barriers,
    sources=(sources_in("hopper/prefill", "prefill_attention.py", "prefill_loads.py", "prefill_mma.py",
                        "prefill_epilogue.py", "prefill_tma.py", "prefill_tile_order.py", "prefill_schedule.py",
                        "prefill_spec.py", "prefill_compile.py", "prefill_family.py")
             + sources_in("hopper/common", "wgmma_layouts.py", "warpgroup_ops.py", "attention_spec.py") + ("paged_tables.py",)
             + sources_in("toolchain/csrc", "prefill_aot.h", "prefill_aot_shim.c")),
)
