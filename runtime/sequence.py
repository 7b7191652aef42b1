"""One generated sequence (a request with n > 1 has n of them) and its per-request metrics."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Wall-clock stamps (time.perf_counter seconds) and the latencies derived from them."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    num_output_tokens: int = 0  # over all n choices (usage)
    longest_choice: int = 0  # output tokens of the longest choice: the choices decode side by side
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.last_token is None or self.longest_choice < 2:
            return None
        return (self.last_token - self.first_token) / (self.longest_choice - 1)

    def as_dict(self) -> dict[str, Any]:
        keys = ("queue_time", "ttft", "tpot", "e2e", "num_output_tokens", "num_cached_prompt_tokens",
                "num_preemptions", "spec_proposed", "spec_accepted")
        return {k: getattr(self, k) for k in keys}


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    index: int  # choice index among the request's n
    token_ids: list[int]  # prompt followed by the outputs so far
    num_prompt_tokens: int
    params: SamplingParams
    metrics: RequestMetrics
    generator: torch.Generator | None = None
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full token blocks
    num_registered_blocks: int = 0  # leading blocks already in the prefix-cache index
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str = ""  # detokenized output, stop string excluded
    num_emitted_chars: int = 0  # of text, already streamed out
    num_emitted_tokens: int = 0
    logprobs: list = field(default_factory=list)
    detokenizer: Any = None
    # static batching: finished and reported, but still decoding as padding until its batch drains;
    # token_ids from this index on are that padding, never reported
    padding_from: int | None = None

    @property
    def ghost(self) -> bool:
        return self.padding_from is not None

    @property
    def output_end(self) -> int:
        """End of the reported tokens in token_ids."""
        return len(self.token_ids) if self.padding_from is None else self.padding_from

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:self.output_end]

    @property
    def num_output_tokens(self) -> int:
        return self.output_end - self.num_prompt_tokens

    @property
    def num_remaining(self) -> int:
        """Known tokens whose KV is not in the cache yet (1 for a plain decode)."""
        return len(self.token_ids) - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def __hash__(self) -> int:
        return self.seq_id
