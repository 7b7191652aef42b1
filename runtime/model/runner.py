"""The Runner seam and the model runner: one step's chunks into packed tensors, the model, logits.

A runner makes no scheduling decisions: it is told which tokens to run, where they sit in each
sequence, and which blocks hold that sequence's KV. The engine sees only the Runner protocol;
a ModelRunner runs this process's model, and the wings wrap or replace it (a graphed runner that
replays CUDA graphs where a step fits one, the tensor-parallel runner over several processes).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from runtime.kv.cache import KVLedger
from runtime.model.attention_batch import AttentionBatch
from runtime.model.llama import LlamaModel
from runtime.sequence import Proposer, SeqChunk


class Prepared(NamedTuple):
    """A step's packed inputs: token ids, positions, the attention record, the rows whose logits are wanted."""

    ids: torch.Tensor
    positions: torch.Tensor
    batch: AttentionBatch
    rows: np.ndarray


class Runner(Protocol):
    """What the engine's step runs on."""

    def prepare(self, chunks: list[SeqChunk]) -> Any:
        """The step's inputs, opaque to the engine."""

    def forward(self, prepared: Any) -> torch.Tensor:
        """Float32 logits [sum of num_logits, vocab], rows in chunk order."""

    def close(self) -> None:
        """Release what outlives the runner (worker processes); idempotent."""

    def failure(self) -> str | None:
        """Why no step can run any more, or None; safe from any thread."""

    def describe(self) -> dict[str, str]:
        """What runs, for logs and the About panel: "backend", "tensor parallel", "cuda graphs"."""


class RunnerWithClose:
    """inner, every call passed through, but close() first does one more thing (a wing's flush or shutdown)."""

    def __init__(self, inner: Runner, before_close: Callable[[], None]) -> None:
        self.inner, self.before_close, self.closed = inner, before_close, False

    def __getattr__(self, name: str) -> Any:  # prepare, forward, failure, describe
        return getattr(self.inner, name)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.before_close()
        self.inner.close()


def _as_decodes(c: SeqChunk) -> bool:
    """Whether a chunk runs as decode rows, one query per token over the paged cache: a decode, or a
    decode with drafts to verify (every token sampled), which then takes the decode kernels too."""
    return len(c.token_ids) == 1 or c.num_logits == len(c.token_ids)


def _padded_tables(tables: list[list[int]]) -> np.ndarray:
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device | str = "cpu", deterministic: bool = False) -> None:
        self.model = model
        # every chunk as decode rows: a query reduces its keys in one kernel's order wherever they came from
        self.all_decodes = deterministic
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = torch.device(device)
        self.hidden: torch.Tensor | None = None  # final hidden states of the last forward's sampled rows

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device, non_blocking=True)

    def prepare(self, chunks: list[SeqChunk]) -> Prepared:
        """Packed ids, positions, the attention record, and the packed rows whose logits are wanted."""
        as_decodes = (lambda c: True) if self.all_decodes else _as_decodes
        order = sorted(range(len(chunks)), key=lambda i: not as_decodes(chunks[i]))  # decodes first
        ordered = [chunks[i] for i in order]
        ndc = sum(map(as_decodes, ordered))
        lens = np.array([len(c.token_ids) for c in ordered], dtype=np.int64)
        starts = np.array([c.start_pos for c in ordered], dtype=np.int64)
        ends = np.cumsum(lens)
        ids = np.fromiter((t for c in ordered for t in c.token_ids), dtype=np.int64, count=int(ends[-1]))
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)])
        row_seq = np.repeat(np.arange(len(ordered)), lens)
        tables = _padded_tables([c.block_table for c in ordered])
        bs = self.block_size
        slots = tables[row_seq, positions // bs].astype(np.int64) * bs + positions % bs
        nd = int(lens[:ndc].sum())
        batch = AttentionBatch(slot_mapping=self._tensor(slots), num_blocks=self.kv_caches[0][0].shape[0],
                               block_size=bs, num_kv_heads=self.kv_caches[0][0].shape[2], num_decode_tokens=nd)
        if nd:
            batch.decode_block_tables = self._tensor(tables[row_seq[:nd]])
            batch.decode_context_lens = self._tensor((positions[:nd] + 1).astype(np.int32))
        if ndc < len(ordered):
            cu = np.concatenate([[0], np.cumsum(lens[ndc:])]).astype(np.int32)
            batch.cu_seqlens_q = self._tensor(cu)
            batch.prefill_prefix_lens = self._tensor(starts[ndc:].astype(np.int32))
            batch.prefill_block_tables = self._tensor(tables[ndc:])
            batch.max_prefix_len = int(starts[ndc:].max())
            batch.max_seqlen_q = int(lens[ndc:].max())
        # rows whose logits are wanted, in the callers' chunk order
        where = np.empty(len(chunks), dtype=np.int64)
        where[order] = np.arange(len(chunks))
        rows = [np.arange(ends[j] - chunks[i].num_logits, ends[j]) for i, j in enumerate(where)]
        return Prepared(self._tensor(ids), self._tensor(positions), batch, np.concatenate(rows))

    def run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        """Float32 logits [sum of num_logits, vocab], rows in chunk order."""
        return self.forward(self.prepare(chunks))

    def forward(self, prepared: Prepared) -> torch.Tensor:
        ids, positions, batch, rows = prepared
        hidden = self.model(ids, positions, batch, self.kv_caches)
        if len(rows) == 0:
            return hidden.new_empty((0, self.model.cfg.vocab_size), dtype=torch.float32)
        self.hidden = hidden[self._tensor(rows)]  # kept for proposers that read the target's states
        return self.model.logits(self.hidden)

    def close(self) -> None:
        pass

    def failure(self) -> str | None:
        return None

    def describe(self) -> dict[str, str]:
        return {"backend": self.model.backend.describe(), "tensor parallel": "off", "cuda graphs": "off"}


@dataclass
class EngineParts:
    """What runtime/build.py hands the engine: its runner, this process's model runner, the KV plan."""

    runner: Runner  # what a step runs on
    model_runner: ModelRunner  # this process's model and KV caches (rank 0's under tensor parallelism)
    ledger: KVLedger
    pool_blocks: int  # KV blocks the pool hands out (a CUDA graph's scratch block is kept out)
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    proposer: Proposer | None = None
