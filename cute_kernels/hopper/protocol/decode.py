"""Protocol model of one CTA of the split-KV decode kernel (hopper/decode/decode_attention.py): the producer
warp, the four consumer warps and the TMA engine, driven by hopper/decode/decode_schedule.py exactly where
the kernel calls it (split_tiles, the block-table columns and lanes, the expect-tx bytes, the mask and
V-tail tests) and by the DSL's PipelineTmaAsync (dsl.py).

Each TMA box is tagged (key tile, block id) as the producer meant it; a consumer's read of a stage
must hold its own key tile and, for every block inside the context, the block the table names for
that key (columns past the context may hold any block: their keys are masked). Q comes by cp.async
from every consumer warp; each warp zeroes its share of a V stage's tail before the PV wgmma.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from cute_kernels.hopper.decode import decode_schedule
from cute_kernels.hopper.decode.decode_spec import BLOCKS_PER_TILE, KEYS_PER_TILE, QUERY_ROWS, DecodeSpec
from cute_kernels.hopper.prefill.prefill_spec import KV_BLOCK_SIZE

from . import dsl as dsl_model
from .engine import ANY, Machine, ProtocolError
from .ops import CpAsync, CpAsyncWait, Fence, NamedSync, Op, Read, Release, TmaLoad, Write, check_index

# decode_attention.py's roles (that module imports the DSL; tests/cute_kernels/hopper/test_kernel_protocol.py checks these)
CONSUMER_THREADS = 128
CONSUMER_WARPS = CONSUMER_THREADS // 32
CONSUMER_BARRIER = 1
LANES = 32
SWIZZLE_SPAN = 128  # bytes of a row one TMA box covers (the 128-byte swizzle)


@dataclass(frozen=True)
class DecodeCase:
    """One CTA: sequence of context_len keys and q_len queries, GQA group, split `split` of num_splits;
    table: the sequence's block-table row (width >= the context's blocks)."""

    context_len: int
    q_len: int
    group: int
    num_splits: int
    split: int
    table: tuple[int, ...]
    head_dim: int = 128
    elem_bytes: int = 2

    def __post_init__(self) -> None:
        blocks = -(-self.context_len // KV_BLOCK_SIZE)
        if not (1 <= self.q_len <= self.context_len and self.q_len * self.group <= QUERY_ROWS
                and len(self.table) >= blocks and 0 <= self.split < self.num_splits):
            raise ValueError(f"not an input the host accepts: {self}")

    @property
    def stages(self) -> int:
        return DecodeSpec("bfloat16", self.head_dim).stages

    @property
    def boxes_per_block(self) -> int:
        return self.head_dim * self.elem_bytes // SWIZZLE_SPAN


def decode_agents(m: Machine, case: DecodeCase, schedule: ModuleType = decode_schedule,
                  dsl: ModuleType = dsl_model) -> dict[str, Iterator[Op]]:
    """The CTA's warps as the kernel body sets them up: the split's tiles computed once, one pipeline."""
    tile_lo, n_local = schedule.split_tiles(case.split, case.num_splits, case.context_len)
    pipe = dsl.PipelineTmaAsync(m, "kv", case.stages, CONSUMER_WARPS,
                                schedule.stage_tx_bytes(case.head_dim, case.elem_bytes))
    agents = {"producer": _producer(case, pipe, tile_lo, n_local, schedule, dsl)}
    for w in range(CONSUMER_WARPS):
        agents[f"consumer{w}"] = _consumer(case, w, pipe, tile_lo, n_local, schedule, dsl)
    return agents


def _table_group(case: DecodeCase, schedule, tile_lo: int, group_index: int, last_col: int) -> list[int]:
    """The 32 entries the producer's lanes read (one table column each)."""
    cols = [schedule.table_column(tile_lo, group_index, lane, last_col) for lane in range(LANES)]
    return [case.table[check_index(c, len(case.table), "block-table column")] for c in cols]


def _producer(case: DecodeCase, pipe, tile_lo: int, n_local: int, schedule, dsl) -> Iterator[Op]:
    last_col = schedule.last_table_column(case.context_len)
    entries = _table_group(case, schedule, tile_lo, 0, last_col)
    next_entries = _table_group(case, schedule, tile_lo, 1, last_col)
    box_bytes = KV_BLOCK_SIZE * SWIZZLE_SPAN
    state = dsl.make_pipeline_state(dsl.PRODUCER, case.stages)
    for i in range(n_local):
        yield from pipe.producer_acquire(state)
        barrier = pipe.producer_get_barrier(state)
        for j in range(BLOCKS_PER_TILE):
            block = entries[check_index(schedule.block_lane(i, j), LANES, "shuffle lane")]
            slot = check_index(state.index * BLOCKS_PER_TILE + j, case.stages * BLOCKS_PER_TILE, "ring block slot")
            for tensor in ("K", "V"):
                for box in range(case.boxes_per_block):
                    yield TmaLoad(barrier, (tensor, slot, box), (tile_lo + i, block), box_bytes)
        yield from pipe.producer_commit(state)
        state.advance()
        if schedule.refills_table_group(i):
            entries = next_entries
            next_entries = _table_group(case, schedule, tile_lo, schedule.next_table_group(i), last_col)


def expected_block(case: DecodeCase, tile: int, j: int):
    """What block j of key tile `tile` must hold: the table's block for those keys, or (past the
    context: masked keys) any block. From the cache layout alone, not from decode_schedule."""
    first_key = tile * KEYS_PER_TILE + j * KV_BLOCK_SIZE
    return case.table[first_key // KV_BLOCK_SIZE] if first_key < case.context_len else ANY


def _stage_reads(case: DecodeCase, tensor: str, stage: int, tile: int) -> list:
    reads = []
    for j in range(BLOCKS_PER_TILE):
        block = expected_block(case, tile, j)
        for box in range(case.boxes_per_block):
            reads.append(((tensor, stage * BLOCKS_PER_TILE + j, box), _TileTag(tile, block)))
    return reads


@dataclass(frozen=True)
class _TileTag:
    """Matches a (tile, block) tag: this tile, and this block unless any will do."""

    tile: int
    block: object

    def __eq__(self, other) -> bool:
        return (isinstance(other, tuple) and other[0] == self.tile
                and (self.block is ANY or other[1] == self.block))

    def __hash__(self) -> int:
        return hash(self.tile)


def _consumer(case: DecodeCase, w: int, pipe, tile_lo: int, n_local: int, schedule, dsl) -> Iterator[Op]:
    # load_q: this warp's cp.async rows, its own wait, the fence to the async proxy, then all warps meet
    yield CpAsync(("Q", w), "Q")
    yield CpAsyncWait()
    yield Fence()
    yield NamedSync(CONSUMER_BARRIER, CONSUMER_THREADS)
    q_reads = [(("Q", x), "Q") for x in range(CONSUMER_WARPS)]
    mask_from = schedule.mask_from(case.context_len, case.q_len)
    state = dsl.make_pipeline_state(dsl.CONSUMER, case.stages)
    for i in range(n_local):
        tile = tile_lo + i
        yield from pipe.consumer_wait(state)
        k_reads = _stage_reads(case, "K", state.index, tile)
        yield Read(q_reads + k_reads)  # S = Q K^T
        v_reads = _stage_reads(case, "V", state.index, tile)
        if schedule.tile_needs_mask(tile, mask_from):
            yield from _zero_v_tail(case, w, state.index, tile, schedule.tile_valid_keys(tile, case.context_len),
                                    v_reads)
            if schedule.tile_valid_keys(tile, case.context_len) < KEYS_PER_TILE:
                v_reads = v_reads + [(("Vtail", state.index, x), (tile, x)) for x in range(CONSUMER_WARPS)]
        yield Read(v_reads)  # O += P V
        yield Release([key for key, _ in q_reads + k_reads + v_reads])
        yield from pipe.consumer_release(state)
        state.advance()


def _zero_v_tail(case: DecodeCase, w: int, stage: int, tile: int, valid_keys: int, v_reads: list) -> Iterator[Op]:
    """zero_v_tail: this warp's columns of the rows past the context, after the stage's copy landed,
    then fence and the consumer barrier (the PV wgmma reads every warp's zeros)."""
    if valid_keys < KEYS_PER_TILE:
        if valid_keys <= 0:
            raise ProtocolError("bounds", f"key tile {tile} holds no key of a context of {case.context_len}")
        yield Write(("Vtail", stage, w), (tile, w), requires=v_reads)
        yield Fence()
        yield NamedSync(CONSUMER_BARRIER, CONSUMER_THREADS)
