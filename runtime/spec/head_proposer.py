"""Drafting with trained heads (runtime/spec/heads.py) over the target's hidden states (HiddenTap).

Each decoding sequence's state at the position before its newest token (the one whose logits sampled
it) feeds the heads; their logits over the draft vocabulary go through the request's own temperature,
top-k/top-p and min-p (runtime/sampling/sampler.py's processed_probs), and the drafts are drawn from that:
a greedy request's drafts are the argmax (a point mass), a sampled one's carry their distribution, so the
rejection sampler's guarantee holds (the output is distributed as the target's alone).
"""
from __future__ import annotations

import torch
from torch import nn

from runtime.model.llama import LlamaModel
from runtime.sampling.sampler import SamplingRow, draw, processed_probs
from runtime.sequence import Draft, Sequence
from runtime.spec.hidden_tap import HiddenTap


def head_rows(model: LlamaModel, ids: torch.Tensor) -> torch.Tensor:
    """[hidden, len(ids)]: the target's LM head restricted to `ids` (read through the head itself, so a
    tied, untied or quantized head gives its own weights: one-hot rows quantize exactly)."""
    eye = torch.eye(model.cfg.hidden_size, device=ids.device, dtype=model.norm.dtype)
    return model.logits(eye)[:, ids].contiguous()


class HeadProposer:
    num_kv_blocks = 0  # the heads keep no KV: they read the target's state

    def __init__(self, head: nn.Module, draft_ids: torch.Tensor, model: LlamaModel, tap: HiddenTap) -> None:
        self.head, self.kind, self.tap = head, head.cfg.kind, tap
        self.draft_ids = draft_ids.to(model.norm.device)
        self.out = head_rows(model, self.draft_ids)  # hidden -> draft-vocabulary logits
        self.embed = model.embedding

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        states = [(s, h) for s in seqs if (h := self.tap.state_before_last(s)) is not None]
        if not states:
            return {}
        seqs = [s for s, _ in states]
        h = torch.stack([h for _, h in states]).to(self.out.dtype)
        rows = [SamplingRow(s.params, s.generator) for s in seqs]
        if self.kind == "medusa":
            tokens, probs = self._pick(self.head(h, k) @ self.out, rows)
        else:
            last = torch.tensor([s.token_ids[-1] for s in seqs], device=h.device)
            steps = []
            for _ in range(k):  # each step is fed the token it drafted
                h = self.head(h, self.embed(last).to(h.dtype))
                steps.append(self._pick((h @ self.out).unsqueeze(1), rows))
                last = steps[-1][0][:, 0]
            tokens = torch.cat([t for t, _ in steps], dim=1)
            probs = None if steps[0][1] is None else torch.cat([p for _, p in steps], dim=1)
        out, sampled = {}, 0
        for i, seq in enumerate(seqs):
            q = None
            if not seq.params.greedy:
                q, sampled = probs[sampled], sampled + 1
            out[seq] = Draft(tokens[i].tolist(), q, None if q is None else self.draft_ids)
        return out

    def _pick(self, logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft-vocabulary logits [seqs, positions, draft vocab] -> (target token ids [seqs, positions],
        the sampled rows' distributions over the draft vocabulary [sampled seqs, positions, draft vocab] or
        None when every row is greedy). The rows carry no logits processors, so the distribution over the
        draft vocabulary alone is the one over the whole vocabulary with every other token at -inf."""
        picks = logits.argmax(-1)
        sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
        if sampled:
            n = logits.shape[1]
            each = [rows[i] for i in sampled for _ in range(n)]
            probs = processed_probs(logits[sampled].reshape(len(sampled) * n, -1).float(), each)
            picks[sampled] = draw(probs, each).view(len(sampled), n)
        return self.draft_ids[picks], probs.view(len(sampled), n, -1) if sampled else None
