"""FP8 (e4m3) GEMM for sm_90a: C[M, N] = (A[M, K] x B[N, K]^T) * scales, in bf16.

Warp-specialized and persistent: warpgroup 0 (registers lowered with setmaxnreg) walks the tile
scheduler and TMA-loads A and B k-tiles into a 4-8 stage mbarrier pipeline; the consumer
warpgroups (registers raised), 64 rows each, run e4m3 wgmma (QGMMA) over each 128-wide k-tile into
a fresh fp32 partial sum, then promote it into the fp32 accumulator. The tensor core accumulates
fp8 products in a reduced-precision adder, so promoting every 128 of K keeps long K at fp32
precision (CUTLASS's fp8 "2xacc", DeepGEMM). A warpgroup waits for its k-tile's wgmma before it
promotes, so its consecutive k-tiles do not overlap on the tensor core (the loads stay stages ahead;
two consumer warpgroups interleave). In block128 mode the promotion also applies that k block's
scales, loaded before the wait so their latency hides; in rowwise mode the scales are applied once in the epilogue, which converts to bf16 and
leaves through shared memory and a TMA store. Rows past M and columns past N read clamped scales
and are dropped by the TMA store; the k tail past K is zero-filled by the TMA load.
Split-K (spec.split_k, for decode-sized M whose output tiles leave SMs idle): the scheduler's batch
mode is the split; the CTA on tile (m, n, s) runs only split s's k-tiles, applies the scales as above
and stores its fp32 partial into workspace[s] by the same TMA-store epilogue (fp32 strips); the host
sums the splits into bf16 (fp8_gemm_launch).
Per-tile control flow (k range per split, expect-tx bytes, epilogue buffer) is fp8_gemm_schedule.py's,
shared with the protocol model (hopper/protocol).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from . import fp8_gemm_layouts as layouts
from . import fp8_gemm_schedule as schedule
from .fp8_gemm_spec import NUM_SMS, SCALE_BLOCK, TILE_K, Fp8GemmSpec

PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232  # 128 x 40 + 256 x 232 fits the 64K-register file with two consumers


class Fp8GemmSm90:
    def __init__(self, spec: Fp8GemmSpec):
        self.spec = spec
        self.block_scaled = spec.scale_mode == "block128"
        self.tile_mnk = (spec.tile_m, spec.tile_n, TILE_K)
        self.num_consumer_threads = 128 * spec.num_consumer_warpgroups
        self.stages = layouts.num_ab_stages(spec)
        self.epi_tile = (spec.tile_m, layouts.EPI_TILE_N)
        self.out_dtype = layouts.out_dtype(spec)
        # Named barrier 0 is __syncthreads; 1 orders the consumers' epilogue sub-tiles.
        self.epilogue_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_consumer_threads)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor,
                 scale_b: cute.Tensor, stream: cuda.CUstream):
        """a [M, K] and b [N, K] e4m3, c [M, N] bf16 (split_k: fp32 [splits, M, N]), all K-/N-contiguous;
        scale_a [M, 1] and scale_b [N, 1] fp32 (rowwise), or scale_a [M, ceil(K/128)] and scale_b
        [ceil(N/128), ceil(K/128)] (block128)."""
        a3, b3 = layouts.with_batch_mode(a), layouts.with_batch_mode(b)
        c3 = layouts.splits_last(c) if cutlass.const_expr(self.spec.split_k) else layouts.with_batch_mode(c)
        tiled_mma = layouts.make_tiled_mma(self.spec)
        a_staged, b_staged, c_staged = layouts.smem_layouts(self.spec, self.stages)
        tma_a, g_a = layouts.tma_load(a3, a_staged, (self.spec.tile_m, TILE_K))
        tma_b, g_b = layouts.tma_load(b3, b_staged, (self.spec.tile_n, TILE_K))
        tma_c, g_c = layouts.tma_store(c3, c_staged, self.epi_tile)
        sched_params, grid = layouts.persistent_grid(c3, self.spec, NUM_SMS)

        @cute.struct
        class SharedStorage:
            pipeline_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(a_staged)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(b_staged)], 1024]
            sC: cute.struct.Align[cute.struct.MemRange[self.out_dtype, cute.cosize(c_staged)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(tma_a, g_a, tma_b, g_b, tma_c, g_c, scale_a, scale_b, tiled_mma,
                    a_staged, b_staged, c_staged, sched_params).launch(
            grid=grid, block=[self.spec.num_threads, 1, 1], cluster=(1, 1, 1), min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_c: cute.CopyAtom, mC: cute.Tensor, scale_a: cute.Tensor, scale_b: cute.Tensor,
               tiled_mma: cute.TiledMma, a_staged: cute.ComposedLayout, b_staged: cute.ComposedLayout,
               c_staged: cute.ComposedLayout, sched_params: utils.PersistentTileSchedulerParams):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        tx_bytes = schedule.stage_tx_bytes(self.spec.tile_m, self.spec.tile_n)
        mainloop = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.pipeline_barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.spec.num_consumer_warpgroups),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sA = storage.sA.get_tensor(a_staged.outer, swizzle=a_staged.inner)
        sB = storage.sB.get_tensor(b_staged.outer, swizzle=b_staged.inner)
        sC = storage.sC.get_tensor(c_staged.outer, swizzle=c_staged.inner)
        gA = cute.local_tile(mA, (self.spec.tile_m, TILE_K), (None, None, None))  # (bM, bK, RestM, RestK, L)
        gB = cute.local_tile(mB, (self.spec.tile_n, TILE_K), (None, None, None))
        gC = cute.local_tile(mC, (self.spec.tile_m, self.spec.tile_n), (None, None, None))
        one_cta = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, one_cta, cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, one_cta, cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        k_tiles = cute.size(gA, mode=[3])
        # Split-K: the tile's batch index is its split; each split takes k_per_split k-tiles (the host
        # picks a split count that leaves none empty). One split: every k-tile.
        k_per_split = schedule.k_tiles_per_split(k_tiles, cute.size(mC, mode=[2]), cute.ceil_div)

        warpgroup_idx = cute.arch.make_warp_uniform(tidx // 128)
        pipeline_init_wait(cluster_shape_mn=(1, 1))
        if warpgroup_idx == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp_idx == schedule.PRODUCER_WARP:
                self.produce(mainloop, tma_a, tma_b, tAsA, tAgA, tBsB, tBgB, k_tiles, k_per_split, sched_params)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS)
            self.consume(mainloop, tiled_mma, sA, sB, sC, tma_c, gC, scale_a, scale_b, k_tiles, k_per_split,
                         sched_params, tidx - 128, warp_idx)

    @cute.jit
    def produce(self, mainloop, tma_a, tma_b, tAsA, tAgA, tBsB, tBgB, k_tiles, k_per_split, sched_params):
        """One thread's loop: every k-tile of every tile this CTA owns, as fast as stages free up."""
        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        while work.is_valid_tile:
            m_idx, n_idx, l_idx = work.tile_idx
            tile_a = tAgA[(None, m_idx, None, 0)]  # A and B have one batch; l_idx is the split
            tile_b = tBgB[(None, n_idx, None, 0)]
            k_begin, k_end = schedule.split_k_range(l_idx, k_per_split, k_tiles, cutlass.min)
            for k_tile in range(k_begin, k_end):
                mainloop.producer_acquire(state)
                full = mainloop.producer_get_barrier(state)
                cute.copy(tma_a, tile_a[(None, k_tile)], tAsA[(None, state.index)], tma_bar_ptr=full)
                cute.copy(tma_b, tile_b[(None, k_tile)], tBsB[(None, state.index)], tma_bar_ptr=full)
                mainloop.producer_commit(state)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        mainloop.producer_tail(state)

    @cute.jit
    def consume(self, mainloop, tiled_mma, sA, sB, sC, tma_c, gC, scale_a, scale_b, k_tiles, k_per_split,
                sched_params, consumer_tidx, warp_idx):
        thr_mma = tiled_mma.get_slice(consumer_tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc_shape = thr_mma.partition_C(gC).shape[:3]
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        partial = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        block_scales = cute.make_rmem_tensor(acc_shape, cutlass.Float32)  # per element; a few distinct values
        # This thread's (row, col) within a tile for each accumulator element: where its scales live.
        coords = thr_mma.partition_C(cute.make_identity_tensor((self.spec.tile_m, self.spec.tile_n)))
        k_blocks = cute.size(tCrA, mode=[2])
        rows, cols = cute.size(scale_a, mode=[0]), cute.size(scale_b, mode=[0])  # M; N (rowwise)

        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=layouts.EPI_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_consumer_threads))
        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        while work.is_valid_tile:
            m_idx, n_idx, l_idx = work.tile_idx
            m0, n0 = m_idx * self.spec.tile_m, n_idx * self.spec.tile_n
            acc.fill(0.0)
            k_begin, k_end = schedule.split_k_range(l_idx, k_per_split, k_tiles, cutlass.min)
            for k_tile in range(k_begin, k_end):
                # Block scales load before the wait and the wgmma: their latency hides behind both.
                self.load_block_scales(block_scales, coords, scale_a, scale_b, m0, n0, k_tile, rows)
                mainloop.consumer_wait(state)
                warpgroup.fence()
                tiled_mma.set(warpgroup.Field.ACCUMULATE, False)  # the first k-block starts a fresh partial
                for k_block in cutlass.range_constexpr(k_blocks):
                    coord = (None, None, k_block, state.index)
                    cute.gemm(tiled_mma, partial, tCrA[coord], tCrB[coord], partial)
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                mainloop.consumer_release(state)  # the producer refills this stage while we promote
                state.advance()
                self.promote(acc, partial, block_scales)
            if cutlass.const_expr(not self.block_scaled):
                self.apply_rowwise_scales(acc, coords, scale_a, scale_b, m0, n0, rows, cols)
            self.epilogue(acc, tiled_mma, sC, tma_c, gC[(None, None, m_idx, n_idx, l_idx)], store_pipeline,
                          sched.num_tiles_executed, consumer_tidx, warp_idx)
            sched.advance_to_next_work()
            work = sched.get_current_work()
        store_pipeline.producer_tail()

    @cute.jit
    def load_block_scales(self, block_scales, coords, scale_a, scale_b, m0, n0, k_tile, rows):
        """block128: each element's activation scale (its row, this k block) x the tile's weight block
        scale (tile_n divides 128). Rowwise mode loads nothing here."""
        if cutlass.const_expr(self.block_scaled):
            weight_scale = scale_b[n0 // SCALE_BLOCK, k_tile]
            for i in cutlass.range_constexpr(cute.size(block_scales)):
                row = cutlass.min(m0 + coords[i][0], rows - 1)
                block_scales[i] = scale_a[row, k_tile] * weight_scale

    @cute.jit
    def promote(self, acc, partial, block_scales):
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cutlass.const_expr(self.block_scaled):
                acc[i] = acc[i] + partial[i] * block_scales[i]
            else:
                acc[i] = acc[i] + partial[i]

    @cute.jit
    def apply_rowwise_scales(self, acc, coords, scale_a, scale_b, m0, n0, rows, cols):
        for i in cutlass.range_constexpr(cute.size(acc)):
            row = cutlass.min(m0 + coords[i][0], rows - 1)
            col = cutlass.min(n0 + coords[i][1], cols - 1)
            acc[i] = acc[i] * (scale_a[row, 0] * scale_b[col, 0])

    @cute.jit
    def epilogue(self, acc, tiled_mma, sC, tma_c, gC_tile, store_pipeline, tiles_done, consumer_tidx, warp_idx):
        """bf16 sub-tiles of tile_m x 32: registers -> swizzled shared memory (stmatrix) -> TMA store,
        rotating through EPI_STAGES buffers so a store drains while the next sub-tile is written.
        Split-K partials leave the same way in fp32 (plain shared stores: stmatrix moves 16-bit only)."""
        r2s_atom = sm90_utils.sm90_get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, elem_ty_d=self.out_dtype,
                                                      elem_ty_acc=cutlass.Float32)
        stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.out_dtype)
        r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(stmatrix, tiled_mma))
        thr_r2s = r2s.get_slice(consumer_tidx)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_acc = r2s.retile(acc)
        sub_layout = cute.make_layout(cute.shape(thr_r2s.partition_S(sC))[:3])
        sub_out = cute.make_rmem_tensor(sub_layout.shape, self.out_dtype)
        sub_size = cute.size(sub_layout.shape)

        gC_subtiles = cute.zipped_divide(gC_tile, self.epi_tile)
        bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                                               gC_subtiles)
        num_subtiles = cute.size(gC_subtiles, mode=[1])
        subtile_shape = gC_subtiles.shape[1]
        subtile_order = cute.make_layout(subtile_shape, stride=(subtile_shape[1], 1))
        for sub in cutlass.range_constexpr(num_subtiles):
            sub_acc = cute.make_tensor(tRS_acc.iterator + sub * sub_size, sub_layout)
            sub_out.store(sub_acc.load().to(self.out_dtype))
            buffer = schedule.epilogue_buffer(tiles_done, num_subtiles, sub, layouts.EPI_STAGES)
            cute.copy(r2s, sub_out, tRS_sC[(None, None, None, buffer)])
            cute.arch.fence_proxy("async.shared", space="cta")  # make the writes visible to the TMA unit
            self.epilogue_barrier.arrive_and_wait()
            if warp_idx == schedule.STORE_WARP:  # the first consumer warp issues the store
                cute.copy(tma_c, bSG_sC[(None, buffer)], bSG_gC[(None, subtile_order.get_hier_coord(sub))])
                store_pipeline.producer_commit()
                store_pipeline.producer_acquire()
            self.epilogue_barrier.arrive_and_wait()
