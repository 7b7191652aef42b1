"""A Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3) over two seams: an
AttentionBackend for attention and the fused elementwise ops, and one Linear object per weight.

The model sees packed tokens of a whole step (no batch dimension, no padding) and a paged KV
cache; it never sees requests. Q/K/V and gate/up are fused into one linear each.
"""
from __future__ import annotations

from collections import Counter
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

import runtime.nvtx as nvtx
from cute_kernels.kv_quant import KVScales
from runtime.model import step_rows
from runtime.model.attention_backend import AttentionBackend
from runtime.model.attention_batch import AttentionBatch
from runtime.model.embedding import Embedding
from runtime.model.linear import Linear, tensor_bytes
from runtime.model.rope import RotaryEmbedding
from weights.config import ModelConfig

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class FusedDecode(Protocol):
    """A whole decode step in one call, attached by a backend that has one (AttentionBackend.attach)."""

    def accepts(self, batch: AttentionBatch, rows: int, kv_caches: KVCaches) -> bool: ...
    def __call__(self, x: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                 kv_caches: KVCaches) -> torch.Tensor: ...


def _same_storage(head: Linear, embedding: Embedding) -> bool:
    """Whether a tied head multiplies by the embedding's own table (not a quantized copy of it)."""
    mine, theirs = (next((t for name in ("weight", "blocks", "table") if (t := getattr(o, name, None)) is not None),
                         None) for o in (head, embedding))
    return mine is not None and theirs is not None and mine.data_ptr() == theirs.data_ptr()


def _float_kind(linear: Linear) -> str:
    weight = getattr(linear, "weight", None)
    return str(weight.dtype).removeprefix("torch.") if weight is not None else type(linear).__name__


class DecoderLayer(nn.Module):
    LINEARS = ("qkv", "o_proj", "gate_up", "down")  # build.py sets these once the weights are loaded

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.input_norm = nn.Parameter(torch.ones(h))
        self.q_norm = nn.Parameter(torch.ones(cfg.head_dim)) if cfg.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(cfg.head_dim)) if cfg.qk_norm else None
        self.post_norm = nn.Parameter(torch.ones(h))
        self.qkv: Linear  # [q_size + 2 * kv_size, h], with the q/k/v bias where the model has one
        self.o_proj: Linear
        self.gate_up: Linear  # [2 * intermediate, h]
        self.down: Linear
        self.kv_scales: KVScales | None = None  # an int8 / e4m3 KV cache's (runtime/kv/scales.py)

    def linears(self) -> list[Linear]:
        return [getattr(self, name) for name in self.LINEARS]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                cos_sin: tuple[torch.Tensor, torch.Tensor], kv_cache: tuple[torch.Tensor, torch.Tensor],
                batch: AttentionBatch, backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        if nvtx.ON: nvtx.push("attention")
        h, residual = backend.add_rms_norm(x, residual, self.input_norm, eps)
        qkv = self.qkv(h)
        heads = cfg.num_heads + cfg.num_kv_heads
        qk, v = qkv.split([cfg.q_size + cfg.kv_size, cfg.kv_size], dim=-1)
        qk = qk.view(-1, heads, cfg.head_dim)
        v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q, k = qk.split([cfg.num_heads, cfg.num_kv_heads], dim=1)
            qk = torch.cat([F.rms_norm(q, (cfg.head_dim,), self.q_norm, eps),
                            F.rms_norm(k, (cfg.head_dim,), self.k_norm, eps)], dim=1)
        # q and k rotate together: one op per layer instead of two
        q, k = backend.rope(qk, *cos_sin).split([cfg.num_heads, cfg.num_kv_heads], dim=1)
        attn = backend.attention(q, k, v, kv_cache[0], kv_cache[1], batch, cfg.head_dim**-0.5, self.kv_scales)
        x = self.o_proj(attn.view(-1, cfg.q_size))
        if nvtx.ON: nvtx.swap("mlp")
        h, residual = backend.add_rms_norm(x, residual, self.post_norm, eps)
        x = self.down(backend.gated(self.gate_up, h))
        if nvtx.ON: nvtx.pop()
        return x, residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.rope = rope
        self.embedding: Embedding  # token ids -> rows; set by build.py
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.head: Linear  # the LM head, over the embedding table when tied; set by build.py
        self.decode_step: FusedDecode | None = None  # decode-only steps in one call; the backend attaches it

    def linears(self) -> list[Linear]:
        return [linear for layer in self.layers for linear in layer.linears()] + [self.head]

    def weight_bytes(self) -> int:
        """Bytes of resident weights: parameters, the embedding and every linear's, packed copies
        included (a tied head's weight is the embedding table, counted once)."""
        table = self.embedding.weight_bytes()
        shared = table if _same_storage(self.head, self.embedding) else 0
        return (tensor_bytes(*self.parameters()) + table - shared
                + sum(linear.weight_bytes() for linear in self.linears()))

    def quantization(self) -> str:
        """How the linear weights are held, e.g. "Q4_1 x 120, Q8_0 x 1" or "float32 x 121"."""
        kinds = Counter(getattr(linear, "quantization", None) or _float_kind(linear) for linear in self.linears())
        return ", ".join(f"{kind} x {count}" for kind, count in kinds.most_common())

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Final hidden states [tokens, hidden] for the packed tokens of one step."""
        self.backend.plan(batch)  # once for every layer
        x = self.embedding(input_ids)
        if self.decode_step is not None and self.decode_step.accepts(batch, x.shape[0], kv_caches):
            return self.decode_step(x, positions, batch, kv_caches)
        residual = None
        cos_sin = self.rope.lookup(positions)
        with step_rows.decode_rows(batch.num_decode_tokens):
            for layer, kv in zip(self.layers, kv_caches):
                x, residual = layer(x, residual, cos_sin, kv, batch, self.backend)
        return self.backend.add_rms_norm(x, residual, self.norm, self.cfg.rms_norm_eps)[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits in float32 for the rows that will be sampled."""
        with step_rows.decode_rows(hidden.shape[0]):  # a sampled row's logits: the same with any company
            return self.head(hidden).float()
