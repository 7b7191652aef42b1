"""The scheduler owns every sequence's lifecycle and KV blocks: admission, prefix matching,
allocation, preemption, the update after each step (tokens, prefix registration, rollback of
rejected drafts) and freeing. It hands the runner model-ready chunks (drafts appended, the rows
whose logits are sampled known) and never touches tensors.

Which tokens run next is its batching policy's decision, a strategy object it owns. Continuous:
running decodes first, then partial prefills, then waiting requests fill the token budget in
chunks; when KV blocks run out the newest running sequence is preempted (its blocks freed,
recomputed later). Static: a batch is admitted only when the last one has drained, with KV for
prompt + max_tokens reserved up front, so it never preempts; finished members decode on as padding
until the batch's longest is done, as static batching costs.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from runtime.engine_config import EngineConfig
from runtime.engine_stats import EngineStats
from runtime.kv.block_manager import BlockManager, KVBlocks
from runtime.kv.block_pool import BlockPool
from runtime.kv.connector import BlockLoad, KVConnector
from runtime.sequence import Draft, SeqChunk, SeqStatus, Sequence, SeqUpdate


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
    # what the runner runs, one per chunk; the (sequence, drafts it verifies) whose logits are sampled,
    # in logits order; the drafts of those that verify
    model_chunks: list[SeqChunk] = field(default_factory=list)
    sampled: list[tuple[Sequence, list[int]]] = field(default_factory=list)
    drafts: dict[Sequence, Draft] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens + c.num_spec_tokens for c in self.chunks)


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
        self.connector: KVConnector | None = None  # prefix blocks beyond the pool (runtime/tiers/); set by the build
        self.loading: dict[Sequence, int] = {}  # waiting aside for a connector's blocks: tokens computed before
        self.loaded: dict[Sequence, int] = {}  # back from a load: their device prefix hit, counted at admission

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def set_draft_pool(self, num_blocks: int) -> None:
        """A draft model's own KV pool of num_blocks blocks (0: the proposer has none)."""
        self.draft_blocks = BlockManager(BlockPool(num_blocks, False), self.blocks.block_size) if num_blocks else None

    def schedule(self, drafts: dict[Sequence, Draft] | None = None) -> SchedulerOutput:
        """The next step's chunks, model-ready; drafts: those offered per decoding sequence (fit_drafts)."""
        drafts = drafts or {}
        self._take_loads()
        out = self.policy.schedule(self, {seq: len(d.tokens) for seq, d in drafts.items()})
        self.stats.preemptions += len(out.preempted)
        verifying = {c.seq for c in out.chunks if c.num_spec_tokens}
        for seq in drafts.keys() - verifying:  # drafts left out are never verified: forget them
            self._forget_drafts(seq, len(seq.token_ids) - 1)
        for c in out.chunks:
            seq, start = c.seq, c.seq.num_computed
            spec = drafts[seq].tokens[:c.num_spec_tokens] if c.num_spec_tokens else []
            reaches_end = start + c.num_tokens == len(seq.token_ids)
            out.model_chunks.append(SeqChunk(seq.token_ids[start:start + c.num_tokens] + spec, start,
                                             seq.kv.block_table, len(spec) + 1 if reaches_end else 0, seq.seq_id))
            if reaches_end:
                out.sampled.append((seq, spec))
        out.drafts = {seq: drafts[seq] for seq, spec in out.sampled if spec}
        return out

    def start_load(self, seq: Sequence) -> bool:
        """After a sequence's device prefix match: have the connector fill the blocks it holds beyond it.
        True when it does: the sequence waits aside (not in the queue) until they have landed."""
        kv, bs = seq.kv, self.blocks.block_size
        if self.connector is None or kv.num_computed != len(kv.block_table) * bs:
            return False
        hashes = self.blocks.block_hashes(kv, seq.token_ids, (len(seq.token_ids) - 1) // bs)
        start = len(kv.block_table)
        transfer = seq.params.kv_transfer_params
        n = self.connector.lookup(hashes[start:], transfer)
        self.stats.external_prefix_cache_queries += (len(hashes) - start) * bs
        if n == 0 or not self.blocks.allocate(kv, n * bs):
            return False
        tokens = seq.token_ids
        self.connector.load(seq, [(kv.block_table[i], hashes[i], tuple(tokens[i * bs:(i + 1) * bs]))
                                  for i in range(start, start + n)], transfer)
        self.loading[seq] = kv.num_computed
        self.waiting.remove(seq)
        self._take_loads(wait=0.0)  # a load the connector did at once rejoins the queue now
        return True

    def _take_loads(self, wait: float | None = None) -> None:
        """Sequences whose loads ended rejoin the head of the queue with the blocks that arrived intact
        computed (and cached); the others are recomputed. With nothing else to run, wait a little."""
        if not self.loading:
            return
        wait = (0.0 if self.waiting or self.running else 0.01) if wait is None else wait
        for seq, intact in self.connector.finished(wait=wait):
            kv, before = seq.kv, self.loading.pop(seq)
            self.blocks.truncate(kv, before + intact * self.blocks.block_size)
            kv.num_computed = len(kv.block_table) * self.blocks.block_size
            if seq.status is SeqStatus.FINISHED:  # aborted while its blocks were filling
                self.blocks.free(kv)
                continue
            self.blocks.register_full_blocks(kv, seq.token_ids)
            self.loaded[seq] = before
            m = seq.metrics
            m.num_cached_prompt_tokens = min(kv.num_computed, seq.num_prompt_tokens)
            m.num_external_prompt_tokens = m.num_cached_prompt_tokens - min(before, seq.num_prompt_tokens)
            self.stats.external_prefix_cache_hits += intact * self.blocks.block_size
            self.waiting.appendleft(seq)

    @staticmethod
    def fit_drafts(drafts: dict[Sequence, Draft], room: dict[Sequence, int]) -> dict[Sequence, Draft]:
        """A proposer's drafts cut to the room draft_room gave each sequence; empty ones dropped."""
        for seq, d in drafts.items():
            n = room[seq]
            d.tokens = d.tokens[:n]
            d.probs = d.probs[:n] if d.probs is not None else None
        return {s: d for s, d in drafts.items() if d.tokens}

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
        # a row that took no token (its grammar mask deferred) stays uncomputed: it runs again next step
        deferred = {u.seq for u in updates if not u.tokens and not u.finished}
        for c in out.chunks:
            seq = c.seq
            if c.num_tokens > 1 or seq.num_output_tokens == 0:
                self.stats.computed_prefill_tokens += c.num_tokens
            seq.kv.num_computed += c.num_tokens - (seq in deferred)
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
        seq.status = SeqStatus.FINISHED
        self.loaded.pop(seq, None)
        if seq.draft_kv is not None:
            self.draft_blocks.free(seq.draft_kv)
        if seq not in self.loading:  # a loading sequence's blocks are still filling: freed once they land
            if self.connector is not None and seq.params.kv_transfer_params is not None:
                seq.metrics.kv_transfer_params = self.connector.request_finished(seq.params.kv_transfer_params,
                                                                                 self._computed_prompt_blocks(seq))
            self.blocks.free(seq.kv)

    def _computed_prompt_blocks(self, seq: Sequence) -> list[BlockLoad]:
        """The sequence's full prompt blocks whose KV is computed: (block, chained hash, token ids)."""
        kv, bs = seq.kv, self.blocks.block_size
        n = min(kv.num_computed, seq.num_prompt_tokens) // bs
        return [(b, h, tuple(seq.token_ids[i * bs:(i + 1) * bs]))
                for i, (b, h) in enumerate(zip(kv.block_table[:n], kv.block_hashes[:n]))]

    def release_held_blocks(self) -> bool:
        """Free the blocks waiting sequences hold since their loads landed (they stay cached: admission
        finds them again). Whether any were held."""
        held = [seq for seq in self.loaded if seq.kv.block_table]
        for seq in held:
            self.blocks.free(seq.kv)
            del self.loaded[seq]
        return bool(held)

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
            hit = sched.loaded.pop(seq, None)  # back from a load (intact or not): no second one
            if hit is None:
                hit = sched.blocks.match_prefix(seq.kv, seq.token_ids)
                if sched.start_load(seq):
                    continue
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
                    if sched.release_held_blocks():  # blocks back from a load, held by waiting sequences
                        continue
                    if sched.loading:  # blocks held for loads free up when they land: wait for them
                        sched.preempt(seq, out)
                        break
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

