"""What the FP8 GEMM's SASS must hold, or the kernel fell off its design (pure Python, no DSL):
the compile check's failure rules for the fp8_gemm family."""
from __future__ import annotations

from cute_kernels.toolchain.sass import SassStats
from cute_kernels.toolchain.sass_resources import WARPGROUP, BarrierRole, RegisterSplit

from .fp8_gemm_spec import Fp8GemmSpec, Fp8QuantRowsSpec


def required_qgmma_shape(spec: Fp8GemmSpec) -> str:
    """Each consumer warpgroup issues m64 x tile_n x k32 e4m3 wgmma into fp32."""
    return f"64x{spec.tile_n}x32.F32"


def fp8_gemm_sass_problems(spec: Fp8GemmSpec | Fp8QuantRowsSpec, stats: SassStats) -> list[str]:
    if isinstance(spec, Fp8QuantRowsSpec):
        return quant_rows_sass_problems(spec, stats)
    problems = []
    if not stats.qgmma:
        problems.append("no QGMMA (fp8 warpgroup MMA)")
    elif required_qgmma_shape(spec) not in stats.hgmma_shapes:
        problems.append(f"no QGMMA.{required_qgmma_shape(spec)} (shapes seen: {list(stats.hgmma_shapes)})")
    if stats.hgmma or stats.hmma:
        problems.append(f"{stats.hgmma} HGMMA / {stats.hmma} HMMA: the fp8 operands were widened")
    if not stats.tma_load:
        problems.append("no UTMALDG (TMA loads)")
    if not stats.tma_store:
        problems.append("no UTMASTG (TMA-store epilogue)")
    if not stats.setmaxnreg:
        problems.append("no USETMAXREG (producer/consumer register split)")
    if not stats.mbarrier_waits:
        problems.append("no mbarrier waits (the TMA pipeline is gone)")
    if stats.first_tma_offset is not None and any(o > stats.first_tma_offset for o in stats.cta_barrier_offsets):
        problems.append("CTA-wide BAR.SYNC after the first TMA load: the pipeline stalls on the whole CTA")
    return problems


def quant_rows_sass_problems(spec: Fp8QuantRowsSpec, stats: SassStats) -> list[str]:
    """An elementwise row kernel: any tensor-core or async-copy instruction means a wrong lowering."""
    if stats.qgmma or stats.hgmma or stats.hmma or stats.tma_load:
        return ["matrix or TMA instructions in the row quantizer"]
    return []


def fp8_gemm_register_split(spec: Fp8GemmSpec) -> RegisterSplit:
    """Warpgroup 0 lowers to PRODUCER_REGISTERS, the consumer warpgroups raise to CONSUMER_REGISTERS."""
    from .fp8_gemm import CONSUMER_REGISTERS, PRODUCER_REGISTERS  # the DSL: only when checking

    producers = spec.num_threads // WARPGROUP - spec.num_consumer_warpgroups
    return RegisterSplit(producers, spec.num_consumer_warpgroups, PRODUCER_REGISTERS, CONSUMER_REGISTERS)


def fp8_gemm_barriers(spec: Fp8GemmSpec) -> tuple[BarrierRole, ...]:
    """The consumers' epilogue barrier has no named constant: read from the kernel object's NamedBarrier."""
    from .fp8_gemm import Fp8GemmSm90

    barrier = Fp8GemmSm90(spec).epilogue_barrier
    return (BarrierRole("epilogue", (barrier.barrier_id,), barrier.num_threads),)
