"""Prefix caching: shared full blocks, identical outputs, LRU eviction that never touches live blocks."""
import random

from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.runtime.test_engine import assert_idle
from tests.tiny_engine import tiny_engine

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def shared_workload(n=12, prefix_len=100, seed=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(prefix_len)]
    prompts = [prefix + [rng.randrange(256) for _ in range(rng.randint(1, 40))] for _ in range(n)]
    return prompts + prompts[:3]  # exact repeats too


def outputs(engine, prompts, params=GREEDY):
    return [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)]


def check_pool_invariants(engine):
    pool = engine.pool
    live = [s for s in engine.scheduler.running]
    for seq in live:
        for b in seq.kv.block_table:
            assert pool.ref_counts[b] > 0 and b not in pool.free_queue
    for h, b in pool.cached.items():
        assert pool.block_hash[b] == h
    assert sum(1 for r in pool.ref_counts if r > 0) + pool.num_free == pool.num_blocks


def test_outputs_identical_with_cache_on_and_off():
    prompts = shared_workload()
    on = tiny_engine(max_num_batched_tokens=64)
    off = tiny_engine(max_num_batched_tokens=64, enable_prefix_caching=False)
    assert outputs(on, prompts) == outputs(off, prompts)
    assert on.stats.prefix_cache_hits > 0 and off.stats.prefix_cache_hits == 0
    assert on.stats.computed_prefill_tokens < off.stats.computed_prefill_tokens
    assert_idle(on)
    assert on.pool.num_cached > 0  # freed blocks keep their contents for later hits


def test_same_prompt_shares_every_full_block_physically():
    engine = tiny_engine()
    prompt = list(range(70))  # 4 full blocks + a partial one
    engine.add_request("a", prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()
    a = engine.requests["a"].choices[0].seq
    engine.add_request("b", prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()
    b = engine.requests["b"].choices[0].seq
    assert b.kv.block_table[:4] == a.kv.block_table[:4]
    assert all(engine.pool.ref_counts[x] == 2 for x in a.kv.block_table[:4])
    assert b.kv.block_table[4] != a.kv.block_table[4]  # the partial block is never shared
    assert b.metrics.num_cached_prompt_tokens == 64
    while engine.has_unfinished_requests():
        engine.step()
    assert_idle(engine)


def test_fully_cached_prompt_still_computes_its_last_token():
    engine = tiny_engine()
    prompt = list(range(64))  # exactly 4 blocks
    first = outputs(engine, [prompt])[0]
    again = LLM.from_engine(engine).generate([prompt], GREEDY, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == first
    assert again.num_cached_tokens == 48  # the block holding the last token is recomputed, not shared


def test_eviction_under_pressure_is_lru_and_never_stale():
    prompts = shared_workload(n=20, prefix_len=40, seed=1) + shared_workload(n=10, prefix_len=60, seed=2)
    random.Random(3).shuffle(prompts)
    on = tiny_engine(num_blocks=24, max_num_batched_tokens=48)
    llm = LLM.from_engine(on)
    for p in prompts:
        on.add_request(f"r{len(on.requests)}-{id(p)}", p, GREEDY)
    got = {}
    while on.has_unfinished_requests():
        for out in on.step():
            if out.finished:
                got[out.request_id] = out.outputs[0].token_ids
        check_pool_invariants(on)
    assert on.pool.evictions > 0 and on.stats.prefix_cache_hits > 0
    off = tiny_engine(enable_prefix_caching=False)
    want = outputs(off, prompts)
    assert [got[k] for k in sorted(got, key=lambda k: int(k[1:].split("-")[0]))] == want
    assert_idle(on)
    del llm


def test_lru_order_keeps_recent_prefixes():
    engine = tiny_engine(num_blocks=12)
    old, new = list(range(100, 148)), list(range(150, 198))  # 3 full blocks each
    outputs(engine, [old])
    outputs(engine, [new])
    outputs(engine, [list(range(0, 64))])  # needs fresh blocks: evicts the oldest cached ones first
    hit_new = LLM.from_engine(engine).generate([new], GREEDY, use_tqdm=False)[0].num_cached_tokens
    assert hit_new == 32  # both leading blocks of the newest prefix survived (the 3rd holds the last token)


def test_preempted_request_finds_its_blocks_and_outputs_match():
    rng = random.Random(4)
    prefix = [rng.randrange(256) for _ in range(48)]
    prompts = [prefix + [rng.randrange(256) for _ in range(rng.randint(5, 30))] for _ in range(10)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    small = tiny_engine(num_blocks=14)
    llm_outs = LLM.from_engine(small).generate(prompts, params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in llm_outs]
    assert small.stats.preemptions > 0 and small.stats.prefix_cache_hits > 0
    # a recomputed request also hits its own output blocks; its metric counts prompt tokens only
    assert all(o.metrics["num_cached_prompt_tokens"] <= len(o.prompt_token_ids) for o in llm_outs)
    assert got == outputs(tiny_engine(enable_prefix_caching=False), prompts, params)
    assert_idle(small)


def test_a_request_waiting_for_blocks_is_counted_once_in_the_cache_stats():
    engine = tiny_engine(num_blocks=8)  # 128 tokens: the second prompt waits until the first is done
    outputs(engine, [list(range(100)), list(range(200, 240))])
    assert engine.stats.preemptions == 0
    assert engine.stats.prefix_cache_queries == 100 + 40


def test_abort_of_one_sharer_leaves_the_other_intact():
    engine = tiny_engine()
    prompt = list(range(80))
    want = outputs(tiny_engine(enable_prefix_caching=False), [prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    engine.add_request("a", prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()
    engine.add_request("b", prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()
    engine.abort_request("a")
    result = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "b" and out.finished:
                result = out.outputs[0].token_ids
    assert result == want
    assert_idle(engine)


def test_sampled_requests_with_cache_match_without():
    prompts = shared_workload(n=6, seed=5)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=10, ignore_eos=True)
    assert outputs(tiny_engine(), prompts, params) == outputs(tiny_engine(enable_prefix_caching=False), prompts, params)
