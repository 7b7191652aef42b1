"""Draft-model proposer: a smaller model sharing the target's tokenizer, with its own paged KV.

Its KV blocks are the scheduler's to reserve, roll back and free (Sequence.draft_kv); the proposer
runs the draft model over them and records how many tokens it has computed.
"""
from __future__ import annotations

import torch

from runtime.model.runner import ModelRunner
from runtime.sampling.sampler import SamplingRow, draw, processed_probs
from runtime.sequence import Draft, SeqChunk, Sequence


class DraftModelProposer:
    """Over the draft model's runner (runtime.build.draft_proposer makes both), with num_kv_blocks of KV."""

    def __init__(self, runner: ModelRunner, num_kv_blocks: int) -> None:
        self.runner = runner
        self.num_kv_blocks = num_kv_blocks

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
