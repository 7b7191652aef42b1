"""A Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3) over an AttentionBackend.

The model sees packed tokens of a whole step (no batch dimension, no padding) and a paged KV
cache; it never sees requests. Q/K/V and gate/up are fused into one matmul each.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model.attention_backend import AttentionBackend
from runtime.model.attention_batch import AttentionBatch
from runtime.model.config import ModelConfig
from runtime.model.cpu_linear import linear, pack_linear_weight
from runtime.model.rope import RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.input_norm = nn.Parameter(torch.ones(h))
        self.qkv = nn.Parameter(torch.empty(cfg.q_size + 2 * cfg.kv_size, h))
        self.qkv_bias = nn.Parameter(torch.zeros(cfg.q_size + 2 * cfg.kv_size)) if cfg.attention_bias else None
        self.q_norm = nn.Parameter(torch.ones(cfg.head_dim)) if cfg.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(cfg.head_dim)) if cfg.qk_norm else None
        self.o_proj = nn.Parameter(torch.empty(h, cfg.q_size))
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate_up = nn.Parameter(torch.empty(2 * cfg.intermediate_size, h))
        self.down = nn.Parameter(torch.empty(h, cfg.intermediate_size))
        self.packed: dict[str, torch.Tensor] = {}  # oneDNN-packed fp32 CPU weights (cpu_linear.py)

    LINEARS = ("qkv", "o_proj", "gate_up", "down")

    def pack_linears(self) -> None:
        for name in self.LINEARS:
            packed = pack_linear_weight(getattr(self, name))
            if packed is not None:
                self.packed[name] = packed

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                cos_sin: tuple[torch.Tensor, torch.Tensor], kv_cache: tuple[torch.Tensor, torch.Tensor],
                batch: AttentionBatch, backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        h, residual = backend.add_rms_norm(x, residual, self.input_norm, eps)
        qkv = linear(h, self.qkv, self.qkv_bias, self.packed.get("qkv"))
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
        attn = backend.attention(q, k, v, kv_cache[0], kv_cache[1], batch, cfg.head_dim**-0.5)
        x = linear(attn.view(-1, cfg.q_size), self.o_proj, None, self.packed.get("o_proj"))
        h, residual = backend.add_rms_norm(x, residual, self.post_norm, eps)
        gate_up = linear(h, self.gate_up, None, self.packed.get("gate_up"))
        return linear(backend.silu_and_mul(gate_up), self.down, None, self.packed.get("down")), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.rope = rope
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = None if cfg.tie_word_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.packed_head: torch.Tensor | None = None

    @property
    def ops(self) -> AttentionBackend:
        """The old name of `backend`, kept only because app/ui.py reads `runner.model.ops.describe()`."""
        return self.backend

    def pack_linears(self) -> None:
        """Pack every linear weight once for oneDNN (fp32 CPU only; elsewhere a no-op)."""
        for layer in self.layers:
            layer.pack_linears()
        self.packed_head = pack_linear_weight(self.embed if self.lm_head is None else self.lm_head)

    def weight_bytes(self) -> int:
        """Bytes of resident weights: parameters plus the packed copies."""
        extra = [t for layer in self.layers for t in layer.packed.values()]
        extra += [self.packed_head] if self.packed_head is not None else []
        return sum(t.numel() * t.element_size() for t in [*self.parameters(), *extra])

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Final hidden states [tokens, hidden] for the packed tokens of one step."""
        self.backend.plan(batch)  # once for every layer
        x = F.embedding(input_ids, self.embed)
        residual = None
        cos_sin = self.rope.lookup(positions)
        for layer, kv in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, cos_sin, kv, batch, self.backend)
        return self.backend.add_rms_norm(x, residual, self.norm, self.cfg.rms_norm_eps)[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits in float32 for the rows that will be sampled."""
        head = self.embed if self.lm_head is None else self.lm_head
        return linear(hidden, head, None, self.packed_head).float()
