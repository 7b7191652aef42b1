"""Every CuTe kernel family the runtime uses, for `python -m cute_kernels.check` and the AOT build.
Cheap to import: each family imports the DSL only when it compiles."""
from __future__ import annotations

from cute_kernels.toolchain.family import KernelFamily

from .decode.decode_family import DECODE, DECODE_MERGE
from .fp8_gemm.fp8_gemm_family import FP8_GEMM, FP8_GEMM_SPLITK, FP8_QUANT
from .fused.fused_family import FUSED_OPS
from .prefill.prefill_family import PREFILL

FAMILIES: tuple[KernelFamily, ...] = (PREFILL, DECODE, DECODE_MERGE, FUSED_OPS, FP8_GEMM, FP8_GEMM_SPLITK, FP8_QUANT)


def selected_variants(include_unused: bool = False, only: list[str] | None = None) -> list[tuple[KernelFamily, object]]:
    """(family, spec) for every variant to check or build, kept to names containing any of `only`."""
    return [(family, spec) for family in FAMILIES for spec in family.selected(include_unused, only)]
