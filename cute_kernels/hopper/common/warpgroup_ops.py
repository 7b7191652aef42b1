"""Pieces shared by the Hopper attention kernels: the wgmma issue loop, quad reductions over an
accumulator row, the online-softmax update of one S tile (fp32, exp2), and their configuration:
swizzled shared-memory layouts, the two tiled MMAs, the 16-byte cp.async row copy."""
from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from .wgmma_layouts import acc_as_rows_cols

DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
LOG2_E = math.log2(math.e)


@cute.jit
def wgmma_issue(tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor,
                zero_init: cutlass.Constexpr):
    """Issue acc (+)= A @ B over the K blocks of the fragments as one wgmma group (the caller waits)."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)  # a fresh atom: its ACCUMULATE flag is mutated below
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


@cute.jit
def wgmma(tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor,
          zero_init: cutlass.Constexpr):
    """acc (+)= A @ B over the K blocks of the fragments, then wait for completion."""
    wgmma_issue(tiled_mma, acc, tA, tB, zero_init)
    warpgroup.wait_group(0)


@cute.jit
def quad_allreduce_max(x: Float32) -> Float32:
    """Max over the 4 lanes that share an accumulator row."""
    x = cutlass.max(x, cute.arch.shuffle_sync_bfly(x, offset=2))
    return cutlass.max(x, cute.arch.shuffle_sync_bfly(x, offset=1))


@cute.jit
def quad_allreduce_sum(x: Float32) -> Float32:
    x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
    return x + cute.arch.shuffle_sync_bfly(x, offset=1)


@cute.jit
def softmax_update(acc_S, row_max, row_sum, softmax_scale_log2: Float32):
    """S -> P = exp2(S*scale_log2 - running max) in place; update the running max and sum (this
    thread's part of each row: the quad's lanes hold the rest, reduced at the end); return each row's
    correction exp2(old max - new max), by which O must be rescaled."""
    s = acc_as_rows_cols(acc_S)
    correction = cute.make_rmem_tensor_like(row_max)
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        tile_max = s[r, None].load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
        tile_max = quad_allreduce_max(tile_max)
        new_max = cutlass.max(row_max[r], tile_max)
        # A row with every key masked so far keeps max -inf: use 0 so exp2 gives 0, not NaN.
        max_scaled = new_max * softmax_scale_log2 if new_max != -Float32.inf else Float32(0.0)
        p = cute.math.exp2(s[r, None].load() * softmax_scale_log2 - max_scaled, fastmath=True)
        s[r, None].store(p)
        correction[r] = cute.math.exp2(row_max[r] * softmax_scale_log2 - max_scaled, fastmath=True)
        row_sum[r] = row_sum[r] * correction[r] + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        row_max[r] = new_max
    return correction


@cute.jit
def rescale_rows(acc_O, correction):
    """O[r, :] *= correction[r] for this thread's accumulator rows."""
    o = acc_as_rows_cols(acc_O)
    for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
        o[r, None].store(o[r, None].load() * correction[r])


@cute.jit
def online_softmax(acc_S, acc_O, row_max, row_sum, softmax_scale_log2: Float32):
    """S -> P = exp2(S*scale_log2 - running max); rescale O and the running sum."""
    rescale_rows(acc_O, softmax_update(acc_S, row_max, row_sum, softmax_scale_log2))


@cute.jit
def row_lse(row_max: Float32, total: Float32, softmax_scale_log2: Float32) -> Float32:
    """Natural-log LSE of one row from its running max (unscaled) and quad-reduced sum; -inf if empty."""
    lse = -Float32.inf
    if total > 0.0:
        lse = (row_max * softmax_scale_log2 + cute.math.log2(total, fastmath=True)) / LOG2_E
    return lse


# -- configuration shared by the attention kernels (host side of @cute.jit, compile-time values) -----
def swizzled_rows_layout(dtype, head_dim: int, shape: tuple):
    """GMMA-swizzled row-major [rows, head_dim, ...] layout (K-major for Q and K), rows before column
    atoms: the rows of one 64-column (128 B) swizzle span are contiguous."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, head_dim), dtype)
    return cute.tile_to_shape(atom, shape, order=tuple(range(len(shape))))


def attention_tiled_mmas(dtype, head_dim: int, tile_n: int, num_warpgroups: int = 1):
    """S = Q K^T (SS, m64 x tile_n per warpgroup) and O += P V (P from registers, m64 x head_dim)."""
    wg_layout = (num_warpgroups, 1, 1)  # warpgroups split the query rows
    mma_qk = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
        Float32, atom_layout_mnk=wg_layout, tiler_mn=(64, tile_n),
    )
    # V is [keys, d] row-major: as the B operand of P @ V it is MN-major (d contiguous).
    mma_pv = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN,
        Float32, atom_layout_mnk=wg_layout, tiler_mn=(64, head_dim),
        a_source=warpgroup.OperandSource.RMEM,
    )
    return mma_qk, mma_pv


def make_row_copy(dtype, head_dim: int, num_threads: int):
    """cp.async tiled copy: each thread moves 16 B of one row per issue."""
    elems = 128 // dtype.width
    chunks_per_row = head_dim // elems
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128)
    thr_layout = cute.make_ordered_layout((num_threads // chunks_per_row, chunks_per_row), order=(1, 0))
    return cute.make_tiled_copy_tv(atom, thr_layout, cute.make_layout((1, elems)))


@cute.jit
def copy_row_chunk(tiled_copy, dtype: cutlass.Constexpr, mSrc, elem_offset, dst):
    """One 16-byte cp.async from mSrc's element `elem_offset` (Int64: large KV pools)."""
    src_ptr = cute.make_ptr(dtype, mSrc.iterator.toint() + elem_offset * (dtype.width // 8),
                            cute.AddressSpace.gmem, assumed_align=16)
    cute.copy(tiled_copy, cute.make_tensor(src_ptr, dst.layout), dst)
