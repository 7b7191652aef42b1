"""What the DSL's pipeline helpers the kernels call do (nvidia-cutlass-dsl 4.8.1, read from
cutlass/pipeline/sm90.py, helpers.py and cutlass/utils/static_persistent_tile_scheduler.py), as
generators of protocol ops. A kernel model takes this module as a parameter (`dsl=`), so a test can
hand it a variant with one helper changed.

- PipelineState: (index, phase, count); advance() steps index and flips phase when it wraps.
  make_pipeline_state: producers start at phase 1 (every stage starts empty: the wait on an empty
  barrier still in phase 0 passes), consumers at phase 0.
- PipelineTmaAsync (one CTA, no cluster): full[i] counts the producer group (1 arrival, plus the
  stage's tx_count bytes), empty[i] the consumer group. producer_acquire waits empty[i] at the
  state's phase, then one elected lane arrive.expect_tx(tx_count) on full[i]; producer_commit does
  nothing (the copies complete the bytes); consumer_wait waits full[i] at the phase;
  consumer_release arrives once per calling warp (is_signaling_thread: lane % 32 < cluster size 1);
  producer_tail waits on the empty barriers of the next `stages` positions.
- PipelineTmaStore: commit = cp.async.bulk.commit_group, acquire = wait_group(stages - 1, read),
  tail = wait_group(0, read); per issuing thread.
- StaticPersistentTileScheduler (swizzle 1, raster along M, 1x1 clusters): CTA c of a grid of g
  walks linear tiles c, c + g, ... < M * N * L; linear -> (m = i % M, n = i // M % N, l = i // (M N));
  num_tiles_executed counts the advances.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .engine import Machine
from .ops import Arrive, BulkCommit, BulkWait, Op, Wait

PRODUCER, CONSUMER = "producer", "consumer"


class PipelineState:
    def __init__(self, stages: int, count: int, index: int, phase: int):
        self.stages, self.count, self.index, self.phase = stages, count, index, phase

    def advance(self) -> None:
        self.index += 1
        self.count += 1
        if self.index == self.stages:
            self.index, self.phase = 0, self.phase ^ 1


def make_pipeline_state(kind: str, stages: int) -> PipelineState:
    return PipelineState(stages, 0, 0, 1 if kind == PRODUCER else 0)


class PipelineTmaAsync:
    def __init__(self, m: Machine, name: str, stages: int, consumer_arrivals: int, tx_count: int):
        self.stages, self.tx_count = stages, tx_count
        self.full = [m.mbarrier(f"{name}.full[{i}]", 1) for i in range(stages)]
        self.empty = [m.mbarrier(f"{name}.empty[{i}]", consumer_arrivals) for i in range(stages)]

    def producer_acquire(self, state: PipelineState) -> Iterator[Op]:
        yield Wait(self.empty[state.index], state.phase)
        yield Arrive(self.full[state.index], 1, self.tx_count)

    def producer_get_barrier(self, state: PipelineState):
        return self.full[state.index]

    def producer_commit(self, state: PipelineState) -> Iterator[Op]:
        yield from ()

    def consumer_wait(self, state: PipelineState) -> Iterator[Op]:
        yield Wait(self.full[state.index], state.phase)

    def consumer_release(self, state: PipelineState) -> Iterator[Op]:
        yield Arrive(self.empty[state.index], 1)

    def producer_tail(self, state: PipelineState) -> Iterator[Op]:
        for _ in range(self.stages):
            yield Wait(self.empty[state.index], state.phase)
            state.advance()


class PipelineTmaStore:
    def __init__(self, stages: int):
        self.stages = stages

    def producer_commit(self) -> Iterator[Op]:
        yield BulkCommit()

    def producer_acquire(self) -> Iterator[Op]:
        yield BulkWait(self.stages - 1)

    def producer_tail(self) -> Iterator[Op]:
        yield BulkWait(0)


@dataclass
class WorkTile:
    tile_idx: tuple[int, int, int]
    is_valid_tile: bool


class StaticPersistentTileScheduler:
    def __init__(self, tiles_mnl: tuple[int, int, int], cta: int, grid: int):
        self.tiles_mnl, self.linear, self.grid = tiles_mnl, cta, grid
        self.num_tiles_executed = 0

    @staticmethod
    def grid_size(tiles_mnl: tuple[int, int, int], max_ctas: int) -> int:
        """get_grid_shape's persistent extent: min(tiles, max active CTAs)."""
        m, n, l_ = tiles_mnl
        return min(m * n * l_, max_ctas)

    def get_current_work(self) -> WorkTile:
        m, n, l_ = self.tiles_mnl
        i = self.linear
        return WorkTile((i % m, i // m % n, i // (m * n)), i < m * n * l_)

    def advance_to_next_work(self) -> None:
        self.linear += self.grid
        self.num_tiles_executed += 1
