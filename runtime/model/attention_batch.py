"""The per-step record that carries KV addressing from the model runner to the attention backend."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cute_kernels.attention_args import DecodeArgs, PrefillArgs


@dataclass
class AttentionBatch:
    """Token rows are ordered [decode tokens (one per decoding sequence)] + [prefill chunk tokens].

    slot_mapping: [tokens] flat cache slot (block * block_size + offset) each new k/v is written to.
    num_blocks, block_size, num_kv_heads: the paged caches' geometry (every layer's cache has it), for the plans.
    Decodes: decode_block_tables [num_decodes, max_blocks], decode_context_lens [num_decodes]
      (context length including the new token).
    Prefill chunks: cu_seqlens_q [num_prefills + 1] over the prefill rows, prefill_prefix_lens
      [num_prefills] tokens already in the cache before this chunk, prefill_block_tables;
      max_seqlen_q, the longest chunk, known on the host so no kernel syncs to learn it.
    """

    slot_mapping: torch.Tensor
    num_blocks: int
    block_size: int
    num_kv_heads: int = 0  # the caches' KV heads (a decode kernel's split heuristic reads it); 0: unknown
    num_decode_tokens: int = 0
    decode_block_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    prefill_prefix_lens: torch.Tensor | None = None
    prefill_block_tables: torch.Tensor | None = None
    max_prefix_len: int = 0
    max_seqlen_q: int = 0
    # the backend's precomputations shared by all layers of the step, made once by backend.plan(batch)
    decode_plan: Any = None
    prefill_plan: Any = None

    @property
    def prefix_lens(self) -> torch.Tensor | None:
        """prefill_prefix_lens, or None when no chunk has a cached prefix (nothing to read from the cache)."""
        return self.prefill_prefix_lens if self.max_prefix_len else None

    def prefill_args(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, scale: float, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> PrefillArgs:
        """One layer's prefill rows as the kernels take them (the new keys are the new queries' tokens)."""
        cu = self.cu_seqlens_q
        return PrefillArgs(q, k, v, cu, cu, scale, True, k_cache, v_cache, self.prefill_block_tables,
                           self.prefix_lens, max_seqlen_q=self.max_seqlen_q, plan=self.prefill_plan,
                           k_scale=k_scale, v_scale=v_scale)

    def decode_args(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
                    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> DecodeArgs:
        """One layer's decode rows as the kernels take them (an e4m3 cache: with its scales)."""
        return DecodeArgs(q, k_cache, v_cache, self.decode_block_tables, self.decode_context_lens, scale,
                          plan=self.decode_plan, k_scale=k_scale, v_scale=v_scale)
