"""KV memory reserved vs actually holding tokens, sampled after each engine step.

Reserved: the distinct KV blocks of running sequences (a block shared by a prefix counts once; free
and cached-free blocks are nobody's reservation). Holding: the tokens in those blocks that belong to
a request still generating (its prompt and the output kept so far). Static batching reserves prompt
+ max_tokens (the batch's widest) per member up front and keeps a finished member's blocks, computing
padding in them, until the batch drains: the unfilled tail and the finished members are its waste.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.engine import LLMEngine


def occupancy(engine: LLMEngine) -> tuple[int, int]:
    """(tokens reserved, tokens holding a request's own KV) right now."""
    bs = engine.config.block_size
    held: dict[int, int] = {}
    live = engine.requests  # a finished request leaves it; a static batch keeps its blocks as padding
    for seq in engine.scheduler.running:
        own = min(seq.num_computed, seq.num_prompt_tokens + seq.metrics.num_output_tokens)
        own = own if seq.request_id in live else 0
        for i, block in enumerate(seq.kv.block_table):
            held[block] = max(held.get(block, 0), min(bs, max(0, own - i * bs)))
    return len(held) * bs, sum(held.values())


@dataclass
class OccupancyMeter:
    """Time-weighted sums: each sample counts for the wall time of the step before it."""

    bytes_per_token: int
    seconds: float = 0.0
    reserved: float = 0.0  # token-seconds
    held: float = 0.0
    peak_reserved: int = 0

    def sample(self, engine: LLMEngine, step_seconds: float) -> None:
        reserved, held = occupancy(engine)
        self.seconds += step_seconds
        self.reserved += reserved * step_seconds
        self.held += held * step_seconds
        self.peak_reserved = max(self.peak_reserved, reserved)

    def summary(self) -> dict[str, float]:
        mib = self.bytes_per_token / 2**20
        t = self.seconds or 1.0
        return {"kv_reserved_mib": self.reserved / t * mib, "kv_held_mib": self.held / t * mib,
                "kv_peak_reserved_mib": self.peak_reserved * mib,
                "kv_waste": 1 - self.held / self.reserved if self.reserved else 0.0}
