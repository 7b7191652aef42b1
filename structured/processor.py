"""One sequence's grammar state: an xgrammar GrammarMatcher. As a logits processor it masks its row
to the tokens the grammar allows next, every grammar row of a step at once (apply_batch); `accept`
advances it on each token the output stage keeps. `prefetch` fills the next mask on a worker thread
while the forward pass runs (torch releases the GIL in its kernels), so sampling only applies it."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # imported on first use: xgrammar brings transformers, seconds of start-up
    import xgrammar as xgr

_FILLER = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")


class GrammarProcessor:
    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: list[int]) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_ids)
        self.vocab_size = compiled.tokenizer_info.vocab_size  # the logits width: the mask covers every logit
        self._next_mask: Future | None = None  # a mask being filled for the matcher's current state
        self._mask = xgr.allocate_token_bitmask(1, self.vocab_size)  # refilled each step, never reallocated

    def prefetch(self) -> None:
        """Start filling the mask of the next token now, on the filler thread (once per state)."""
        if self._next_mask is None and not self.matcher.is_terminated():
            self._next_mask = _FILLER.submit(self._fill)

    def _fill(self) -> torch.Tensor:
        self.matcher.fill_next_token_bitmask(self._mask)
        return self._mask

    def _take_mask(self) -> torch.Tensor | None:
        """The prefetched mask (waiting for it), or None; the matcher is this thread's again after."""
        pending, self._next_mask = self._next_mask, None
        return pending.result() if pending is not None else None

    def __call__(self, row: torch.Tensor) -> None:
        GrammarProcessor.apply_batch(row.unsqueeze(0), [0], [self])

    @staticmethod
    def apply_batch(logits: torch.Tensor, rows: list[int], processors: list["GrammarProcessor"]) -> None:
        """Mask logits[rows[j]] [B, V] by processors[j], in place: one bitmask filled row by row, then
        one xgrammar apply (unpacking each row's bits in torch cost ~100x more at batch 32)."""
        live = [(i, p) for i, p in zip(rows, processors) if not p.matcher.is_terminated()]
        if not live:  # only a static batch's padding rows sample past the end
            return
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(logits.shape[0], live[0][1].vocab_size)
        for i, p in live:
            mask = p._take_mask()
            if mask is None:
                p.matcher.fill_next_token_bitmask(bitmask, i)
            else:
                bitmask[i] = mask[0]
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                        indices=[i for i, _ in live])

    def accept(self, token: int) -> bool:
        """Advance over a kept token; False when the grammar forbids it (the matcher is unchanged)."""
        self._take_mask()  # a mask still being filled was for the state this token leaves
        return not self.matcher.is_terminated() and self.matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()
