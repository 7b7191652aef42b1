"""--deterministic: a request's tokens and logprobs do not depend on what else runs or what the cache
holds. One greedy and one seeded (temperature 1) request, compared bit for bit (tokens and the chosen
tokens' logprobs, which show a difference in the logits long before it flips a token) with the same
request run alone with the prefix cache off: alone cold and warm, among 1, 7 and 31 other requests of
other lengths, under chunked prefill, with n-gram speculation, after a preemption; on a tiny GGUF of
Q4_1 blocks (the default quantized path, fused decode step included) and on its float weights
(--quantization none)."""
import random

import pytest

from runtime.build import build_engine
from runtime.engine_config import EngineConfig
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.model_files import write_tiny_gguf
from tests.tiny_engine import BOS, EOS, TINY_VOCAB, byte_tokenizer
from weights.load import load_checkpoint

DETERMINISTIC = {"deterministic": True}
PATHS = ("Q4_1", "none")  # the GGUF's blocks as shipped; dequantized to float
TOKENS = 8


def _prompt(seed: int, n: int, repeat: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 256) for _ in range(n)] * repeat


# the requests under test; their phrases repeat so the n-gram proposer drafts while they decode
TARGETS = [(_prompt(1, 13, 3), SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, logprobs=0)),
           (_prompt(2, 11, 4), SamplingParams(temperature=1.0, seed=1234, max_tokens=TOKENS, ignore_eos=True,
                                              logprobs=0))]


def _others(n: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(n)
    return [(_prompt(100 + i, rng.randint(3, 90)),
             SamplingParams(temperature=rng.choice([0, 0.8]), seed=i, max_tokens=rng.randint(2, 12), ignore_eos=True))
            for i in range(n)]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("det") / "tiny-q4_1.gguf")
    write_tiny_gguf(path, qtype="Q4_1", tensor_types={"token_embd.weight": "Q8_0"}, vocab_size=TINY_VOCAB,
                    bos_token_id=BOS, eos_token_ids=[EOS], max_position_embeddings=1024)
    return path


def engine(path: str, quantization: str, num_blocks: int = 256, **config):
    ck = load_checkpoint(path, keep_quantized=True)
    per_block = 16 * 2 * ck.config.num_kv_heads * ck.config.head_dim * 4 * ck.config.num_layers
    econf = EngineConfig(device="cpu", backend="torch", kv_cache_memory=num_blocks * per_block, log_ledger=False,
                         quantization=None if quantization == "Q4_1" else quantization, **DETERMINISTIC, **config)
    return build_engine(econf, ck.config, ck.tensors, byte_tokenizer())


def results(eng, requests) -> list[tuple[list[int], list[float]]]:
    """Per request (tokens, chosen-token logprobs), all requests submitted at once."""
    outs = LLM.from_engine(eng).generate([p for p, _ in requests], [s for _, s in requests], use_tqdm=False)
    return [(o.outputs[0].token_ids, [lp for lp, _ in o.outputs[0].logprobs or []]) for o in outs]


@pytest.fixture(scope="module", params=PATHS)
def setup(request, gguf_path):
    """(quantization, the targets' results alone with no prefix cache and one chunk)."""
    ref = engine(gguf_path, request.param, enable_prefix_caching=False, max_num_batched_tokens=4096)
    return request.param, [results(ref, [t])[0] for t in TARGETS]


def test_alone_prefix_cache_cold_then_warm(setup, gguf_path):
    quantization, want = setup
    eng = engine(gguf_path, quantization)
    for _ in ("cold", "warm"):
        assert [results(eng, [t])[0] for t in TARGETS] == want
    assert eng.stats.prefix_cache_hits > 0


@pytest.mark.parametrize("others", [1, 7, 31])
def test_among_other_requests(setup, gguf_path, others):
    quantization, want = setup
    eng = engine(gguf_path, quantization)
    got = results(eng, TARGETS + _others(others))
    assert got[:len(TARGETS)] == want


@pytest.mark.parametrize("budget", [5, 16, 37])
def test_chunked_prefill(setup, gguf_path, budget):
    quantization, want = setup
    got = results(engine(gguf_path, quantization, max_num_batched_tokens=budget), TARGETS + _others(3))
    assert got[:len(TARGETS)] == want


@pytest.mark.parametrize("others", [0, 7])
def test_ngram_speculation(setup, gguf_path, others):
    quantization, want = setup
    eng = engine(gguf_path, quantization, speculative="ngram", num_speculative_tokens=3)
    got = results(eng, TARGETS + _others(others))
    assert eng.stats.spec_proposed > 0
    assert got[:len(TARGETS)] == want


def test_after_preemption(setup, gguf_path):
    quantization, want = setup
    eng = engine(gguf_path, quantization, num_blocks=12)
    got = results(eng, TARGETS + _others(9))
    assert eng.stats.preemptions > 0
    assert got[:len(TARGETS)] == want
