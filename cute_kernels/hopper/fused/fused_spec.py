"""What the fused elementwise kernels of a decoder layer are specialized on (their compile keys).

Four ops share one kernel signature and one AOT ABI (hopper/fused_abi.py): add+RMSNorm (residual add
fused, both outputs written), RoPE (rotate-half, fp32 cos/sin), silu-and-mul, and writing new K/V
into the paged cache through slot_mapping. Row counts, row widths and row strides are runtime
values; only the dtype and, where a loop bound depends on it, a size are compiled in.
Pure Python: importable without the DSL.
"""
from __future__ import annotations

from dataclasses import dataclass

FAMILY = "fused_ops"
OPS = ("add_rms_norm", "rope", "silu_and_mul", "write_kv", "write_kv_e4m3")
DTYPES = ("bfloat16", "float16")
VEC_BYTES = 16  # every global load/store of a row is one 128-bit vector: 8 bf16/fp16 or 4 fp32
VEC = 8  # 16-bit elements per vector; row widths must be multiples of it
FP8_VEC = 16  # e4m3 elements per 128-bit vector (the quantizing KV write stores whole ones)
E4M3_MAX = 448.0  # largest finite float8_e4m3fn: quantized values saturate to it
# add+RMSNorm keeps its whole row in registers; a size class is the widest row it takes. At most 4
# vectors (32 values) per thread: 8 spilled to local memory, so the widest class uses 512 threads.
NORM_SIZE_CLASSES = (2048, 4096, 8192, 16384)  # Llama 3 8B's hidden size is 4096, 70B's 8192
ROPE_HEAD_DIMS = (64, 128)


def norm_size_class(width: int) -> int | None:
    """The smallest size class whose register row holds `width` elements; None when none does."""
    return next((c for c in NORM_SIZE_CLASSES if width <= c), None)


def norm_threads(size_class: int) -> int:
    return 512 if size_class > 8192 else 256


def norm_vectors_per_thread(size_class: int) -> int:
    return size_class // (norm_threads(size_class) * VEC)


@dataclass(frozen=True)
class FusedOpSpec:
    """op: one of OPS; size: the norm's size class or rope's head_dim (0 for the others);
    residual: add+RMSNorm with a residual input (False for the first layer, whose residual is x)."""

    op: str
    dtype: str
    size: int = 0
    residual: bool = False

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"fused ops: op {self.op!r} not in {OPS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"fused ops: dtype {self.dtype!r} not in {DTYPES}")
        sizes = {"add_rms_norm": NORM_SIZE_CLASSES, "rope": ROPE_HEAD_DIMS, "write_kv_e4m3": ROPE_HEAD_DIMS}.get(
            self.op, (0,))
        if self.size not in sizes:
            raise ValueError(f"fused ops: {self.op} size {self.size} not in {sizes}")
        if self.residual and self.op != "add_rms_norm":
            raise ValueError(f"fused ops: {self.op} takes no residual")

    @property
    def name(self) -> str:
        suffix = {"add_rms_norm": f"_w{self.size}{'_res' if self.residual else ''}", "rope": f"_d{self.size}",
                  "write_kv_e4m3": f"_d{self.size}"}
        return f"{FAMILY}_{self.op}_{self.dtype}{suffix.get(self.op, '')}"


def runtime_variants() -> list[FusedOpSpec]:
    """Every variant the runtime can pick: both 16-bit dtypes, every size class and head_dim."""
    specs = []
    for dtype in DTYPES:
        specs += [FusedOpSpec("add_rms_norm", dtype, c, r) for c in NORM_SIZE_CLASSES for r in (False, True)]
        specs += [FusedOpSpec("rope", dtype, d) for d in ROPE_HEAD_DIMS]
        specs += [FusedOpSpec("silu_and_mul", dtype), FusedOpSpec("write_kv", dtype)]
        specs += [FusedOpSpec("write_kv_e4m3", dtype, d) for d in ROPE_HEAD_DIMS]  # head_dim: a head's scale
    return specs


def fused_specs(include_unused: bool = False) -> list[FusedOpSpec]:
    """The family's variants (include_unused changes nothing: the runtime can pick every one)."""
    return runtime_variants()
