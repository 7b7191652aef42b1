"""Verification of draft tokens against the target: exact speculative sampling.

For temperature > 0 a draft token d drawn from q is accepted with probability min(1, p(d)/q(d));
on the first rejection the token is drawn from the normalized residual max(0, p - q); when every
draft is accepted a bonus token is drawn from p. The emitted tokens are then distributed exactly
as if sampled from the target alone. A point-mass draft (n-gram) has q(d) = 1.
"""
from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _uniform(gen: torch.Generator | None, device: torch.device) -> float:
    return float(torch.rand(1, generator=gen, device=device))


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of non-negative weights, the first position whose cumulative weight exceeds u * total."""
    cdf = weights.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    # a position without weight never has cdf above u * total; rounding can leave u * total at the
    # total itself, past every position: those rows take their last position with weight
    over = (idx >= weights.shape[1]).nonzero().squeeze(1)
    if over.numel():
        idx[over] = weights.shape[1] - 1 - (weights[over].flip(-1) > 0).int().argmax(-1)
    return idx


def _draw(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    """One token from (unnormalized) probs by inverse CDF: torch.multinomial took ~1 ms at 49k on the CPU."""
    u = torch.rand(1, generator=gen, device=probs.device)
    return int(inverse_cdf(probs.unsqueeze(0), u))


def uniform_at(seed: int, position: int) -> float:
    """u in [0, 1) from (seed, position) alone (splitmix64 of the pair, 24 bits: exact in float32), so a
    draw does not depend on how many draws came before it (speculation, preemption)."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 40) / float(1 << 24)


def verify_by_sampling(sampled: list[int], draft: list[int]) -> list[int]:
    """Tokens to emit when every position was sampled as plain decoding samples it (sampled: k+1
    tokens): the drafts up to the first that differs from its position's token, then that token. Exact
    for any proposal: each emitted token is plain decoding's own draw."""
    for j, d in enumerate(draft):
        if sampled[j] != d:
            return sampled[:j + 1]
    return sampled


def verify_one(p: torch.Tensor, draft: list[int], q: torch.Tensor | None, gen: torch.Generator | None,
               q_ids: torch.Tensor | None = None) -> list[int]:
    """A sampled sequence's accepted drafts then a corrected or bonus token (greedy: verify_by_sampling). p: target
    distributions [k+1, V]; q: draft distributions [k, V] (None: a point mass); q_ids: the token ids of q's columns
    where q covers a draft vocabulary only (q = 0 elsewhere); gen: the sequence's generator."""
    for j, d in enumerate(draft):
        qd = 1.0 if q is None else float(q[j, d if q_ids is None else int((q_ids == d).nonzero()[0])])
        if _uniform(gen, p.device) >= min(1.0, float(p[j, d]) / qd):
            return draft[:j] + [_draw(_residual(p[j], d, None if q is None else q[j], q_ids), gen)]
    return draft + [_draw(p[len(draft)], gen)]


def _residual(p: torch.Tensor, d: int, q: torch.Tensor | None, q_ids: torch.Tensor | None) -> torch.Tensor:
    """max(0, p - q) once draft d was rejected (q None: a point mass on d); p where p == q up to rounding."""
    r = p.clone()
    if q is None:
        r[d] = 0.0
    else:
        r[slice(None) if q_ids is None else q_ids] -= q
    return p if float(r.clamp_(min=0).sum()) <= 0 else r
