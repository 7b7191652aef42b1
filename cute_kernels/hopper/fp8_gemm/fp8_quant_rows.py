"""Dynamic per-token FP8 quantization for sm_90a: x [M, K] bf16 -> q [M, K] e4m3 and scale [M, 1]
fp32 with scale = amax(|x_row|) / 448 (1 for an all-zero row), q = x / scale. The FP8 GEMM's
activation operand, made in one pass over each row's amax and one over its conversion.

One CTA of 128 threads per row; each thread moves 16-byte chunks (8 bf16 in, 8 e4m3 out). The row's
amax: per thread, then per warp (shuffles), then across the four warps through shared memory. The
second pass re-reads the row, which the first pass left in L1/L2.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory

E4M3_MAX = 448.0
THREADS = 128
VEC = 8  # bf16 elements per 16-byte load


class Fp8QuantRowsSm90:
    @cute.jit
    def __call__(self, x: cute.Tensor, q: cute.Tensor, scale: cute.Tensor, stream: cuda.CUstream):
        self.kernel(x, q, scale).launch(grid=[cute.size(x, mode=[0]), 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, q: cute.Tensor, scale: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        warp = tidx // 32
        x_chunks = cute.zipped_divide(x[(row, None)], (VEC,))  # ((8), (K/8))
        q_chunks = cute.zipped_divide(q[(row, None)], (VEC,))
        n_chunks = cute.size(x_chunks, mode=[1])
        x_frag = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        q_frag = cute.make_rmem_tensor((VEC,), cutlass.Float8E4M3FN)
        warp_amax = cutlass.memory.SmemAllocator().allocate_tensor(cutlass.Float32, cute.make_layout(THREADS // 32), 16)

        amax = cutlass.Float32(0.0)
        for j in range(tidx, n_chunks, THREADS):
            cute.autovec_copy(x_chunks[(None, j)], x_frag)
            chunk_amax = cute.math.absf(x_frag.load().to(cutlass.Float32)).reduce(cute.ReductionOp.MAX, 0.0, 0)
            amax = cutlass.max(amax, chunk_amax)
        amax = cute.arch.warp_reduction_max(amax)
        if tidx % 32 == 0:
            warp_amax[warp] = amax
        cute.arch.barrier()
        for w in cutlass.range_constexpr(THREADS // 32):
            amax = cutlass.max(amax, warp_amax[w])

        row_scale = cutlass.Float32(1.0)
        if amax > 0.0:
            row_scale = amax / E4M3_MAX
        if tidx == 0:
            scale[row, 0] = row_scale
        for j in range(tidx, n_chunks, THREADS):
            cute.autovec_copy(x_chunks[(None, j)], x_frag)
            q_frag.store((x_frag.load().to(cutlass.Float32) / row_scale).to(cutlass.Float8E4M3FN))
            cute.autovec_copy(q_frag, q_chunks[(None, j)])
