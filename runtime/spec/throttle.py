"""Speculation per request only while it pays: a wrapper over any proposer that sets each sequence's draft
length from how its drafts have fared, down to none.

Per sequence, a = hits / (hits + misses) estimates the chance that a draft token is accepted once those
before it were (hits: drafts accepted, misses: verifications that rejected one; both decayed, so the
estimate follows the text, and started from one of each). Draft j is then accepted with probability
about a^j, and verifying it costs one more query row, taken as `row_cost` of a batch-1 step (batch-1
decode reads every weight once whatever the rows, so a row adds a fraction of a step). In a batch of
B the weights are shared by B rows already, so a row costs more of the step while an accepted draft
adds one token to the B the step makes: a draft pays when a^j >= Bc / (1 + Bc), c = row_cost / (1 -
row_cost) (0.15 at batch 1, 0.58 at batch 8). That model is the fallback: once the step clock
(step_clock.py) has timed steps at B rows and at more, the line is the measured cost of a row over a
token's share of the step, since the step's cost is not linear in its rows (the fused step's GEMV takes
rows 4 at a time, the tiles GEMM past 16); where that line is 1, no draft could pay and none is made, probes
included (while the fused step took 8 rows, each probe at batch 8 moved all of them off it). The draft length is the largest such j <= k. Medusa
heads accepting ~35% of first drafts slowed batch-8 chat to 0.43x with the batch-1 line. Where
even one draft does not pay, the sequence drafts
nothing for `backoff` steps (doubling each time, up to max_backoff), then probes with one; the proposer
does no work for it meanwhile. A new sequence starts from the proposer's acceptance on the traffic so far
(every sequence's verifications, decayed more slowly), weighted as two verifications: a request of 64
tokens on chat, where trained heads accept ~25%, would otherwise spend its first steps learning from an
even start what the previous requests already showed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.sequence import Draft, Proposer, SeqStatus, Sequence
from runtime.spec.step_clock import StepClock

TRAFFIC_DECAY = 0.98  # the traffic's estimate follows the last ~50 verifications


@dataclass
class _Record:
    hits: float = 1.0
    misses: float = 1.0
    pending: tuple[int, int, int] | None = None  # (tokens, draft length, request's verified drafts) when drafted
    skip: int = 0  # steps left without drafting
    backoff: int = 0  # the last such pause
    probe: bool = True  # a draft of one is due once the estimate is below the line


class Throttle:
    def __init__(self, inner: Proposer, row_cost: float = 0.15, decay: float = 0.8, max_backoff: int = 64,
                 clock: StepClock | None = None) -> None:
        self.inner, self.row_cost, self.decay, self.max_backoff = inner, row_cost, decay, max_backoff
        self.clock = StepClock() if clock is None else clock
        self.num_kv_blocks = inner.num_kv_blocks
        self.records: dict[Sequence, _Record] = {}
        self.traffic = _Record()  # every sequence's hits and misses, decayed by TRAFFIC_DECAY

    def _fresh(self) -> _Record:
        a = self.traffic.hits / (self.traffic.hits + self.traffic.misses)
        return _Record(hits=2.0 * a, misses=2.0 * (1.0 - a))

    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        for seq in [s for s in self.records if s.status is SeqStatus.FINISHED]:
            del self.records[seq]
        lengths, cost = {}, self.step_cost(len(seqs))
        for seq in seqs:
            if (r := self.records.get(seq)) is None:  # a fresh record only for a sequence not seen yet
                r = self.records[seq] = self._fresh()
            self._learn(seq, r)
            if cost >= 1.0:  # measured: not even a sure draft pays at this batch, so neither does a probe
                continue
            if r.skip:
                r.skip -= 1
            elif n := self.length(r, k, cost):  # above the line: pauses start short again
                lengths[seq], r.backoff = n, 0
            elif r.probe:  # below the line: one draft, then steps without any, twice as many each time
                lengths[seq], r.probe = 1, False
            else:
                r.backoff = min(max(1, 2 * r.backoff), self.max_backoff)
                r.skip, r.probe = r.backoff, True
        # the inner proposer drafts only as far as a sequence here may use (heads cost per position)
        drafts = self.inner.propose(list(lengths), max(lengths.values())) if lengths else {}
        for seq, d in drafts.items():
            d.tokens, d.probs = d.tokens[:lengths[seq]], None if d.probs is None else d.probs[:lengths[seq]]
            self.records[seq].pending = (len(seq.token_ids), len(d.tokens), seq.metrics.spec_proposed)
        self.clock.tick(len(seqs) + sum(len(d.tokens) for d in drafts.values()))
        return drafts

    def step_cost(self, batch: int) -> float:
        """The chance a draft must have to pay for its verify row in a batch of that many sequences:
        measured by the step clock where it can say, else from row_cost."""
        line = self.clock.row_line(batch)
        if line is not None:
            return line
        c = batch * self.row_cost / (1.0 - self.row_cost)
        return c / (1.0 + c)

    def length(self, r: _Record, k: int, cost: float | None = None) -> int:
        """Drafts worth their verify rows at the current estimate (0: none); cost: step_cost's line
        (default: batch 1's)."""
        a = r.hits / (r.hits + r.misses)
        if a >= 1.0:
            return k
        return min(k, int(math.log(cost or self.row_cost) / math.log(a))) if a > 0 else 0

    def _learn(self, seq: Sequence, r: _Record) -> None:
        """Fold in the verification of the last draft (if one ran: the request's verified drafts grew)."""
        if r.pending is None:
            return
        start, n, verified = r.pending
        grown = len(seq.token_ids) - start
        if grown < 1 or seq.metrics.spec_proposed - verified < n:
            return  # not run yet, or its drafts were left out of the step
        r.pending = None
        accepted = min(grown - 1, n)
        for rec, decay in ((r, self.decay), (self.traffic, TRAFFIC_DECAY)):
            rec.hits = rec.hits * decay + accepted
            rec.misses = rec.misses * decay + (accepted < n)
