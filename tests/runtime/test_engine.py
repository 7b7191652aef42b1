"""Engine-core invariants on tiny random models: no leaks, batch/chunk/preemption invariance, sampling."""
import random

import pytest

from runtime.errors import RequestError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import EOS, tiny_engine

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def prompts(n, seed=0, lo=3, hi=120):
    rng = random.Random(seed)
    return [[rng.randrange(0, 256) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run(engine, ps, params=GREEDY):
    return [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(ps, params, use_tqdm=False)]


def assert_idle(engine):
    pool = engine.pool
    assert pool.num_free == pool.num_blocks
    assert all(r == 0 for r in pool.ref_counts)
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.requests


def test_batch_invariance_16_mixed_prompts():
    ps = prompts(16)
    together = run(tiny_engine(), ps)
    engine = tiny_engine()
    alone = [run(engine, [p])[0] for p in ps]
    assert together == alone
    assert_idle(engine)


@pytest.mark.parametrize("budget", [3, 32])
def test_chunked_prefill_matches_unchunked(budget):
    ps = prompts(6, seed=1, lo=40, hi=200)
    assert run(tiny_engine(max_num_batched_tokens=budget), ps) == run(tiny_engine(max_num_batched_tokens=4096), ps)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_storm_outputs_unchanged(prefix_caching):
    ps = prompts(12, seed=2, lo=20, hi=60)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = run(tiny_engine(), ps, params)
    # 12 requests x up to 100 tokens need ~70 blocks; give 8 (about 10x too few)
    small = tiny_engine(num_blocks=8, enable_prefix_caching=prefix_caching)
    got = run(small, ps, params)
    assert got == want
    assert small.stats.preemptions > 0
    assert_idle(small)


def test_static_scheduler_matches_continuous():
    ps = prompts(8, seed=3)
    mixed = [SamplingParams(temperature=0, max_tokens=4 + 5 * i, ignore_eos=True) for i in range(8)]
    static = tiny_engine(scheduler="static", max_num_seqs=3)
    assert run(static, ps, mixed) == run(tiny_engine(), ps, mixed)
    # finished members kept decoding as padding until their batch's longest member finished
    assert static.stats.steps > sum(p.max_tokens for p in mixed[2::3])
    assert_idle(static)


def test_static_abort_of_the_last_live_member_releases_its_batch():
    engine = tiny_engine(scheduler="static")
    engine.add_request("short", [1, 2, 3], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.add_request("long", [4, 5, 6], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    for _ in range(4):
        engine.step()  # "short" has finished and decodes on as padding
    assert engine.abort_request("long")
    engine.step()
    assert_idle(engine)  # the padding member went with its batch; the next request starts at once
    assert len(run(engine, [[7, 8]], SamplingParams(temperature=0, max_tokens=2))[0]) == 2
    assert engine.stats.steps <= 4 + 1 + 3


def test_static_padding_of_a_finished_choice_is_never_reported_nor_its_logprobs():
    # n=3 seeded choices stop at different steps; the early ones decode on as static padding
    params = SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=40, stop_token_ids=list(range(0, 256, 5)),
                            logprobs=1)
    outs = {}
    for name, engine in (("static", tiny_engine(scheduler="static")), ("continuous", tiny_engine())):
        engine.add_request("r", [10, 20, 30], params)
        streamed, streamed_logprobs = {}, {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                for c in out.outputs:
                    streamed.setdefault(c.index, []).extend(c.delta_token_ids)
                    streamed_logprobs.setdefault(c.index, []).extend(c.delta_logprobs)
                    final = {c.index: (c.token_ids, c.finish_reason) for c in out.outputs}
                    final_logprobs = {c.index: c.logprobs for c in out.outputs}
        assert {i: ids for i, (ids, _) in final.items()} == streamed
        assert final_logprobs == streamed_logprobs  # one record per reported token, streamed once
        outs[name] = final
    assert outs["static"] == outs["continuous"]
    assert len({len(ids) for ids, _ in outs["static"].values()}) > 1  # the choices did end apart


def test_no_leak_after_aborts_mid_prefill_and_mid_decode():
    engine = tiny_engine(max_num_batched_tokens=16)
    long = prompts(1, seed=4, lo=100, hi=100)[0]
    engine.add_request("decode", [1, 2, 3], GREEDY)
    engine.add_request("prefill", long, GREEDY)
    engine.add_request("queued", [4, 5, 6], GREEDY)
    engine.step()
    engine.step()  # "prefill" is partway through its prompt, "decode" is decoding
    assert engine.requests["prefill"].choices[0].seq.num_computed < len(long)
    assert engine.requests["decode"].choices[0].seq.num_output_tokens >= 1
    for rid in ("prefill", "decode", "queued"):
        assert engine.abort_request(rid)
    outs = {o.request_id: o for o in engine.step()}
    assert {o.outputs[0].finish_reason for o in outs.values()} == {"abort"}
    assert_idle(engine)


def test_seeded_sampling_is_reproducible_regardless_of_batch_mates():
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=20, ignore_eos=True)
    alone = run(tiny_engine(), [[10, 20, 30]], p)[0]
    mates = prompts(5, seed=5)
    with_mates = run(tiny_engine(), [[10, 20, 30]] + mates, [p] + [SamplingParams(temperature=1.0, max_tokens=20)] * 5)
    assert with_mates[0] == alone
    other_seed = run(tiny_engine(), [[10, 20, 30]], SamplingParams(temperature=1.0, seed=99, max_tokens=20, ignore_eos=True))
    assert other_seed[0] != alone


def test_stop_token_and_stop_string():
    engine = tiny_engine()
    free = run(engine, [[65, 66, 67]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    stop_id = free[5]
    out = LLM.from_engine(engine).generate([[65, 66, 67]], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_id],
                                                                          ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert out.token_ids == free[: free.index(stop_id) + 1]
    # a stop string spanning two byte tokens: the text ends right before it
    text = engine.tokenizer.decode(free)
    span = engine.tokenizer.decode(free[3:5])
    if span and span.isprintable():
        out = LLM.from_engine(engine).generate([[65, 66, 67]], SamplingParams(temperature=0, max_tokens=30, stop=[span],
                                                                              ignore_eos=True), use_tqdm=False)[0].outputs[0]
        assert out.finish_reason == "stop" and out.stop_reason == span
        assert out.text == text[: text.index(span)]


def test_stop_string_text_spanning_tokens():
    engine = tiny_engine()
    # force the model's choices with logit_bias so the output text is known: "ab" then "cd"
    bias = {ord("a"): 100.0}
    out = LLM.from_engine(engine).generate([[1, 2]], SamplingParams(temperature=0, max_tokens=5, logit_bias=bias, stop=["aa"]),
                                           use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == "aa" and out.text == ""
    assert out.token_ids == [ord("a"), ord("a")]


def test_eos_ends_generation_unless_ignored():
    engine = tiny_engine()
    bias = {EOS: 100.0}
    out = LLM.from_engine(engine).generate([[1, 2]], SamplingParams(temperature=0, max_tokens=5, logit_bias=bias),
                                           use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids == [EOS]
    out = LLM.from_engine(engine).generate([[1, 2]], SamplingParams(temperature=0, max_tokens=5, logit_bias=bias, min_tokens=3),
                                           use_tqdm=False)[0].outputs[0]
    assert EOS not in out.token_ids[:3] and out.token_ids[3] == EOS
    out = LLM.from_engine(engine).generate([[1, 2]], SamplingParams(temperature=0, max_tokens=5, logit_bias=bias, ignore_eos=True),
                                           use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_n_choices_and_logprobs():
    engine = tiny_engine()
    out = LLM.from_engine(engine).generate([[5, 6, 7]], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8,
                                                                       ignore_eos=True, logprobs=3), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        assert len(c.logprobs) == 8
        chosen, top = c.logprobs[0]
        assert len(top) == 3 and chosen <= 0 and top[0][1] >= top[-1][1]
    m = out.metrics
    assert m["num_output_tokens"] == 24  # usage counts every choice
    span = m["e2e"] - m["ttft"]  # first token to the end: 7 more steps for each choice, side by side
    assert 0.7 * span <= m["tpot"] * 7 <= 1.05 * span  # not divided by all 23 other tokens
    assert_idle(engine)


def test_penalties_change_output_and_greedy_is_deterministic():
    engine = tiny_engine()
    base = run(engine, [[9, 9, 9]])[0]
    assert run(engine, [[9, 9, 9]])[0] == base
    pen = run(engine, [[9, 9, 9]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=2.0,
                                                  frequency_penalty=1.5))[0]
    assert pen != base
    assert max(pen.count(t) for t in set(pen)) <= max(base.count(t) for t in set(base))


@pytest.mark.parametrize("bad", [
    dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(max_tokens=0), dict(n=0), dict(top_k=-5),
    dict(logprobs=50), dict(stop_token_ids=[10**6]), dict(logit_bias={10**6: 1.0}), dict(min_p=2.0),
    dict(presence_penalty=3.0), dict(max_tokens="7"),
])
def test_invalid_params_rejected_before_enqueue(bad):
    engine = tiny_engine()
    with pytest.raises(RequestError):
        engine.add_request("r", [1, 2, 3], SamplingParams(**bad))
    assert not engine.requests and not engine.scheduler.waiting


def test_a_top_k_of_the_whole_vocabulary_means_no_cut():
    for k in (260, 10**12):  # the tiny vocabulary, and a k too large for any tensor
        p = SamplingParams(top_k=k)
        assert p.validate(260).top_k == 0 and p.top_k == k  # a copy: the caller's object is left as it is
    assert SamplingParams(top_k=259).validate(260).top_k == 259


def test_requests_that_can_never_fit_are_rejected():
    engine = tiny_engine(num_blocks=4)  # 64 tokens of KV
    with pytest.raises(RequestError, match="can never fit"):
        engine.add_request("big", list(range(100)), SamplingParams(max_tokens=1))
    with pytest.raises(RequestError, match="context length"):
        engine.add_request("ctx", [1] * 10, SamplingParams(max_tokens=2000))
    with pytest.raises(RequestError, match="empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(RequestError, match="not in"):
        engine.add_request("oov", [1, 99999], SamplingParams())
    # prompt fits, but prompt + output outgrows the whole pool while alone: finishes, never hangs
    out = run(engine, [list(range(60))], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    assert 1 <= len(out[0]) < 30
    assert_idle(engine)
    # the engine keeps serving afterwards
    assert len(run(engine, [[1, 2, 3]])[0]) == 24


def test_a_text_longer_than_any_tokenization_could_fit_is_refused_untokenized(monkeypatch):
    engine = tiny_engine()  # context 1024; the byte tokenizer's longest entry is "</s>", 4 characters
    assert engine.tokenizer.max_chars_per_token == 4
    monkeypatch.setattr(engine.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    with pytest.raises(RequestError, match="4097 characters") as exc:
        engine.add_request("r", "a" * 4097, GREEDY)
    assert exc.value.code == "context_length_exceeded"
    with pytest.raises(RequestError, match="characters"):
        engine.limits.encode_chat([{"role": "user", "content": "a" * 5000}])
    assert not engine.requests


def test_static_rejects_a_reservation_larger_than_the_pool():
    engine = tiny_engine(num_blocks=4, scheduler="static")  # 64 tokens of KV
    with pytest.raises(RequestError, match="reserves up front"):
        engine.add_request("r", list(range(40)), SamplingParams(max_tokens=30))
    assert len(run(engine, [list(range(40))], SamplingParams(temperature=0, max_tokens=24))[0]) == 24


def test_a_tiny_temperature_samples_like_greedy():
    engine = tiny_engine()
    greedy = run(engine, [[11, 12, 13]])[0]
    for t in (1e-40, 1e-6):
        assert run(engine, [[11, 12, 13]], SamplingParams(temperature=t, max_tokens=24, ignore_eos=True))[0] == greedy


def test_engine_seed_makes_unseeded_sampling_reproducible():
    p = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    ps = prompts(3, seed=6)
    first = run(tiny_engine(engine_seed=5), ps, p)
    assert run(tiny_engine(engine_seed=5), ps, p) == first
    assert run(tiny_engine(engine_seed=6), ps, p) != first
