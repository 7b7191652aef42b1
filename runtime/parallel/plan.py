"""Who holds what under tensor parallelism: query, KV and MLP slices and the vocabulary range of a rank.

Query heads and the MLP split evenly; KV heads split evenly when there are at least N of them, else
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


def local_config(cfg: ModelConfig, shard: RankShard) -> ModelConfig:
    """The shapes one rank's model is built with (its heads, MLP slice and padded vocabulary slice)."""
    return dataclasses.replace(cfg, num_heads=shard.q_heads[1] - shard.q_heads[0],
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
