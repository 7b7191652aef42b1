"""Training the draft heads by self-distillation (profiling/quality/train_heads.py drives it): the draft
vocabulary, the target's teacher distributions, the losses, the AdamW loop, and the held-out evaluation.

Medusa head k learns the teacher's distribution k positions ahead (soft cross-entropy over its top 32);
the EAGLE-style block learns the next state (smooth L1) and the teacher's distribution from it, unrolled
a few steps, each fed the answer's token (at inference its own accepted guesses are those tokens).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from runtime.spec.distill import Samples
from runtime.spec.heads import MedusaHeads

TEACHER_TOP = 32


def draft_vocab(tokens: torch.Tensor, size: int, always: list[int]) -> torch.Tensor:
    """The `size` most frequent tokens (and `always`), ascending ids."""
    counts = torch.bincount(tokens)
    top = counts.argsort(descending=True)[:size]
    top = top[counts[top] > 0]
    return torch.unique(torch.cat([top, torch.tensor(always, dtype=torch.long)]))


def teacher(hidden: torch.Tensor, out: torch.Tensor, chunk: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distribution at each row over the draft vocabulary: (top ids [N, 32], probs [N, 32])."""
    ids, probs = [], []
    for i in range(0, hidden.shape[0], chunk):
        p = torch.softmax(hidden[i:i + chunk].float() @ out, dim=-1)
        top = p.topk(min(TEACHER_TOP, p.shape[1]), dim=-1)
        ids.append(top.indices)
        probs.append(top.values / top.values.sum(-1, keepdim=True))
    return torch.cat(ids), torch.cat(probs)


def _ends(s: Samples) -> torch.Tensor:
    """For each row, where its response ends (exclusive)."""
    return torch.repeat_interleave(s.starts[1:], s.starts[1:] - s.starts[:-1])


def _soft_ce(logits: torch.Tensor, target: tuple[torch.Tensor, torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    ids, probs = target
    ce = -(probs * F.log_softmax(logits, dim=-1).gather(1, ids)).sum(-1)
    return (ce * valid).sum() / valid.sum().clamp(min=1)


def losses(head, s: Samples, rows: torch.Tensor, out: torch.Tensor, teach, emb: torch.Tensor, steps: int):
    """Per draft position, the loss of the heads on rows `rows` of s (a list of scalars)."""
    ends, n = _ends(s)[rows], s.tokens.shape[0]
    h = s.hidden[rows].float()
    result = []
    if isinstance(head, MedusaHeads):
        states = head(h)
        for k in range(1, head.cfg.num_heads + 1):
            j = (rows + k).clamp(max=n - 1)
            result.append(_soft_ce(states[:, k - 1] @ out, (teach[0][j], teach[1][j]), (rows + k < ends).float()))
        return result
    for k in range(1, steps + 1):
        j = (rows + k).clamp(max=n - 1)
        valid = (rows + k < ends).float()
        h = head(h, emb[(rows + k - 1).clamp(max=n - 1)].float())  # fed the token the last state produced
        state = (F.smooth_l1_loss(h, s.hidden[j].float(), reduction="none").mean(-1) * valid).sum() / valid.sum().clamp(min=1)
        result.append(_soft_ce(h @ out, (teach[0][j], teach[1][j]), valid) + state)
    return result


def fit(head, s: Samples, out: torch.Tensor, teach, emb: torch.Tensor, epochs: int, batch: int, lr: float,
        steps: int, log=print) -> None:
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    total = epochs * ((s.tokens.shape[0] + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=max(total, 1), pct_start=0.1)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(epochs):
        perm, t0, seen = torch.randperm(s.tokens.shape[0], generator=gen), time.perf_counter(), []
        for i in range(0, len(perm), batch):
            parts = losses(head, s, perm[i:i + batch], out, teach, emb, steps)
            opt.zero_grad()
            sum(parts).backward()
            opt.step()
            sched.step()
            seen.append([float(p.detach()) for p in parts])
        mean = torch.tensor(seen).mean(0).tolist()
        log(f"  epoch {epoch + 1}/{epochs}: loss by position {', '.join(f'{v:.2f}' for v in mean)} "
            f"({time.perf_counter() - t0:.0f} s)")


@torch.no_grad()
def evaluate(head, s: Samples, out: torch.Tensor, draft_ids: torch.Tensor, emb: torch.Tensor, k: int) -> dict:
    """Greedy chains of k drafts from every row of greedy answers with k tokens after it: per position the
    share accepted given the earlier ones were, and the mean accepted length."""
    keep = torch.nonzero(s.temperatures == 0).squeeze(1).tolist()
    g = s.subset(keep)
    rows = torch.nonzero(torch.arange(g.tokens.shape[0]) + k < _ends(g)).squeeze(1)
    if not len(rows):
        return {"acceptance_by_position": [], "mean_accepted": 0.0, "chains": 0}
    h, alive, tries, hits = g.hidden[rows].float(), torch.ones(len(rows), dtype=torch.bool), [], []
    medusa = head(h) if isinstance(head, MedusaHeads) else None
    for j in range(1, k + 1):
        if medusa is not None:
            state = medusa[:, j - 1]
        else:
            h = state = head(h, emb[rows + j - 1].float())  # accepted so far, so the fed token is the answer's
        right = draft_ids[(state @ out).argmax(-1)] == g.tokens[rows + j]
        tries.append(int(alive.sum()))
        alive &= right
        hits.append(int(alive.sum()))
    return {"acceptance_by_position": [b / a if a else 0.0 for a, b in zip(tries, hits)],
            "mean_accepted": sum(hits) / len(rows), "chains": len(rows)}
