"""Protocol model of one persistent CTA of the FP8 GEMM (hopper/fp8_gemm/fp8_gemm.py): the producer warp, the
consumer warps (4 per warpgroup), the epilogue's store warp and the TMA load / store engines, driven by
hopper/fp8_gemm/fp8_gemm_schedule.py where the kernel calls it (k-tiles per split, each role's k range, the
expect-tx bytes, the epilogue buffer) and by the DSL's PipelineTmaAsync, PipelineTmaStore and
StaticPersistentTileScheduler (dsl.py).

A stage's A box is tagged (m tile, k-tile), its B box (n tile, k-tile); a consumer reading its k-tile
must find exactly those, so a stage refilled early, late or for another tile fails. The epilogue's
sub-tile strips are tagged (tile, sub-tile) by every consumer warp and read by the store warp's TMA
store, which must see all of them and must be done reading before the buffer is written again.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from cute_kernels.hopper.fp8_gemm import fp8_gemm_schedule
from cute_kernels.hopper.fp8_gemm.fp8_gemm_spec import TILE_K, Fp8GemmSpec

from . import dsl as dsl_model
from .engine import Machine
from .ops import BulkStore, Fence, NamedSync, Op, Read, Release, TmaLoad, Write, check_index

# fp8_gemm.py / fp8_gemm_layouts.py constants (those modules import the DSL; a test checks these)
EPI_TILE_N = 32
EPI_STAGES = 4
EPILOGUE_BARRIER = 1
SMEM_BYTES = 232448
MAX_STAGES = 8


def ab_stages(spec: Fp8GemmSpec) -> int:
    """fp8_gemm_layouts.num_ab_stages without the DSL: the ring depth the kernel gets."""
    out_bytes = 4 if spec.split_k else 2
    epi_bytes = spec.tile_m * EPI_TILE_N * out_bytes * EPI_STAGES
    return min((SMEM_BYTES - 1024 - epi_bytes) // fp8_gemm_schedule.stage_tx_bytes(spec.tile_m, spec.tile_n),
               MAX_STAGES)


@dataclass(frozen=True)
class GemmCase:
    """One CTA `cta` of a persistent grid of at most max_ctas over C[m, n] (x splits of K)."""

    m: int
    n: int
    k: int
    spec: Fp8GemmSpec
    splits: int = 1
    cta: int = 0
    max_ctas: int = 132
    stages: int | None = None  # None: the kernel's; smaller to force ring wrap-around in short runs

    @property
    def tiles_mnl(self) -> tuple[int, int, int]:
        return -(-self.m // self.spec.tile_m), -(-self.n // self.spec.tile_n), self.splits

    @property
    def k_tiles(self) -> int:
        return -(-self.k // TILE_K)

    @property
    def ring(self) -> int:
        return self.stages or ab_stages(self.spec)


def gemm_agents(m: Machine, case: GemmCase, schedule: ModuleType = fp8_gemm_schedule, dsl: ModuleType = dsl_model,
                producer_schedule: ModuleType | None = None) -> dict[str, Iterator[Op]]:
    """The CTA's warps; producer_schedule (default: schedule) is what the producer warp calls, so a
    test can make the two roles disagree as separate code paths of the kernel could."""
    spec = case.spec
    consumers = 4 * spec.num_consumer_warpgroups
    pipe = dsl.PipelineTmaAsync(m, "ab", case.ring, consumers, schedule.stage_tx_bytes(spec.tile_m, spec.tile_n))
    grid = dsl.StaticPersistentTileScheduler.grid_size(case.tiles_mnl, case.max_ctas)
    check_index(case.cta, grid, "CTA")
    k_per_split = schedule.k_tiles_per_split(case.k_tiles, case.splits)
    agents = {"producer": _producer(case, pipe, grid, k_per_split, producer_schedule or schedule, dsl)}
    for w in range(consumers):
        agents[f"consumer{w}"] = _consumer(case, w, pipe, grid, k_per_split, schedule, dsl)
    return agents


def _producer(case: GemmCase, pipe, grid: int, k_per_split: int, schedule, dsl) -> Iterator[Op]:
    spec = case.spec
    sched = dsl.StaticPersistentTileScheduler(case.tiles_mnl, case.cta, grid)
    work = sched.get_current_work()
    state = dsl.make_pipeline_state(dsl.PRODUCER, case.ring)
    while work.is_valid_tile:
        m_idx, n_idx, l_idx = work.tile_idx
        k_begin, k_end = schedule.split_k_range(l_idx, k_per_split, case.k_tiles)
        for k_tile in range(k_begin, k_end):
            check_index(k_tile, case.k_tiles, "k-tile")
            yield from pipe.producer_acquire(state)
            full = pipe.producer_get_barrier(state)
            yield TmaLoad(full, ("A", state.index), (m_idx, k_tile), spec.tile_m * TILE_K)
            yield TmaLoad(full, ("B", state.index), (n_idx, k_tile), spec.tile_n * TILE_K)
            yield from pipe.producer_commit(state)
            state.advance()
        sched.advance_to_next_work()
        work = sched.get_current_work()
    yield from pipe.producer_tail(state)


def _consumer(case: GemmCase, w: int, pipe, grid: int, k_per_split: int, schedule, dsl) -> Iterator[Op]:
    store = dsl.PipelineTmaStore(EPI_STAGES)
    sched = dsl.StaticPersistentTileScheduler(case.tiles_mnl, case.cta, grid)
    work = sched.get_current_work()
    state = dsl.make_pipeline_state(dsl.CONSUMER, case.ring)
    while work.is_valid_tile:
        m_idx, n_idx, l_idx = work.tile_idx
        k_begin, k_end = schedule.split_k_range(l_idx, k_per_split, case.k_tiles)
        for k_tile in range(k_begin, k_end):
            yield from pipe.consumer_wait(state)
            reads = [(("A", state.index), (m_idx, k_tile)), (("B", state.index), (n_idx, k_tile))]
            yield Read(reads)  # the k-tile's wgmmas, then wait_group(0)
            yield Release([key for key, _ in reads])
            yield from pipe.consumer_release(state)
            state.advance()
        yield from _epilogue(case, w, work.tile_idx, sched.num_tiles_executed, store, schedule)
        sched.advance_to_next_work()
        work = sched.get_current_work()
    yield from store.producer_tail()


def _epilogue(case: GemmCase, w: int, tile: tuple, tiles_done: int, store, schedule) -> Iterator[Op]:
    """Per sub-tile: every consumer warp writes its rows of the strip into the rotating buffer, fences,
    meets the others; the store warp issues the TMA store, commits and waits until at most
    EPI_STAGES - 1 stores still read; everyone meets again before the next strip."""
    spec = case.spec
    warps = 4 * spec.num_consumer_warpgroups
    threads = 32 * warps
    warp_idx = 4 + w  # consumer warps follow the producer warpgroup's four
    num_subtiles = spec.tile_n // EPI_TILE_N  # epi tile: all tile_m rows x 32 columns
    for sub in range(num_subtiles):
        buffer = check_index(schedule.epilogue_buffer(tiles_done, num_subtiles, sub, EPI_STAGES), EPI_STAGES,
                             "epilogue buffer")
        yield Write(("C", buffer, w), (tile, sub))
        yield Fence()
        yield NamedSync(EPILOGUE_BARRIER, threads)
        if warp_idx == schedule.STORE_WARP:
            yield BulkStore([(("C", buffer, x), (tile, sub)) for x in range(warps)])
            yield from store.producer_commit()
            yield from store.producer_acquire()
        yield NamedSync(EPILOGUE_BARRIER, threads)
