"""The proposer interface: draft tokens for decoding sequences, verified by the target next step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from runtime.sequence import Sequence


@dataclass
class Draft:
    tokens: list[int]
    # the draft distribution each token was sampled from, [len(tokens), vocab]; None = point mass
    # (a deterministic proposer such as n-gram lookup)
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        """Up to k draft tokens for each sequence (sequences may be left out)."""

    def on_verified(self, seq: Sequence, num_valid_tokens: int) -> None:
        """After verification: seq.token_ids[:num_valid_tokens] are final (rejected drafts dropped)."""

    def release(self, seq: Sequence) -> None:
        """The sequence finished or was aborted: drop any state kept for it."""
