"""Protocol model of one persistent CTA of the prefill kernel (hopper/prefill/prefill_attention.py,
prefill_loads.py, prefill_mma.py, prefill_epilogue.py as of commit b787bfc): the four producer warps,
the MMA warpgroups (4 warps each), the O store and the copy engines.

Per tile it calls hopper/prefill/prefill_schedule.py as the kernel does: tile_coords, tile_has_rows,
kv_block_range and loads_key_tiles (produce_tile and consume_tile each call them: the model gives each
role its own schedule, so a test can make them disagree), tile_tokens, num_query_tiles and ring_slot
(the (stage, phase) of a K/V ring position, passed as `ring` so a test can break it). Key tiles touching the paged prefix
are cp.async gathers by all four producer warps (own wait, fence, producer barrier, one arrival);
the others, and Q, are TMA boxes issued by producer warp 0 after its elected expect-tx.
Tags: Q (tile id), K/V stage parts (tile id, key tile), O strips (tile id).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from cute_kernels.hopper.prefill import prefill_schedule
from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec

from .engine import Machine
from .ops import (
    Arrive,
    BulkCommit,
    BulkStore,
    BulkWait,
    CpAsync,
    CpAsyncWait,
    Fence,
    NamedArrive,
    NamedSync,
    Op,
    Read,
    Release,
    TmaLoad,
    Wait,
    Write,
)

# prefill_loads / prefill_mma / prefill_epilogue constants (DSL modules; a test checks these)
PRODUCER_BARRIER_ID, SCHEDULER_BARRIER_ID, EPILOGUE_BARRIER_ID, PAIR = 1, 2, 5, 256
PRODUCER_WARPS = 4
SPAN = 128  # bytes of a row per TMA box (128-byte swizzle)


@dataclass(frozen=True)
class PrefillCase:
    """seqs: (q_len, new_k_len, prefix_len) per sequence; tile_order: the linear tile ids the CTAs
    walk (prefill_tile_order.longest_first_tiles); CTA `cta` of num_ctas."""

    spec: PrefillSpec
    seqs: tuple[tuple[int, int, int], ...]
    kv_heads: int
    tile_order: tuple[int, ...]
    num_ctas: int
    cta: int

    @property
    def tile_tokens(self) -> int:
        return prefill_schedule.tile_tokens(self.spec.tile.tile_m, self.spec.qheads_per_kvhead)


@dataclass(frozen=True)
class _Tile:
    tile_id: int
    m_block: int
    q_len: int
    prefix_len: int
    seqlen_k: int


def prefill_agents(m: Machine, case: PrefillCase, schedule: ModuleType = prefill_schedule,
                   consumer_schedule: ModuleType | None = None, ring=prefill_schedule.ring_slot) -> dict[str, Iterator[Op]]:
    """schedule: what the producer calls; consumer_schedule (default: the same) what the MMA warps call."""
    tile = case.spec.tile
    mma_threads = 128 * tile.num_mma_warpgroups
    bars = {"q_full": m.mbarrier("q_full", 1), "q_empty": m.mbarrier("q_empty", mma_threads)}
    for name, count in (("k_full", 1), ("v_full", 1), ("k_empty", mma_threads), ("v_empty", mma_threads)):
        bars[name] = [m.mbarrier(f"{name}[{s}]", count) for s in range(tile.stages)]
    agents = {f"producer{w}": _producer(case, w, bars, schedule, ring) for w in range(PRODUCER_WARPS)}
    for w in range(4 * tile.num_mma_warpgroups):
        agents[f"mma{w}"] = _mma_warp(case, w, bars, consumer_schedule or schedule, ring)
    return agents


def _tiles(case: PrefillCase, schedule) -> Iterator[_Tile]:
    """The CTA's list entries cta, cta + num_ctas, ... as _tile_context reads them."""
    max_q = max(q for q, _, _ in case.seqs)
    num_m_blocks = schedule.num_query_tiles(max_q, case.spec.qheads_per_kvhead, case.spec.tile.tile_m)
    for idx in range(case.cta, len(case.tile_order), case.num_ctas):
        tile_id = case.tile_order[idx]
        m_block, _, batch = schedule.tile_coords(tile_id, num_m_blocks, case.kv_heads)
        q_len, new_k, prefix = case.seqs[batch]
        yield _Tile(tile_id, m_block, q_len, prefix, prefix + new_k)


def _key_tiles(case: PrefillCase, t: _Tile, schedule) -> tuple[int, int] | None:
    """(n_block_max, n_mask_start) of a tile that loads (None: nothing to load or wait for)."""
    g, tile = case.spec.qheads_per_kvhead, case.spec.tile
    if not schedule.tile_has_rows(t.m_block, case.tile_tokens, t.q_len):
        return None
    n_max, n_mask = schedule.kv_block_range(t.m_block, t.q_len, t.seqlen_k, g, case.tile_tokens * g, tile.tile_n,
                                            case.spec.causal)
    return (n_max, n_mask) if schedule.loads_key_tiles(n_max) else None


def _producer(case: PrefillCase, pwarp: int, bars: dict, schedule, ring) -> Iterator[Op]:
    spec, tile = case.spec, case.spec.tile
    elem = 2
    boxes = spec.head_dim * elem // SPAN
    q_bytes = case.tile_tokens * spec.qheads_per_kvhead * spec.head_dim * elem
    kv_bytes = tile.tile_n * spec.head_dim * elem
    kv_count = tiles_done = 0
    for t in _tiles(case, schedule):
        key_tiles = _key_tiles(case, t, schedule)
        if key_tiles is None:
            continue
        n_block_max = key_tiles[0]
        if pwarp == 0:
            yield Wait(bars["q_empty"], (tiles_done % 2) ^ 1)
            yield Arrive(bars["q_full"], 1, q_bytes)
            for _ in range(boxes):
                yield TmaLoad(bars["q_full"], ["Q"], t.tile_id, q_bytes // boxes)
        for i in range(n_block_max):
            n_block = n_block_max - 1 - i
            stage, phase = ring(kv_count + i, tile.stages)
            for tensor in ("k", "v"):
                yield Wait(bars[f"{tensor}_empty"][stage], phase ^ 1)
                yield from _load_kv_tile(case, pwarp, bars[f"{tensor}_full"][stage], tensor.upper(), stage,
                                         (t.tile_id, n_block), n_block * tile.tile_n >= t.prefix_len, kv_bytes, boxes)
        kv_count += n_block_max
        tiles_done += 1


def _load_kv_tile(case, pwarp: int, full, tensor: str, stage: int, tag, by_tma: bool, nbytes: int,
                  boxes: int) -> Iterator[Op]:
    parts = [(tensor, stage, p) for p in range(PRODUCER_WARPS)]
    if by_tma:
        if pwarp == 0:
            yield Arrive(full, 1, nbytes)
            for _ in range(boxes):
                yield TmaLoad(full, parts, tag, nbytes // boxes)
        return
    yield CpAsync(parts[pwarp], tag)  # this warp's rows of the gather
    yield CpAsyncWait()
    yield Fence()
    yield NamedSync(PRODUCER_BARRIER_ID, 32 * PRODUCER_WARPS)
    if pwarp == 0:  # ptid == 0
        yield Arrive(full, 1)


def _mma_warp(case: PrefillCase, w: int, bars: dict, schedule, ring) -> Iterator[Op]:
    wg = w // 4
    if wg == 0:  # start_ping_pong: the first warpgroup issues first
        yield NamedArrive(SCHEDULER_BARRIER_ID, PAIR)
    kv_count = tiles_done = 0
    for t in _tiles(case, schedule):
        key_tiles = _key_tiles(case, t, schedule)
        if key_tiles is None:
            continue  # past the sequence's end, or store_unseeing_tile: registers to global only
        yield from _consume(case, wg, t, key_tiles, bars, kv_count, tiles_done, ring)
        yield from _epilogue(case, w, t)
        kv_count += key_tiles[0]
        tiles_done += 1
    if w == 0:  # drain_stores (ctid == 0)
        yield BulkWait(0)


def _kv_reads(tensor: str, stage: int, tag) -> list:
    return [((tensor, stage, p), tag) for p in range(PRODUCER_WARPS)]


def _consume(case, wg: int, t: _Tile, key_tiles: tuple[int, int], bars: dict, kv_count: int,
             tiles_done: int, ring) -> Iterator[Op]:
    """prefill_mma.consume: Q, then S[0]; steps 1 .. n_masked-1 (masked) and max(n_masked, 1) ..
    n_block_max-1 (visible) each issue S[i] and P[i-1] V[i-1] in this warpgroup's turn; the tail P V
    of the last key tile. Arrivals once each read is done."""
    stages = case.spec.tile.stages
    n_block_max = key_tiles[0]
    n_masked = n_block_max - min(max(key_tiles[1], 0), n_block_max)
    q = [("Q", t.tile_id)]
    yield Wait(bars["q_full"], tiles_done % 2)
    stage, phase = ring(kv_count, stages)
    yield Wait(bars["k_full"][stage], phase)
    k = _kv_reads("K", stage, (t.tile_id, n_block_max - 1))
    yield Read(q + k)
    yield Release([key for key, _ in k])
    yield Arrive(bars["k_empty"][stage], 32)
    for i in [*range(1, n_masked), *range(max(n_masked, 1), n_block_max)]:
        yield from _overlapped_step(case, wg, t, i, n_block_max, bars, kv_count, ring)
    stage, phase = ring(kv_count + n_block_max - 1, stages)
    yield Wait(bars["v_full"][stage], phase)
    v = _kv_reads("V", stage, (t.tile_id, 0))
    yield Read(v)
    yield Release([key for key, _ in v] + ["Q"])
    yield Arrive(bars["v_empty"][stage], 32)
    yield Arrive(bars["q_empty"], 32)


def _overlapped_step(case, wg: int, t: _Tile, i: int, n_block_max: int, bars: dict, kv_count: int,
                     ring) -> Iterator[Op]:
    """prefill_mma.overlapped_step: K[i] waited, this warpgroup's turn taken, S[i] and the P V of
    position i - 1 issued, the turn handed on; K released after S, V after P V."""
    stages, num_wg = case.spec.tile.stages, case.spec.tile.num_mma_warpgroups
    n_block = n_block_max - 1 - i
    stage, phase = ring(kv_count + i, stages)
    prev_stage, prev_phase = ring(kv_count + i - 1, stages)
    yield Wait(bars["k_full"][stage], phase)
    yield NamedSync(SCHEDULER_BARRIER_ID + wg, PAIR)
    k = _kv_reads("K", stage, (t.tile_id, n_block))
    yield Read(k)
    yield Wait(bars["v_full"][prev_stage], prev_phase)
    v = _kv_reads("V", prev_stage, (t.tile_id, n_block + 1))
    yield Read(v)
    yield NamedArrive(SCHEDULER_BARRIER_ID + (wg + 1) % num_wg, PAIR)
    yield Release([key for key, _ in k])  # wait_group(1): S[i] done
    yield Arrive(bars["k_empty"][stage], 32)
    yield Release([key for key, _ in v])  # wait_all_below_branch: P V done
    yield Arrive(bars["v_empty"][prev_stage], 32)


def _epilogue(case, w: int, t: _Tile) -> Iterator[Op]:
    """A full tile leaves by one TMA store of sO (ctid 0 = this CTA's first MMA warp issues it);
    the ragged last tile of a sequence stores per thread to global memory."""
    if (t.m_block + 1) * case.tile_tokens > t.q_len:
        return
    mma_threads = 128 * case.spec.tile.num_mma_warpgroups
    if w == 0:
        yield BulkWait(0)  # the previous tile's store has read sO
    yield NamedSync(EPILOGUE_BARRIER_ID, mma_threads)
    yield Write(("O", w), t.tile_id)
    yield Fence()
    yield NamedSync(EPILOGUE_BARRIER_ID, mma_threads)
    if w == 0:
        yield BulkStore([(("O", x), t.tile_id) for x in range(mma_threads // 32)])
        yield BulkCommit()
