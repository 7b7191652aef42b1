"""The fused elementwise kernels (add+RMSNorm, RoPE, silu-and-mul, paged KV write) as a KernelFamily:
their variants and the SASS their design relies on: every row moved in 128-bit vectors."""
from __future__ import annotations

from typing import Any

from cute_kernels.toolchain.family import KernelFamily, sources_in

from .fused_spec import FAMILY, FP8_VEC, fused_specs

_MATRIX = ((1, 1), (1, 0))  # [rows, cols], runtime row stride
_SLOTS = ((1,), (0,))
SHIM_ABI = (_MATRIX,) * 5 + (_SLOTS, None, None)  # then the fp32 scalar and the stream
# Occupancy plan: >= 8 CTAs of 256 threads per SM for the norm, more for the others; 64 registers allow it.
MAX_REGISTERS = 64


def fused_sass_problems(spec, stats) -> list[str]:
    """A memory-bound kernel off its fast path moves data in narrow pieces: require 128-bit loads and
    stores and forbid 16-bit element accesses (the slot vector's 64-bit loads are fine)."""
    problems = []
    if not stats.global_load_128:
        problems.append("no 128-bit global loads (LDG.E.128)")
    if not stats.global_store_128:
        problems.append("no 128-bit global stores (STG.E.128)")
    if stats.global_16bit:
        problems.append(f"{stats.global_16bit} 16-bit global accesses (not vectorized)")
    if stats.hgmma or stats.hmma or stats.qgmma:
        problems.append("tensor-core instructions in an elementwise kernel")
    # the quantizing KV write: 16 values of K and of V per vector, packed two at a time, saturated
    if spec.op == "write_kv_e4m3" and stats.fp8_pack < 2 * FP8_VEC // 2:
        problems.append(f"{stats.fp8_pack} F2FP.SATFINITE.E4M3.F32.PACK_AB < {FP8_VEC}: new K/V not quantized "
                        "to e4m3 (saturating)")
    if spec.op != "write_kv_e4m3" and stats.fp8_pack:
        problems.append(f"{stats.fp8_pack} e4m3 conversions in a 16-bit kernel")
    return problems


def _compile(spec, keep_artifacts: bool) -> Any:
    from . import fused_compile  # the DSL, only when compiling

    return fused_compile.compile_fused(spec, keep_artifacts=keep_artifacts)


def _fake_args(spec) -> tuple:
    from .fused_compile import fake_fused_arguments

    return fake_fused_arguments(spec)


FUSED_OPS = KernelFamily(
    name=FAMILY, specs=fused_specs, compile=_compile, sass_problems=fused_sass_problems,
    max_registers=MAX_REGISTERS, fake_args=_fake_args, shim_abi=SHIM_ABI, shim="fused_ops_aot_shim.c",
    sources=(sources_in("hopper/fused", "fused_spec.py", "fused_common.py", "fused_norm.py", "fused_rope.py",
                        "fused_silu.py", "kv_write.py", "fused_compile.py", "fused_family.py")
             + sources_in("toolchain/csrc", "fused_ops_aot.h", "fused_ops_aot_shim.c")),
)
