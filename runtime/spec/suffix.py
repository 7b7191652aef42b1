"""Suffix decoding (Arctic Inference's SuffixDecoding, vLLM's `method: suffix`), training-free drafting
for repetitive and agentic traffic: the continuation of the longest match of the sequence's recent tokens,
looked up in the request's own tokens (prompt and output so far) and in a bounded cache of recent
responses, chosen by frequency.

Arctic keeps a suffix tree per request and a global one; here both are token arrays searched like a
suffix array, which keeps no node per (position, depth) and so costs no memory beyond the tokens: the
occurrences of the sequence's last token are found at once (numpy), then narrowed one token further back
at a time, up to `max_depth` tokens of match. From those occurrences the draft follows the most frequent
next token, each step's estimate (its share of the occurrences still matching) multiplied into the
draft's probability; the draft stops below `min_prob`, and is at most `factor` x the match length long.
Of the two lookups, the one whose draft has the larger expected accepted length (the sum of those
probabilities) is proposed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from runtime.sequence import Draft, SeqStatus, Sequence

END = -1  # between cached responses: a match never continues across it


@dataclass
class Guess:
    tokens: list[int]
    score: float  # expected accepted tokens: the sum of the draft's running probabilities


def occurrences(buf: np.ndarray, context: np.ndarray, max_depth: int) -> tuple[np.ndarray, int]:
    """(indices i where buf[i - m:i] == context[-m:] and buf[i] continues it, m), for the longest m <= max_depth
    that has any; (empty, 0) when the last token never occurred before. When context is buf itself, its
    own end is no occurrence (nothing follows it)."""
    hits = np.flatnonzero(buf[:-1] == context[-1]) + 1
    hits = hits[buf[hits] != END]
    m = 1
    while len(hits) and m < min(max_depth, len(context)):
        back = hits - m - 1
        keep = hits[(back >= 0) & (buf[np.maximum(back, 0)] == context[-m - 1])]
        if not len(keep):
            break
        hits, m = keep, m + 1
    return hits, (m if len(hits) else 0)


def follow(buf: np.ndarray, hits: np.ndarray, limit: int, min_prob: float) -> Guess:
    """The most frequent continuation of the occurrences `hits`, while its probability stays >= min_prob."""
    tokens, p, score = [], 1.0, 0.0
    while len(tokens) < limit and len(hits):
        nxt = buf[hits]
        values, counts = np.unique(nxt[nxt != END], return_counts=True)
        if not len(values):
            break
        top = values[counts == counts.max()]
        best = int(nxt[np.flatnonzero(np.isin(nxt, top))[-1]])  # a tie goes to the latest occurrence
        p *= counts.max() / len(hits)
        if p < min_prob:
            break
        tokens.append(best)
        score += float(p)
        hits = hits[nxt == best] + 1
        hits = hits[hits < len(buf)]
    return Guess(tokens, score)


class ResponseCache:
    """The outputs of the last `max_requests` finished sequences, one array with END between them."""

    def __init__(self, max_requests: int) -> None:
        self.lengths: deque[int] = deque()
        self.max_requests = max_requests
        self.buf = np.empty(0, np.int64)

    def add(self, tokens: list[int]) -> None:
        if not tokens or not self.max_requests:
            return
        if len(self.lengths) == self.max_requests:
            self.buf = self.buf[self.lengths.popleft() + 1:]
        self.buf = np.concatenate([self.buf, np.asarray(tokens, np.int64), [END]])
        self.lengths.append(len(tokens))


class SuffixProposer:
    num_kv_blocks = 0  # no KV of its own

    def __init__(self, max_depth: int = 24, max_cached_requests: int = 1000, factor: float = 1.0,
                 min_prob: float = 0.1, window: int = 8192) -> None:
        if max_depth < 1 or factor <= 0 or not 0 <= min_prob <= 1:
            raise ValueError("suffix decoding needs max_depth >= 1, factor > 0 and min_prob in [0, 1]")
        self.max_depth, self.factor, self.min_prob, self.window = max_depth, factor, min_prob, window
        self.cache = ResponseCache(max_cached_requests)
        # sequences seen decoding, with their tokens as an array (grown as they do); their outputs join
        # the cache when they finish
        self.live: dict[Sequence, np.ndarray] = {}

    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        self._retire()
        out = {}
        for seq in seqs:
            own = self.live.get(seq, np.empty(0, np.int64))
            if len(own) < len(seq.token_ids):
                own = self.live[seq] = np.concatenate([own, np.asarray(seq.token_ids[len(own):], np.int64)])
            guess = self.guess(own[-self.window:], k)
            if guess.tokens:
                out[seq] = Draft(guess.tokens)
        return out

    def guess(self, own: np.ndarray, k: int) -> Guess:
        """The better draft of the two lookups: the tokens' own earlier occurrences, the response cache."""
        best = Guess([], 0.0)
        for buf in (own, self.cache.buf):
            hits, m = occurrences(buf, own, self.max_depth)
            if m:
                g = follow(buf, hits, min(k, max(1, int(self.factor * m))), self.min_prob)
                best = g if g.score > best.score else best
        return best

    def _retire(self) -> None:
        for seq in [s for s in self.live if s.status is SeqStatus.FINISHED]:
            del self.live[seq]
            self.cache.add(seq.token_ids[seq.num_prompt_tokens:])
