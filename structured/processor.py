"""One sequence's grammar state: an xgrammar GrammarMatcher. As a logits processor it masks its row
to the tokens the grammar allows next, every grammar row of a step at once (apply_batch); `accept`
advances it on each token the output stage keeps."""
from __future__ import annotations

import torch
import xgrammar as xgr

class GrammarProcessor:
    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: list[int]) -> None:
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_ids)
        self.vocab_size = compiled.tokenizer_info.vocab_size  # the logits width: the mask covers every logit

    def __call__(self, row: torch.Tensor) -> None:
        GrammarProcessor.apply_batch(row.unsqueeze(0), [0], [self])

    @staticmethod
    def apply_batch(logits: torch.Tensor, rows: list[int], processors: list["GrammarProcessor"]) -> None:
        """Mask logits[rows[j]] [B, V] by processors[j], in place: one bitmask filled row by row, then
        one xgrammar apply (unpacking each row's bits in torch cost ~100x more at batch 32)."""
        live = [(i, p) for i, p in zip(rows, processors) if not p.matcher.is_terminated()]
        if not live:  # only a static batch's padding rows sample past the end
            return
        bitmask = xgr.allocate_token_bitmask(logits.shape[0], live[0][1].vocab_size)
        for i, p in live:
            p.matcher.fill_next_token_bitmask(bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                        indices=[i for i, _ in live])

    def accept(self, token: int) -> bool:
        """Advance over a kept token; False when the grammar forbids it (the matcher is unchanged)."""
        return not self.matcher.is_terminated() and self.matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()
