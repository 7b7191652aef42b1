"""Speculative decoding: greedy outputs unchanged, sampled distribution exactly the target's, no leaks."""
import collections
import dataclasses
import random

import pytest
import torch
from scipy.stats import chisquare

from runtime.build import draft_proposer
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.llm import LLM
from runtime.sampling.verify import verify_one
from runtime.sampling_params import SamplingParams
from runtime.spec.ngram import NgramProposer, find_continuation
from tests.runtime.test_engine import assert_idle
from tests.tiny_engine import tiny_engine, tiny_weights

GREEDY = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)


def with_draft(engine, seed=1, logit_scale=1.0, k=3):
    cfg, tensors = tiny_weights(seed=seed, logit_scale=logit_scale)
    engine.config.num_speculative_tokens = k
    engine.set_proposer(draft_proposer(cfg, tensors, engine.model_config, engine.config, engine.device,
                                           engine.dtype, kv_budget_bytes=8 << 20))
    return engine


def with_ngram(engine, k=4):
    engine.config.num_speculative_tokens = k
    engine.set_proposer(NgramProposer(1, 4))
    return engine


def draft_kv_all_free(engine):
    pool = engine.scheduler.draft_blocks.pool
    return pool.num_free == pool.num_blocks


def mixed_prompts(seed=0):
    rng = random.Random(seed)
    motif = [rng.randrange(256) for _ in range(12)]
    repetitive = [motif * 5, (motif[:5] + [7]) * 8]  # the n-gram proposer finds matches here
    return repetitive + [[rng.randrange(256) for _ in range(rng.randint(5, 60))] for _ in range(6)]


def run(engine, prompts, params=GREEDY):
    return [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)]


def test_find_continuation_prefers_longest_latest_match():
    assert find_continuation([5, 1, 2, 9, 1, 2, 3, 8, 1, 2], 2, 1, 3) == [3, 8]
    assert find_continuation([1, 2, 3], 2, 1, 3) == []
    assert find_continuation([4, 4, 4], 3, 1, 2) == [4]


def test_ngram_greedy_identical_to_no_speculation():
    prompts = mixed_prompts()
    want = run(tiny_engine(), prompts)
    engine = with_ngram(tiny_engine())
    assert run(engine, prompts) == want
    assert engine.stats.spec_proposed > 0 and engine.stats.spec_accepted > 0
    assert_idle(engine)


def test_greedy_logprobs_with_speculation_equal_those_without():
    """A verified greedy step reports the emitted tokens' logprob records (chosen and top 2), as plain decoding does."""
    params = dataclasses.replace(GREEDY, logprobs=2)

    def records(engine):
        outs = LLM.from_engine(engine).generate(mixed_prompts(1)[:3], params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]

    engine = with_ngram(tiny_engine())
    got, want = records(engine), records(tiny_engine())
    assert engine.stats.spec_accepted > 0 and [t for t, _ in got] == [t for t, _ in want]
    for (_, g), (_, w) in zip(got, want):
        assert len(g) == len(w) == GREEDY.max_tokens
        for (gc, gtop), (wc, wtop) in zip(g, w):
            assert gc == pytest.approx(wc, abs=1e-5) and [t for t, _ in gtop] == [t for t, _ in wtop]


@pytest.mark.parametrize("draft_seed", [0, 1])  # seed 0 = the target itself (all accepted), 1 = a different model
def test_draft_model_greedy_identical_to_no_speculation(draft_seed):
    prompts = mixed_prompts(1)
    want = run(tiny_engine(), prompts)
    engine = with_draft(tiny_engine(), seed=draft_seed)
    assert run(engine, prompts) == want
    s = engine.stats
    assert s.spec_proposed > 0
    if draft_seed == 0:
        assert s.spec_accepted == s.spec_proposed
    else:
        assert s.spec_accepted < s.spec_proposed
    assert draft_kv_all_free(engine)
    assert_idle(engine)


@pytest.mark.parametrize("left_out", ["drafts", "whole sequence"])
def test_drafts_left_out_of_a_step_are_forgotten_by_the_draft_model(left_out):
    prompts = [p[:2] for p in mixed_prompts(1)[2:5]]
    want = run(tiny_engine(), prompts)
    engine = with_draft(tiny_engine(max_num_batched_tokens=6), seed=0, k=3)  # the draft is the target
    if left_out == "whole sequence":  # every other step the scheduler skips one drafted decode entirely
        schedule, steps = engine.scheduler.policy.schedule, iter(range(10**6))

        def skipping(sched, spec_tokens):
            out = schedule(sched, spec_tokens)
            if next(steps) % 2 and len(out.chunks) > 1 and out.chunks[-1].seq in spec_tokens:
                out.chunks.pop()
            return out
        engine.scheduler.policy.schedule = skipping
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = out.outputs[0].token_ids
        for seq in (c.seq for r in engine.requests.values() for c in r.choices):
            st = seq.draft_kv
            assert st is None or st.num_computed < len(seq.token_ids)  # no guess kept; the last token to run
    assert [done[f"r{i}"] for i in range(len(prompts))] == want
    s = engine.stats
    assert 0 < s.spec_accepted == s.spec_proposed  # counts only the drafts verified, all of them right
    assert draft_kv_all_free(engine)
    assert_idle(engine)


def test_static_batches_never_draft():
    with pytest.raises(UserError, match="continuous scheduler"):
        EngineConfig(scheduler="static", speculative="ngram")
    engine = with_draft(tiny_engine(scheduler="static"), seed=0, k=3)  # attached behind the config's back
    assert run(engine, [[1, 2, 3], [4, 5, 6]]) == run(tiny_engine(), [[1, 2, 3], [4, 5, 6]])
    assert engine.stats.spec_proposed == 0 and draft_kv_all_free(engine)


def test_per_request_switch_and_mixed_batch():
    prompts = mixed_prompts(2)
    engine = with_ngram(tiny_engine())
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, speculative=i % 2 == 0)
              for i in range(len(prompts))]
    assert run(engine, prompts, params) == run(tiny_engine(), prompts)


def _first_token_counts(p, q, trials, rule=verify_one, seed=0):
    """Sample a draft token from q, verify it against p, count the first emitted token."""
    gen = torch.Generator().manual_seed(seed)
    counts = collections.Counter()
    for _ in range(trials):
        d = int(torch.multinomial(q, 1, generator=gen))
        emitted = rule(torch.stack([p, p]), [d], q.unsqueeze(0), gen)
        counts[emitted[0]] += 1
    return [counts[i] for i in range(len(p))]


def _always_accept(p, draft, q, gen):  # deliberately broken rule: outputs follow the draft
    return list(draft) + [0]


def test_rejection_sampling_preserves_target_distribution_and_test_detects_broken_rule():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g) * 1.5, 0)
    q = torch.softmax(torch.randn(6, generator=g) * 1.5, 0)
    n = 6000
    good = _first_token_counts(p, q, n)
    assert chisquare(good, (p * n).tolist()).pvalue > 0.001
    bad = _first_token_counts(p, q, n, rule=_always_accept)
    assert chisquare(bad, (p * n).tolist()).pvalue < 1e-6


def test_a_draft_vocabulary_q_preserves_target_distribution():
    """q over a draft vocabulary (columns = q_ids, every other token q = 0): the residual subtracts q at those
    ids only, so the first token still follows p (a residual taken as if the columns were ids 0..n fails)."""
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(8, generator=g) * 1.5, 0)
    ids = torch.tensor([6, 1, 3, 7])
    q = torch.softmax(torch.randn(4, generator=g) * 1.5, 0)
    n, counts = 6000, collections.Counter()
    for _ in range(n):
        d = int(ids[torch.multinomial(q, 1, generator=g)])
        counts[verify_one(torch.stack([p, p]), [d], q.unsqueeze(0), g, ids)[0]] += 1
    assert chisquare([counts[i] for i in range(8)], (p.double() / p.double().sum() * n).tolist()).pvalue > 0.001


def test_point_mass_draft_preserves_target_distribution():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(5, generator=g) * 2, 0)
    counts = collections.Counter(verify_one(torch.stack([p, p]), [2], None, g)[0] for _ in range(5000))
    assert chisquare([counts[i] for i in range(5)], (p * 5000).tolist()).pvalue > 0.001


def test_engine_sampling_distribution_with_draft_equals_without():
    """Second and third generated tokens (the verified ones) follow the target's distribution."""
    params = SamplingParams(n=400, temperature=1.0, max_tokens=3, ignore_eos=True)
    prompt = [[10, 20, 30, 40]]

    def positions(engine):
        out = LLM.from_engine(engine).generate(prompt, params, use_tqdm=False)[0]
        return [tuple(c.token_ids[1:3]) for c in out.outputs]

    torch.manual_seed(0)
    base = positions(tiny_engine(logit_scale=60.0))
    torch.manual_seed(1)
    engine = with_draft(tiny_engine(logit_scale=60.0), seed=3, logit_scale=60.0, k=2)
    spec = positions(engine)
    assert engine.stats.spec_proposed > 0 and engine.stats.spec_accepted < engine.stats.spec_proposed
    for pos in (0, 1):
        a = collections.Counter(t[pos] for t in base)
        b = collections.Counter(t[pos] for t in spec)
        top = [t for t, _ in (a + b).most_common(8)]
        obs = [[c[t] for t in top] + [sum(c.values()) - sum(c[t] for t in top)] for c in (a, b)]
        # two-sample chi-square on the contingency table
        from scipy.stats import chi2_contingency

        cols = [i for i in range(len(obs[0])) if obs[0][i] + obs[1][i] > 0]
        assert chi2_contingency([[r[i] for i in cols] for r in obs]).pvalue > 0.001


def test_no_leaks_with_rejections_aborts_and_preemptions():
    engine = with_draft(tiny_engine(num_blocks=10), seed=2, k=4)
    prompts = mixed_prompts(3)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0.9, seed=i, max_tokens=40, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps in (3, 9, 15):
            engine.abort_request(f"r{steps % 7}")
    assert engine.stats.preemptions > 0 and engine.stats.spec_proposed > engine.stats.spec_accepted
    assert_idle(engine)
    assert draft_kv_all_free(engine)
