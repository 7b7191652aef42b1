"""The per-request throttle: draft lengths follow acceptance, down to none with growing pauses for drafts
that never pay, and back up once they do; greedy output never changes."""
import pytest

from runtime.sampling_params import SamplingParams
from runtime.sequence import Draft
from runtime.spec.throttle import Throttle, _Record
from tests.runtime.spec.test_spec import mixed_prompts, run
from tests.runtime.test_engine import assert_idle
from tests.tiny_engine import tiny_engine


class Fixed:
    """Drafts from a fixed rule: right (the greedy continuation, from a reference run) or always wrong."""

    num_kv_blocks = 0

    def __init__(self, answers=None) -> None:
        self.answers, self.asked = answers, []

    def propose(self, seqs, k):
        self.asked.append(len(seqs))
        if self.answers is None:
            return {s: Draft([259] * k) for s in seqs}  # 259 is never the tiny model's greedy pick here
        return {s: Draft(self.answers[tuple(s.token_ids[:s.num_prompt_tokens])][len(s.token_ids):][:k]) for s in seqs}


def test_the_length_is_the_longest_worth_its_verify_rows():
    t = Throttle(Fixed(), row_cost=0.15)
    assert t.length(_Record(hits=9, misses=1), 4) == 4  # 0.9^4 > 0.15
    assert t.length(_Record(hits=1, misses=1), 4) == 2  # 0.5^2 = 0.25 >= 0.15 > 0.5^3
    assert t.length(_Record(hits=1, misses=9), 4) == 0  # 0.1 < 0.15: none


def test_in_a_batch_a_draft_must_be_likelier_to_pay_for_its_row():
    t = Throttle(Fixed(), row_cost=0.15)
    assert t.step_cost(1) == pytest.approx(0.15)
    assert t.step_cost(8) == pytest.approx(0.585, abs=1e-3)  # 8c / (1 + 8c), c = 0.15 / 0.85
    half = _Record(hits=1, misses=1)
    assert t.length(half, 4, t.step_cost(1)) == 2 and t.length(half, 4, t.step_cost(8)) == 0
    assert t.length(_Record(hits=9, misses=1), 4, t.step_cost(8)) == 4  # 0.9^4 = 0.66 still pays


def test_drafts_that_never_pay_are_turned_down_with_growing_pauses():
    inner = Fixed()
    engine = tiny_engine()
    engine.config.num_speculative_tokens = 4
    engine.set_proposer(Throttle(inner))
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    assert run(engine, [[1, 2, 3]], params) == run(tiny_engine(), [[1, 2, 3]], params)
    s = engine.stats
    assert s.spec_accepted == 0 and s.spec_verify_steps <= 12 and s.spec_proposed <= 20
    assert len(inner.asked) == s.spec_verify_steps  # no work for the proposer while paused
    assert_idle(engine)


@pytest.mark.parametrize("right", [True, False])
def test_drafts_that_pay_keep_their_full_length(right):
    prompts = mixed_prompts(5)[:3]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = run(tiny_engine(), prompts, params)
    engine = tiny_engine()
    engine.config.num_speculative_tokens = 4
    engine.set_proposer(Throttle(Fixed({tuple(p): p + w for p, w in zip(prompts, want)} if right else None)))
    assert run(engine, prompts, params) == want
    s = engine.stats
    if right:
        # the first drafts, at the starting estimate 0.5 and batch 3, are one token long; the rest are 4
        assert s.spec_accepted == s.spec_proposed and s.spec_mean_accepted_len > 3.3
    else:
        assert s.spec_accepted == 0 and s.spec_verify_steps < len(prompts) * 10
