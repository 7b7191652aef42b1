"""Batched sampling: logit bias, min-tokens, penalties, temperature, top-k/top-p/min-p, seeds.

Each row carries its own parameters; a seeded row draws from its own generator so its output does
not depend on which requests share the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    output_ids: list[int]
    prompt_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None  # set for seeded requests
    banned_ids: list[int] = field(default_factory=list)  # eos/stop ids while under min_tokens


@dataclass
class SampleResult:
    token_ids: list[int]
    # per row: (chosen token logprob, [(token, logprob), ...] top-n) when the row asked for logprobs
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]


def _needs_processing(p: SamplingParams, row: SamplingRow) -> bool:
    return bool(p.logit_bias or row.banned_ids or p.repetition_penalty != 1.0
                or p.presence_penalty or p.frequency_penalty)


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """In place, row by row (only rows that ask for it pay for it)."""
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        p = row.params
        if not _needs_processing(p, row):
            continue
        x = logits[i]
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=x.device)
            x.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), device=x.device, dtype=x.dtype))
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(row.prompt_ids + row.output_ids, dtype=torch.long, device=x.device).unique()
            vals = x[seen]
            x[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and row.output_ids:
            counts = torch.bincount(torch.tensor(row.output_ids, device=x.device), minlength=vocab).to(x.dtype)
            x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)
        if row.banned_ids:
            x[torch.tensor(row.banned_ids, device=x.device)] = float("-inf")


def _truncate(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero out tokens outside each row's top-k and top-p nucleus; rows [R, V]."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[1], device=probs.device).unsqueeze(0)
    keep = rank < top_k.unsqueeze(1)
    # keep a token while the mass before it is below top_p (the top token always survives)
    keep &= (sorted_p.cumsum(-1) - sorted_p) < top_p.unsqueeze(1)
    return torch.zeros_like(probs).scatter_(1, idx, sorted_p * keep)


def processed_probs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The distribution each sampled row draws from ([B, V]); greedy rows get a one-hot."""
    logits = logits.float().clone()
    _apply_penalties(logits, rows)
    temps = torch.tensor([1.0 if r.params.greedy else r.params.temperature for r in rows], device=logits.device)
    probs = torch.softmax(logits / temps.unsqueeze(1), dim=-1)
    trunc = [i for i, r in enumerate(rows) if r.params.top_k or r.params.top_p < 1.0]
    if trunc:
        vocab = logits.shape[1]
        k = torch.tensor([rows[i].params.top_k or vocab for i in trunc], device=logits.device)
        p = torch.tensor([rows[i].params.top_p for i in trunc], device=logits.device)
        probs[trunc] = _truncate(probs[trunc], k, p)
    minp = [i for i, r in enumerate(rows) if r.params.min_p > 0]
    if minp:
        sub = probs[minp]
        thresh = torch.tensor([rows[i].params.min_p for i in minp], device=logits.device).unsqueeze(1)
        probs[minp] = torch.where(sub >= thresh * sub.max(-1, keepdim=True).values, sub, 0.0)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    if greedy:
        probs[greedy] = torch.nn.functional.one_hot(logits[greedy].argmax(-1), logits.shape[1]).float()
    return probs / probs.sum(-1, keepdim=True)


def draw(probs: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """One token per row by the exponential race argmax(p / E), E ~ Exp(1), from each row's generator."""
    noise = torch.empty_like(probs)
    own = [i for i, row in enumerate(rows) if row.generator is not None]
    if len(own) < len(rows):
        noise.exponential_()
    for i in own:
        noise[i].exponential_(generator=rows[i].generator)
    return (probs / noise).argmax(-1)


def logprob_records(logits: torch.Tensor, tokens: torch.Tensor, n: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """(chosen token's logprob, top-n (token, logprob)) per row, from the model's raw distribution
    (before temperature and penalties, as vLLM reports it)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, tokens.view(-1, 1)).squeeze(1).tolist()
    if not n:
        return [(c, []) for c in chosen]
    top = lp.topk(n, dim=-1)
    return [(c, list(zip(i, v))) for c, i, v in zip(chosen, top.indices.tolist(), top.values.tolist())]


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow]) -> list:
    want = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
    out: list = [None] * len(rows)
    for i in want:  # rows may ask for different n
        out[i] = logprob_records(logits[i:i + 1], tokens[i:i + 1], rows[i].params.logprobs)[0]
    return out


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
    """Sample one token per row of logits [B, V]."""
    if all(r.params.greedy and not _needs_processing(r.params, r) for r in rows):
        tokens = logits.argmax(-1)  # the common fast path: plain greedy
    else:
        tokens = draw(processed_probs(logits, rows), rows)
    return SampleResult(tokens.tolist(), _logprobs(logits, tokens, rows))
