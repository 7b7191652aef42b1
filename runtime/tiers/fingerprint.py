"""What a stored KV block is only valid for: this model's weights as this engine computes with them, and
the cache's layout. The numerics come from a probe: the logits of one fixed prompt, bit for bit, so a
fine-tune with the same shapes, another quantization or another kernel route gets a fingerprint of its
own (its blocks would differ from what a recompute gives)."""
from __future__ import annotations

import json
from hashlib import blake2b

from runtime.kv.cache import KVLedger
from runtime.model.runner import ModelRunner
from runtime.sequence import SeqChunk
from weights.config import ModelConfig


def fingerprint(runner: ModelRunner, ledger: KVLedger, cfg: ModelConfig) -> bytes:
    """16 bytes. Runs the probe in the pool's first block: call before any request is served."""
    layout = {"arch": cfg.arch, "name": cfg.name, "layers": cfg.num_layers, "kv_heads": cfg.num_kv_heads,
              "head_dim": cfg.head_dim, "block_size": ledger.block_size, "kv_dtype": ledger.kv_dtype,
              "weights": ledger.quantization, "weight_bytes": ledger.weight_bytes}
    probe = [(7 * i + 3) % cfg.vocab_size for i in range(ledger.block_size)]  # one block: block 0
    logits = runner.run([SeqChunk(probe, 0, [0])]).float().cpu()
    digest = blake2b(json.dumps(layout, sort_keys=True).encode(), digest_size=16)
    digest.update(logits.numpy().tobytes())
    return digest.digest()
