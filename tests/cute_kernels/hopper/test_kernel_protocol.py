"""The protocol model (cute_kernels/hopper/protocol): the decode kernel, the FP8 GEMM and the
prefill kernel, one CTA at a time, under fixed seeds of random interleavings and copy completion
orders, over shapes with ring wrap-around across tiles, persistent CTAs walking several tiles, empty
splits and tiles, ragged tails, K not a multiple of the tile and split-K. Each check is also shown
to FAIL: the same model run with one schedule function (or DSL helper) broken, through the seams the
kernels call, must report the deadlock or race that bug would cause on the GPU.
No DSL and no GPU needed; a last test (DSL only) checks the model's copies of kernel constants."""
from __future__ import annotations

import random
import types

import pytest

from cute_kernels.hopper.decode import decode_schedule
from cute_kernels.hopper.fp8_gemm import fp8_gemm_schedule
from cute_kernels.hopper.fp8_gemm.fp8_gemm_spec import Fp8GemmSpec
from cute_kernels.hopper.prefill import prefill_schedule
from cute_kernels.hopper.prefill.prefill_schedule import ring_slot
from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
from cute_kernels.hopper.protocol import dsl, engine
from cute_kernels.hopper.protocol.decode import DecodeCase, decode_agents
from cute_kernels.hopper.protocol.fp8_gemm import GemmCase, ab_stages, gemm_agents
from cute_kernels.hopper.protocol.ops import BulkWait, CpAsync, CpAsyncWait, Fence, NamedSync, Read, Wait
from cute_kernels.hopper.protocol.prefill import PrefillCase, prefill_agents

SEEDS = range(6)


def run_all(build, seeds=SEEDS) -> list[engine.RunStats]:
    return [engine.run(build, seed) for seed in seeds]


def first_failure(build, seeds=range(12)) -> engine.ProtocolError:
    for seed in seeds:
        try:
            engine.run(build, seed)
        except engine.ProtocolError as exc:
            return exc
    pytest.fail("the model passed a broken kernel under every seed")


def variant(module, **changes) -> types.SimpleNamespace:
    """The module's functions with some replaced: what a kernel calling the broken version does."""
    ns = types.SimpleNamespace(**{k: getattr(module, k) for k in dir(module) if not k.startswith("__")})
    for name, value in changes.items():
        assert hasattr(ns, name), name
        setattr(ns, name, value)
    return ns


# ------------------------------------------------------------------------------- the machine itself
def test_mbarrier_parity_is_ptx_try_wait_parity():
    bar = engine.MBarrier("b", 2)
    assert bar.passed(1) and not bar.passed(0)  # phase 0 running: "phase 1" (the one before) counts as done
    bar.arrive(1, tx=100)
    bar.arrive(1)
    assert not bar.passed(0)  # arrivals done, bytes due
    bar.complete_tx(100)
    assert bar.passed(0) and not bar.passed(1)
    bar.arrive(2)  # a second phase completes: the bit is back at 0
    assert not bar.passed(0), "a wait two phases late blocks: the hardware keeps one parity bit"
    with pytest.raises(engine.ProtocolError, match="barrier"):
        bar.arrive(3)


def _writer_reader(fence: bool, barrier_count: int = 64):
    """Warp a cp.asyncs a slot (and fences it or not); both meet; warp b reads it through wgmma."""
    def build(m):
        def a():
            yield CpAsync("s", "x")
            yield CpAsyncWait()
            if fence:
                yield Fence()
            yield NamedSync(1, 64)

        def b():
            yield NamedSync(1, barrier_count)
            yield Read([("s", "x")])
        return {"a": a(), "b": b()}
    return build


def test_machine_checks_proxy_fences_and_barrier_counts():
    run_all(_writer_reader(fence=True))
    assert first_failure(_writer_reader(fence=False)).kind == "unfenced"
    assert first_failure(_writer_reader(fence=True, barrier_count=96)).kind == "barrier"


# ------------------------------------------------------------------------------------------ decode
def _decode_cases() -> list[DecodeCase]:
    rng = random.Random(7)
    cases = []
    for ctx, q_len, group, splits, d in [(1, 1, 8, 1, 128), (16, 1, 1, 3, 64), (65, 4, 8, 32, 128),
                                         (300, 2, 4, 3, 128), (300, 1, 8, 1, 64), (1100, 3, 2, 1, 128),
                                         (1100, 1, 4, 5, 64), (640, 64, 1, 2, 128)]:
        table = tuple(rng.sample(range(4096), -(-ctx // 16) + 1))  # shuffled blocks, one spare column
        for split in sorted({0, 1 % splits, splits // 2, splits - 1}):
            cases.append(DecodeCase(ctx, q_len, group, splits, split, table, head_dim=d))
    return cases


DECODE_CASES = _decode_cases()


def test_decode_cases_cover_the_hard_paths():
    spans = [decode_schedule.split_tiles(c.split, c.num_splits, c.context_len) for c in DECODE_CASES]
    assert any(n == 0 for _, n in spans), "an empty split"
    assert any(n > 2 * c.stages for c, (_, n) in zip(DECODE_CASES, spans)), "ring wrap-around, twice"
    assert any(n > 2 * decode_schedule.TILES_PER_GROUP for _, n in spans), "table groups refilled twice"
    assert any(c.q_len > 1 and c.context_len % 64 for c in DECODE_CASES), "verify queries, ragged tail"


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"ctx{c.context_len}_s{c.split}of{c.num_splits}_d{c.head_dim}")
def test_decode_protocol_holds(case):
    stats = run_all(lambda m: decode_agents(m, case))
    tiles = decode_schedule.split_tiles(case.split, case.num_splits, case.context_len)[1]
    assert stats[0].max_fills("K") == -(-tiles // case.stages)  # each ring slot filled once per lap


def _parity_flipped_consumer(kind, stages):
    state = dsl.make_pipeline_state(kind, stages)
    if kind == dsl.CONSUMER:
        state.phase = 1  # the consumer waits for the phase "before" the first: it passes at once
    return state


class _NoFlipState(dsl.PipelineState):
    def advance(self):
        self.index, self.count = (self.index + 1) % self.stages, self.count + 1


class _SkipsOneRelease(dsl.PipelineTmaAsync):
    skipped = False

    def consumer_release(self, state):
        if not self.skipped:  # one warp forgets one empty-barrier arrive
            self.skipped = True
            return
        yield from super().consumer_release(state)


class _OneStageAhead(dsl.PipelineTmaAsync):
    def producer_acquire(self, state):
        """Waits for the release of the position one earlier than it refills: stages + 1 in flight."""
        if state.count:
            index, phase = (state.index - 1, state.phase) if state.index else (self.stages - 1, state.phase ^ 1)
            yield Wait(self.empty[index], phase)
        yield from list(super().producer_acquire(state))[1:]


LONG = DecodeCase(1100, 1, 4, 1, 0, tuple(random.Random(3).sample(range(4096), 70)), head_dim=128)
DECODE_BROKEN = {
    "consumer waits on the wrong parity": (dict(dsl=variant(dsl, make_pipeline_state=_parity_flipped_consumer)),
                                           {"stale", "race", "deadlock"}),
    "ring advance never flips the phase": (
        dict(dsl=variant(dsl, make_pipeline_state=lambda kind, s: _NoFlipState(s, 0, 0, int(kind == dsl.PRODUCER)))),
        {"stale", "race", "deadlock", "barrier"}),
    "a consumer skips an empty arrive": (dict(dsl=variant(dsl, PipelineTmaAsync=_SkipsOneRelease)), {"deadlock"}),
    "producer loads one stage too far ahead": (dict(dsl=variant(dsl, PipelineTmaAsync=_OneStageAhead)),
                                               {"race", "stale", "barrier"}),
    "expect-tx short of the copies": (
        dict(schedule=variant(decode_schedule, stage_tx_bytes=lambda d, e: decode_schedule.stage_tx_bytes(d, e) // 2)),
        {"stale"}),
    "expect-tx past the copies": (
        dict(schedule=variant(decode_schedule, stage_tx_bytes=lambda d, e: decode_schedule.stage_tx_bytes(d, e) + 16)),
        {"deadlock"}),
    "table column not clamped": (
        dict(schedule=variant(decode_schedule, table_column=lambda lo, g, lane, last, imin=min: lo * 4 + g * 32 + lane)),
        {"bounds"}),
    "wrong shuffle lane": (dict(schedule=variant(decode_schedule, block_lane=lambda i, j: (i % 8) * 4 + (j + 1) % 4)),
                           {"stale"}),
    "next table group read one group early": (
        dict(schedule=variant(decode_schedule, next_table_group=lambda i: i // 8 + 1)), {"stale"}),
}


@pytest.mark.parametrize("name", DECODE_BROKEN)
def test_decode_model_catches(name):
    seams, kinds = DECODE_BROKEN[name]
    error = first_failure(lambda m: decode_agents(m, LONG, **seams))
    assert error.kind in kinds, error


# ------------------------------------------------------------------------------------------ FP8 GEMM
def _gemm_cases() -> list[GemmCase]:
    cases = []
    for spec, shapes in [(Fp8GemmSpec("rowwise", 64, 64), [(64, 256, 2048, 1), (1, 320, 1000, 1)]),
                         (Fp8GemmSpec("block128", 128, 128), [(300, 256, 1000, 1), (128, 128, 128, 1)]),
                         (Fp8GemmSpec("rowwise", 64, 64, split_k=True), [(16, 128, 1000, 3), (64, 64, 2048, 4)])]:
        for m_, n, k, splits in shapes:
            probe = GemmCase(m_, n, k, spec, splits, max_ctas=3)
            grid = dsl.StaticPersistentTileScheduler.grid_size(probe.tiles_mnl, 3)
            cases += [GemmCase(m_, n, k, spec, splits, cta, max_ctas=3) for cta in range(grid)]
    return cases


GEMM_CASES = _gemm_cases()


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: f"{c.spec.name}_{c.m}x{c.n}x{c.k}_cta{c.cta}")
def test_fp8_gemm_protocol_holds(case):
    stats = run_all(lambda m: gemm_agents(m, case))
    assert stats[0].steps > 0


def test_fp8_gemm_cases_cover_the_hard_paths():
    stats = {c: engine.run(lambda m, c=c: gemm_agents(m, c), 0) for c in GEMM_CASES}
    assert any(s.max_fills("A") > 1 for s in stats.values()), "ring wrap-around"
    assert any(s.max_fills("C") > 1 for s in stats.values()), "epilogue buffers reused across tiles"
    assert any(c.k % 128 for c in GEMM_CASES) and any(c.splits > 1 for c in GEMM_CASES)
    assert all(ab_stages(c.spec) >= 4 for c in GEMM_CASES)


def test_split_k_ranges_cover_k_once():
    for k_tiles in range(1, 40):
        for splits in range(1, k_tiles + 1):
            per = fp8_gemm_schedule.k_tiles_per_split(k_tiles, splits)
            covered = [t for s in range(splits) for t in range(*fp8_gemm_schedule.split_k_range(s, per, k_tiles))]
            assert covered == list(range(k_tiles))


class _StoreWaitsOneShort(dsl.PipelineTmaStore):
    def producer_acquire(self):
        yield BulkWait(self.stages)


class _NoStoreTail(dsl.PipelineTmaStore):
    def producer_tail(self):
        yield from ()


GEMM_PERSISTENT = GemmCase(64, 512, 1000, Fp8GemmSpec("rowwise", 64, 64), 1, 0, max_ctas=2)
GEMM_BROKEN = {
    "producer's k range one short": (
        dict(producer_schedule=variant(fp8_gemm_schedule, split_k_range=lambda s, per, k, imin=min: (
            s * per, imin(s * per + per, k) - 1))), {"deadlock", "stale"}),
    "producer's k range one long": (
        dict(producer_schedule=variant(fp8_gemm_schedule, split_k_range=lambda s, per, k, imin=min: (
            s * per, imin(s * per + per, k) + 1))), {"bounds", "stale", "deadlock"}),
    "epilogue buffers not rotated across tiles": (
        dict(schedule=variant(fp8_gemm_schedule, epilogue_buffer=lambda done, n, sub, stages: sub % stages)),
        {"race"}),
    "store acquire waits one group short": (dict(dsl=variant(dsl, PipelineTmaStore=_StoreWaitsOneShort)), {"race"}),
    "no store drain before exit": (dict(dsl=variant(dsl, PipelineTmaStore=_NoStoreTail)), {"exit"}),
    "consumer waits on the wrong parity": (dict(dsl=variant(dsl, make_pipeline_state=_parity_flipped_consumer)),
                                           {"stale", "race", "deadlock"}),
    "a consumer skips an empty arrive": (dict(dsl=variant(dsl, PipelineTmaAsync=_SkipsOneRelease)), {"deadlock"}),
    "expect-tx off by a byte": (
        dict(schedule=variant(fp8_gemm_schedule, stage_tx_bytes=lambda tm, tn: (tm + tn) * 128 - 1)), {"deadlock"}),
}


@pytest.mark.parametrize("name", GEMM_BROKEN)
def test_fp8_gemm_model_catches(name):
    seams, kinds = GEMM_BROKEN[name]
    error = first_failure(lambda m: gemm_agents(m, GEMM_PERSISTENT, **seams))
    assert error.kind in kinds, error


# ------------------------------------------------------------------------------------------ prefill
def _prefill_cases(spec: PrefillSpec, seqs, kv_heads: int, num_ctas: int) -> list[PrefillCase]:
    """The tile list the kernel gets (prefill_tile_order, torch), split over num_ctas CTAs."""
    import torch

    from cute_kernels.hopper.prefill.prefill_tile_order import longest_first_tiles

    cum = lambda xs: torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    order = longest_first_tiles(cum([s[0] for s in seqs]), cum([s[1] for s in seqs]),
                                torch.tensor([s[2] for s in seqs], dtype=torch.int32), kv_heads,
                                spec.qheads_per_kvhead, spec.tile, spec.causal, max(s[0] for s in seqs))
    return [PrefillCase(spec, tuple(seqs), kv_heads, tuple(order.tolist()), num_ctas, c) for c in range(num_ctas)]


# (q_len, new keys, paged prefix): square causal, a chunk after a prefix (cp.async gathers), a
# decode-like row, and (host-refused, kernel-guarded) queries that see no key: seqlen_k < q_len.
PREFILL_SEQS = [(300, 300, 0), (40, 40, 200), (1, 1, 33), (260, 60, 0)]
PREFILL_CASES = [c for spec, ctas in [(PrefillSpec("bfloat16", 128, 4), 3), (PrefillSpec("float16", 64, 1), 2),
                                      (PrefillSpec("bfloat16", 128, 1, causal=False), 2)]
                 for c in _prefill_cases(spec, PREFILL_SEQS, 2, ctas)]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"{c.spec.name}_cta{c.cta}of{c.num_ctas}")
def test_prefill_protocol_holds(case):
    stats = run_all(lambda m: prefill_agents(m, case), SEEDS[:4])
    assert stats[0].steps > 0


def test_prefill_cases_cover_the_hard_paths():
    causal = PREFILL_CASES[0]
    g, tile = causal.spec.qheads_per_kvhead, causal.spec.tile
    n_max = [prefill_schedule.kv_block_range(m, q, p + k, g, causal.tile_tokens * g, tile.tile_n, True)[0]
             for q, k, p in PREFILL_SEQS for m in range(-(-q // causal.tile_tokens))]
    assert 0 in n_max, "a tile whose queries see no key"
    stats = [engine.run(lambda m, c=c: prefill_agents(m, c), 0) for c in PREFILL_CASES]
    assert any(s.max_fills("K") > 2 for s in stats), "ring wrap-around across tiles"
    assert any(s.max_fills("O") > 1 for s in stats), "sO reused by a later tile's store"


PREFILL_CAUSAL = PREFILL_CASES[0]
PREFILL_BROKEN = {
    "consumer waits for key tiles of a tile that loads none": (
        dict(consumer_schedule=variant(prefill_schedule, loads_key_tiles=lambda n: True)), {"deadlock"}),
    "producer loads one key tile fewer than the consumers wait for": (
        dict(schedule=variant(prefill_schedule, kv_block_range=lambda *a, **k: (
            prefill_schedule.kv_block_range(*a, **k)[0] - 1, prefill_schedule.kv_block_range(*a, **k)[1])),
             consumer_schedule=prefill_schedule), {"deadlock", "stale"}),
    "ring phase parity flipped": (dict(ring=lambda pos, s: (pos % s, 1 - (pos // s) % 2)), {"deadlock", "stale"}),
    "ring phase never flips": (dict(ring=lambda pos, s: (pos % s, 0)), {"deadlock", "stale", "race"}),
}


@pytest.mark.parametrize("name", PREFILL_BROKEN)
def test_prefill_model_catches(name):
    seams, kinds = PREFILL_BROKEN[name]
    error = first_failure(lambda m: prefill_agents(m, PREFILL_CAUSAL, **seams))
    assert error.kind in kinds, error


def test_prefill_ring_is_the_kernels_formula():
    assert [ring_slot(p, 2) for p in range(5)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0)]


# ----------------------------------------------------------------------- the model's kernel constants
def test_model_constants_match_the_kernels():
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    from cute_kernels.hopper.decode import decode_attention
    from cute_kernels.hopper.fp8_gemm import fp8_gemm_layouts
    from cute_kernels.hopper.prefill import prefill_epilogue, prefill_loads, prefill_mma
    from cute_kernels.hopper.protocol import decode, fp8_gemm, prefill

    assert (decode.CONSUMER_THREADS, decode.CONSUMER_BARRIER) == (decode_attention.CONSUMER_THREADS,
                                                                   decode_attention.CONSUMER_BARRIER)
    assert decode_attention.PRODUCER_WARP == decode.CONSUMER_WARPS  # the producer warp follows the consumers
    for name in ("EPI_TILE_N", "EPI_STAGES", "SMEM_BYTES", "MAX_STAGES"):
        assert getattr(fp8_gemm, name) == getattr(fp8_gemm_layouts, name), name
    for spec in (Fp8GemmSpec("rowwise", 64, 64), Fp8GemmSpec("block128", 128, 128), Fp8GemmSpec("rowwise", 64, 64, True)):
        assert ab_stages(spec) == fp8_gemm_layouts.num_ab_stages(spec)
    assert (prefill.PRODUCER_BARRIER_ID, prefill.SCHEDULER_BARRIER_ID, prefill.PAIR, prefill.EPILOGUE_BARRIER_ID) == (
        prefill_loads.PRODUCER_BARRIER_ID, prefill_mma.SCHEDULER_BARRIER_ID, prefill_mma.PAIR,
        prefill_epilogue.EPILOGUE_BARRIER_ID)
