"""The step's sampling batch, built in one place: one SamplingRow per sequence that gets tokens
(its parameters, generator and logits processors), plain rows sampled together, rows with drafts
verified against the target's distributions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from runtime.sampling.processors import request_processors
from runtime.sampling.sampler import SamplingRow, logprob_records, processed_probs, sample
from runtime.sampling.verify import verify_one
from runtime.sequence import Sequence
from runtime.spec.proposer import Draft


@dataclass
class Sampled:
    seq: Sequence
    tokens: list[int]  # one sampled token, or accepted drafts then a corrected or bonus token
    logprobs: list | None = None  # one record per token, when the request asked for logprobs
    num_drafts: int = 0  # drafts verified


def sampling_row(seq: Sequence, eos_ids: set[int], extra: list[int] = (), grammar: Any = None) -> SamplingRow:
    """Sampling context of seq's next token, with `extra` draft tokens treated as already output."""
    p = seq.params
    prompt = seq.token_ids[:seq.num_prompt_tokens] if p.repetition_penalty != 1.0 else []
    penalized = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
    out = seq.token_ids[seq.num_prompt_tokens:] + list(extra) if penalized else []
    banned = []
    if seq.num_output_tokens + len(extra) < p.min_tokens:  # no end before min_tokens
        banned = sorted((set() if p.ignore_eos else eos_ids) | set(p.stop_token_ids))
    procs = request_processors(p, prompt, out, banned)
    return SamplingRow(p, seq.generator, procs + [grammar] if grammar is not None else procs)


def sample_step(rows_of: list[tuple[Sequence, list[int]]], logits: torch.Tensor, drafts: dict[Sequence, Draft],
                eos_ids: set[int], grammar_of: Callable[[Sequence], Any] = lambda seq: None) -> list[Sampled]:
    """rows_of: (sequence, draft tokens it verifies) in logits order, len(drafts) + 1 rows each.
    grammar_of: a sequence's grammar processor, or None (structured requests never draft)."""
    offsets = np.cumsum([0] + [len(spec) + 1 for _, spec in rows_of])
    plain = [i for i, (_, spec) in enumerate(rows_of) if not spec]
    out: list[Sampled] = []
    if plain:
        seqs = [rows_of[i][0] for i in plain]
        result = sample(_rows(logits, offsets[plain]), [sampling_row(s, eos_ids, grammar=grammar_of(s)) for s in seqs])
        out = [Sampled(s, [t], None if lp is None else [lp])
               for s, t, lp in zip(seqs, result.token_ids, result.logprobs)]
    for i, (seq, spec) in enumerate(rows_of):
        if spec:
            out.append(_verify(seq, spec, logits[offsets[i]:offsets[i + 1]], drafts[seq], eos_ids))
    return out


def _rows(logits: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """logits[rows] without a copy when rows are all of them (numpy-array indexing is a slow path)."""
    if len(rows) == logits.shape[0] and (rows == np.arange(len(rows))).all():
        return logits
    return logits.index_select(0, torch.from_numpy(rows).to(logits.device))


def _verify(seq: Sequence, spec: list[int], logits: torch.Tensor, draft: Draft, eos_ids: set[int]) -> Sampled:
    rows = [sampling_row(seq, eos_ids, spec[:j]) for j in range(len(spec) + 1)]
    probs = processed_probs(logits, rows)
    q = draft.probs[:len(spec)] if draft.probs is not None else None
    tokens = verify_one(probs, spec, q, rows[0])
    lp = None
    if seq.params.logprobs is not None:
        lp = logprob_records(logits[:len(tokens)], torch.tensor(tokens, device=logits.device), seq.params.logprobs)
    return Sampled(seq, tokens, lp, len(spec))
