"""What the paged decode-attention kernels are specialized on, their tile plan, and the split-KV
heuristic. Pure Python: importable without the DSL (the host, the AOT loader and the tests use it).

Everything but dtype and head_dim is a runtime value: batch, context lengths, query and KV head
counts (so the GQA group), query tokens per sequence, cache size, table width and the split count.
"""
from __future__ import annotations

from dataclasses import dataclass

from cute_kernels.paged_tables import KV_BLOCK_SIZE

from ..common.attention_spec import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

KEYS_PER_TILE = 64  # keys per pipeline stage: 4 cache blocks, the N of S = Q K^T (a wgmma N)
BLOCKS_PER_TILE = KEYS_PER_TILE // KV_BLOCK_SIZE
QUERY_ROWS = 64  # packed (query token x query head of one KV head) rows: one wgmma M
MAX_SPLITS = 32  # the merge kernel reduces split LSEs across one warp's lanes
H100_SMS = 132  # H100 SXM and H200
MIN_TILES_PER_SPLIT = 4  # 256 keys: below that a split's fixed cost (Q load, epilogue, merge) dominates
FP8_KV = "float8_e4m3fn"  # the quantized cache's element type (torch.float8_e4m3fn, static per-head scales)
KV_DTYPES = (None, FP8_KV)  # None: the cache holds the compute dtype


@dataclass(frozen=True)
class DecodeSpec:
    """Compile-time specialization of the split-KV decode kernel."""

    dtype: str  # "bfloat16" | "float16": Q, O and the math
    head_dim: int  # 64 | 128
    kv_dtype: str | None = None  # FP8_KV: an e4m3 cache, dequantized in shared memory (decode_dequant.py)

    def __post_init__(self) -> None:
        _check(self.dtype, self.head_dim, "decode attention")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"decode attention: kv_dtype {self.kv_dtype!r} not in {KV_DTYPES}")

    @property
    def fp8_kv(self) -> bool:
        return self.kv_dtype == FP8_KV

    @property
    def name(self) -> str:
        return f"decode_{self.dtype}_d{self.head_dim}" + ("_kv_e4m3" if self.fp8_kv else "")

    @property
    def kv_elem_bytes(self) -> int:
        return 1 if self.fp8_kv else 2

    @property
    def stages(self) -> int:
        """Shared-memory stages: sized so that two CTAs fit an SM (2 x 112 KiB of 227 KiB) and each
        keeps 2-3 stages (64-96 KiB of K/V) in flight, about what one SM needs to cover HBM latency.
        An e4m3 stage is half the bytes, and one 16-bit tile of K and V is the dequantized copy the
        wgmmas read: 4 (d128) or 8 (d64) stages fit the same 112 KiB and keep as many bytes in flight."""
        if self.fp8_kv:
            return 4 if self.head_dim == 128 else 8
        return 3 if self.head_dim == 128 else 6

    @property
    def smem_bytes(self) -> int:
        kv = 2 * self.stages * KEYS_PER_TILE * self.head_dim * self.kv_elem_bytes
        staged = 2 * KEYS_PER_TILE * self.head_dim * 2 if self.fp8_kv else 0
        return kv + staged + QUERY_ROWS * self.head_dim * 2 + 2 * 8 * self.stages


@dataclass(frozen=True)
class DecodeMergeSpec:
    """Compile-time specialization of the kernel that merges split-KV partial results."""

    dtype: str
    head_dim: int

    def __post_init__(self) -> None:
        _check(self.dtype, self.head_dim, "decode merge")

    @property
    def name(self) -> str:
        return f"decode_merge_{self.dtype}_d{self.head_dim}"


def _check(dtype: str, head_dim: int, what: str) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{what}: dtype {dtype!r} not in {SUPPORTED_DTYPES}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{what}: head_dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")


# The kernel holds 2 CTAs per SM: 2 x 160 threads x registers <= 64K, so at most 200 (a multiple of 8).
DECODE_MAX_REGISTERS = 200
CTAS_PER_SM = 2


def decode_specs(include_unused: bool = False) -> list:
    """Every variant the runtime can pick: decode and merge kernels for each dtype and head_dim."""
    pairs = [(dtype, d) for dtype in SUPPORTED_DTYPES for d in SUPPORTED_HEAD_DIMS]
    return ([DecodeSpec(*p, kv_dtype=kv) for kv in KV_DTYPES for p in pairs]
            + [DecodeMergeSpec(*p) for p in pairs])


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def num_splits(batch: int, kv_heads: int, max_context: int, num_sms: int = H100_SMS) -> int:
    """How many parallel partitions of each sequence's context (flash-decoding).

    One CTA per (sequence, KV head) already fills the GPU when there are at least as many as the SMs
    hold at once (CTAS_PER_SM each): then splitting only adds partial writes and a merge. Below that,
    split so that about one full wave runs, but keep every split at least MIN_TILES_PER_SPLIT tiles
    long, and at most MAX_SPLITS (the merge's warp-wide reduction).
    """
    ctas = batch * kv_heads
    slots = num_sms * CTAS_PER_SM
    if ctas <= 0 or ctas >= slots:
        return 1
    tiles = ceil_div(max(max_context, 1), KEYS_PER_TILE)
    by_length = max(1, tiles // MIN_TILES_PER_SPLIT)
    return max(1, min(ceil_div(slots, ctas), by_length, MAX_SPLITS))


def split_tile_range(split: int, splits: int, context_len: int) -> tuple[int, int]:
    """[first, last) key tiles of `split`: the sequence's tiles in equal contiguous runs (the last
    runs may be short or empty). The kernel's decode_schedule.split_tiles as a range (a CPU test
    checks the two agree, and the cover)."""
    tiles = ceil_div(context_len, KEYS_PER_TILE)
    per_split = ceil_div(tiles, splits)
    first = min(split * per_split, tiles)
    return first, min(first + per_split, tiles)
