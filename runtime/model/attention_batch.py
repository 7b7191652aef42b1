"""The per-step record that carries KV addressing from the model runner to the attention ops."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AttentionBatch:
    """Token rows are ordered [decode tokens (one per decoding sequence)] + [prefill chunk tokens].

    slot_mapping: [tokens] flat cache slot (block * block_size + offset) each new k/v is written to.
    Decodes: decode_block_tables [num_decodes, max_blocks], decode_context_lens [num_decodes]
      (context length including the new token).
    Prefill chunks: cu_seqlens_q [num_prefills + 1] over the prefill rows, prefill_prefix_lens
      [num_prefills] tokens already in the cache before this chunk, prefill_block_tables.
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int = 0
    decode_block_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    prefill_prefix_lens: torch.Tensor | None = None
    prefill_block_tables: torch.Tensor | None = None
    max_prefix_len: int = 0
    # backend-specific precomputations shared by all layers of the step, made by the first
    decode_plan: Any = None
    prefill_plan: Any = None
