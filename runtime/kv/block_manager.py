"""Per-sequence block tables over the pool: allocation as tokens arrive, prefix matching, rollback.

The block manager works on KVBlocks records, one per sequence and pool; only the scheduler calls it.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from hashlib import blake2b

from runtime.kv.block_pool import BlockPool


def chain_hash(parent: int, tokens: list[int]) -> int:
    """128-bit hash of (parent block hash, token ids): collisions, crafted or not, are infeasible."""
    data = parent.to_bytes(16, "little") + array("q", tokens).tobytes()
    return int.from_bytes(blake2b(data, digest_size=16).digest(), "little")


@dataclass
class KVBlocks:
    """One sequence's blocks in one pool (the target's, or a draft model's)."""

    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # leading tokens whose KV is in these blocks
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full token blocks
    num_registered: int = 0  # leading blocks already in the prefix-cache index


class BlockManager:
    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(self, kv: KVBlocks, tokens: list[int], num_full: int) -> list[int]:
        """Chained hashes of the first num_full full blocks, extending the cached list."""
        bs = self.block_size
        hashes = kv.block_hashes
        for i in range(len(hashes), num_full):
            parent = hashes[i - 1] if i else 0
            hashes.append(chain_hash(parent, tokens[i * bs : (i + 1) * bs]))
        return hashes[:num_full]

    def match_prefix(self, kv: KVBlocks, tokens: list[int]) -> int:
        """Before a sequence's first chunk: share every leading cached block; returns tokens hit."""
        if not self.pool.enable_prefix_caching or kv.block_table or kv.num_computed:
            return 0
        bs = self.block_size
        # never match the block holding the last token: it must be computed to get logits,
        # and it must not be written into a block another sequence can see
        num_full = (len(tokens) - 1) // bs
        for i, h in enumerate(self.block_hashes(kv, tokens, num_full)):
            block = self.pool.lookup(h, tuple(tokens[i * bs : (i + 1) * bs]))
            if block is None:
                break
            self.pool.share(block)
            kv.block_table.append(block)
        kv.num_computed = len(kv.block_table) * bs
        kv.num_registered = len(kv.block_table)
        return kv.num_computed

    def allocate(self, kv: KVBlocks, num_new_tokens: int) -> bool:
        """Grow the table to hold num_computed + num_new_tokens tokens; False if the pool is short."""
        need = self.blocks_needed(kv.num_computed + num_new_tokens) - len(kv.block_table)
        if need > self.pool.num_free:
            return False
        for _ in range(need):
            kv.block_table.append(self.pool.allocate())
        return True

    def register_full_blocks(self, kv: KVBlocks, tokens: list[int]) -> None:
        """Index the blocks that became full and computed, so later requests can share them."""
        num_full = min(kv.num_computed, len(tokens)) // self.block_size
        if num_full <= kv.num_registered or not self.pool.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self.block_hashes(kv, tokens, num_full)
        for i in range(kv.num_registered, num_full):
            self.pool.register(kv.block_table[i], hashes[i], tuple(tokens[i * bs : (i + 1) * bs]),
                               hashes[i - 1] if i else None)
        kv.num_registered = num_full

    def truncate(self, kv: KVBlocks, num_tokens: int) -> None:
        """Roll back to num_tokens cached tokens (rejected speculative tokens), returning spare blocks."""
        kv.num_computed = min(kv.num_computed, num_tokens)
        keep = self.blocks_needed(num_tokens)
        if len(kv.block_table) > keep:
            self.pool.free(kv.block_table[keep:][::-1])
            del kv.block_table[keep:]
        del kv.block_hashes[num_tokens // self.block_size:]
        kv.num_registered = min(kv.num_registered, num_tokens // self.block_size)

    def free(self, kv: KVBlocks) -> None:
        """Return every block; tail first so the prompt's head blocks stay cached longest."""
        self.pool.free(kv.block_table[::-1])
        kv.block_table = []
        kv.num_computed = 0
        kv.num_registered = 0
