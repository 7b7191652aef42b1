"""The scheduler owns every sequence's lifecycle and KV blocks: admission, prefix matching,
allocation, preemption, the update after each step (tokens, prefix registration, rollback of
rejected drafts) and freeing. Which tokens run next is its batching policy's decision
(runtime/batching.py: continuous, or static for comparison). It never touches tensors.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from runtime.batching import ContinuousBatching, SchedulerOutput, StaticBatching
from runtime.engine_config import EngineConfig
from runtime.engine_stats import EngineStats
from runtime.kv.block_manager import BlockManager, KVBlocks
from runtime.sequence import SeqStatus, Sequence


@dataclass
class SeqUpdate:
    """What a step decided for one scheduled sequence."""

    seq: Sequence
    tokens: list[int]  # new tokens, in order (cut after a stop)
    finished: bool = False
    num_drafts: int = 0  # draft tokens verified this step: len(tokens) - 1 of them were accepted


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager, stats: EngineStats, max_model_len: int,
                 draft_blocks: BlockManager | None = None) -> None:
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = max_model_len
        self.blocks = blocks
        self.draft_blocks = draft_blocks  # a draft model's own pool, with a draft-model proposer
        self.stats = stats
        self.policy = StaticBatching() if config.scheduler == "static" else ContinuousBatching()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, spec_tokens: dict[Sequence, int] | None = None) -> SchedulerOutput:
        """The next step's chunks; spec_tokens: draft tokens offered per decoding sequence."""
        spec_tokens = spec_tokens or {}
        out = self.policy.schedule(self, spec_tokens)
        self.stats.preemptions += len(out.preempted)
        verifying = {c.seq for c in out.chunks if c.num_spec_tokens}
        for seq in spec_tokens.keys() - verifying:  # drafts left out are never verified: forget them
            self._forget_drafts(seq, len(seq.token_ids) - 1)
        return out

    def draft_room(self, k: int) -> dict[Sequence, int]:
        """Decoding sequences that may speculate, with how many draft tokens each has room for; with
        a draft model, its KV for them is reserved here (a sequence it has no room for is left out)."""
        room: dict[Sequence, int] = {}
        if not self.policy.allows_drafts:
            return room
        for s in self.running:
            n = min(k, s.params.max_tokens - s.num_output_tokens - 1, self.max_model_len - len(s.token_ids) - 1)
            if s.num_remaining != 1 or not s.params.speculative or n <= 0:
                continue
            if self.draft_blocks is not None:
                kv = s.draft_kv = s.draft_kv or KVBlocks()
                if not self.draft_blocks.allocate(kv, len(s.token_ids) + k - 1 - kv.num_computed):
                    continue
            room[s] = n
        return room

    def update(self, out: SchedulerOutput, updates: list[SeqUpdate]) -> None:
        """After the step: the scheduled tokens are computed; new tokens join their sequences, KV of
        rejected drafts rolls back, full blocks join the prefix cache, finished sequences leave."""
        for c in out.chunks:
            seq = c.seq
            if c.num_tokens > 1 or seq.num_output_tokens == 0:
                self.stats.computed_prefill_tokens += c.num_tokens
            seq.kv.num_computed += c.num_tokens
            self.blocks.register_full_blocks(seq.kv, seq.token_ids)
        for u in updates:
            seq = u.seq
            start_len = len(seq.token_ids)
            seq.token_ids.extend(u.tokens)
            if u.finished:
                self.policy.on_finished(self, seq)
            elif seq in out.padding:
                self.policy.on_padding_token(self, seq)
            elif u.num_drafts:  # KV is valid for the known tokens and the accepted drafts only
                seq.kv.num_computed = start_len + len(u.tokens) - 1
                self.blocks.truncate(seq.kv, seq.kv.num_computed)
                self.blocks.register_full_blocks(seq.kv, seq.token_ids)
                self._forget_drafts(seq, seq.kv.num_computed)

    def abort(self, seq: Sequence) -> None:
        """Remove an aborted sequence and return its blocks at once."""
        self.finish(seq)
        self.policy.on_aborted(self)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence and return its blocks (a draft model's too)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.kv)
        if seq.draft_kv is not None:
            self.draft_blocks.free(seq.draft_kv)
        seq.status = SeqStatus.FINISHED

    def preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free a running sequence's blocks and put it first in line, to recompute later."""
        self.running.remove(seq)
        self.blocks.free(seq.kv)
        seq.status = SeqStatus.WAITING
        seq.metrics.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def count_prefix_lookup(self, seq: Sequence, hit: int) -> None:
        """Count an admitted sequence's prefix lookup (once: an admission that fails is retried later)."""
        if self.blocks.pool.enable_prefix_caching:
            self.stats.prefix_cache_queries += len(seq.token_ids)
            self.stats.prefix_cache_hits += hit
        # a recomputed (preempted) sequence can also hit its own output blocks: count prompt tokens only
        seq.metrics.num_cached_prompt_tokens = max(seq.metrics.num_cached_prompt_tokens,
                                                   min(hit, seq.num_prompt_tokens))

    def _forget_drafts(self, seq: Sequence, num_valid: int) -> None:
        """Roll the draft model's KV back to num_valid tokens (its guesses past them are void)."""
        if seq.draft_kv is not None and seq.draft_kv.num_computed > num_valid:
            self.draft_blocks.truncate(seq.draft_kv, num_valid)
