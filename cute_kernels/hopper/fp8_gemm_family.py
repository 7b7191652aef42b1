"""The FP8 GEMM as a KernelFamily: its variants and the SASS its design relies on."""
from __future__ import annotations

from typing import Any

from cute_kernels.toolchain.family import KernelFamily

from .fp8_gemm_check import fp8_gemm_sass_problems
from .fp8_gemm_spec import selected_specs


def _compile(spec, keep_artifacts: bool) -> Any:
    from . import fp8_gemm_compile  # the DSL, only when compiling

    return fp8_gemm_compile.compile_fp8_gemm(spec, keep_artifacts=keep_artifacts)


FP8_GEMM = KernelFamily(
    name="fp8_gemm", specs=selected_specs, compile=_compile, sass_problems=fp8_gemm_sass_problems,
    sources=("hopper/fp8_gemm.py", "hopper/fp8_gemm_layouts.py", "hopper/fp8_gemm_spec.py",
             "hopper/fp8_gemm_compile.py", "hopper/fp8_gemm_family.py", "hopper/fp8_quant_rows.py"),
)
