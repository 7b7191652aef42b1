"""The records a step passes along: one generated sequence (a request with n > 1 has n of them) and
its per-request metrics, the chunk of it the model runs, a proposer's draft and what a step decided."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from runtime.kv.block_manager import KVBlocks
from runtime.sampling_params import SamplingParams


class GrammarMask(Protocol):
    """A sequence's grammar state (structured output): which tokens may come next, advanced by the
    tokens kept. The sampler applies a step's masks of one kind in one call, after the row processors
    (-inf stays -inf under them, so the order does not change the result)."""

    def prefetch(self) -> None:
        """Start computing the next mask (it fills while the forward pass runs)."""

    def accept(self, token: int) -> bool:
        """Advance by a kept token; False: the sequence ends here (ending() says how)."""

    def ending(self) -> tuple[str, str | None]:
        """(finish_reason, stop_reason) once accept() said False."""

    def deferred(self) -> bool:
        """The last apply_batch left this row's mask pending, so as not to hold the step: the sequence
        takes no token this step (its row is computed again next step)."""

    @staticmethod
    def apply_batch(logits: torch.Tensor, rows: list[int], masks: list) -> None:
        """-inf into logits[rows[i]] wherever masks[i] forbids a token."""


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
    num_external_prompt_tokens: int = 0  # of which a KV connector loaded (runtime/kv/connector.py)
    num_preemptions: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    kv_transfer_params: dict | None = None  # what the KV connector answers as the request finishes (vLLM's)

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
                "num_preemptions", "spec_proposed", "spec_accepted", "kv_transfer_params")
        return {k: getattr(self, k) for k in keys}


@dataclass(eq=False)
class Sequence:
    """Scheduling state of one generated sequence, owned by the scheduler: its tokens and its KV.

    What was reported to the client (text, stop state, logprobs) lives in the output stage."""

    seq_id: int
    request_id: str
    token_ids: list[int]  # prompt followed by the tokens generated so far
    num_prompt_tokens: int
    params: SamplingParams
    metrics: RequestMetrics
    generator: torch.Generator | None = None  # set for sampled requests: draws independent of batch mates
    draw_seed: int | None = None  # --deterministic, sampled: draws keyed by (this seed, position), not sequential
    grammar: GrammarMask | None = None  # a structured request's grammar state: masks its row, takes its tokens
    status: SeqStatus = SeqStatus.WAITING
    kv: KVBlocks = field(default_factory=KVBlocks)
    draft_kv: KVBlocks | None = None  # the draft model's blocks, with a draft-model proposer

    @property
    def num_computed(self) -> int:
        return self.kv.num_computed

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_remaining(self) -> int:
        """Known tokens whose KV is not in the cache yet (1 for a plain decode)."""
        return len(self.token_ids) - self.kv.num_computed

    def __hash__(self) -> int:
        return self.seq_id


@dataclass
class SeqChunk:
    """New tokens of one sequence for this step, as the model runs them."""

    token_ids: list[int]
    start_pos: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # must cover start_pos + len(token_ids) tokens
    num_logits: int = 1  # logits wanted for this many trailing tokens (0 for a mid-prompt chunk)
    seq_id: int = -1  # whose tokens (Sequence.seq_id), for proposers that read the target's hidden states


@dataclass
class SeqUpdate:
    """What a step decided for one scheduled sequence."""

    seq: Sequence
    tokens: list[int]  # new tokens, in order (cut after a stop)
    finished: bool = False
    num_drafts: int = 0  # draft tokens verified this step: len(tokens) - 1 of them were accepted


@dataclass
class Draft:
    tokens: list[int]
    # the draft distribution each token was sampled from, [len(tokens), vocab]; None = point mass
    # (a deterministic proposer such as n-gram lookup)
    probs: torch.Tensor | None = None
    prob_ids: torch.Tensor | None = None  # probs' columns' token ids (q = 0 elsewhere); None: the vocabulary


class Proposer(Protocol):
    """Draft tokens for decoding sequences, verified by the target next step."""

    # blocks of a KV cache of its own (a draft model), 0 for none: the scheduler then keeps each
    # sequence's draft_kv (reserved before propose, rolled back after verification, freed with it)
    num_kv_blocks: int

    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        """Up to k draft tokens for each sequence (sequences may be left out)."""
