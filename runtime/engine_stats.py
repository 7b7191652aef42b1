"""The engine's one metrics record: counters since start (or reset), gauges, and step time shares.

The engine thread keeps one live EngineStats; snapshot() copies it with the gauges filled in, so
other threads (the server's /metrics, the UI) read a frozen copy and never the engine itself.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import runtime.nvtx as nvtx

PHASES = ("propose", "schedule", "prepare", "forward", "sample", "output")


@dataclass
class StepTimes:
    """Seconds spent per phase, summed over steps."""

    propose: float = 0.0  # speculative drafting (a draft model's forward passes)
    schedule: float = 0.0
    prepare: float = 0.0  # building the packed input tensors
    forward: float = 0.0
    sample: float = 0.0
    output: float = 0.0  # stop checks, scheduler update, detokenization, output records

    @property
    def total(self) -> float:
        return sum(getattr(self, k) for k in PHASES)

    def shares(self) -> dict[str, float]:
        t = self.total or 1.0
        return {k: getattr(self, k) / t for k in PHASES}


@dataclass
class EngineStats:
    # counters
    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens received
    computed_prefill_tokens: int = 0  # tokens run through the model in prefill chunks (after cache hits)
    generated_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})  # sequences
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_verify_steps: int = 0  # (sequence, step) pairs that verified drafts
    spec_proposed_by_pos: list[int] = field(default_factory=list)  # drafts verified at each draft position
    spec_accepted_by_pos: list[int] = field(default_factory=list)  # of which accepted
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of which found in the cache
    external_prefix_cache_queries: int = 0  # tokens asked of a KV connector past the pool's prefix match
    external_prefix_cache_hits: int = 0  # of which it loaded
    prefix_cache_evictions: int = 0  # cached blocks dropped for a fresh allocation (filled by snapshots)
    times: StepTimes = field(default_factory=StepTimes)
    tiers: dict[str, float] = field(default_factory=dict)  # a KV connector's counters, by name (runtime/tiers/)
    # gauges, filled by snapshots
    num_requests_running: int = 0  # requests with at least one sequence scheduled to run
    num_requests_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_bytes_per_block: int = 0
    prefix_cached_blocks: int = 0  # blocks findable by hash (in use or free)
    block_states: np.ndarray | None = None  # 0 free, 1 cached, 2 in use, 3 shared; | 4: held below too

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0

    @property
    def spec_mean_accepted_len(self) -> float:
        return self.spec_accepted / self.spec_verify_steps if self.spec_verify_steps else 0.0

    @property
    def spec_acceptance_by_pos(self) -> list[float]:
        accepted = self.spec_accepted_by_pos + [0] * len(self.spec_proposed_by_pos)
        return [a / p if p else 0.0 for a, p in zip(accepted, self.spec_proposed_by_pos)]

    def copy(self, **gauges) -> "EngineStats":
        """A frozen-in-time copy with the given gauges set."""
        out = copy.copy(self)
        out.finished, out.times = dict(self.finished), copy.copy(self.times)
        out.spec_proposed_by_pos, out.spec_accepted_by_pos = list(self.spec_proposed_by_pos), list(self.spec_accepted_by_pos)
        out.tiers = dict(self.tiers)
        for name, value in gauges.items():
            setattr(out, name, value)
        return out




class PhaseTimer:
    """The one clock of a step: timer("phase") ends the current phase (its seconds go to stats.times)
    and starts the next, marked as an NVTX range of the same name for nsys; end() closes the last."""

    def __init__(self, stats: EngineStats) -> None:
        self.stats = stats  # not stats.times: a reset replaces that record
        self.current: str | None = None
        self.since = 0.0
        self.listener: Callable[[str, float, float], None] | None = None  # (phase, start, end) of each (tracing)

    def __call__(self, phase: str) -> float:
        """Start `phase` (a no-op when it is the current one); returns the time (time.perf_counter)."""
        now = time.perf_counter()
        if phase == self.current:
            return now
        self._close(now)
        self.current, self.since = phase, now
        if nvtx.ON:
            nvtx.push(phase)
        return now

    def end(self) -> None:
        self._close(time.perf_counter())
        self.current = None

    def _close(self, now: float) -> None:
        if self.current is not None:
            times = self.stats.times
            setattr(times, self.current, getattr(times, self.current) + now - self.since)
            if self.listener is not None:
                self.listener(self.current, self.since, now)
            if nvtx.ON:
                nvtx.pop()
