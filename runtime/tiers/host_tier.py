"""The host-memory tier: encoded KV blocks in RAM, least recently used first out of a byte budget; what
it evicts spills to the tier below (the disk). On a GPU this is the tier that pays: a block comes back
over PCIe instead of being recomputed. On the CPU the KV pool is host memory already, so a tier holding
the same bytes is only a bigger pool (raise --kv-cache-memory instead; docs/tiered_kv.md)."""
from __future__ import annotations

import threading
from collections import OrderedDict


class HostTier:
    name = "host"
    inline = True
    checksummed = False  # its bytes never leave this process's memory

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.blocks: OrderedDict[int, bytes] = OrderedDict()
        self.used = 0
        self.guard = threading.Lock()

    def __len__(self) -> int:
        return len(self.blocks)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self.blocks

    def read(self, block_hash: int) -> bytes | None:
        with self.guard:
            data = self.blocks.get(block_hash)
            if data is not None:
                self.blocks.move_to_end(block_hash)
        return data  # immutable: a load reads from it in place

    def write(self, block_hash: int, data: bytes) -> list[tuple[int, bytes]]:
        """Keep a block; returns the blocks it evicted (least recent first), for the tier below."""
        with self.guard:
            if block_hash in self.blocks or len(data) > self.budget:
                return [] if block_hash in self.blocks else [(block_hash, data)]
            self.blocks[block_hash] = data
            self.used += len(data)
            out = []
            while self.used > self.budget:
                h, old = self.blocks.popitem(last=False)
                self.used -= len(old)
                out.append((h, old))
            return out

    def drop(self, block_hash: int) -> None:
        with self.guard:
            data = self.blocks.pop(block_hash, None)
            self.used -= len(data) if data is not None else 0

    def drain(self) -> list[tuple[int, bytes]]:
        """Empty the tier, least recent first: at shutdown its blocks go to the disk, which outlives it."""
        with self.guard:
            out, self.used = list(self.blocks.items()), 0
            self.blocks.clear()
        return out

    def close(self) -> None:
        self.blocks.clear()

    def describe(self) -> str:
        return f"host {self.budget / 2**30:.1f} GiB"
