"""Pipeline parallelism: a rank's share of one step, over its stage's layers.

Rank 0 splits a step's chunks into up to P micro-batches (consecutive chunks, about the same number of
tokens each) and broadcasts them; every rank prepares each one the same way. Stage s runs micro-batch
m as soon as stage s-1 has sent it m's activations (the hidden states and the residual, one tensor),
then sends them on without waiting, so while stage 1 runs micro-batch 0, stage 0 already runs
micro-batch 1 (GPipe's forward schedule: P stages and M micro-batches take M + P - 1 slots, P - 1 of
them idle on each stage). The last stage's TP rank 0 sends each micro-batch's logits to rank 0, which
alone samples. Point-to-point messages travel on the `pipe` group: its timeout bounds a wait for a
dead stage.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from runtime.model.llama import LlamaModel
from runtime.model.runner import ModelRunner, Prepared
from runtime.parallel.group import ParallelGroup
from runtime.parallel.layers import COMM
from runtime.sequence import SeqChunk

LOGITS_TAG = 1 << 20  # tags of the logits messages start here (activation messages: the micro-batch's index)


class AbsentPart:
    """Where a stage's model has no embedding (not the first stage) or no head (not the last)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"this pipeline stage holds no {self.what}")

    def weight_bytes(self) -> int:
        return 0


def trim_to_stage(model: LlamaModel, first: bool, last: bool) -> None:
    """Drop the embedding and the head where the stage runs neither (their memory goes with them)."""
    if not first:
        model.embedding = AbsentPart("embedding")
    if not last:
        model.head = AbsentPart("LM head")


def split_micro_batches(chunks: list[SeqChunk], parts: int) -> list[list[SeqChunk]]:
    """Up to `parts` runs of consecutive chunks with about the same number of tokens each, none empty."""
    if parts <= 1 or len(chunks) <= 1:
        return [chunks]
    ends = np.cumsum([len(c.token_ids) for c in chunks])  # cut after the chunks that end by each target
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts, side="right")
    bounds = sorted({0, *np.clip(cuts, 1, len(chunks) - 1).tolist(), len(chunks)})
    return [chunks[a:b] for a, b in zip(bounds, bounds[1:])]


@torch.inference_mode()
def stage_forward(model: LlamaModel, kv_caches, prepared: Prepared, incoming: torch.Tensor | None,
                  last: bool) -> torch.Tensor:
    """incoming: the previous stage's [2, tokens, hidden] (hidden states, residual), None on the first stage.
    Returns the same for the next stage, or the last stage's logits of the rows to sample."""
    ids, positions, batch, rows = prepared
    model.backend.plan(batch)
    x, residual = (model.embedding(ids), None) if incoming is None else (incoming[0], incoming[1])
    cos_sin = model.rope.lookup(positions)
    for layer, kv in zip(model.layers, kv_caches):
        x, residual = layer(x, residual, cos_sin, kv, batch, model.backend)
    if not last:
        return torch.stack([x, residual])
    hidden = model.backend.add_rms_norm(x, residual, model.norm, model.cfg.rms_norm_eps)[0]
    return model.logits(hidden[torch.from_numpy(rows).to(hidden.device)])


class StageStep:
    """One rank's part of every step: the whole model's forward without pipelining, else its stage's."""

    def __init__(self, runner: ModelRunner, group: ParallelGroup | None, pp: int = 1) -> None:
        self.runner, self.group, self.pp = runner, group, pp

    def run(self, micro: list[list[SeqChunk]]) -> torch.Tensor | None:
        """Logits of the step (rows in chunk order) on rank 0; None on the other ranks of a pipeline."""
        if self.pp == 1:
            return self.runner.forward(self.runner.prepare(micro[0]))
        g, model = self.group, self.runner.model
        first, last = g.stage == 0, g.stage == self.pp - 1
        hidden = model.cfg.hidden_size
        pending: list = []  # (tensor, work): a send's tensor lives until it is delivered
        rows = []
        for m, chunks in enumerate(micro):
            prepared = self.runner.prepare(chunks)
            rows.append(len(prepared.rows))
            incoming = None
            if not first:
                incoming = torch.empty((2, prepared.ids.numel(), hidden), dtype=model.norm.dtype,
                                       device=self.runner.device)
                self._p2p(g.pipe.recv, incoming, g.rank - g.layout.tp, m)
            out = stage_forward(model, self.runner.kv_caches, prepared, incoming, last).contiguous()
            if not last:
                pending.append((out, self._p2p(g.pipe.send, out, g.rank + g.layout.tp, m, wait=False)))
            elif g.tp_rank == 0:
                pending.append((out, self._p2p(g.pipe.send, out, 0, LOGITS_TAG + m, wait=False)))
        logits = self._receive_logits(rows) if g.rank == 0 else None
        t0 = time.perf_counter()
        for _, work in pending:
            work.wait()
        COMM.p2p_seconds += time.perf_counter() - t0
        return logits

    def _p2p(self, op, t: torch.Tensor, peer: int, tag: int, wait: bool = True):
        t0 = time.perf_counter()
        work = op([t], peer, tag)
        if wait:
            work.wait()
        COMM.p2p_seconds += time.perf_counter() - t0
        return work

    def _receive_logits(self, rows: list[int]) -> torch.Tensor:
        """Rank 0, after its own stage's part: wait for the last stage (its idle time is the bubble)."""
        g, vocab = self.group, self.runner.model.cfg.vocab_size
        t0 = time.perf_counter()
        parts = [torch.empty((n, vocab), dtype=torch.float32, device=self.runner.device) for n in rows]
        for m, part in enumerate(parts):
            g.pipe.recv([part], (self.pp - 1) * g.layout.tp, LOGITS_TAG + m).wait()
        COMM.bubble_seconds += time.perf_counter() - t0
        return torch.cat(parts)
