"""The prefill side's held blocks: a finished prompt's KV, copied out of the pool as the request finished
(the pool goes on prefilling), kept under an id of its own until a decode instance fetches it or
--kv-hold-timeout passes (then freed and counted as expired, vLLM's nixl_num_kv_expired_reqs)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from runtime.tiers.block_io import Snapshot

log = logging.getLogger("cute_serve")


@dataclass
class HeldRequest:
    blocks: dict[int, tuple[tuple[int, ...], Snapshot]]  # chained hash -> (token ids, the block's bytes)
    nbytes: int
    deadline: float


class HeldBlocks:
    def __init__(self, hold_seconds: float, count) -> None:
        self.hold_seconds, self.count = hold_seconds, count
        self.requests: dict[str, HeldRequest] = {}
        self.guard = threading.Lock()

    def hold(self, request_id: str, blocks: dict[int, tuple[tuple[int, ...], Snapshot]], nbytes: int) -> None:
        with self.guard:
            self.requests[request_id] = HeldRequest(blocks, nbytes, time.monotonic() + self.hold_seconds)

    def take(self, request_id: str) -> HeldRequest | None:
        """The request's blocks, no longer held (a fetch sends them, a release drops them)."""
        with self.guard:
            return self.requests.pop(request_id, None)

    def expire(self) -> int:
        """Free the requests nobody fetched in time; how many."""
        now = time.monotonic()
        with self.guard:
            late = [rid for rid, r in self.requests.items() if r.deadline <= now]
            for rid in late:
                del self.requests[rid]
        for rid in late:
            log.warning("KV transfer: request %s's blocks were never fetched; freed after %.0f s", rid,
                        self.hold_seconds)
        self.count("transfer_expired", len(late))
        return len(late)

    def levels(self) -> tuple[int, int]:
        """(requests held, bytes held)."""
        with self.guard:
            return len(self.requests), sum(r.nbytes for r in self.requests.values())
