"""The roofline's arithmetic: FLOPs and bytes moved by one engine step of a Llama-family model, the
chips' ceilings (published peaks for H100/H200, measured for this CPU), and the bound they imply.

A step's cost model: every linear weight is read once per step (batching shares it), the KV of every
attended context is read once, the new tokens' KV is written, activations stream in and out of each
linear; FLOPs are 2 per weight per token, attention 4 x heads x head_dim per (query, key) pair, and
the LM head runs only on the rows that are sampled.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from weights.config import ModelConfig


@dataclass
class Chip:
    name: str
    peak_flops: float  # FLOP/s at the dtype the engine runs there
    bandwidth: float  # bytes/s of main memory
    dtype_bytes: int  # weights, KV and activations
    source: str

    @property
    def ridge(self) -> float:
        """FLOP/byte where the two roofs meet: below it a step is bandwidth-bound."""
        return self.peak_flops / self.bandwidth


# SXM parts, dense BF16 tensor-core peak (the sparse figure is twice this) and HBM bandwidth
PUBLISHED = {"h100": Chip("H100 SXM", 989.4e12, 3.35e12, 2, "NVIDIA H100 datasheet: 989 TFLOP/s BF16 dense, 3.35 TB/s"),
             "h200": Chip("H200 SXM", 989.4e12, 4.8e12, 2, "NVIDIA H200 datasheet: 989 TFLOP/s BF16 dense, 4.8 TB/s")}


def measure_cpu(seconds: float = 1.0) -> Chip:
    """This CPU at float32 with torch's threads: best matmul FLOP rate and streaming-read bandwidth,
    each measured for about half of `seconds`."""
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = _best_rate(lambda: torch.mm(a, b), 2 * n**3, seconds / 2)
    x = torch.ones(64 << 20)  # 256 MiB: far past any cache
    bandwidth = _best_rate(lambda: x.sum(), x.numel() * 4, seconds / 2)
    return Chip(f"this CPU (threads: {torch.get_num_threads()})", flops, bandwidth, 4,
                "measured: float32 torch.mm 1024^3, sum over 256 MiB")


def _best_rate(fn, work: float, budget: float) -> float:
    fn()  # warm-up
    best, deadline = float("inf"), time.perf_counter() + budget
    while True:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() > deadline:
            return work / best


@dataclass
class StepCost:
    label: str
    tokens: int
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def time_bound(self, chip: Chip) -> float:
        """The least time the chip needs for the step: whichever roof binds."""
        return max(self.flops / chip.peak_flops, self.bytes / chip.bandwidth)

    def bound(self, chip: Chip) -> str:
        return "compute" if self.intensity >= chip.ridge else "bandwidth"


def layer_weights(cfg: ModelConfig) -> int:
    h, i = cfg.hidden_size, cfg.intermediate_size
    return h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 3 * h * i


def weight_count(cfg: ModelConfig) -> int:
    """Weights a step reads: every layer's linears and the LM head (or the tied embedding table)."""
    return cfg.num_layers * layer_weights(cfg) + cfg.vocab_size * cfg.hidden_size


def kv_bytes_per_token(cfg: ModelConfig, dtype_bytes: int) -> int:
    return 2 * cfg.num_layers * cfg.kv_size * dtype_bytes


def step_cost(cfg: ModelConfig, dtype_bytes: int, label: str, new_tokens: int, attended_pairs: float,
              kv_read_tokens: float, logit_rows: int) -> StepCost:
    """One step that runs new_tokens through the model, with attended_pairs (query, key) pairs per layer,
    reading kv_read_tokens tokens of cached KV and computing logit_rows rows of the LM head."""
    h, v = cfg.hidden_size, cfg.vocab_size
    flops = (2 * new_tokens * cfg.num_layers * layer_weights(cfg) + 2 * logit_rows * v * h
             + 4 * cfg.num_heads * cfg.head_dim * attended_pairs * cfg.num_layers)
    per_layer_acts = (h + cfg.q_size + 2 * cfg.kv_size) + (cfg.q_size + h) + (h + 2 * cfg.intermediate_size) \
        + (cfg.intermediate_size + h)
    moved = (weight_count(cfg) + new_tokens * per_layer_acts * cfg.num_layers + logit_rows * v) * dtype_bytes \
        + (kv_read_tokens + new_tokens) * kv_bytes_per_token(cfg, dtype_bytes)
    return StepCost(label, new_tokens, flops, moved)


def prefill(cfg: ModelConfig, dtype_bytes: int, batch: int, prompt: int) -> StepCost:
    """batch prompts of `prompt` tokens from an empty cache (causal: P(P+1)/2 pairs each)."""
    return step_cost(cfg, dtype_bytes, f"prefill {batch}x{prompt}", batch * prompt, batch * prompt * (prompt + 1) / 2,
                     batch * prompt, batch)


def decode(cfg: ModelConfig, dtype_bytes: int, batch: int, context: int) -> StepCost:
    """One token for each of batch sequences holding `context` tokens of KV."""
    return step_cost(cfg, dtype_bytes, f"decode b={batch} ctx {context}", batch, batch * (context + 1),
                     batch * context, batch)


def run_cost(cfg: ModelConfig, dtype_bytes: int, label: str, steps: int, prefill_tokens: int, decode_tokens: int,
             prompt: float, context: float) -> StepCost:
    """A whole measured run as one cost: `steps` weight reads, prefill tokens attending half their prompt
    on average, decode tokens attending (and reading the KV of) the mean context."""
    one = step_cost(cfg, dtype_bytes, label, prefill_tokens + decode_tokens,
                    prefill_tokens * prompt / 2 + decode_tokens * context, decode_tokens * context, decode_tokens)
    extra_weight_reads = (steps - 1) * weight_count(cfg) * dtype_bytes
    return StepCost(label, one.tokens, one.flops, one.bytes + extra_weight_reads)
