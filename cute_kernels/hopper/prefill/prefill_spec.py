"""What a prefill-attention kernel is specialized on (its compile key) and its tile configuration.

Everything else (batch, sequence lengths, head counts, number of cache blocks, block-table width)
is a runtime value, so prefill chunks of any shape reuse one compiled kernel.
Pure Python: importable without the DSL.
"""
from __future__ import annotations

from dataclasses import dataclass

from cute_kernels.paged_tables import KV_BLOCK_SIZE  # noqa: F401  (its kernels' layout, re-exported)

from ..common.attention_spec import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

FP8_KV = "float8_e4m3fn"  # a paged prefix in an e4m3 cache (per-head scales), dequantized as it is gathered


@dataclass(frozen=True)
class PrefillSpec:
    """Compile-time specialization of the prefill kernel."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # 64 | 128
    qheads_per_kvhead: int  # GQA group size; the query heads of one KV head share a CTA
    causal: bool = True
    kv_dtype: str | None = None  # FP8_KV: the paged prefix is e4m3 (new keys stay 16-bit)

    def __post_init__(self) -> None:
        if self.kv_dtype not in (None, FP8_KV):
            raise ValueError(f"prefill attention: kv_dtype {self.kv_dtype!r} not in (None, {FP8_KV!r})")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"prefill attention: dtype {self.dtype!r} not in {SUPPORTED_DTYPES}")
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"prefill attention: head_dim {self.head_dim} not in {SUPPORTED_HEAD_DIMS}")
        if self.qheads_per_kvhead < 1:
            raise ValueError("prefill attention: qheads_per_kvhead must be >= 1")

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        kv = "_kv_e4m3" if self.fp8_kv else ""
        return f"prefill_{self.dtype}_d{self.head_dim}_g{self.qheads_per_kvhead}_{mask}{kv}"

    @property
    def fp8_kv(self) -> bool:
        return self.kv_dtype == FP8_KV

    @property
    def tile(self) -> "TileConfig":
        return TileConfig.for_head_dim(self.head_dim, self.causal)


@dataclass(frozen=True)
class TileConfig:
    """CTA tile: tile_m packed query rows (token x group head) against tile_n keys."""

    tile_m: int
    tile_n: int
    num_mma_warpgroups: int
    stages: int = 2  # K and V ring depth (shared memory: Q + 2 * stages key tiles)
    # setmaxnreg split of the 65536-register file over 1 producer + 2 MMA warpgroups (multiples of 8;
    # the producer gathers the paged prefix with cp.async, so it keeps 40, not 24)
    producer_registers: int = 40
    mma_registers: int = 232

    @staticmethod
    def for_head_dim(head_dim: int, causal: bool = True) -> "TileConfig":
        if head_dim <= 64 and causal:
            # 192x128 with 3 MMA warpgroups: S (64), O (32) and P (32) fit 160 registers at d 64, and a
            # third warpgroup keeps the tensor cores busy while two run softmax (FlashAttention-3's
            # shape). The non-causal d 64 kernel spills at 160 (12 LDL / 9 STL): it keeps 128x128.
            return TileConfig(tile_m=192, tile_n=128, num_mma_warpgroups=3, producer_registers=32, mma_registers=160)
        # 128x128 with 2 MMA warpgroups (64 rows each) keeps S, P and O in 232 registers at d 128.
        return TileConfig(tile_m=128, tile_n=128, num_mma_warpgroups=2)

    @property
    def launch_registers(self) -> int:
        """What every thread gets at launch: the register file split over the CTA (multiple of 8)."""
        return 65536 // self.num_threads // 8 * 8

    @property
    def num_threads(self) -> int:
        return 128 * (self.num_mma_warpgroups + 1)  # + the producer warpgroup


# The variants the runtime compiles: GQA ratios of the models we serve (1:1, 9:3, 32:8, 8:1).
RUNTIME_GROUP_SIZES = (1, 3, 4, 8)


def runtime_variants() -> list[PrefillSpec]:
    return [
        PrefillSpec(dtype, d, g, causal=True, kv_dtype=kv)
        for kv in (None, FP8_KV)
        for dtype in SUPPORTED_DTYPES
        for d in SUPPORTED_HEAD_DIMS
        for g in RUNTIME_GROUP_SIZES
    ]

