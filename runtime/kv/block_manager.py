"""Per-sequence block tables over the pool: allocation as tokens arrive, prefix matching, rollback."""
from __future__ import annotations

from array import array
from hashlib import blake2b

from runtime.kv.block_pool import BlockPool
from runtime.sequence import Sequence


def chain_hash(parent: int, tokens: list[int]) -> int:
    """128-bit hash of (parent block hash, token ids): collisions, crafted or not, are infeasible."""
    data = parent.to_bytes(16, "little") + array("q", tokens).tobytes()
    return int.from_bytes(blake2b(data, digest_size=16).digest(), "little")


class BlockManager:
    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _block_hashes(self, seq: Sequence, num_full: int) -> list[int]:
        """Chained hashes of the first num_full full blocks, extending the cached list."""
        bs = self.block_size
        hashes = seq.block_hashes
        for i in range(len(hashes), num_full):
            parent = hashes[i - 1] if i else 0
            hashes.append(chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes[:num_full]

    def match_prefix(self, seq: Sequence) -> int:
        """Before a sequence's first chunk: share every leading cached block; returns tokens hit."""
        if not self.pool.enable_prefix_caching or seq.block_table or seq.num_computed:
            return 0
        bs = self.block_size
        # never match the block holding the last token: it must be computed to get logits,
        # and it must not be written into a block another sequence can see
        num_full = (len(seq.token_ids) - 1) // bs
        for i, h in enumerate(self._block_hashes(seq, num_full)):
            block = self.pool.lookup(h, tuple(seq.token_ids[i * bs : (i + 1) * bs]))
            if block is None:
                break
            self.pool.share(block)
            seq.block_table.append(block)
        hit = len(seq.block_table) * bs
        seq.num_computed = hit
        seq.num_registered_blocks = len(seq.block_table)
        return hit

    def record_lookup(self, seq: Sequence, hit: int) -> None:
        """Count an admitted sequence's prefix lookup (once: an admission that fails is retried later)."""
        if self.pool.enable_prefix_caching:
            self.pool.stats.queries += len(seq.token_ids)
            self.pool.stats.hits += hit

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow the table to hold num_computed + num_new_tokens tokens; False if the pool is short."""
        need = self.blocks_needed(seq.num_computed + num_new_tokens) - len(seq.block_table)
        if need > self.pool.num_free:
            return False
        for _ in range(need):
            seq.block_table.append(self.pool.allocate())
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """Index the blocks that became full and computed, so later requests can share them."""
        num_full = min(seq.num_computed, len(seq.token_ids)) // self.block_size
        if num_full <= seq.num_registered_blocks or not self.pool.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self._block_hashes(seq, num_full)
        for i in range(seq.num_registered_blocks, num_full):
            self.pool.register(seq.block_table[i], hashes[i], tuple(seq.token_ids[i * bs : (i + 1) * bs]))
        seq.num_registered_blocks = num_full

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll back to num_tokens cached tokens (rejected speculative tokens), returning spare blocks."""
        seq.num_computed = min(seq.num_computed, num_tokens)
        keep = self.blocks_needed(num_tokens)
        if len(seq.block_table) > keep:
            self.pool.free(seq.block_table[keep:][::-1])
            del seq.block_table[keep:]
        del seq.block_hashes[num_tokens // self.block_size:]
        seq.num_registered_blocks = min(seq.num_registered_blocks, num_tokens // self.block_size)

    def free(self, seq: Sequence) -> None:
        """Return every block; tail first so the prompt's head blocks stay cached longest."""
        self.pool.free(seq.block_table[::-1])
        seq.block_table = []
        seq.num_computed = 0
        seq.num_registered_blocks = 0
