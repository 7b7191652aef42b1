"""Where one long prefill's time goes on the CPU: the default model's linears (every layer's q/k/v, o,
gate/up and down on GGUF blocks: the int8 tiles GEMM, or on CPUs with AMX the bf16 tiles, gate/up joined
with its SiLU), its attention (the backend's attention call),
and the rest (norms, RoPE, embedding, the last row's head, step overhead). bench_quant_gemm.py
--prefill-split prints it; each part is timed around its call on the engine's own objects.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from cute_kernels.cpu import quant_amx
from runtime.engine import LLMEngine
from runtime.model.llama import DecoderLayer


class _Timed:
    """A callable that adds its wall time under `name` in `totals`."""

    def __init__(self, inner, name: str, totals: dict[str, float], clock) -> None:
        self.inner, self.name, self.totals, self.clock = inner, name, totals, clock

    def __call__(self, *args, **kwargs):
        t0 = self.clock()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.totals[self.name] += self.clock() - t0

    def __getattr__(self, attr):
        inner = getattr(self.inner, attr)
        # gate/up joined with its SiLU in one pass (backend.gated) is the linear's time too
        return _Timed(inner, self.name, self.totals, self.clock) if attr == "silu_and_mul" else inner


def _engine(tokens: int) -> LLMEngine:
    from runtime.build import build_engine
    from runtime.engine_config import EngineConfig
    from runtime.load import load_model

    cfg, tensors, tok, _ = load_model(None)
    return build_engine(EngineConfig(device="cpu", log_ledger=False, enable_prefix_caching=False,
                                     max_num_batched_tokens=max(tokens, 1024), kv_cache_memory=1 << 30),
                        cfg, tensors, tok)


def _instrument(engine: LLMEngine, totals: dict[str, float], clock) -> list[int]:
    """Wraps every layer's linears and the attention backend's attention; returns the linears' MACs per token."""
    model = engine.model_runner.model
    macs = []
    for layer in model.layers:
        for name in DecoderLayer.LINEARS:
            linear = getattr(layer, name)
            blocks = getattr(linear, "blocks", None)
            if blocks is not None:
                macs.append(blocks.shape[0] * layer.cfg.hidden_size if name != "down"
                            else blocks.shape[0] * layer.cfg.intermediate_size)
            setattr(layer, name, _Timed(linear, "linears", totals, clock))
    model.backend.attention = _Timed(model.backend.attention, "attention", totals, clock)
    return macs


def prefill_split(tokens: int, repeat: int, peak_gops: float | None, clock=time.perf_counter) -> None:
    """Prints the best of `repeat` prefills of one `tokens`-token prompt, split into linears, attention, rest;
    where a bf16 prefill attention kernel runs (AMX tiles, vdpbf16ps), the same again on our fp32 kernel.
    clock: time.process_time counts CPU seconds of all threads (steadier on a shared machine; with one
    thread, the seconds of work), and then the rates are per CPU second, as peak_gops must be."""
    from cute_kernels.cpu import prefill_attention

    engine = _engine(tokens)
    totals: dict[str, float] = defaultdict(float)
    macs = sum(_instrument(engine, totals, clock))
    routed = [k for k in ("amx", "bf16") if prefill_attention.available(k)]
    attention = _split(engine, totals, macs, tokens, repeat, peak_gops, clock, f"attention kernel {routed[0] if routed else 'fp32'}")
    if routed:
        chosen = prefill_attention.bf16_kernel
        prefill_attention.bf16_kernel = lambda args: None  # our fp32 kernel, the path without the feature
        try:
            fp32 = _split(engine, totals, macs, tokens, repeat, peak_gops, clock, "attention kernel fp32")
        finally:
            prefill_attention.bf16_kernel = chosen
        print(f"attention: the {routed[0]} kernel {fp32 / attention:.2f}x our fp32 kernel")


def _split(engine: LLMEngine, totals: dict[str, float], macs: int, tokens: int, repeat: int,
           peak_gops: float | None, clock, label: str) -> float:
    """One prefill_split measurement, printed; returns the attention seconds."""
    from runtime.sampling_params import SamplingParams

    vocab = engine.model_config.vocab_size
    best = None
    for i in range(repeat + 1):  # the first is a warm-up
        ids = torch.randint(3, vocab, (tokens,), generator=torch.Generator().manual_seed(i)).tolist()
        totals.clear()
        engine.add_request(f"split{i} {label}", ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        t0 = clock()
        while engine.has_unfinished_requests():
            engine.step()
        wall = clock() - t0
        if i and (best is None or wall < best[0]):
            best = (wall, dict(totals))
    wall, parts = best
    rest = wall - parts["linears"] - parts["attention"]
    rate = 2 * macs * tokens / parts["linears"] / 1e9
    share = f", {rate / peak_gops:.0%} of the int8 peak" if peak_gops else ""
    if quant_amx.available():  # prefill rows take the AMX bf16 tiles, past the int8 peak
        share = ", AMX tiles"
    print(f"prefill of {tokens} tokens ({label}): {wall:.3f} s ({tokens / wall:.0f} tok/s); linears "
          f"{parts['linears']:.3f} s ({parts['linears'] / wall:.0%}, {rate:.0f} GOP/s{share}), attention "
          f"{parts['attention']:.3f} s ({parts['attention'] / wall:.0%}), the rest {rest:.3f} s ({rest / wall:.0%})")
    return parts["attention"]
