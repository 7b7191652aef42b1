"""Batch-1 greedy decode TPOT of an 8B-shaped random-weight model with `--quantization fp8` vs bf16,
in one run on one GPU (`python profiling/gpu/bench_kernels.py fp8_engine`). Llama-3-8B's shapes (32
layers, hidden 4096, 32:8 heads of 128, MLP 14336) with SmolLM2's 49152-token vocabulary, so the
default model's tokenizer can detokenize; decode reads every weight once per token, so fp8's half
the bytes should show as up to ~2x on the decoder layers (the LM head stays bf16).
"""
from __future__ import annotations

import time

from weights.config import ModelConfig

CONFIG = ModelConfig(arch="llama", vocab_size=49152, hidden_size=4096, intermediate_size=14336, num_layers=32,
                     num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=4096,
                     rope_theta=500000.0, name="random-8b-shape")
PROMPT_TOKENS, NEW_TOKENS = 128, 64


def _random_weights(device: str) -> dict:
    """HF-named bf16 tensors, made on the GPU (seconds, not the minutes of a CPU randn)."""
    import torch

    from weights.checkpoint import expected_shapes

    g = torch.Generator(device).manual_seed(0)
    out = {}
    for name, shape in expected_shapes(CONFIG).items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, device=device, dtype=torch.bfloat16)
        else:  # std 1/sqrt(fan_in): activations stay O(1) through 32 layers
            out[name] = (torch.randn(shape, generator=g, device=device) * shape[-1] ** -0.5).bfloat16()
    return out


def _tpot_ms(quantization: str | None) -> tuple[float, float]:
    """(TPOT ms, weight GiB) of one greedy request after a warm-up request."""
    import torch

    from runtime.build import build_engine
    from runtime.engine_config import EngineConfig
    from runtime.load import load_model
    from runtime.sampling_params import SamplingParams

    tokenizer = load_model(None)[2]
    config = EngineConfig(device="cuda", dtype="bfloat16", kv_cache_memory=2 << 30, quantization=quantization,
                          log_ledger=False, enable_prefix_caching=False)
    engine = build_engine(config, CONFIG, _random_weights("cuda"), tokenizer)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    prompt = list(range(1000, 1000 + PROMPT_TOKENS))
    tpot = None
    for attempt in range(2):  # the first run compiles / loads the kernels
        engine.add_request(f"fp8-bench-{attempt}", prompt, params)
        out = None
        while engine.has_unfinished_requests():
            out = (engine.step() or [out])[-1]  # the last output holds the metrics
        m = out.metrics
        tpot = (m["e2e"] - m["ttft"]) / (NEW_TOKENS - 1) * 1e3
    weight_gib = engine.ledger.weight_bytes / 2**30
    del engine
    torch.cuda.empty_cache()
    return tpot, weight_gib


def run_fp8_engine(dry_run: bool) -> list[dict]:
    if dry_run:
        return [{"case": f"{CONFIG.name} {q or 'bf16'}", "prompt": PROMPT_TOKENS, "new_tokens": NEW_TOKENS,
                 "dry_run": True} for q in (None, "fp8")]
    from weights.default import default_model_path
    from weights.errors import ModelLoadError

    try:
        default_model_path()  # its tokenizer detokenizes the generated ids
    except ModelLoadError as exc:
        return [{"case": CONFIG.name, "skipped": str(exc)}]
    rows, start = [], time.perf_counter()
    try:
        results = {q: _tpot_ms(q) for q in (None, "fp8")}
    except Exception as exc:  # noqa: BLE001 - one row that says why
        return [{"case": CONFIG.name, "error": f"{type(exc).__name__}: {exc}"[:200]}]
    base = results[None][0]
    for q, (tpot, gib) in results.items():
        rows.append({"case": f"{CONFIG.name} {q or 'bf16'}", "tpot_ms": round(tpot, 2), "weights_gib": round(gib, 2),
                     "speedup_vs_bf16": round(base / tpot, 2)})
    rows[-1]["bench_s"] = round(time.perf_counter() - start, 1)
    return rows
