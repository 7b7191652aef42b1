"""Trained-head speculation (Medusa, EAGLE-style) on the tiny model: the hidden-state seam reads the right
rows, verify chunks run as decode rows with the prefill path's logits, greedy output is unchanged, sampled
output keeps the target's distribution, and the head file round-trips into --speculative medusa|eagle."""
import collections

import pytest
import torch
from scipy.stats import chi2_contingency

from runtime.build import heads_proposer
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from runtime.sequence import SeqChunk
from runtime.spec.head_proposer import HeadProposer
from runtime.spec.heads import HeadConfig, load_heads, make_head, save_heads
from runtime.spec.hidden_tap import HiddenTap
from tests.runtime.spec.test_spec import mixed_prompts, run
from tests.runtime.test_engine import assert_idle
from tests.tiny_engine import TINY_VOCAB, tiny_engine

DRAFT_IDS = torch.tensor([*range(0, 256, 2), 257])  # a draft vocabulary that is a strict subset


def random_head(kind: str, cfg, seed: int = 0, scale: float = 0.3):
    head = make_head(HeadConfig(kind, cfg.hidden_size, 3, 48, cfg.name, cfg.vocab_size))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if p.ndim == 1 and kind == "eagle" else 0.0))
    return head.eval().requires_grad_(False)


def with_heads(engine, kind: str, k: int = 3, seed: int = 0):
    tap = engine.runner = HiddenTap(engine.runner, engine.model_runner)
    engine.config.num_speculative_tokens = k
    engine.set_proposer(HeadProposer(random_head(kind, engine.model_config, seed), DRAFT_IDS,
                                     engine.model_runner.model, tap))
    return engine


def test_the_tap_holds_the_state_before_the_newest_token():
    engine = tiny_engine()
    tap = engine.runner = HiddenTap(engine.runner, engine.model_runner)
    engine.add_request("a", [5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    seq = engine.requests["a"].choices[0].seq
    fresh = tiny_engine().model_runner
    for _ in range(3):
        engine.step()
        got = tap.state_before_last(seq)
        # the same state from scratch: a prefill of every token before the newest, its last row
        fresh.run([SeqChunk(seq.token_ids[:-1], 0, list(range(4)))])
        torch.testing.assert_close(got, fresh.hidden[-1], rtol=1e-4, atol=1e-4)


def test_a_verify_chunk_runs_as_decode_rows_with_the_prefill_paths_logits():
    runner = tiny_engine().model_runner
    context, new = list(range(10, 40)), [41, 42, 43, 44]
    runner.run([SeqChunk(context, 0, [0, 1, 2])])
    prepared = runner.prepare([SeqChunk(new, len(context), [0, 1, 2], num_logits=len(new))])
    assert prepared.batch.num_decode_tokens == len(new) and prepared.batch.cu_seqlens_q is None
    as_rows = runner.forward(prepared)
    as_prefill = runner.run([SeqChunk(context + new, 0, [3, 4, 5], num_logits=len(new))])
    torch.testing.assert_close(as_rows, as_prefill, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_greedy_output_identical_to_no_speculation(kind):
    prompts = mixed_prompts(4)
    want = run(tiny_engine(), prompts)
    engine = with_heads(tiny_engine(), kind)
    assert run(engine, prompts) == want
    s = engine.stats
    assert s.spec_proposed > 0 and len(s.spec_proposed_by_pos) == 3
    assert sum(s.spec_accepted_by_pos) == s.spec_accepted and s.spec_proposed_by_pos[0] == s.spec_verify_steps
    assert_idle(engine)


def _positions(engine, prompt, params):
    out = LLM.from_engine(engine).generate([prompt], params, use_tqdm=False)[0]
    return [tuple(c.token_ids[1:3]) for c in out.outputs]


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_sampled_output_keeps_the_targets_distribution(kind):
    """Tokens 2 and 3 (drafted from the heads after token 1, then verified) follow the target's distribution."""
    params = SamplingParams(n=300, temperature=1.0, top_p=0.9, max_tokens=3, ignore_eos=True)
    prompt = [10, 20, 30, 40]
    base = _positions(tiny_engine(logit_scale=8.0), prompt, params)
    engine = with_heads(tiny_engine(logit_scale=8.0, engine_seed=1), kind, k=2, seed=3)
    spec = _positions(engine, prompt, params)
    assert 0 < engine.stats.spec_accepted < engine.stats.spec_proposed
    for pos in (0, 1):
        a, b = (collections.Counter(t[pos] for t in runs) for runs in (base, spec))
        top = [t for t, _ in (a + b).most_common(6)]
        table = [[c[t] for t in top] + [sum(c.values()) - sum(c[t] for t in top)] for c in (a, b)]
        cols = [i for i in range(len(table[0])) if table[0][i] + table[1][i] > 0]
        assert chi2_contingency([[r[i] for i in cols] for r in table]).pvalue > 0.001


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_the_head_file_round_trips_into_the_engine(kind, tmp_path):
    engine = tiny_engine()
    head = random_head(kind, engine.model_config, seed=2)
    path = str(tmp_path / f"{kind}.safetensors")
    save_heads(path, head, DRAFT_IDS)
    loaded, ids = load_heads(path)
    assert torch.equal(ids, DRAFT_IDS)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(a.half().float(), b, msg=name)
    tap = HiddenTap(engine.runner, engine.model_runner)
    config = EngineConfig(speculative=kind, speculative_model=path)
    assert isinstance(heads_proposer(config, engine.model_config, engine.model_runner, tap), HeadProposer)
    other = "eagle" if kind == "medusa" else "medusa"
    with pytest.raises(UserError, match=f"holds {kind} heads"):
        heads_proposer(EngineConfig(speculative=other, speculative_model=path), engine.model_config,
                       engine.model_runner, tap)
    with pytest.raises(UserError, match="cannot load heads"):
        heads_proposer(EngineConfig(speculative=kind, speculative_model=str(tmp_path / "none")),
                       engine.model_config, engine.model_runner, tap)
    assert TINY_VOCAB == loaded.cfg.target_vocab
