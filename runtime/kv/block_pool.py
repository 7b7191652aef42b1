"""The KV block pool: reference counts, a LRU free queue, and the prefix-cache index.

A block is in exactly one of three states: in use (ref > 0), cached-free (ref == 0 but still holds
the KV of a known token block, findable by hash), or empty-free. Free blocks of both kinds sit in
one queue in the order they were freed; a fresh allocation takes the oldest, evicting its hash.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import numpy as np

ALSO_BELOW = 4  # a states() flag: the block's KV is also held by a connector (host memory, disk)


class PoolListener(Protocol):  # told as the prefix-cache index changes (runtime/kv_events/ tells routers)
    def stored(self, block_hash: int, parent_hash: int | None, tokens: tuple[int, ...]) -> None: ...
    def removed(self, block_hash: int) -> None: ...
    def cleared(self) -> None: ...


class BlockPool:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.evictions = 0  # cached blocks whose contents were dropped for a fresh allocation
        # called with (block, hash, tokens) before an eviction reuses a cached block (a KV connector's offer)
        self.on_evict: Callable[[int, int, tuple[int, ...]], None] | None = None
        self.listeners: list[PoolListener] = []

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    def allocate(self) -> int:
        """A fresh block (ref 1), evicting the least recently freed one's cached contents."""
        block, _ = self.free_queue.popitem(last=False)
        self._uncache(block)
        self.ref_counts[block] = 1
        return block

    def _uncache(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None:
            if self.cached.get(h) == block:
                del self.cached[h]
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(block, h, self.block_tokens[block])
                for listener in self.listeners:
                    listener.removed(h)
            self.block_hash[block] = None
            self.block_tokens[block] = None

    def lookup(self, block_hash: int, tokens: tuple[int, ...]) -> int | None:
        """The cached block holding exactly these tokens after this prefix, or None."""
        block = self.cached.get(block_hash)
        if block is None or self.block_tokens[block] != tokens:  # token check guards against collisions
            return None
        return block

    def share(self, block: int) -> None:
        """Take one more reference to a cached block (reviving it if it was free)."""
        if self.ref_counts[block] == 0:
            del self.free_queue[block]
        self.ref_counts[block] += 1

    def register(self, block: int, block_hash: int, tokens: tuple[int, ...], parent: int | None = None) -> None:
        """Mark a full, computed block as findable by its chained hash (parent: the previous block's)."""
        if not self.enable_prefix_caching or self.block_hash[block] is not None:
            return
        if block_hash in self.cached:  # an identical block exists already; keep the first
            return
        self.block_hash[block] = block_hash
        self.block_tokens[block] = tokens
        self.cached[block_hash] = block
        for listener in self.listeners:
            listener.stored(block_hash, parent, tokens)

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each; a block reaching zero joins the free queue's tail."""
        for block in blocks:
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed twice"
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
                if self.block_hash[block] is None:  # nothing worth keeping: reuse it first
                    self.free_queue.move_to_end(block, last=False)

    def reset_prefix_cache(self) -> None:
        for block in list(self.free_queue):
            self._uncache(block)
        if not self.cached:  # the index is empty: say so in one event
            for listener in self.listeners:
                listener.cleared()

    def states(self, held_below: Callable[[int], bool] | None = None) -> np.ndarray:
        """Per block: 0 free, 1 cached-free, 2 in use by one sequence, 3 shared (for the UI's map), plus
        ALSO_BELOW for a cached block a KV connector also holds (held_below(its hash))."""
        refs = np.asarray(self.ref_counts)
        cached = np.fromiter((h is not None for h in self.block_hash), dtype=bool, count=self.num_blocks)
        states = np.where(refs > 1, 3, np.where(refs == 1, 2, np.where(cached, 1, 0))).astype(np.uint8)
        if held_below is not None:
            below = np.fromiter((h is not None and held_below(h) for h in self.block_hash), dtype=bool,
                                count=self.num_blocks)
            states[below] |= ALSO_BELOW
        return states
