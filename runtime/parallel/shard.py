"""Cut a checkpoint (HF-named tensors) into one rank's part, before any Linear is built.

Sharding the weights first lets build_model and make_linear run unchanged on each rank, so every
Linear kind (dense, oneDNN-packed, quantized, CuTe) runs its shard through the same kernels. A GGUF's
blocks are cut as blocks (rows whole; input columns on block boundaries, else a UserError), never
dequantized: each rank holds its share of the file's bytes. q, k and v
(and gate, up) are separate checkpoint tensors here: each is cut on its own, and build_model fuses the
cuts. Column-parallel (cut rows): q/k/v, gate/up, the vocabulary of the embedding and LM head.
Row-parallel (cut input columns): o_proj, down. Norms are replicated. A pipeline stage keeps its own layers.
"""
from __future__ import annotations

import torch

from runtime.errors import UserError
from runtime.parallel.plan import RankShard
from weights.config import ModelConfig
from weights.quantized import QuantizedParts, QuantizedTensor, block_shape

Tensor = torch.Tensor | QuantizedTensor

_Q_ROWS = ("self_attn.q_proj.weight", "self_attn.q_proj.bias")
_KV_ROWS = ("self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias")
_MLP_ROWS = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
_VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")


def _rows(t: Tensor, start: int, end: int, pad_to: int | None = None) -> Tensor:
    if isinstance(t, QuantizedTensor):  # a row is whole blocks: cut (and pad: zero blocks are zeros) the bytes
        return t.with_blocks(_rows(t.blocks, start, end, pad_to))
    part = t[start:end]
    if pad_to is not None and part.shape[0] < pad_to:  # the last rank's vocabulary slice: zero rows
        part = torch.cat([part, part.new_zeros((pad_to - part.shape[0], *part.shape[1:]))])
    return part.contiguous().clone()  # clone: never keep (or share with a worker) the whole tensor


def _cols(name: str, t: Tensor, start: int, end: int) -> Tensor:
    """Input columns [start, end) of a row-parallel weight."""
    if not isinstance(t, QuantizedTensor):
        return _rows(t.T, start, end).T.contiguous()
    values, nbytes = block_shape(t.type_name)
    if start % values or end % values:
        raise UserError(f"--tensor-parallel-size does not fit {name}: its {t.type_name} blocks hold {values} "
                        f"values and a rank's input columns [{start}, {end}) would cut one (choose a size that "
                        f"splits it on {values}-column boundaries, or --quantization none)")
    return QuantizedTensor(t.type_name, t.blocks[:, start // values * nbytes:end // values * nbytes].contiguous()
                           .clone(), end - start)


def _cut(name: str, t: Tensor, cfg: ModelConfig, shard: RankShard) -> Tensor:
    if isinstance(t, QuantizedParts):  # only build_model fuses parts; a checkpoint's tensors are single
        raise TypeError(f"{name}: a checkpoint tensor of several block types")
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
        return _cols(name, t, shard.q_heads[0] * d, shard.q_heads[1] * d)
    if name.endswith("mlp.down_proj.weight"):
        return _cols(name, t, *shard.mlp)
    return t.clone() if isinstance(t, torch.Tensor) else t.with_blocks(t.blocks.clone())  # norms, unsplit


def shard_checkpoint(cfg: ModelConfig, tensors: dict[str, Tensor], shard: RankShard) -> dict[str, Tensor]:
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
