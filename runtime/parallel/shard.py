"""Cut a checkpoint (HF-named float tensors) into one rank's part, before any Linear is built.

Sharding the float weights first lets build_model and make_linear run unchanged on each rank, so every
Linear kind (dense, oneDNN-packed, quantized, CuTe) runs its shard through the same kernels. q, k and v
(and gate, up) are separate checkpoint tensors here: each is cut on its own, and build_model fuses the
cuts. Column-parallel (cut rows): q/k/v, gate/up, the vocabulary of the embedding and LM head.
Row-parallel (cut input columns): o_proj, down. Norms are replicated. A pipeline stage keeps its own layers.
"""
from __future__ import annotations

import torch

from runtime.parallel.plan import RankShard
from weights.config import ModelConfig

_Q_ROWS = ("self_attn.q_proj.weight", "self_attn.q_proj.bias")
_KV_ROWS = ("self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias")
_MLP_ROWS = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
_VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")


def _rows(t: torch.Tensor, start: int, end: int, pad_to: int | None = None) -> torch.Tensor:
    part = t[start:end]
    if pad_to is not None and part.shape[0] < pad_to:  # the last rank's vocabulary slice: zero rows
        part = torch.cat([part, part.new_zeros((pad_to - part.shape[0], *part.shape[1:]))])
    return part.contiguous().clone()  # clone: never keep (or share with a worker) the whole tensor


def _cut(name: str, t: torch.Tensor, cfg: ModelConfig, shard: RankShard) -> torch.Tensor:
    d = cfg.head_dim
    if name.endswith(_Q_ROWS):
        return _rows(t, shard.q_heads[0] * d, shard.q_heads[1] * d)
    if name.endswith(_KV_ROWS):
        return _rows(t, shard.kv_heads[0] * d, shard.kv_heads[1] * d)
    if name.endswith(_MLP_ROWS):
        return _rows(t, *shard.mlp)
    if name in _VOCAB_ROWS:
        return _rows(t, *shard.vocab, pad_to=shard.vocab_per_rank)
    if name.endswith("self_attn.o_proj.weight"):
        return _rows(t.T, shard.q_heads[0] * d, shard.q_heads[1] * d).T.contiguous()
    if name.endswith("mlp.down_proj.weight"):
        return _rows(t.T, *shard.mlp).T.contiguous()
    return t.clone()  # norms and anything the model does not split


def shard_checkpoint(cfg: ModelConfig, tensors: dict[str, torch.Tensor], shard: RankShard) -> dict[str, torch.Tensor]:
    """This rank's tensors, under the checkpoint's names; `tensors` is left as it was."""
    return {name: _cut(name, t, cfg, shard) for name, t in tensors.items()}


def stage_checkpoint(tensors: dict[str, torch.Tensor], layers: tuple[int, int]) -> dict[str, torch.Tensor]:
    """A pipeline stage's tensors: its layers renumbered from 0 (the others left out) and everything outside
    the layers (the embedding, final norm and head, which the stage's model drops where it runs none)."""
    start, end = layers
    out = {}
    for name, t in tensors.items():
        if not name.startswith("model.layers."):
            out[name] = t
            continue
        _, _, n, rest = name.split(".", 3)
        if start <= int(n) < end:
            out[f"model.layers.{int(n) - start}.{rest}"] = t
    return out
