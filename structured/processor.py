"""One sequence's grammar state: an xgrammar GrammarMatcher. As a logits processor it masks its row
to the tokens the grammar allows next, every grammar row of a step at once (apply_batch); `accept`
advances it on each token the output stage keeps. `prefetch` fills the next mask on a worker thread
while the forward pass runs (xgrammar releases the GIL), so sampling only applies it.

A mask may take at most `wait` seconds past the forward pass it was started beside: an ambiguous
grammar's masks grow without bound (a 27-byte one took 0.2 s at its 30th token, 2.8 s at its 63rd).
A mask not ready within GRACE of the forward's end never holds the step's other rows: its sequence
takes no token this step (`deferred`; the scheduler computes its row again next step, the grammar
state unchanged) and the step goes on. Waiting for it held every other request of the batch, 50 ms a
step beside a ~20 ms forward, and plain requests' TPOT doubled beside two clients sending such a
grammar. Only a step whose every row waits for a mask waits, to the deadline.
A sequence whose mask is late ends with finish_reason "error" (the server answers it with an error),
and its fill finishes unseen on its thread, moved to the idle scheduling class so it yields its core
to the engine (structured/fillers.py). Each fill has a thread of its own among several, so a late
one delays no other grammar.
Masks in time still take CPU beside the forward pass (on a CPU server, from the model itself): two
clients cycling the ambiguous grammar, each request's masks growing to 50 ms before it ended, halved
the other requests' pace on 2 cores. So a sequence whose masks each take more than `cpu` seconds of
CPU (the fill thread's own time, whatever the load) SLOW_MASKS in a row while other rows share its
steps ends the same way; alone it harms nobody and only the wait applies."""
from __future__ import annotations

import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

import torch

from structured.fillers import FillerPool
from structured.limits import SLOW_MASKS

if TYPE_CHECKING:  # imported on first use: xgrammar brings transformers, seconds of start-up
    import xgrammar as xgr

_FILLERS = FillerPool(8, "grammar-masks")
GRACE = 0.002  # seconds a step waits for its masks before deferring those not ready (a fill just ending)


class GrammarStop(str):
    """A stop_reason that is the grammar's reason for ending a choice, not a stop string: the server
    shows it as the choice's finish_details."""


class GrammarProcessor:
    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: list[int], wait: float = 0.05,
                 cpu: float = 0.01) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_ids)
        self.vocab_size = compiled.tokenizer_info.vocab_size  # the logits width: the mask covers every logit
        self.wait = wait  # seconds a step waits for this mask after the forward pass
        self.cpu = cpu  # CPU seconds a mask may take while other rows share the step
        self._next_mask: Future | None = None  # a mask being filled for the matcher's current state
        self._filler: list[int] = []  # the native id of the thread filling it, while it runs
        self._mask = xgr.allocate_token_bitmask(1, self.vocab_size)  # refilled each step, never reallocated
        self._ending: tuple[str, str | None] | None = None  # (finish_reason, stop_reason) once it ends
        self._fill_cpu = 0.0  # the last fill's CPU seconds (set on its thread, read after its result)
        self._slow_fills = 0  # fills in a row, beside other rows, that took more CPU than cpu
        self._deadline: float | None = None  # when the pending mask is late: wait past its first forward
        self._deferred = False  # this step's mask was not ready: the sequence takes no token this step

    def prefetch(self) -> None:
        """Start filling the mask of the next token now, on a filler thread (once per state)."""
        if self._next_mask is None and self._ending is None and not self.matcher.is_terminated():
            self._next_mask, self._filler = _FILLERS.submit(self._fill)

    def _fill(self) -> torch.Tensor:
        started = time.thread_time()
        self.matcher.fill_next_token_bitmask(self._mask)
        self._fill_cpu = time.thread_time() - started
        return self._mask

    def _take_mask(self, timeout: float | None, shared: bool = False) -> torch.Tensor | None:
        """The prefetched mask, waiting at most timeout; None when late (this sequence then ends, as
        it does after SLOW_MASKS slow ones in a row, counted while the step is shared)."""
        pending, self._next_mask, self._deadline = self._next_mask, None, None
        try:
            mask = pending.result(timeout) if pending is not None else None
        except FutureTimeout:
            _FILLERS.demote(self._filler)  # it runs on unseen: on a core the engine leaves free
            self._ending = ("error", f"its grammar's token mask took longer than {self.wait * 1000:g} ms "
                                     f"(--max-mask-wait-ms) to compute: the grammar is too ambiguous to enforce")
            return None
        if pending is not None and (shared or self._fill_cpu <= self.cpu):
            self._slow_fills = self._slow_fills + 1 if self._fill_cpu > self.cpu else 0
            if self._slow_fills >= SLOW_MASKS:
                self._ending = ("error", f"{SLOW_MASKS} of its grammar's token masks in a row each took more than "
                                         f"{self.cpu * 1000:g} ms of CPU (--max-mask-cpu-ms) beside other "
                                         f"requests: the grammar is too ambiguous to enforce")
        return mask

    def _ready(self, until: float) -> bool:
        """Whether the pending mask is done (or there is none), waiting for it until `until` at most."""
        pending = self._next_mask
        if pending is None or pending.done():
            return True
        try:
            pending.result(max(0.0, until - time.monotonic()))
            return True
        except FutureTimeout:
            return False

    def __call__(self, row: torch.Tensor) -> None:
        GrammarProcessor.apply_batch(row.unsqueeze(0), [0], [self])

    @staticmethod
    def apply_batch(logits: torch.Tensor, rows: list[int], processors: list["GrammarProcessor"]) -> None:
        """Mask logits[rows[j]] [B, V] by processors[j], in place: one bitmask filled row by row, then
        one xgrammar apply (unpacking each row's bits in torch cost ~100x more at batch 32). A row
        whose mask is late stays unmasked: its token is refused (accept) and the sequence ends. A row
        whose mask is not ready, beside rows that are, is deferred: its token is not taken."""
        live = [(i, p) for i, p in zip(rows, processors) if p._ending is None and not p.matcher.is_terminated()]
        for p in processors:
            p._deferred = False
        if not live:  # only a static batch's padding rows sample past the end
            return
        import xgrammar as xgr

        start = time.monotonic()
        for _, p in live:
            p.prefetch()  # normally done before the forward; each fills on a thread of its own
            if p._deadline is None:
                p._deadline = start + p.wait
        waiting = [p for _, p in live if not p._ready(min(start + GRACE, p._deadline))]
        if len(waiting) < logits.shape[0]:  # waiting longer would hold rows whose tokens are ready
            for p in waiting:
                p._deferred = time.monotonic() < p._deadline  # else late: taken below, and it ends
        bitmask = xgr.allocate_token_bitmask(logits.shape[0], live[0][1].vocab_size)
        masked = []
        for i, p in live:
            if p._deferred:
                continue
            mask = p._take_mask(max(0.0, p._deadline - time.monotonic()), logits.shape[0] > 1)
            if mask is not None:
                bitmask[i] = mask[0]
                masked.append(i)
        if masked:
            xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=masked)

    def deferred(self) -> bool:
        """This step's mask was not ready in time for the step: the sequence takes no token now and its
        row is computed again next step (the grammar state is unchanged)."""
        return self._deferred

    def accept(self, token: int) -> bool:
        """Advance over a kept token; False: the sequence ends here (ending() says how)."""
        if self._ending is None:
            self._take_mask(None)  # a mask still being filled was for the state this token leaves
        if self._ending is not None:
            return False
        if self.matcher.is_terminated() or not self.matcher.accept_token(token):
            self._ending = ("stop", GrammarStop("the grammar allows no further token (a token it allows was "
                                                "banned: min_tokens, logit_bias or a stop token id)"))
            return False
        if self.matcher.is_terminated():  # it took a stop token: complete, whatever ignore_eos says
            self._ending = ("stop", GrammarStop("the grammar is complete: nothing may follow"))
            return False
        return True

    def ending(self) -> tuple[str, str | None]:
        """After accept() said False: (finish_reason, stop_reason). "stop" when the grammar is complete
        or allows no token (stop_reason: a GrammarStop saying which); "error" when its mask was late."""
        return self._ending or ("stop", None)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()
