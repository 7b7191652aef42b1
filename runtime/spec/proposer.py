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
        """Up to k draft tokens for each sequence (sequences may be left out). A proposer with a KV
        cache of its own declares num_kv_blocks; the scheduler then keeps each sequence's draft_kv
        (reserved before propose, rolled back after verification, freed with the sequence)."""
