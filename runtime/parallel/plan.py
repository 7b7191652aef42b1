"""Who holds what: a rank's pipeline stage and layers, and under tensor parallelism its query, KV and
MLP slices and the vocabulary range.

Ranks count stage-major: rank = stage * tp + tp_rank, so rank 0 is stage 0's first TP rank (the engine).
Layers split over the stages as evenly as they go, the first stages taking one more when they do not
divide. Query heads and the MLP split evenly; KV heads split evenly when there are at least N of them, else
each is replicated on N / kv_heads ranks (as vLLM does), so a rank's query heads always find their
KV head locally. The vocabulary is padded to a multiple of N.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from runtime.errors import UserError
from weights.config import ModelConfig


def check_tp_size(cfg: ModelConfig, n: int) -> None:
    """Raise UserError unless the model splits into n ranks."""
    if n == 1:
        return
    why = None
    if cfg.num_heads % n:
        why = f"its {cfg.num_heads} attention heads do not divide by {n}"
    elif cfg.num_kv_heads % n and n % cfg.num_kv_heads:
        why = f"its {cfg.num_kv_heads} KV heads neither divide by {n} nor divide it"
    elif cfg.intermediate_size % n:
        why = f"its MLP width {cfg.intermediate_size} does not divide by {n}"
    if why:
        raise UserError(f"--tensor-parallel-size {n} does not fit {cfg.name}: {why}")


def check_pp_size(cfg: ModelConfig, p: int) -> None:
    """Raise UserError unless every one of p stages gets at least one layer."""
    if p > cfg.num_layers:
        raise UserError(f"--pipeline-parallel-size {p} does not fit {cfg.name}: its {cfg.num_layers} layers "
                        f"cannot give each of {p} stages one")


@dataclass(frozen=True)
class Layout:
    """tp ranks per stage, pp stages: world size tp * pp."""

    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def stage(self, rank: int) -> int:
        return rank // self.tp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def layers(self, cfg: ModelConfig, stage: int) -> tuple[int, int]:
        """[start, end) of the decoder layers stage `stage` runs."""
        per, extra = divmod(cfg.num_layers, self.pp)
        start = stage * per + min(stage, extra)
        return start, start + per + (stage < extra)

    def check(self, cfg: ModelConfig) -> None:
        check_tp_size(cfg, self.tp)
        check_pp_size(cfg, self.pp)


@dataclass(frozen=True)
class RankShard:
    """The slices of the full model one rank holds (head indices count heads, not rows)."""

    rank: int
    size: int
    q_heads: tuple[int, int]  # [start, end)
    kv_heads: tuple[int, int]
    mlp: tuple[int, int]  # rows of gate/up, columns of down
    vocab: tuple[int, int]  # rows of the embedding / LM head this rank holds, before padding
    vocab_per_rank: int  # padded: every rank's table has this many rows


def rank_shard(cfg: ModelConfig, rank: int, n: int) -> RankShard:
    check_tp_size(cfg, n)
    hq = cfg.num_heads // n
    if cfg.num_kv_heads >= n:
        hkv = cfg.num_kv_heads // n
        kv = (rank * hkv, (rank + 1) * hkv)
    else:  # replicated: ranks r*k .. r*k+k-1 share KV head r
        head = rank // (n // cfg.num_kv_heads)
        kv = (head, head + 1)
    i = cfg.intermediate_size // n
    per = -(-cfg.vocab_size // n)
    vocab = (min(rank * per, cfg.vocab_size), min((rank + 1) * per, cfg.vocab_size))
    return RankShard(rank, n, (rank * hq, (rank + 1) * hq), kv, (rank * i, (rank + 1) * i), vocab, per)


def local_config(cfg: ModelConfig, shard: RankShard, layers: tuple[int, int] | None = None) -> ModelConfig:
    """The shapes one rank's model is built with (its heads, MLP slice, padded vocabulary slice, its stage's layers)."""
    num_layers = cfg.num_layers if layers is None else layers[1] - layers[0]
    return dataclasses.replace(cfg, num_layers=num_layers, num_heads=shard.q_heads[1] - shard.q_heads[0],
                               num_kv_heads=shard.kv_heads[1] - shard.kv_heads[0],
                               intermediate_size=shard.mlp[1] - shard.mlp[0], vocab_size=shard.vocab_per_rank)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(n: int) -> int:
    """N ranks share the machine's cores: more threads each would only oversubscribe them."""
    return max(1, usable_cores() // n)
