"""One sequence's grammar state: an xgrammar GrammarMatcher and its token bitmask. As a logits
processor it masks its row to the tokens the grammar allows next; `accept` advances it on each
token the output stage keeps."""
from __future__ import annotations

import torch
import xgrammar as xgr

_SHIFTS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """xgrammar's packed int32 bitmask [words] -> bool [width], token i allowed iff bit i is set."""
    bits = (bitmask.unsqueeze(1) >> _SHIFTS.to(bitmask.device)) & 1
    return bits.reshape(-1)[:width].bool()


class GrammarProcessor:
    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: list[int]) -> None:
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_ids)
        self.bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)

    def __call__(self, row: torch.Tensor) -> None:
        if self.matcher.is_terminated():  # only a static batch's padding rows sample past the end
            return
        self.matcher.fill_next_token_bitmask(self.bitmask)
        mask = self.bitmask[0].to(row.device, non_blocking=True)
        row.masked_fill_(~allowed_tokens(mask, row.shape[0]), float("-inf"))

    def accept(self, token: int) -> bool:
        """Advance over a kept token; False when the grammar forbids it (the matcher is unchanged)."""
        return not self.matcher.is_terminated() and self.matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()
