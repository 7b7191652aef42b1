"""What a prefill-attention kernel is specialized on (its compile key) and its tile configuration.

Everything else (batch, sequence lengths, head counts, number of cache blocks, block-table width)
is a runtime value, so prefill chunks of any shape reuse one compiled kernel.
Pure Python: importable without the DSL.
"""
from __future__ import annotations

from dataclasses import dataclass

KV_BLOCK_SIZE = 16  # tokens per paged-KV block; the runtime's cache layout
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class PrefillSpec:
    """Compile-time specialization of the prefill kernel."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # 64 | 128
    qheads_per_kvhead: int  # GQA group size; the query heads of one KV head share a CTA
    causal: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"prefill attention: dtype {self.dtype!r} not in {SUPPORTED_DTYPES}")
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"prefill attention: head_dim {self.head_dim} not in {SUPPORTED_HEAD_DIMS}")
        if self.qheads_per_kvhead < 1:
            raise ValueError("prefill attention: qheads_per_kvhead must be >= 1")

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"prefill_{self.dtype}_d{self.head_dim}_g{self.qheads_per_kvhead}_{mask}"

    @property
    def tile(self) -> "TileConfig":
        return TileConfig.for_head_dim(self.head_dim)


@dataclass(frozen=True)
class TileConfig:
    """CTA tile: tile_m packed query rows (token x group head) against tile_n keys."""

    tile_m: int
    tile_n: int
    num_mma_warpgroups: int

    @staticmethod
    def for_head_dim(head_dim: int) -> "TileConfig":
        # 128x128 with 2 warpgroups (64 rows each) keeps S and O in registers for d <= 128.
        return TileConfig(tile_m=128, tile_n=128, num_mma_warpgroups=2)

    @property
    def num_threads(self) -> int:
        return 128 * self.num_mma_warpgroups


# The variants the runtime compiles: GQA ratios of the models we serve (1:1, 9:3, 32:8, 8:1).
RUNTIME_GROUP_SIZES = (1, 3, 4, 8)


def runtime_variants() -> list[PrefillSpec]:
    return [
        PrefillSpec(dtype, d, g, causal=True)
        for dtype in SUPPORTED_DTYPES
        for d in SUPPORTED_HEAD_DIMS
        for g in RUNTIME_GROUP_SIZES
    ]

