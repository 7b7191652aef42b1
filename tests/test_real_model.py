"""End to end on the real default model (SmolLM2-135M-Instruct GGUF), against transformers as the oracle."""
import os

import pytest
import torch

from runtime.engine import LLMEngine
from runtime.engine_config import EngineConfig
from runtime.kv.block_manager import KVBlocks
from runtime.llm import LLM
from runtime.load import load_model
from runtime.model_runner import SeqChunk
from runtime.sampling_params import SamplingParams
from weights.default import default_model_path

# Same dequantized weights, both float32: only summation order differs. Observed max |diff| on
# logits of magnitude ~20 is ~1e-4; 2e-3 absolute leaves room without hiding a real bug (a wrong
# RoPE or head mapping moves logits by whole units).
LOGIT_ATOL = 2e-3

LONG_TEXT = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog while counting {i * 7} "
                     f"sheep near the river bank, and the weather is {'sunny' if i % 2 else 'rainy'}." for i in range(24))


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 torch_dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def engine():
    cfg, tensors, tok, _ = load_model(None)
    return LLMEngine(EngineConfig(device="cpu", backend="torch", kv_cache_memory=256 << 20, log_ledger=False),
                     cfg, tensors, tok)


def prompt_ids(engine, kind):
    tok = engine.tokenizer
    if kind == "chat":
        return tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    if kind == "plain":
        return tok.encode("The three primary colors are")
    ids = tok.encode(LONG_TEXT)
    assert len(ids) >= 512
    return ids


@pytest.mark.parametrize("kind", ["chat", "plain", "long"])
def test_logits_match_transformers(engine, hf_model, kind):
    ids = prompt_ids(engine, kind)
    blocks = engine.scheduler.blocks
    kv = KVBlocks()
    assert blocks.allocate(kv, len(ids))
    try:
        ours = engine.runner.run([SeqChunk(ids, 0, kv.block_table, num_logits=len(ids))])
    finally:
        blocks.free(kv)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=LOGIT_ATOL, rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.99


@pytest.mark.parametrize("kind", ["chat", "long"])
def test_32_greedy_tokens_identical_to_transformers(engine, hf_model, kind):
    ids = prompt_ids(engine, kind)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    ours = LLM.from_engine(engine).generate([ids], params, use_tqdm=False)[0].outputs[0].token_ids
    assert ours == hf_greedy(hf_model, ids, 32)


def hf_greedy(model, ids, n):
    """Plain greedy decoding with transformers' own KV cache, EOS not special (like ignore_eos)."""
    out, past, x = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            res = model(x, past_key_values=past, use_cache=True)
            past = res.past_key_values
            out.append(int(res.logits[0, -1].argmax()))
            x = torch.tensor([[out[-1]]])
    return out


def test_chat_answers_paris(engine):
    out = LLM.from_engine(engine).chat([{"role": "user", "content": "What is the capital of France?"}],
                                       SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"
