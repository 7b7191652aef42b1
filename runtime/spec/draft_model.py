"""Draft-model proposer: a smaller model sharing the target's tokenizer, with its own paged KV.

Its KV blocks are the scheduler's to reserve, roll back and free (Sequence.draft_kv); the proposer
runs the draft model over them and records how many tokens it has computed.
"""
from __future__ import annotations

import torch

from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.model.factory import make_runner
from runtime.model.runner import SeqChunk
from runtime.sampling.sampler import SamplingRow, draw, processed_probs
from runtime.sequence import Sequence
from runtime.spec.proposer import Draft
from weights.config import ModelConfig


class DraftModelProposer:
    def __init__(self, draft_cfg: ModelConfig, tensors: dict[str, torch.Tensor], target_cfg: ModelConfig,
                 config: EngineConfig, device: torch.device, dtype: torch.dtype, kv_budget_bytes: int = 256 << 20) -> None:
        if draft_cfg.vocab_size != target_cfg.vocab_size:
            raise UserError(f"the draft model's vocabulary ({draft_cfg.vocab_size}) differs from the target's "
                            f"({target_cfg.vocab_size}); they must share a tokenizer")
        self.runner, ledger = make_runner(draft_cfg, tensors, kv_budget_bytes, config.block_size, device, dtype,
                                          config.backend, config.quantization)
        self.num_kv_blocks = max(ledger.num_blocks, 1)

    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        """k tokens for each sequence; their draft KV covers len(token_ids) + k - 1 tokens already."""
        if not seqs:
            return {}
        # catch up on the tokens the draft has not run yet (at least the last one)
        chunks = [SeqChunk(s.token_ids[s.draft_kv.num_computed:], s.draft_kv.num_computed, s.draft_kv.block_table)
                  for s in seqs]
        rows = [SamplingRow(s.params, s.generator) for s in seqs]
        tokens: list[list[int]] = [[] for _ in seqs]
        dists: list[list[torch.Tensor]] = [[] for _ in seqs]
        for _ in range(k):
            probs = processed_probs(self.runner.run(chunks), rows)
            picked = draw(probs, rows).tolist()
            for i, seq in enumerate(seqs):
                seq.draft_kv.num_computed += len(chunks[i].token_ids)
                tokens[i].append(picked[i])
                dists[i].append(probs[i])
            chunks = [SeqChunk([picked[i]], s.draft_kv.num_computed, s.draft_kv.block_table)
                      for i, s in enumerate(seqs)]
        return {seq: Draft(tokens[i], None if seq.params.greedy else torch.stack(dists[i]))
                for i, seq in enumerate(seqs)}
