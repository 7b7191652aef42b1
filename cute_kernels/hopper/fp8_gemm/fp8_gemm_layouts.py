"""Compile-time layout choices of the FP8 GEMM: the warpgroup MMA, shared-memory tiles, pipeline
depth and the TMA atoms. Separate from the kernel body so the body reads as the algorithm."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

from .fp8_gemm_schedule import stage_tx_bytes
from .fp8_gemm_spec import TILE_K, Fp8GemmSpec

SMEM_BYTES = 232448  # sm_90 dynamic shared memory per CTA
MAX_STAGES = 8  # deeper buys nothing once the loads of a tile are all in flight
EPI_TILE_N = 32  # bf16 columns per epilogue sub-tile (a 64- or 128-row strip through shared memory)
EPI_STAGES = 4


def make_tiled_mma(spec: Fp8GemmSpec) -> cute.TiledMma:
    """One m64 x tile_n x k32 e4m3 wgmma atom per consumer warpgroup, stacked along M."""
    k_major = warpgroup.OperandMajorMode.K
    return sm90_utils.make_trivial_tiled_mma(
        cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, k_major, k_major, cutlass.Float32,
        (spec.num_consumer_warpgroups, 1, 1), tiler_mn=(64, spec.tile_n),
    )


def out_dtype(spec: Fp8GemmSpec):
    """bf16 C, or the fp32 split-K workspace."""
    return cutlass.Float32 if spec.split_k else cutlass.BFloat16


def num_ab_stages(spec: Fp8GemmSpec) -> int:
    ab_bytes = stage_tx_bytes(spec.tile_m, spec.tile_n)
    epi_bytes = spec.tile_m * EPI_TILE_N * out_dtype(spec).width // 8 * EPI_STAGES
    stages = (SMEM_BYTES - 1024 - epi_bytes) // ab_bytes
    if stages < 4:
        raise ValueError(f"{spec.name}: only {stages} pipeline stages fit in shared memory")
    return min(stages, MAX_STAGES)


def _staged(atom_kind, dtype, shape_mn: tuple[int, int], major_size: int, stages: int):
    atom = warpgroup.make_smem_layout_atom(atom_kind(dtype, major_size), dtype)
    return cute.tile_to_shape(atom, (*shape_mn, stages), order=(0, 1, 2))


def smem_layouts(spec: Fp8GemmSpec, stages: int):
    """(A, B, C) staged shared-memory layouts: A and B K-major with the widest swizzle a 128-byte
    k row allows; C row-major epilogue strips."""
    pick = lambda layout, dtype, size: sm90_utils.get_smem_layout_atom(layout, dtype, size)  # noqa: E731
    row_major = utils.LayoutEnum.ROW_MAJOR
    a = _staged(lambda d, s: pick(row_major, d, s), cutlass.Float8E4M3FN, (spec.tile_m, TILE_K), TILE_K, stages)
    b = _staged(lambda d, s: pick(row_major, d, s), cutlass.Float8E4M3FN, (spec.tile_n, TILE_K), TILE_K, stages)
    c = _staged(lambda d, s: pick(row_major, d, s), out_dtype(spec), (spec.tile_m, EPI_TILE_N), EPI_TILE_N,
                EPI_STAGES)
    return a, b, c


def tma_load(tensor: cute.Tensor, staged, tile: tuple[int, int]):
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), tensor,
                                       cute.slice_(staged, (None, None, 0)), tile)


def tma_store(tensor: cute.Tensor, staged, tile: tuple[int, int]):
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), tensor,
                                       cute.slice_(staged, (None, None, 0)), tile)


def with_batch_mode(t: cute.Tensor) -> cute.Tensor:
    """(rows, cols) -> (rows, cols, 1): the tile scheduler and TMA partitions speak (M, N, L)."""
    layout = cute.make_layout((t.shape[0], t.shape[1], 1), stride=(t.stride[0], t.stride[1], 0))
    return cute.make_tensor(t.iterator, layout)


def splits_last(t: cute.Tensor) -> cute.Tensor:
    """The split-K workspace [splits, rows, cols] -> (rows, cols, splits): the split is the batch mode."""
    layout = cute.make_layout((t.shape[1], t.shape[2], t.shape[0]), stride=(t.stride[1], t.stride[2], t.stride[0]))
    return cute.make_tensor(t.iterator, layout)


def persistent_grid(c_mnl: cute.Tensor, spec: Fp8GemmSpec, num_sms: int):
    """Scheduler parameters over C's tiles, and a grid of min(tiles, SMs) CTAs."""
    tiles = cute.zipped_divide(c_mnl, tiler=(spec.tile_m, spec.tile_n))
    num_tiles_mnl = tiles[(0, (None, None, None))].shape
    params = utils.PersistentTileSchedulerParams(num_tiles_mnl, (1, 1, 1), 1, True)
    return params, utils.StaticPersistentTileScheduler.get_grid_shape(params, num_sms)
