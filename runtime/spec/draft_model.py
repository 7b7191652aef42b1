"""Draft-model proposer: a smaller model sharing the target's tokenizer, with its own paged KV."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.kv.block_manager import BlockManager
from runtime.kv.block_pool import BlockPool
from runtime.model.factory import make_runner
from runtime.model_runner import SeqChunk
from runtime.sampler import SamplingRow, draw, processed_probs
from runtime.sequence import Sequence
from runtime.spec.proposer import Draft
from weights.config import ModelConfig


@dataclass
class DraftSeq:
    """The draft model's KV bookkeeping for one target sequence (same fields BlockManager uses)."""

    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_hashes: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0


class DraftModelProposer:
    def __init__(self, draft_cfg: ModelConfig, tensors: dict[str, torch.Tensor], target_cfg: ModelConfig,
                 config: EngineConfig, device: torch.device, dtype: torch.dtype, kv_budget_bytes: int = 256 << 20) -> None:
        if draft_cfg.vocab_size != target_cfg.vocab_size:
            raise UserError(f"the draft model's vocabulary ({draft_cfg.vocab_size}) differs from the target's "
                            f"({target_cfg.vocab_size}); they must share a tokenizer")
        self.runner, ledger = make_runner(draft_cfg, tensors, kv_budget_bytes, config.block_size, device, dtype,
                                          config.backend)
        self.blocks = BlockManager(BlockPool(max(ledger.num_blocks, 1), enable_prefix_caching=False), config.block_size)
        self.state: dict[int, DraftSeq] = {}

    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        active, chunks = [], []
        for seq in seqs:
            st = self.state.setdefault(seq.seq_id, DraftSeq())
            catch_up = seq.token_ids[st.num_computed:]  # tokens the draft has not run yet (at least the last)
            if not self.blocks.allocate(st, len(catch_up) + k - 1):
                continue  # draft KV is full: this sequence decodes without speculation this step
            active.append((seq, st))
            chunks.append(SeqChunk(catch_up, st.num_computed, st.block_table))
        if not active:
            return {}
        rows = [SamplingRow(seq.params, [], [], seq.generator) for seq, _ in active]
        tokens: list[list[int]] = [[] for _ in active]
        dists: list[list[torch.Tensor]] = [[] for _ in active]
        for step in range(k):
            probs = processed_probs(self.runner.run(chunks), rows)
            picked = draw(probs, rows).tolist()
            for i, (seq, st) in enumerate(active):
                st.num_computed += len(chunks[i].token_ids)
                tokens[i].append(picked[i])
                dists[i].append(probs[i])
            chunks = [SeqChunk([picked[i]], st.num_computed, st.block_table) for i, (_, st) in enumerate(active)]
        return {seq: Draft(tokens[i], None if seq.params.greedy else torch.stack(dists[i]))
                for i, (seq, _) in enumerate(active)}

    def on_verified(self, seq: Sequence, num_valid_tokens: int) -> None:
        st = self.state.get(seq.seq_id)
        if st is not None and st.num_computed > num_valid_tokens:
            self.blocks.truncate(st, num_valid_tokens)

    def release(self, seq: Sequence) -> None:
        st = self.state.pop(seq.seq_id, None)
        if st is not None:
            self.blocks.free(st)

    @property
    def pool(self) -> BlockPool:
        return self.blocks.pool
