"""Suffix decoding: the longest match and its most frequent continuation, the probability cut-off and the
length scaled by the match, the bounded response cache, and on the engine: greedy output unchanged, and
a response seen before drafted for a new request."""
import numpy as np
import pytest

from runtime.sampling_params import SamplingParams
from runtime.spec.suffix import END, ResponseCache, SuffixProposer, follow, occurrences
from tests.runtime.spec.test_spec import mixed_prompts, run
from tests.runtime.test_engine import assert_idle
from tests.tiny_engine import tiny_engine


def test_the_longest_match_wins_and_its_own_end_is_no_occurrence():
    buf = np.array([5, 1, 2, 9, 7, 1, 2, 3, 8, 7, 1, 2])
    hits, m = occurrences(buf, buf, 24)
    assert m == 3 and hits.tolist() == [7]  # "7 1 2" is followed by 3; "1 2" alone would also give 9
    hits, m = occurrences(buf, buf, 2)  # max depth 2: both "1 2" occurrences
    assert m == 2 and hits.tolist() == [3, 7]
    assert occurrences(np.array([4, 5, 6]), np.array([4, 5, 6]), 24)[1] == 0


def test_the_most_frequent_continuation_until_the_probability_falls_below_the_minimum():
    buf = np.array([9, 1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    hits, m = occurrences(buf, buf, 24)
    assert m == 3  # "9 1 2", followed by 3 twice and 4 once
    guess = follow(buf, hits, 5, 0.1)
    # 3 (2/3), then both of its occurrences go on "9 1 2", then one 3 and one 4: the latest wins (2/3 * 1/2)
    assert guess.tokens == [3, 9, 1, 2, 4] and guess.score == pytest.approx(2 / 3 * 4 + 1 / 3)
    assert follow(buf, hits, 5, 0.5).tokens == [3, 9, 1, 2]  # 1/3 is below 0.5
    assert follow(buf, hits, 5, 0.7).tokens == []  # 2/3 is below 0.7


def test_the_draft_length_scales_with_the_match_length():
    proposer = SuffixProposer(factor=1.0)
    one = np.array([7, 8, 9, 10, 11, 12, 99, 7])  # a match of 1 token: 1 draft at factor 1
    assert proposer.guess(one, 4).tokens == [8]
    three = np.array([7, 8, 9, 10, 11, 12, 99, 7, 8, 9])
    assert proposer.guess(three, 4).tokens == [10, 11, 12]


def test_the_response_cache_keeps_the_last_requests_only():
    cache = ResponseCache(2)
    for tokens in ([1, 2], [3, 4, 5], [6]):
        cache.add(tokens)
    assert cache.buf.tolist() == [3, 4, 5, END, 6, END]


def test_greedy_identical_to_no_speculation_and_drafts_accepted():
    prompts = mixed_prompts()
    want = run(tiny_engine(), prompts)
    engine = tiny_engine()
    engine.config.num_speculative_tokens = 4
    engine.set_proposer(SuffixProposer())
    assert run(engine, prompts) == want
    assert engine.stats.spec_accepted > 0
    assert_idle(engine)


def test_a_response_seen_before_is_drafted_from_the_cache():
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine = tiny_engine()
    engine.config.num_speculative_tokens = 4
    proposer = engine.proposer = SuffixProposer(max_cached_requests=4)
    prompt = [11, 22, 33, 44, 55]
    first = run(engine, [prompt], params)
    before = engine.stats.spec_accepted
    assert run(engine, [prompt], params) == first  # the same request again: only the cache knows its answer
    assert proposer.cache.buf.tolist()[:len(first[0]) + 1] == first[0] + [END]  # the first output joined it
    assert engine.stats.spec_accepted - before >= 16
