"""--deterministic on the real default model (SmolLM2-135M-Instruct, its Q4_1/Q8_0 blocks as shipped): a
greedy and a seeded request give the same tokens and logprobs alone with no prefix cache and one prefill
chunk, and then with the prefix cache cold and warm, 32-token prefill chunks and n-gram speculation,
alone and among 7 other requests."""
import pytest

from runtime.build import build_engine
from runtime.engine_config import EngineConfig
from runtime.llm import LLM
from runtime.load import load_model
from runtime.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

QUESTION = "List three uses of a paperclip, then repeat the list word for word."
TARGETS = [SamplingParams(temperature=0, max_tokens=10, logprobs=0),
           SamplingParams(temperature=1.0, seed=1234, max_tokens=10, logprobs=0)]


def engine(**config):
    cfg, tensors, tok, _ = load_model(None)
    return build_engine(EngineConfig(device="cpu", backend="torch", kv_cache_memory=64 << 20, log_ledger=False,
                                     deterministic=True, **config), cfg, tensors, tok)


def results(eng, questions, params):
    outs = LLM.from_engine(eng).chat([[{"role": "user", "content": q}] for q in questions], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [lp for lp, _ in o.outputs[0].logprobs or []]) for o in outs]


@pytest.fixture(scope="module")
def want():
    ref = engine(enable_prefix_caching=False, max_num_batched_tokens=4096)
    return [results(ref, [QUESTION], [p])[0] for p in TARGETS]


def test_cold_warm_chunked_speculating_and_batched(want):
    eng = engine(max_num_batched_tokens=32, speculative="ngram")
    for _ in ("cold", "warm"):
        assert [results(eng, [QUESTION], [p])[0] for p in TARGETS] == want
    others = [f"Write a haiku about the number {i}." + " Please." * i for i in range(7)]
    mates = [SamplingParams(temperature=0.7, seed=i, max_tokens=2 + i // 2) for i in range(7)]
    got = results(eng, [QUESTION, QUESTION, *others], [*TARGETS, *mates])
    assert got[:2] == want
    assert eng.stats.prefix_cache_hits > 0 and eng.stats.spec_proposed > 0
