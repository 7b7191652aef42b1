"""Embeddings from the model's final hidden states (POST /v1/embeddings).

Each prompt runs as one whole prefill into scratch KV blocks of its own, so the engine's KV cache
is neither read nor written: generation's blocks and its prefix cache are untouched. The caller
runs this between two engine steps (the model is not thread-safe). Prompts are batched up to
max_batch_tokens per forward; each is pooled ("mean" of its tokens, or its "last" token) and,
by default, scaled to unit length (cosine similarity is then a dot product)."""
from __future__ import annotations

import torch

from runtime.model.runner import ModelRunner
from runtime.sequence import SeqChunk

POOLINGS = ("mean", "last")


@torch.inference_mode()
def embed(runner: ModelRunner, prompts: list[list[int]], pooling: str = "mean", normalize: bool = True,
          max_batch_tokens: int = 4096) -> list[torch.Tensor]:
    """One float32 vector [hidden] per prompt, in order."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, not {pooling!r}")
    # prepare() packs one-token chunks first: sorted alike, each batch's rows come back in its order
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) != 1)
    out: list[torch.Tensor | None] = [None] * len(prompts)
    batch: list[int] = []
    for i in order + [-1]:
        if batch and (i < 0 or sum(len(prompts[j]) for j in batch) + len(prompts[i]) > max_batch_tokens):
            for j, vector in zip(batch, _pooled(runner, [prompts[j] for j in batch], pooling)):
                out[j] = torch.nn.functional.normalize(vector, dim=0) if normalize else vector
            batch = []
        batch.append(i)
    return out  # type: ignore[return-value]


def _pooled(runner: ModelRunner, prompts: list[list[int]], pooling: str) -> list[torch.Tensor]:
    bs, tables, used = runner.block_size, [], 0
    for p in prompts:
        n = -(-len(p) // bs)
        tables.append(list(range(used, used + n)))
        used += n
    scratch = [(k.new_empty((used, *k.shape[1:])), v.new_empty((used, *v.shape[1:]))) for k, v in runner.kv_caches]
    own = ModelRunner(runner.model, scratch, bs, runner.device)
    ids, positions, batch, _ = own.prepare([SeqChunk(p, 0, t, 0) for p, t in zip(prompts, tables)])
    hidden = runner.model(ids, positions, batch, scratch).float()
    rows = hidden.split([len(p) for p in prompts])
    return [r.mean(0) if pooling == "mean" else r[-1] for r in rows]
