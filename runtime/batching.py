"""Batching policies: which tokens of which sequences run in the next step.

Continuous: running decodes first, then partial prefills, then waiting requests fill the token
budget in chunks; when KV blocks run out the newest running sequence is preempted (its blocks
freed, recomputed later). Static: a batch is admitted only when the last one has drained, with KV
for prompt + max_tokens reserved up front, so it never preempts; finished members decode on as
padding until the batch's longest is done, as static batching costs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.sequence import SeqStatus, Sequence

if TYPE_CHECKING:
    from runtime.scheduler import Scheduler


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int  # of the sequence's known tokens, from seq.num_computed on
    num_spec_tokens: int = 0  # draft tokens appended after them, to verify


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # sequences that could never fit the pool even alone: to finish with reason "length"
    out_of_memory: list[Sequence] = field(default_factory=list)
    # static batching: finished members computed only to keep the batch's shape, never reported
    padding: frozenset[Sequence] = frozenset()

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens + c.num_spec_tokens for c in self.chunks)


def _decodes_first(seqs: list[Sequence]) -> list[Sequence]:
    return sorted(seqs, key=lambda s: s.num_remaining > 1)


class ContinuousBatching:
    allows_drafts = True

    def schedule(self, sched: Scheduler, spec_tokens: dict[Sequence, int]) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(sched, out, sched.max_num_batched_tokens, spec_tokens)
        if out.preempted:  # memory is short: admit nothing new this step
            return out
        while sched.waiting and budget > 0 and len(sched.running) < sched.max_num_seqs:
            seq = sched.waiting[0]
            hit = sched.blocks.match_prefix(seq.kv, seq.token_ids)
            n = min(seq.num_remaining, budget)
            if not sched.blocks.allocate(seq.kv, n):
                sched.blocks.free(seq.kv)  # do not pin shared blocks while waiting
                break
            sched.count_prefix_lookup(seq, hit)
            sched.waiting.popleft()
            _start_running(sched, seq)
            out.chunks.append(ScheduledChunk(seq, n))
            budget -= n
        return out

    def _schedule_running(self, sched: Scheduler, out: SchedulerOutput, budget: int,
                          spec_tokens: dict[Sequence, int]) -> int:
        scheduled: set[Sequence] = set()
        order = _decodes_first(sched.running)
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
            while not sched.blocks.allocate(seq.kv, n + spec):
                if spec:  # draft tokens are optional: drop them before preempting anyone
                    spec = 0
                    continue
                victim = next((s for s in reversed(sched.running) if s not in scheduled), None)
                if victim is None or (victim is seq and len(sched.running) == 1):
                    # alone and still short of blocks: it can never grow further
                    sched.running.remove(seq)
                    out.out_of_memory.append(seq)
                    break
                sched.preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING or seq in out.out_of_memory:
                continue
            scheduled.add(seq)
            out.chunks.append(ScheduledChunk(seq, n, spec))
            budget -= n + spec
        return budget

    def on_finished(self, sched: Scheduler, seq: Sequence) -> None:
        sched.finish(seq)

    def on_padding_token(self, sched: Scheduler, seq: Sequence) -> None:
        raise AssertionError("continuous batching has no padding")

    def on_aborted(self, sched: Scheduler) -> None:
        pass


class StaticBatching:
    allows_drafts = False  # a static batch never verifies drafts

    def __init__(self) -> None:
        self.padding: set[Sequence] = set()  # finished members still computed as padding

    def schedule(self, sched: Scheduler, spec_tokens: dict[Sequence, int]) -> SchedulerOutput:
        out = SchedulerOutput()
        if not sched.running:
            self._admit_batch(sched, out)
        budget = sched.max_num_batched_tokens
        for seq in _decodes_first(sched.running):
            n = min(seq.num_remaining, budget)
            if n <= 0:
                break
            out.chunks.append(ScheduledChunk(seq, n))
            budget -= n
        out.padding = frozenset(self.padding)
        return out

    def _admit_batch(self, sched: Scheduler, out: SchedulerOutput) -> None:
        """FCFS into one padded rectangle: every member reserves (longest prompt + largest max_tokens)."""
        batch: list[Sequence] = []
        width = 0
        for seq in sched.waiting:
            if len(batch) == sched.max_num_seqs:
                break
            w = max(width, len(seq.token_ids) + seq.params.max_tokens - seq.num_output_tokens)
            if (len(batch) + 1) * sched.blocks.blocks_needed(w) > sched.blocks.pool.num_free:
                break
            batch.append(seq)
            width = w
        if not batch and sched.waiting:  # the head cannot fit even alone
            out.out_of_memory.append(sched.waiting.popleft())
            return
        for seq in batch:
            sched.waiting.popleft()
            if not sched.blocks.allocate(seq.kv, width - seq.num_computed):
                raise RuntimeError("static batch admission overran the free blocks it counted")
            _start_running(sched, seq)

    def on_finished(self, sched: Scheduler, seq: Sequence) -> None:
        self.padding.add(seq)  # a static batch computes finished members until its longest is done
        self._release_drained(sched)

    def on_padding_token(self, sched: Scheduler, seq: Sequence) -> None:
        if len(seq.token_ids) >= min(len(seq.kv.block_table) * sched.blocks.block_size, sched.max_model_len):
            self.padding.discard(seq)
            sched.finish(seq)

    def on_aborted(self, sched: Scheduler) -> None:
        self._release_drained(sched)  # an abort may leave only padding members

    def _release_drained(self, sched: Scheduler) -> None:
        """Once every member of the batch has finished, free the whole rectangle."""
        if all(s in self.padding for s in sched.running):
            for seq in list(sched.running):
                self.padding.discard(seq)
                sched.finish(seq)


def _start_running(sched: Scheduler, seq: Sequence) -> None:
    seq.status = SeqStatus.RUNNING
    if seq.metrics.first_scheduled is None:
        seq.metrics.first_scheduled = time.perf_counter()
    sched.running.append(seq)

