"""The wire format of vLLM's KV events (vllm/distributed/kv_events.py), as current vLLM sends them.

Each ZMQ message is three frames: topic, an 8-byte big-endian sequence number, and a msgpack
KVEventBatch. The batch is a positional array [ts, events, data_parallel_rank]; each event is a map
tagged by its class name under "type" (vLLM dropped array_like from the events, not from the batch).
Block hashes go out as unsigned 64-bit ints, as vLLM's do by default; token ids as ints.
"""
from __future__ import annotations

from typing import Any

import msgspec

MEDIUM = "GPU"  # vLLM's name for the pool a step reads KV from (here host RAM on the CPU): not a tier below it
HASH_MASK = (1 << 64) - 1  # our chained hashes are 128-bit; msgpack ints stop at 64


def wire_hash(block_hash: int) -> int:
    return block_hash & HASH_MASK


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Tagged by class name: {"type": "BlockStored", ...}."""


# vLLM's fields without a default are always on the wire; the defaulted ones only when set (omit_defaults)
class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None  # one entry per block: None, no salt, adapter or image in the hash
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


def stored(hashes: list[int], parent: int | None, tokens: list[int], block_size: int) -> BlockStored:
    """One run of chained blocks, each the next one's parent, with vLLM's values for one full-attention group."""
    return BlockStored(hashes, parent, tokens, block_size, None, MEDIUM, None, [None] * len(hashes), 0,
                       "full_attention")


def removed(hashes: list[int]) -> BlockRemoved:
    return BlockRemoved(hashes, MEDIUM, 0)


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None
