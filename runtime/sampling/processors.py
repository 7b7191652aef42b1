"""Per-row logits processors: the sampler's hook for everything that edits a row's logits before
temperature (logit bias, repetition/presence/frequency penalties, min_tokens bans; grammar masks
plug in here too). Each adjusts one row [vocab] in place."""
from __future__ import annotations

from typing import Protocol

import torch

from runtime.sampling_params import SamplingParams


class LogitsProcessor(Protocol):
    def __call__(self, logits: torch.Tensor) -> None:
        """Adjust one row's logits [vocab] in place."""


class LogitBias:
    def __init__(self, bias: dict[int, float]) -> None:
        self.ids, self.values = list(bias), list(bias.values())

    def __call__(self, x: torch.Tensor) -> None:
        x.index_add_(0, torch.tensor(self.ids, device=x.device), torch.tensor(self.values, device=x.device,
                                                                               dtype=x.dtype))


class RepetitionPenalty:
    """Divide positive (multiply negative) logits of every token seen in the prompt or output."""

    def __init__(self, seen: list[int], penalty: float) -> None:
        self.seen, self.penalty = seen, penalty

    def __call__(self, x: torch.Tensor) -> None:
        seen = torch.tensor(self.seen, dtype=torch.long, device=x.device).unique()
        vals = x[seen]
        x[seen] = torch.where(vals > 0, vals / self.penalty, vals * self.penalty)


class PresenceFrequencyPenalty:
    def __init__(self, output_ids: list[int], presence: float, frequency: float) -> None:
        self.output_ids, self.presence, self.frequency = output_ids, presence, frequency

    def __call__(self, x: torch.Tensor) -> None:
        counts = torch.bincount(torch.tensor(self.output_ids, device=x.device), minlength=x.shape[0]).to(x.dtype)
        x -= self.frequency * counts + self.presence * (counts > 0).to(x.dtype)


class BanTokens:
    """Tokens that may not be sampled now (eos and stop ids while under min_tokens)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def __call__(self, x: torch.Tensor) -> None:
        x[torch.tensor(self.ids, device=x.device)] = float("-inf")


def request_processors(p: SamplingParams, prompt_ids: list[int], output_ids: list[int],
                       banned: list[int]) -> list[LogitsProcessor]:
    """The built-in processors a request's parameters ask for, in the order they apply."""
    procs: list[LogitsProcessor] = []
    if p.logit_bias:
        procs.append(LogitBias(p.logit_bias))
    if p.repetition_penalty != 1.0:
        procs.append(RepetitionPenalty(prompt_ids + output_ids, p.repetition_penalty))
    if (p.presence_penalty or p.frequency_penalty) and output_ids:
        procs.append(PresenceFrequencyPenalty(output_ids, p.presence_penalty, p.frequency_penalty))
    if banned:
        procs.append(BanTokens(banned))
    return procs
