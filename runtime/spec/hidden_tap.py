"""The target's hidden states for proposers that draft from them (trained heads): a Runner wrapper that
keeps, per sequence, the final hidden states (ModelRunner.hidden) of the rows its last forward sampled.

A proposer runs before the next step's schedule, so what the wrapper holds then is exactly the last step's:
the state at the position before each sequence's newest token (the one that sampled it) is among them.
"""
from __future__ import annotations

from typing import Any

import torch

from runtime.model.runner import ModelRunner, Runner
from runtime.sequence import SeqChunk, Sequence


class HiddenTap:
    """A Runner over `inner` whose forwards also record `local`'s sampled rows' hidden states by sequence."""

    def __init__(self, inner: Runner, local: ModelRunner) -> None:
        self.inner, self.local = inner, local
        self.rows: dict[int, tuple[int, torch.Tensor]] = {}  # seq_id -> (position of its first row, [rows, hidden])

    def prepare(self, chunks: list[SeqChunk]) -> Any:
        return chunks, self.inner.prepare(chunks)

    def forward(self, prepared: Any) -> torch.Tensor:
        chunks, inner = prepared
        self.local.hidden = None  # a step the local model did not run (a replayed CUDA graph) records nothing
        logits = self.inner.forward(inner)
        hidden, self.rows = self.local.hidden, {}
        if hidden is not None and hidden.shape[0] == logits.shape[0]:
            i = 0
            for c in chunks:
                if c.num_logits:
                    self.rows[c.seq_id] = (c.start_pos + len(c.token_ids) - c.num_logits, hidden[i:i + c.num_logits])
                    i += c.num_logits
        return logits

    def state_before_last(self, seq: Sequence) -> torch.Tensor | None:
        """The target's final hidden state at the position before seq's newest token, if the last step ran it."""
        first, hidden = self.rows.get(seq.seq_id, (0, None))
        i = len(seq.token_ids) - 2 - first
        return hidden[i] if hidden is not None and 0 <= i < hidden.shape[0] else None

    def close(self) -> None:
        self.inner.close()

    def failure(self) -> str | None:
        return self.inner.failure()

    def describe(self) -> dict[str, str]:
        return self.inner.describe()
