"""The per-request throttle: draft lengths follow acceptance, down to none with growing pauses for drafts
that never pay, and back up once they do; greedy output never changes."""
import pytest

from runtime.sampling_params import SamplingParams
from runtime.sequence import Draft, RequestMetrics, Sequence
from runtime.spec.step_clock import MAX_GAP_S, STALE_S, StepClock
from runtime.spec.throttle import Throttle, _Record
from tests.runtime.spec.test_spec import mixed_prompts, run
from tests.runtime.test_engine import assert_idle
from tests.tiny_engine import tiny_engine


def frozen() -> StepClock:
    """A clock that never times a step, so the engine tests below follow the row-cost model alone."""
    return StepClock(enabled=False)


class Fake:
    """A step clock's time source moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed(steps: list[tuple[int, float]]) -> StepClock:
    """A StepClock that saw steps of (rows, seconds), in order."""
    fake = Fake()
    clock = StepClock(clock=fake)
    for rows, seconds in steps:
        clock.tick(rows)
        fake.now += seconds
    clock.tick(0)
    return clock


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
    engine.set_proposer(Throttle(inner, clock=frozen()))
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
    engine.set_proposer(Throttle(Fixed({tuple(p): p + w for p, w in zip(prompts, want)} if right else None),
                                 clock=frozen()))
    assert run(engine, prompts, params) == want
    s = engine.stats
    if right:
        # the first drafts, at the starting estimate 0.5 and batch 3, are one token long; the rest are 4
        assert s.spec_accepted == s.spec_proposed and s.spec_mean_accepted_len > 3.3
    else:
        assert s.spec_accepted == 0 and s.spec_verify_steps < len(prompts) * 10


def test_the_clock_prices_a_row_by_the_steps_it_timed():
    # 8 rows: 32 ms (4 ms a token); 9 rows: 38 ms, so a ninth row costs 6 ms, 1.5 tokens' share: never pays
    clock = timed([(8, 0.032), (9, 0.038)] * 3)
    assert clock.step_time(8) == pytest.approx(0.032) and clock.row_line(8) == 1.0
    # 4 rows: 20 ms, 6 rows: 22 ms: 1 ms a row against 5 ms a token
    clock = timed([(4, 0.020), (6, 0.022)] * 3)
    assert clock.row_line(4) == pytest.approx(0.2)
    assert clock.row_line(6) is None  # nothing timed above 6 rows


def test_the_clock_takes_the_steepest_measured_slope():
    # 9 rows timed no slower than 8 (noise), 12 rows 3 ms more: the line is 12 rows' (0.75 ms a row over
    # 4 ms a token), not a near-free row that would let every sequence draft its whole length
    clock = timed([(8, 0.032), (9, 0.0319), (12, 0.035)] * 3)
    assert clock.row_line(8) == pytest.approx(0.1875)


def test_the_clock_trusts_a_median_and_skips_idle_gaps():
    clock = timed([(1, 0.010), (1, 0.011), (1, 0.5), (2, 0.012), (2, 0.012), (2, MAX_GAP_S + 1)])
    assert clock.step_time(1) == pytest.approx(0.011)  # one slow step (a prefill chunk) does not move it
    assert clock.step_time(2) is None  # the idle gap was not a step: two samples are too few
    assert clock.row_line(1) is None


def test_the_throttle_takes_the_measured_line_and_falls_back_to_the_model():
    t = Throttle(Fixed(), row_cost=0.15, clock=timed([(8, 0.032), (9, 0.038)] * 3))
    assert t.step_cost(8) == 1.0  # measured: drafts never pay at batch 8
    assert t.step_cost(2) == pytest.approx(2 * 0.15 / 0.85 / (1 + 2 * 0.15 / 0.85))  # not timed: the model
    assert t.length(_Record(hits=9, misses=1), 4, t.step_cost(8)) == 0


def test_the_throttle_times_the_rows_it_hands_out():
    fake = Fake()
    t = Throttle(Fixed(), clock=StepClock(clock=fake))  # always wrong, drafts of k tokens
    seqs = [Sequence(i, str(i), [1, 2, 3], 3, SamplingParams(), RequestMetrics(0.0)) for i in range(2)]
    for batch in (seqs, seqs, seqs[:1]):
        t.propose(batch, 2)
        fake.now += 0.01
    # estimate 0.5 against batch 2's line (0.26): one draft each (4 rows); at batch 1 (line 0.15): two
    assert t.clock._last[1] == 3 and {rows: list(s) for rows, s in t.clock.samples.items()} == {4: [0.01, 0.01]}


def test_where_no_draft_can_pay_none_is_made_not_even_a_probe():
    clock = timed([(2, 0.010), (3, 0.030)] * 3)  # a third row triples the step
    inner = Fixed()
    t = Throttle(inner, clock=clock)
    seqs = [Sequence(i, str(i), [1, 2, 3], 3, SamplingParams(), RequestMetrics(0.0)) for i in range(2)]
    assert t.step_cost(2) == 1.0
    for _ in range(5):
        assert t.propose(seqs, 4) == {}
    assert inner.asked == []  # the proposer did no work either
    assert t.step_cost(1) < 1.0  # batch 1 is not measured: the model's line, so its probes still run


def test_row_counts_not_seen_for_a_while_are_forgotten():
    clock = timed([(2, 0.010), (3, 0.030)] * 3)
    fake = clock.clock
    assert clock.row_line(2) == 1.0
    for _ in range(4):  # only 2-row steps from now on, past STALE_S
        clock.tick(2)
        fake.now += STALE_S / 2
    assert clock.step_time(3) is None and clock.row_line(2) is None  # back to the model, which probes again


def test_a_deterministic_engine_drafts_by_the_model_alone():
    from runtime.build import _step_clock
    from runtime.engine_config import EngineConfig

    assert _step_clock(EngineConfig(deterministic=False)).enabled
    clock = _step_clock(EngineConfig(deterministic=True))
    for rows, _ in [(8, 0.032), (9, 0.038)] * 3:
        clock.tick(rows)
    assert not clock.samples and clock.row_line(8) is None


@pytest.mark.parametrize("right", [True, False])
def test_a_new_request_starts_from_the_traffics_acceptance(right):
    """After requests whose drafts were always right, a new one drafts all k at once; after always wrong ones,
    it starts below the line (one probe), where an even start would draft two at batch 1."""
    prompts = mixed_prompts(5)[:3]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    want = run(tiny_engine(), prompts, params)
    inner = Fixed({tuple(p): p + w for p, w in zip(prompts, want)} if right else None)
    t = Throttle(inner, clock=frozen())
    engine = tiny_engine()
    engine.config.num_speculative_tokens = 4
    engine.set_proposer(t)
    assert run(engine, prompts[:2], params) == want[:2]
    seq = Sequence(9, "9", prompts[2], len(prompts[2]), params, RequestMetrics(0.0))
    drafts = t.propose([seq], 4)
    assert len(drafts[seq].tokens) == (4 if right else 1)


def test_an_accepted_probe_below_the_line_keeps_the_pauses_growing():
    """Heads accepting ~30% at batch 8 (line 0.585): a probe that happens to be accepted leaves the estimate
    below the line, so the next pause doubles (resetting it on any accepted probe re-probed every few steps)."""
    t = Throttle(Fixed(), row_cost=0.15, clock=frozen())
    seqs = [Sequence(i, str(i), [1, 2, 3], 3, SamplingParams(), RequestMetrics(0.0)) for i in range(8)]
    for s in seqs:
        t.records[s] = _Record(hits=0.1, misses=5.0, backoff=8)  # a probe is due
    assert all(len(d.tokens) == 1 for d in t.propose(seqs, 4).values())
    for s in seqs:  # each probe accepted: its token and a bonus token
        s.token_ids += [7, 8]
        s.metrics.spec_proposed += 1
    assert t.propose(seqs, 4) == {}
    assert all(t.records[s].backoff == 16 and t.records[s].skip == 16 for s in seqs)
