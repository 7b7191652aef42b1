"""A token bucket per client address for failed API-key checks (/login, a wrong Bearer key): an
attack guessed ~430 keys a second with no delay. Each failure spends a token; tokens come back at
`rate` a second up to `burst`; with none left every key check from that address, right or wrong,
gets 429 with Retry-After (answering a right key would tell a guesser it found it). Successful
requests spend nothing, so a client with the key is never slowed."""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

MAX_ADDRESSES = 10_000  # buckets kept; full ones (nothing to remember) are dropped first


@dataclass
class _Bucket:
    tokens: float
    at: float


class AuthThrottle:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def retry_after(self, address: str) -> int:
        """Seconds until this address may try a key again; 0 when it may now."""
        with self._lock:
            bucket = self._refill(address)
            return 0 if bucket is None or bucket.tokens >= 1 else math.ceil((1 - bucket.tokens) / self.rate)

    def failed(self, address: str) -> None:
        """A wrong key from this address: spend a token."""
        with self._lock:
            bucket = self._refill(address) or self._new(address)
            bucket.tokens -= 1

    def _refill(self, address: str) -> _Bucket | None:
        bucket = self._buckets.get(address)
        if bucket is not None:
            now = time.monotonic()
            bucket.tokens, bucket.at = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate), now
        return bucket

    def _new(self, address: str) -> _Bucket:
        if len(self._buckets) >= MAX_ADDRESSES:
            for key in [k for k in self._buckets if self._refill(k).tokens >= self.burst]:
                del self._buckets[key]
            while len(self._buckets) >= MAX_ADDRESSES:  # all still throttled: forget the oldest
                del self._buckets[next(iter(self._buckets))]
        bucket = self._buckets[address] = _Bucket(self.burst, time.monotonic())
        return bucket


def client_address(scope: dict) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"
