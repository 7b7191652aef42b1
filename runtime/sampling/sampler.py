"""Batched sampling: per-row logits processors and grammar masks, temperature, top-k/top-p/min-p,
seeds; and the step's sampling batch, built in one place (sample_step): one SamplingRow per sequence
that gets tokens, plain rows sampled together, rows with drafts verified against the target.

Each row carries its own parameters; a seeded row draws from its own generator so its output does
not depend on which requests share the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from runtime.sampling.processors import LogitsProcessor, request_processors
from runtime.sampling.verify import inverse_cdf, uniform_at, verify_by_sampling, verify_one
from runtime.sampling_params import SamplingParams
from runtime.sequence import Draft, GrammarMask, Sequence

TRUNCATION_CANDIDATES = (256, 4096)  # top-k/top-p try these many leading tokens before a full sort


@dataclass
class SamplingRow:
    params: SamplingParams
    generator: torch.Generator | None = None  # set for sampled requests: draws independent of batch mates
    processors: list[LogitsProcessor] = field(default_factory=list)  # applied in order before temperature
    mask: GrammarMask | None = None  # a structured request's grammar: applied after the processors
    draw_at: tuple[int, int] | None = None  # (seed, position): the draw keyed by them instead of the generator


@dataclass
class SampleResult:
    token_ids: list[int]
    # per row: (chosen token logprob, [(token, logprob), ...] top-n) when the row asked for logprobs
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]


def _edits(row: SamplingRow) -> bool:
    return bool(row.processors) or row.mask is not None


def _apply_processors(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """In place, row by row (only rows that ask for it pay for it), then the grammar masks, those of
    one kind in one call for all their rows."""
    masks: dict[type, tuple[list[int], list[GrammarMask]]] = {}
    for i, row in enumerate(rows):
        for process in row.processors:
            process(logits[i])
        if row.mask is not None:
            indices, kind = masks.setdefault(type(row.mask), ([], []))
            indices.append(i)
            kind.append(row.mask)
    for kind, (indices, of_kind) in masks.items():
        kind.apply_batch(logits, indices, of_kind)


def _nucleus(sorted_p: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep mask over each row's tokens in descending probability: rank below top_k, and the mass
    before the token below top_p (so the top token always survives)."""
    rank = torch.arange(sorted_p.shape[1], device=sorted_p.device).unsqueeze(0)
    return (rank < top_k.unsqueeze(1)) & ((sorted_p.cumsum(-1) - sorted_p) < top_p.unsqueeze(1))


def _leading_groups(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Yields (rows, sorted_p, token_ids, keep) until every row is covered: each row's most probable
    tokens, enough of them to settle its top-k/top-p cut.

    A full sort of a 49k vocabulary costs ~2 ms a row on the CPU. The leading c tokens (topk) settle
    a row whose top_k is within them or whose nucleus closes inside them; for a language model's
    distributions 256 nearly always do. Open rows try the next size, then a full sort. Every path
    keeps exactly the tokens the full sort keeps."""
    vocab = probs.shape[1]
    todo = torch.arange(probs.shape[0], device=probs.device)
    for c in (*TRUNCATION_CANDIDATES, vocab):
        sub, k, p = _rows(probs, todo), top_k[todo], top_p[todo]
        if c < vocab:
            lead_p, lead_ids = sub.topk(c, dim=-1)
            # the token ranked c is cut when top_k excludes it or the mass before it reaches top_p
            settled = (k <= c) | (lead_p.sum(-1) >= p)
        else:
            lead_p, lead_ids = sub.sort(dim=-1, descending=True)
            settled = torch.ones_like(todo, dtype=torch.bool)
        s = settled.nonzero().squeeze(1)
        yield todo[s], lead_p[s], lead_ids[s], _nucleus(lead_p[s], k[s], p[s])
        todo = todo[~settled]
        if not todo.numel():
            return


def _rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] for ascending row indices idx, without the copy when they are all of x's rows."""
    return x if idx.numel() == x.shape[0] else x[idx]


def _truncation(rows: list[SamplingRow], vocab: int, device: torch.device):
    """Indices of rows with a top-k or top-p cut, and their top_k (vocab when unset) and top_p."""
    idx = [i for i, r in enumerate(rows) if not r.params.greedy and (r.params.top_k or r.params.top_p < 1.0)]
    k = torch.tensor([rows[i].params.top_k or vocab for i in idx], device=device)
    p = torch.tensor([rows[i].params.top_p for i in idx], device=device)
    return idx, k, p


def _min_p(rows: list[SamplingRow], device: torch.device) -> torch.Tensor | None:
    """Each row's min_p ([B]), or None when no row sets one."""
    if not any(r.params.min_p > 0 for r in rows):
        return None
    return torch.tensor([r.params.min_p for r in rows], device=device)


def _above_min_p(w: torch.Tensor, probs: torch.Tensor, min_p: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """w where a token's probability is at least min_p times its row's top probability, else 0."""
    return torch.where(probs >= (min_p * top).unsqueeze(1), w, 0.0)


def _tempered(logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits after bias and penalties, their softmax at each row's temperature), both [B, V] float32."""
    logits = logits.float()
    if any(_edits(r) for r in rows):
        logits = logits.clone()
        _apply_processors(logits, rows)
    temps = torch.tensor([1.0 if r.params.greedy else r.params.temperature for r in rows], device=logits.device)
    return logits, torch.softmax(logits / temps.unsqueeze(1), dim=-1)


def processed_probs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The distribution each row draws from ([B, V], dense); greedy rows get a one-hot."""
    logits, probs = _tempered(logits, rows)
    vocab = probs.shape[1]
    trunc, k, p = _truncation(rows, vocab, probs.device)
    if trunc:
        cut = torch.zeros(len(trunc), vocab, device=probs.device)
        for r, lead_p, lead_ids, keep in _leading_groups(probs[trunc], k, p):
            cut[r.unsqueeze(1), lead_ids] = lead_p * keep
        probs[trunc] = cut
    min_p = _min_p(rows, probs.device)
    if min_p is not None:
        probs = _above_min_p(probs, probs, min_p, probs.max(-1).values)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    if greedy:
        probs[greedy] = torch.nn.functional.one_hot(logits[greedy].argmax(-1), vocab).float()
    return probs / probs.sum(-1, keepdim=True)


def _deferred(row: SamplingRow) -> bool:
    """The row's grammar mask was not ready for this step: it takes no token now (see sample_step)."""
    return row.mask is not None and row.mask.deferred()


def _uniforms(rows: list[SamplingRow], device: torch.device) -> torch.Tensor:
    """One u ~ U[0, 1) per row: keyed by (seed, position) under --deterministic, else from the row's own
    generator when it has one. A deferred row draws nothing: a seeded request's next number is kept
    for the token it takes later, so its output does not depend on when its masks were ready."""
    return torch.stack([torch.tensor(uniform_at(*row.draw_at), device=device) if row.draw_at is not None
                        else torch.zeros((), device=device) if _deferred(row)
                        else torch.rand((), generator=row.generator, device=device) for row in rows])


def draw(probs: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """One token per row of (unnormalized) probs, by inverse CDF: one random number a row, where an
    exponential race needs one per vocabulary entry (~1 ms a row at 49k on the CPU)."""
    return inverse_cdf(probs, _uniforms(rows, probs.device))


def _sampled_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """processed_probs then draw, without building the dense distribution of rows with a top-k/top-p
    cut: those draw among their leading tokens only."""
    logits, probs = _tempered(logits, rows)
    device = probs.device
    tokens = torch.empty(len(rows), dtype=torch.long, device=device)
    u = _uniforms(rows, device)
    min_p = _min_p(rows, device)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    if greedy:
        tokens[greedy] = logits[greedy].max(-1).indices  # argmax, faster (sample())
    trunc, k, p = _truncation(rows, probs.shape[1], device)
    if trunc:
        t = torch.tensor(trunc, device=device)
        for r, lead_p, lead_ids, keep in _leading_groups(_rows(probs, t), k, p):
            rows_r = t[r]
            w = lead_p * keep
            if min_p is not None:  # the top token leads, so lead_p[:, 0] is the row's max
                w = _above_min_p(w, lead_p, min_p[rows_r], lead_p[:, 0])
            pos = inverse_cdf(w, u[rows_r])
            tokens[rows_r] = lead_ids.gather(1, pos.unsqueeze(1)).squeeze(1)
    cut = set(trunc)
    plain = [i for i, r in enumerate(rows) if not r.params.greedy and i not in cut]
    if plain:
        sub = _rows(probs, torch.tensor(plain, device=device))
        if min_p is not None:
            sub = _above_min_p(sub, sub, min_p[plain], sub.max(-1).values)
        tokens[plain] = inverse_cdf(sub, u[plain])
    return tokens


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
    if all(r.params.greedy and not _edits(r) for r in rows):
        tokens = logits.max(-1).indices  # plain greedy: argmax's tokens, 0.41 vs 1.04 ms at 32 x 49152 on 2 CPU threads
    else:
        tokens = _sampled_tokens(logits, rows)
    return SampleResult(tokens.tolist(), _logprobs(logits, tokens, rows))


@dataclass
class Sampled:
    seq: Sequence
    tokens: list[int]  # one sampled token, accepted drafts then a corrected or bonus token, or none (deferred)
    logprobs: list | None = None  # one record per token, when the request asked for logprobs
    num_drafts: int = 0  # drafts verified


def sampling_row(seq: Sequence, eos_ids: set[int], extra: list[int] = ()) -> SamplingRow:
    """Sampling context of seq's next token, with `extra` draft tokens treated as already output
    (structured requests, the ones with a grammar, never draft)."""
    p = seq.params
    prompt = seq.token_ids[:seq.num_prompt_tokens] if p.repetition_penalty != 1.0 else []
    penalized = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
    out = seq.token_ids[seq.num_prompt_tokens:] + list(extra) if penalized else []
    banned = []
    if seq.num_output_tokens + len(extra) < p.min_tokens:  # no end before min_tokens
        banned = sorted((set() if p.ignore_eos else eos_ids) | set(p.stop_token_ids))
    procs = request_processors(p, prompt, out, banned)
    draw_at = None if seq.draw_seed is None else (seq.draw_seed, len(seq.token_ids) + len(extra))
    return SamplingRow(p, seq.generator, procs, seq.grammar, draw_at)


def sample_step(rows_of: list[tuple[Sequence, list[int]]], logits: torch.Tensor, drafts: dict[Sequence, Draft],
                eos_ids: set[int]) -> list[Sampled]:
    """rows_of: (sequence, draft tokens it verifies) in logits order, len(drafts) + 1 rows each."""
    offsets = np.cumsum([0] + [len(spec) + 1 for _, spec in rows_of])
    plain = [i for i, (_, spec) in enumerate(rows_of) if not spec]
    out: list[Sampled] = []
    if plain:
        seqs = [rows_of[i][0] for i in plain]
        rows = [sampling_row(s, eos_ids) for s in seqs]
        result = sample(_index_rows(logits, offsets[plain]), rows)
        out = [Sampled(s, [], None) if _deferred(r) else Sampled(s, [t], None if lp is None else [lp])
               for s, r, t, lp in zip(seqs, rows, result.token_ids, result.logprobs)]
    for i, (seq, spec) in enumerate(rows_of):
        if spec:
            out.append(_verify(seq, spec, logits[offsets[i]:offsets[i + 1]], drafts[seq], eos_ids))
    return out


def _index_rows(logits: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """logits[rows] without a copy when rows are all of them (numpy-array indexing is a slow path)."""
    if len(rows) == logits.shape[0] and (rows == np.arange(len(rows))).all():
        return logits
    return logits.index_select(0, torch.from_numpy(rows).to(logits.device))


def _verify(seq: Sequence, spec: list[int], logits: torch.Tensor, draft: Draft, eos_ids: set[int]) -> Sampled:
    rows = [sampling_row(seq, eos_ids, spec[:j]) for j in range(len(spec) + 1)]
    if seq.draw_seed is not None or seq.params.greedy:  # plain decoding's draws (greedy: argmax, no softmax)
        result = sample(logits, rows)  # with the rows' logprob records, when asked for: the emitted tokens'
        tokens = verify_by_sampling(result.token_ids, spec)
        return Sampled(seq, tokens, None if seq.params.logprobs is None else result.logprobs[:len(tokens)], len(spec))
    q = None if draft.probs is None else draft.probs[:len(spec)]
    tokens = verify_one(processed_probs(logits, rows), spec, q, seq.generator, draft.prob_ids)
    lp = None
    if seq.params.logprobs is not None:
        lp = logprob_records(logits[:len(tokens)], torch.tensor(tokens, device=logits.device), seq.params.logprobs)
    return Sampled(seq, tokens, lp, len(spec))
