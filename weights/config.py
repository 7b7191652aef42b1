"""Model architecture description shared by the loaders and the model."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    """A Llama-family decoder. Qwen2 (q/k/v bias) and Qwen3 (q/k RMSNorm) are switches."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # HF-style rope_scaling dict, e.g. {"rope_type": "llama3", "factor": 8.0, ...}; None = plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = "model"
    # An FP8 checkpoint's weight block size (128: 128x128 block scales); its tensors arrive dequantized.
    fp8_weight_block: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_parameters(self) -> int:
        """Parameter count as the checkpoint stores it (tied embeddings counted once)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        layer = attn + 3 * h * i + 2 * h
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h
