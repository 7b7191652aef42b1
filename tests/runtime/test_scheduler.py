"""The scheduler alone, over a real block pool: what one step holds, in what order, and who is preempted."""
import itertools

from runtime.engine_config import EngineConfig
from runtime.engine_stats import EngineStats
from runtime.kv.block_manager import BlockManager
from runtime.kv.block_pool import BlockPool
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Scheduler
from runtime.sequence import Draft, RequestMetrics, SeqStatus, Sequence, SeqUpdate

BLOCK = 4
_ids = itertools.count()


def scheduler(num_blocks=64, budget=32, max_seqs=8, policy="continuous"):
    pool = BlockPool(num_blocks, enable_prefix_caching=False)
    config = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, scheduler=policy)
    return Scheduler(config, BlockManager(pool, BLOCK), EngineStats(), max_model_len=1 << 20)


def seq(prompt_len, max_tokens=100):
    n = next(_ids)
    return Sequence(n, f"r{n}", list(range(1, prompt_len + 1)), prompt_len,
                    SamplingParams(temperature=0, max_tokens=max_tokens), RequestMetrics(arrival=0.0))


def run_step(sched, spec=None):
    """Schedule one step and play the model's part: computed tokens are cached, a finished prompt
    or decode gets one new token. spec: draft tokens offered per sequence (their count)."""
    out = sched.schedule({q: Draft([9] * n) for q, n in (spec or {}).items()})
    reaching_end = [c.seq for c in out.chunks if c.seq.num_computed + c.num_tokens == len(c.seq.token_ids)]
    sched.update(out, [SeqUpdate(q, [7]) for q in reaching_end])
    return out


def test_decodes_first_then_prefill_chunks_fill_the_budget_in_one_step():
    s = scheduler(budget=32)
    decoders = [seq(5), seq(6)]
    for d in decoders:
        s.add(d)
    run_step(s)  # both prompts prefilled; each now has one token to decode
    long, short = seq(50), seq(10)
    s.add(long)
    s.add(short)
    out = run_step(s)
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(decoders[0], 1), (decoders[1], 1), (long, 30)]
    assert out.num_tokens == 32  # the budget, exactly
    out = run_step(s)  # decodes, then the rest of the long prompt, then the short one starts
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(decoders[0], 1), (decoders[1], 1), (long, 20),
                                                           (short, 10)]


def test_sequence_cap_holds_admission():
    s = scheduler(budget=1000, max_seqs=3)
    seqs = [seq(4) for _ in range(5)]
    for q in seqs:
        s.add(q)
    out = run_step(s)
    assert [c.seq for c in out.chunks] == seqs[:3] and list(s.waiting) == seqs[3:]


def test_newest_running_sequence_is_preempted_and_goes_to_the_front():
    s = scheduler(num_blocks=6, budget=100)
    old, mid, new = seq(8), seq(8), seq(7)  # 2 + 2 + 2 blocks: the pool is full
    for q in (old, mid, new):
        s.add(q)
    run_step(s)
    waiting = seq(3)
    s.add(waiting)
    out = run_step(s)  # old and mid each need a third block for their first decode
    assert out.preempted == [new]
    assert new.status is SeqStatus.WAITING and not new.kv.block_table and new.num_computed == 0
    assert list(s.waiting) == [new, waiting]  # recomputed before anyone who arrived later
    assert [c.seq for c in out.chunks] == [old, mid]  # and nothing new is admitted this step


def test_draft_tokens_are_dropped_before_anyone_is_preempted():
    s = scheduler(num_blocks=4, budget=100)
    a, b = seq(7), seq(6)  # 2 blocks each, the pool is full; both decodes still fit their second block
    s.add(a)
    s.add(b)
    run_step(s)
    out = run_step(s, {a: 3})  # a's 3 drafts would need a fifth block
    assert not out.preempted
    assert [(c.seq, c.num_tokens, c.num_spec_tokens) for c in out.chunks] == [(a, 1, 0), (b, 1, 0)]


def test_every_decode_gets_its_token_before_anyone_gets_drafts():
    s = scheduler(budget=6)
    seqs = [seq(2) for _ in range(3)]
    for q in seqs:
        s.add(q)
    run_step(s)  # one step prefills all three
    out = run_step(s, {q: 3 for q in seqs})
    assert [(c.seq, c.num_tokens, c.num_spec_tokens) for c in out.chunks] == [(seqs[0], 1, 3), (seqs[1], 1, 0),
                                                                                (seqs[2], 1, 0)]


def test_static_batch_reserves_prompt_plus_max_tokens_up_front():
    s = scheduler(num_blocks=64, budget=1000, policy="static")
    a, b = seq(6, max_tokens=10), seq(3, max_tokens=4)
    s.add(a)
    s.add(b)
    run_step(s)
    # one padded rectangle: every member reserves the longest prompt + the largest max_tokens
    assert len(a.kv.block_table) == len(b.kv.block_table) == -(-(6 + 10) // BLOCK)
    late = seq(2)
    s.add(late)
    run_step(s)
    assert late.status is SeqStatus.WAITING  # no admission until the batch drains


def test_update_rolls_back_the_kv_of_rejected_drafts():
    s = scheduler(num_blocks=64, budget=100)
    a = seq(7)
    s.add(a)
    run_step(s)  # 7 prompt tokens computed, one sampled: 8 known
    out = s.schedule({a: Draft([9] * 6)})
    assert out.chunks[0].num_spec_tokens == 6 and len(a.kv.block_table) == -(-(7 + 7) // BLOCK)
    s.update(out, [SeqUpdate(a, [9, 9], num_drafts=6)])  # one draft accepted, then a corrected token
    assert a.token_ids[-2:] == [9, 9] and a.num_computed == 9  # the 8 known tokens and the accepted draft
    assert len(a.kv.block_table) == -(-9 // BLOCK)  # blocks holding only rejected drafts went back


def test_static_finished_member_pads_until_its_batch_drains():
    s = scheduler(budget=100, policy="static")
    a, b = seq(3, max_tokens=2), seq(3, max_tokens=5)
    s.add(a)
    s.add(b)
    for finished in ([], [a]):
        out = s.schedule()
        assert not out.padding
        s.update(out, [SeqUpdate(q, [7], finished=q in finished) for q in (a, b)])
    out = s.schedule()
    assert out.padding == {a} and [c.seq for c in out.chunks] == [a, b]  # a is computed, never reported
    s.update(out, [SeqUpdate(a, [8]), SeqUpdate(b, [7], finished=True)])
    assert not s.running and s.blocks.pool.num_free == s.blocks.pool.num_blocks
