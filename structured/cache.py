"""The compiled-grammar cache, bounded in bytes: a large schema's compiled grammar holds 65-100 MiB
(its token-mask cache), so a count of entries bounds nothing. Failures are kept too (a small count
of short messages): the same hostile schema sent again fails at once instead of compiling again."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable

MAX_FAILURES = 1024


class GrammarCache:
    """LRU of compiled grammars by their memory_size_bytes; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._failures: OrderedDict[Hashable, Exception] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        """The compiled grammar, or None; raises the failure kept for key."""
        with self._lock:
            if key in self._failures:
                raise self._failures[key]
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, compiled: Any, size: int) -> None:
        """Keep it, evicting the least recently used; one larger than the whole cache is not kept."""
        with self._lock:
            if key in self._items or size > self.max_bytes:
                return
            self._items[key] = (compiled, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self.bytes -= evicted

    def fail(self, key: Hashable, error: Exception) -> None:
        with self._lock:
            self._failures[key] = error
            while len(self._failures) > MAX_FAILURES:
                self._failures.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
