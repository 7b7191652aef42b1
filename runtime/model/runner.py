"""Turns one step's scheduled chunks into packed tensors, runs the model, returns logits.

The runner makes no scheduling decisions: it is told which tokens to run, where they sit in
each sequence, and which blocks hold that sequence's KV.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runtime.model.attention_batch import AttentionBatch
from runtime.model.llama import LlamaModel


@dataclass
class SeqChunk:
    """New tokens of one sequence for this step."""

    token_ids: list[int]
    start_pos: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # must cover start_pos + len(token_ids) tokens
    num_logits: int = 1  # logits wanted for this many trailing tokens (0 for a mid-prompt chunk)


def _padded_tables(tables: list[list[int]]) -> np.ndarray:
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device | str = "cpu") -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = torch.device(device)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device, non_blocking=True)

    def prepare(self, chunks: list[SeqChunk]) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch, np.ndarray]:
        """Packed ids, positions, the attention record, and the packed rows whose logits are wanted."""
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) != 1)  # decodes first
        ordered = [chunks[i] for i in order]
        lens = np.array([len(c.token_ids) for c in ordered], dtype=np.int64)
        starts = np.array([c.start_pos for c in ordered], dtype=np.int64)
        ends = np.cumsum(lens)
        ids = np.fromiter((t for c in ordered for t in c.token_ids), dtype=np.int64, count=int(ends[-1]))
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)])
        row_seq = np.repeat(np.arange(len(ordered)), lens)
        tables = _padded_tables([c.block_table for c in ordered])
        bs = self.block_size
        slots = tables[row_seq, positions // bs].astype(np.int64) * bs + positions % bs
        nd = int((lens == 1).sum())
        batch = AttentionBatch(slot_mapping=self._tensor(slots), num_blocks=self.kv_caches[0][0].shape[0],
                               block_size=bs, num_kv_heads=self.kv_caches[0][0].shape[2], num_decode_tokens=nd)
        if nd:
            batch.decode_block_tables = self._tensor(tables[:nd])
            batch.decode_context_lens = self._tensor((starts[:nd] + 1).astype(np.int32))
        if nd < len(ordered):
            cu = np.concatenate([[0], np.cumsum(lens[nd:])]).astype(np.int32)
            batch.cu_seqlens_q = self._tensor(cu)
            batch.prefill_prefix_lens = self._tensor(starts[nd:].astype(np.int32))
            batch.prefill_block_tables = self._tensor(tables[nd:])
            batch.max_prefix_len = int(starts[nd:].max())
            batch.max_seqlen_q = int(lens[nd:].max())
        # rows whose logits are wanted, in the callers' chunk order
        where = np.empty(len(chunks), dtype=np.int64)
        where[order] = np.arange(len(chunks))
        rows = [np.arange(ends[j] - chunks[i].num_logits, ends[j]) for i, j in enumerate(where)]
        return self._tensor(ids), self._tensor(positions), batch, np.concatenate(rows)

    def run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        """Float32 logits [sum of num_logits, vocab], rows in chunk order."""
        return self.forward(*self.prepare(chunks))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                rows: np.ndarray) -> torch.Tensor:
        hidden = self.model(ids, positions, batch, self.kv_caches)
        if len(rows) == 0:
            return hidden.new_empty((0, self.model.cfg.vocab_size), dtype=torch.float32)
        return self.model.logits(hidden[self._tensor(rows)])
