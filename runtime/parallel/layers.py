"""The collectives inside a tensor-parallel model, as wrappers around each rank's ordinary layers.

Row-parallel o_proj/down: each rank's partial sums, all-reduced. Vocab-parallel embedding: a masked
lookup of the ids this rank holds, all-reduced. LM head: each rank's vocabulary slice of the logits,
all-gathered (only for the rows that are sampled). Every collective is timed (CommTimer) so a step's
time splits into compute and communication.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from runtime.model.embedding import Embedding
from runtime.model.linear import Linear
from runtime.model.llama import LlamaModel
from runtime.parallel.group import ParallelGroup
from runtime.parallel.plan import RankShard
from weights.config import ModelConfig


@dataclass
class CommTimer:
    """Seconds spent in collectives (waiting for the slowest rank included). sync: wait for the device
    around each one, so asynchronous NCCL calls count their real time (benchmarks only)."""

    seconds: float = 0.0
    calls: int = 0
    broadcast_seconds: float = 0.0  # rank 0 sending each step's chunks
    p2p_seconds: float = 0.0  # a stage's activations sent on and received (pipeline parallelism)
    bubble_seconds: float = 0.0  # rank 0 idle, waiting for the last stage's logits
    sync: bool = False

    def reset(self) -> None:
        self.seconds, self.calls, self.broadcast_seconds, self.p2p_seconds, self.bubble_seconds = 0.0, 0, 0.0, 0.0, 0.0


COMM = CommTimer()  # one per process: a process is one rank


def _timed(x: torch.Tensor, collective, *args):
    if COMM.sync and x.is_cuda:
        torch.cuda.synchronize(x.device)
    t0 = time.perf_counter()
    out = collective(*args)
    if COMM.sync and x.is_cuda:
        torch.cuda.synchronize(x.device)
    COMM.seconds += time.perf_counter() - t0
    COMM.calls += 1
    return out


def all_reduce(x: torch.Tensor, group: ParallelGroup) -> torch.Tensor:
    _timed(x, group.all_reduce, x)
    return x


class RowParallelLinear:
    """A linear over this rank's input columns; the ranks' partial outputs sum to the full product."""

    def __init__(self, inner: Linear, group: ParallelGroup) -> None:
        self.inner, self.group = inner, group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.inner(x), self.group)

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()


class GatheredHead:
    """The LM head over this rank's vocabulary rows; the ranks' logits concatenate, padding cut."""

    def __init__(self, inner: Linear, vocab_size: int, group: ParallelGroup) -> None:
        self.inner, self.vocab_size, self.group = inner, vocab_size, group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        local = self.inner(x).contiguous()
        return torch.cat(_timed(local, self.group.all_gather, local), dim=-1)[:, :self.vocab_size]

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()


class VocabParallelEmbedding:
    """Rows [start, start + rows) of the table live here (in the rank's Embedding, float or blocks); other
    ids read zeros, which the sum fills."""

    def __init__(self, inner: Embedding, start: int, rows: int, group: ParallelGroup) -> None:
        self.inner, self.start, self.rows, self.group = inner, start, rows, group

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = self.inner(local.masked_fill(outside, 0))
        return all_reduce(x.masked_fill_(outside.unsqueeze(-1), 0.0), self.group)

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()


def parallelize(model: LlamaModel, full: ModelConfig, shard: RankShard, group: ParallelGroup,
                first: bool = True, last: bool = True) -> LlamaModel:
    """Wrap a rank's model (built from its shard) with the collectives that make it compute the full one;
    first/last: whether its pipeline stage embeds the ids / computes the logits (the others have neither)."""
    for layer in model.layers:
        layer.o_proj = RowParallelLinear(layer.o_proj, group)
        layer.down = RowParallelLinear(layer.down, group)
    if last:
        model.head = GatheredHead(model.head, full.vocab_size, group)
    if first:
        model.embedding = VocabParallelEmbedding(model.embedding, shard.vocab[0], shard.vocab_per_rank, group)
    model.cfg = dataclasses.replace(model.cfg, vocab_size=full.vocab_size)  # logits come out full width
    return model
