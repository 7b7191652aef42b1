"""What an FP8 GEMM kernel is specialized on (its compile key), and which variant serves which M.

C[M, N] = (A[M, K] x B[N, K]^T) * scales, A and B e4m3, C bf16. M, N and K are runtime values, so
one compiled kernel serves every batch and every weight shape of a model.
Pure Python: importable without the DSL.
"""
from __future__ import annotations

from dataclasses import dataclass

# "rowwise": scale_a [M, 1] per token x scale_b [N, 1] per output channel, applied in the epilogue.
# "block128": scale_a [M, K/128] per (token, 128-wide k block) x scale_b [N/128, K/128] per 128x128
# weight block (DeepSeek-V3 / DeepGEMM), applied as each k-tile's partial sum is promoted.
SCALE_MODES = ("rowwise", "block128")
SCALE_BLOCK = 128
TILE_K = 128  # 4 wgmma k-blocks of k32 for fp8: one promotion (and one scale block) per k-tile
NUM_SMS = 132  # H100 SXM / H200: the persistent grid's size
SMALL_M = 64  # rows at or below this take the decode tile
MAX_SPLITS = 16  # split-K: more partials cost more workspace traffic than the extra CTAs win
MIN_K_TILES_PER_SPLIT = 4  # each split streams >= 512 of K, so its prologue and epilogue stay a small share


@dataclass(frozen=True)
class Fp8GemmSpec:
    scale_mode: str
    tile_m: int  # 64: one consumer warpgroup; 128: two, 64 rows each
    tile_n: int  # divides 128, so a tile never straddles a weight scale block
    # split_k: C is an fp32 workspace [splits, M, N]; the CTA on tile (m, n, split) sums only that
    # split's k-tiles (scales applied), and a reduction adds the splits into bf16 (host: fp8_gemm_launch).
    split_k: bool = False

    def __post_init__(self) -> None:
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"fp8 gemm: scale_mode {self.scale_mode!r} not in {SCALE_MODES}")
        if self.tile_m not in (64, 128) or self.tile_n not in (64, 128):
            raise ValueError(f"fp8 gemm: tile {self.tile_m}x{self.tile_n}; tile_m and tile_n in (64, 128)")

    @property
    def name(self) -> str:
        return f"fp8_gemm{'_splitk' if self.split_k else ''}_{self.scale_mode}_{self.tile_m}x{self.tile_n}"

    @property
    def num_consumer_warpgroups(self) -> int:
        return self.tile_m // 64

    @property
    def num_threads(self) -> int:  # one producer warpgroup + the consumers
        return 128 * (1 + self.num_consumer_warpgroups)


@dataclass(frozen=True)
class Fp8QuantRowsSpec:
    """The per-token activation quantizer (bf16 rows -> e4m3 + one fp32 scale per row); one variant."""

    name: str = "fp8_quant_rows_bf16"


def spec_for(scale_mode: str, m: int) -> Fp8GemmSpec:
    """Decode-sized M takes 64x64 tiles (twice the CTAs over N, so more loads in flight for the
    bandwidth-bound case); prefill-sized M takes 128x128 with two consumer warpgroups."""
    if m <= SMALL_M:
        return Fp8GemmSpec(scale_mode, 64, 64)
    return Fp8GemmSpec(scale_mode, 128, 128)


def num_splits(m: int, n: int, k: int) -> int:
    """How many CTAs share each output tile's K: decode-sized M whose tiles leave SMs idle splits K
    until about every SM has a CTA, each split keeping >= MIN_K_TILES_PER_SPLIT k-tiles; the count is
    then evened out so no split is empty (splits x ceil(k_tiles / splits) covers k_tiles once)."""
    spec = spec_for("rowwise", m)
    tiles = -(-m // spec.tile_m) * -(-n // spec.tile_n)
    k_tiles = -(-k // TILE_K)
    if m > SMALL_M or tiles >= NUM_SMS:
        return 1
    splits = min(NUM_SMS // tiles, k_tiles // MIN_K_TILES_PER_SPLIT, MAX_SPLITS)
    if splits <= 1:
        return 1
    return -(-k_tiles // -(-k_tiles // splits))


def runtime_variants() -> list[Fp8GemmSpec]:
    plain = [spec_for(mode, m) for mode in SCALE_MODES for m in (1, SMALL_M + 1)]
    return plain + split_variants()


def split_variants() -> list[Fp8GemmSpec]:
    return [Fp8GemmSpec(mode, 64, 64, split_k=True) for mode in SCALE_MODES]


def quant_specs(include_unused: bool = False) -> list[Fp8QuantRowsSpec]:
    return [Fp8QuantRowsSpec()]


def selected_specs(include_unused: bool = False) -> list[Fp8GemmSpec]:
    """The plain-output variants (the fp8_gemm family; split_variants() are fp8_gemm_splitk's)."""
    specs = [s for s in runtime_variants() if not s.split_k]
    if include_unused:
        specs += [Fp8GemmSpec(mode, 128, 64) for mode in SCALE_MODES]
    return specs
