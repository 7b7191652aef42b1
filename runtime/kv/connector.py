"""The KV-connector seam: KV blocks kept beyond the device pool (host memory, disk, another instance).

The scheduler asks a connector how many more prefix blocks it can supply after the device's prefix
cache, has it fill freshly allocated device blocks with them asynchronously (the sequence waits
aside meanwhile, other requests keep stepping), and offers it every cached block the pool is about
to reuse. A request's kv_transfer_params (vLLM's, opaque to the core) reach it with each call about that
request, and what it answers as the request finishes goes out with the request's last output. Nothing
else in the core knows about tiers or other instances; runtime/tiers/ implements both.
"""
from __future__ import annotations

from typing import Hashable, Protocol

BlockLoad = tuple[int, int, tuple[int, ...]]  # (device block id, chained block hash, its token ids)


class KVConnector(Protocol):
    def lookup(self, hashes: list[int], transfer: dict | None = None) -> int:
        """How many of these leading chained block hashes it can supply (transfer: the request's params)."""

    def load(self, key: Hashable, blocks: list[BlockLoad], transfer: dict | None = None) -> None:
        """Fill these device blocks, asynchronously; finished() reports the outcome under key."""

    def finished(self, wait: float = 0.0) -> list[tuple[Hashable, int]]:
        """Loads done since the last call (waiting up to `wait` seconds for one): (key, how many leading
        blocks arrived intact)."""

    def gauges(self) -> dict[str, float]:
        """Its levels now, by name (f"{tier}_used_bytes", ...), beside the counters it keeps in EngineStats.tiers."""

    def holds(self, block_hash: int) -> bool:
        """Whether it holds this block (for the UI's block map: a cheap index lookup)."""

    def offer(self, block: int, block_hash: int, tokens: tuple[int, ...]) -> None:
        """A cached block whose contents the pool is about to drop (its KV is still in place)."""

    def request_finished(self, transfer: dict, blocks: list[BlockLoad]) -> dict | None:
        """A request with kv_transfer_params finished; its computed prompt blocks are still in place. The
        params its answer carries (where another instance can fetch these blocks), or None."""
