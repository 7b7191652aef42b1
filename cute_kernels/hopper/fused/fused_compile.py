"""Compile one fused elementwise kernel (FusedOpSpec) for sm_90a against fake tensors (no GPU, no data).

Rows, row widths (multiples of 8) and row strides (64-bit, multiples of 8) are symbolic, so one
compile serves every batch and model of that dtype and size class.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

from cute_kernels.toolchain.compile_cache import CompileCache, CompiledKernel, compile_sm90

from .fused_common import DTYPES
from .fused_norm import AddRmsNormSm90
from .fused_rope import RopeSm90
from .fused_silu import SiluAndMulSm90
from .fused_spec import FP8_VEC, VEC, FusedOpSpec
from .kv_write import KvWriteE4m3Sm90, KvWriteSm90

KERNELS = {"add_rms_norm": AddRmsNormSm90, "rope": RopeSm90, "silu_and_mul": SiluAndMulSm90,
           "write_kv": KvWriteSm90, "write_kv_e4m3": KvWriteE4m3Sm90}


def fake_matrix(dtype, divisibility: int = VEC, align: int = 16):
    """[rows, cols] with unit column stride and a runtime row stride; 16-byte aligned rows."""
    rows, cols = cute.sym_int32(), cute.sym_int32(divisibility=divisibility)
    stride = cute.sym_int(64, divisibility=divisibility)
    return make_fake_tensor(dtype, (rows, cols), (stride, 1), assumed_align=align)


def _fake_write_kv_e4m3(dtype) -> tuple:
    """k, v (dtype, any views of the fused qkv the 16-bit write takes); the e4m3 caches (rows of whole
    16-byte vectors); fp32 scales [2, kv_heads]."""
    cache = lambda: fake_matrix(cutlass.Float8E4M3FN, FP8_VEC)  # noqa: E731
    return fake_matrix(dtype), fake_matrix(dtype), cache(), cache(), fake_matrix(cutlass.Float32, 1, 4)


def fake_fused_arguments(spec: FusedOpSpec) -> tuple:
    """Fake tensors in the argument order of FusedKernelSm90.__call__ (mA..mE, mSlots, scalar, stream)."""
    dtype = DTYPES[spec.dtype]
    kinds = (dtype, cutlass.Float32, cutlass.Float32) if spec.op == "rope" else (dtype,) * 3  # cos/sin fp32
    matrices = tuple(fake_matrix(kind) for kind in kinds + (dtype, dtype))
    if spec.op == "write_kv_e4m3":
        matrices = _fake_write_kv_e4m3(dtype)
    slots = make_fake_compact_tensor(cutlass.Int64, (cute.sym_int32(),), assumed_align=8)
    return (*matrices, slots, cutlass.Float32(1e-6), make_fake_stream())


def compile_fused(spec: FusedOpSpec, keep_artifacts: bool = False) -> CompiledKernel:
    """Compile for sm_90a; with keep_artifacts the PTX text and cubin bytes are returned too."""
    return compile_sm90(KERNELS[spec.op](spec), fake_fused_arguments(spec), spec.name, keep_artifacts)


FUSED_CACHE = CompileCache(compile_fused)
