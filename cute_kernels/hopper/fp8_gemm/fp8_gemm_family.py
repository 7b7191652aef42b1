"""The FP8 GEMM and its per-token activation quantizer as KernelFamilies: their variants, the SASS
their designs rely on, and the C shims of their ahead-of-time export."""
from __future__ import annotations

from typing import Any

from cute_kernels.toolchain.family import KernelFamily, sources_in

from .fp8_gemm_check import fp8_gemm_barriers, fp8_gemm_register_split, fp8_gemm_sass_problems, quant_rows_sass_problems
from .fp8_gemm_spec import quant_specs, selected_specs, split_variants

# What the shims pack per tensor argument: (dynamic shape modes, dynamic stride modes).
_MATRIX = ((1, 1), (1, 0))  # [rows, cols], row stride at runtime, column stride 1
_COLUMN = ((1, 0), (0, 0))  # [rows, 1]
GEMM_SHIM_ABI = (_MATRIX,) * 5 + (None,)  # a, b, c, scale_a, scale_b, stream
SPLIT_SHIM_ABI = (_MATRIX, _MATRIX, ((1, 1, 1), (1, 1, 0)), _MATRIX, _MATRIX, None)  # c: [splits, M, N]
QUANT_SHIM_ABI = (_MATRIX, _MATRIX, _COLUMN, None)  # x, q, scale, stream
_COMMON = sources_in("hopper/fp8_gemm", "fp8_gemm_spec.py", "fp8_gemm_compile.py", "fp8_gemm_family.py") + (
    "toolchain/csrc/fp8_gemm_aot.h",)
_GEMM = sources_in("hopper/fp8_gemm", "fp8_gemm.py", "fp8_gemm_layouts.py", "fp8_gemm_schedule.py")


def _compile(spec, keep_artifacts: bool) -> Any:
    from . import fp8_gemm_compile  # the DSL, only when compiling

    return fp8_gemm_compile.compile_fp8_gemm(spec, keep_artifacts=keep_artifacts)


def _fake_args(spec) -> tuple:
    from . import fp8_gemm_compile

    return fp8_gemm_compile.fake_arguments(spec)


FP8_GEMM = KernelFamily(
    name="fp8_gemm", specs=selected_specs, compile=_compile, sass_problems=fp8_gemm_sass_problems,
    fake_args=_fake_args, shim_abi=GEMM_SHIM_ABI, shim="fp8_gemm_aot_shim.c",
    register_split=fp8_gemm_register_split, barriers=fp8_gemm_barriers,
    sources=_COMMON + _GEMM + ("toolchain/csrc/fp8_gemm_aot_shim.c",),
)

FP8_GEMM_SPLITK = KernelFamily(
    name="fp8_gemm_splitk", specs=lambda include_unused: split_variants(), compile=_compile,
    sass_problems=fp8_gemm_sass_problems, fake_args=_fake_args, shim_abi=SPLIT_SHIM_ABI,
    shim="fp8_gemm_splitk_aot_shim.c", register_split=fp8_gemm_register_split, barriers=fp8_gemm_barriers,
    sources=_COMMON + _GEMM + sources_in("toolchain/csrc", "fp8_gemm_aot_shim.c", "fp8_gemm_splitk_aot_shim.c"),
)

FP8_QUANT = KernelFamily(
    name="fp8_quant", specs=quant_specs, compile=_compile, sass_problems=quant_rows_sass_problems,
    fake_args=_fake_args, shim_abi=QUANT_SHIM_ABI, shim="fp8_quant_aot_shim.c",
    sources=_COMMON + ("hopper/fp8_gemm/fp8_quant_rows.py", "toolchain/csrc/fp8_quant_aot_shim.c"),
)
