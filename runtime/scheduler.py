"""Iteration-level scheduling: which tokens of which sequences run in the next forward pass.

Continuous: running decodes first, then partial prefills, then waiting requests fill the token
budget in chunks; when KV blocks run out the newest running sequence is preempted (its blocks
freed, recomputed later). Static: a batch is admitted only when the last one has drained, with KV
for prompt + max_tokens reserved up front, so it never preempts.
The scheduler touches block tables but never tensors.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from runtime.kv.block_manager import BlockManager
from runtime.sequence import Sequence, SeqStatus


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    policy: str = "continuous"  # or "static"

    def __post_init__(self) -> None:
        if self.policy not in ("continuous", "static"):
            raise ValueError(f"unknown scheduler policy {self.policy!r} (continuous or static)")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int  # of the sequence's known tokens, from seq.num_computed on
    num_spec_tokens: int = 0  # draft tokens appended after them, to verify


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # sequences that could never fit the pool even alone: finished with reason "length"
    out_of_memory: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens + c.num_spec_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence (finished or aborted) and return its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = SeqStatus.FINISHED

    def schedule(self, spec_tokens: dict[Sequence, int] | None = None) -> SchedulerOutput:
        if self.config.policy == "static":
            return self._schedule_static()
        return self._schedule_continuous(spec_tokens or {})

    # -- continuous ---------------------------------------------------------------------------

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SeqStatus.WAITING
        seq.metrics.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def _schedule_running(self, out: SchedulerOutput, budget: int, spec_tokens: dict[Sequence, int]) -> int:
        scheduled: set[Sequence] = set()
        order = sorted(self.running, key=lambda s: s.num_remaining > 1)  # decodes before partial prefills
        decodes = {s for s in order if s.num_remaining == 1}  # as they stand now: preemption changes them
        decodes_after = len(decodes)
        for seq in order:
            if budget <= 0:
                break
            decodes_after -= seq in decodes
            if seq.status is not SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_remaining, budget)
            # drafts only from budget left once every later decode has its one token
            spec = max(0, min(spec_tokens.get(seq, 0), budget - n - decodes_after)) if n == seq.num_remaining else 0
            while not self.blocks.allocate(seq, n + spec):
                if spec:  # draft tokens are optional: drop them before preempting anyone
                    spec = 0
                    continue
                victim = next((s for s in reversed(self.running) if s not in scheduled), None)
                if victim is None or (victim is seq and len(self.running) == 1):
                    # alone and still short of blocks: it can never grow further
                    self.running.remove(seq)
                    out.out_of_memory.append(seq)
                    break
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING or seq in out.out_of_memory:
                continue
            scheduled.add(seq)
            out.chunks.append(ScheduledChunk(seq, n, spec))
            budget -= n + spec
        return budget

    def _admit(self, seq: Sequence, n: int, out: SchedulerOutput) -> None:
        self.waiting.popleft()
        seq.status = SeqStatus.RUNNING
        if seq.metrics.first_scheduled is None:
            seq.metrics.first_scheduled = time.perf_counter()
        self.running.append(seq)
        out.chunks.append(ScheduledChunk(seq, n))

    def _schedule_continuous(self, spec_tokens: dict[Sequence, int]) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens, spec_tokens)
        if out.preempted:  # memory is short: admit nothing new this step
            return out
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hit = self.blocks.match_prefix(seq)
            n = min(seq.num_remaining, budget)
            if not self.blocks.allocate(seq, n):
                self.blocks.free(seq)  # do not pin shared blocks while waiting
                break
            self.blocks.record_lookup(seq, hit)
            # a recomputed (preempted) sequence can also hit its own output blocks: count prompt tokens only
            seq.metrics.num_cached_prompt_tokens = max(seq.metrics.num_cached_prompt_tokens,
                                                       min(hit, seq.num_prompt_tokens))
            self._admit(seq, n, out)
            budget -= n
        return out

    # -- static -------------------------------------------------------------------------------

    def _admit_static_batch(self, out: SchedulerOutput) -> None:
        """FCFS into one padded rectangle: every member reserves (longest prompt + largest max_tokens)."""
        batch: list[Sequence] = []
        width = 0
        for seq in self.waiting:
            if len(batch) == self.config.max_num_seqs:
                break
            w = max(width, len(seq.token_ids) + seq.params.max_tokens - seq.num_output_tokens)
            if (len(batch) + 1) * self.blocks.blocks_needed(w) > self.blocks.pool.num_free:
                break
            batch.append(seq)
            width = w
        if not batch and self.waiting:  # the head cannot fit even alone
            out.out_of_memory.append(self.waiting.popleft())
            return
        for seq in batch:
            self.waiting.popleft()
            assert self.blocks.allocate(seq, width - seq.num_computed)
            seq.status = SeqStatus.RUNNING
            seq.metrics.first_scheduled = time.perf_counter()
            self.running.append(seq)

    def release_drained_batch(self) -> None:
        """Static mode: once every member of the batch has finished, free the whole rectangle."""
        if all(s.ghost for s in self.running):
            for seq in list(self.running):
                self.finish(seq)

    def _schedule_static(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if not self.running:
            self._admit_static_batch(out)
        budget = self.config.max_num_batched_tokens
        for seq in sorted(self.running, key=lambda s: s.num_remaining > 1):
            n = min(seq.num_remaining, budget)
            if n <= 0:
                break
            out.chunks.append(ScheduledChunk(seq, n))
            budget -= n
        return out
