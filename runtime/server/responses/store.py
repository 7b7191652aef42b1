"""Responses kept for GET /v1/responses/{id} and previous_response_id: in memory, least recently
used first out, at most MAX_RESPONSES (a server restart forgets them all)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_RESPONSES = 1024


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # as returned
    conversation: list[dict[str, Any]]  # chat messages up to and including its output (instructions excluded)


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES) -> None:
        self.max_responses = max_responses
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None:
                self._items.move_to_end(response_id)
            return item

    def put(self, item: StoredResponse) -> None:
        with self._lock:
            self._items[item.response["id"]] = item
            self._items.move_to_end(item.response["id"])
            while len(self._items) > self.max_responses:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
