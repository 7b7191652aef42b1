"""KV events from an engine's settings (--kv-events-config): a listener on the block pool feeding a ZMQ
publisher, stopped when the engine closes."""
from __future__ import annotations

from runtime.engine import LLMEngine
from runtime.kv_events.config import KVEventsConfig
from runtime.kv_events.publisher import ZmqEventPublisher
from runtime.kv_events.wire import AllBlocksCleared, BlockStored, removed, stored, wire_hash
from runtime.model.runner import RunnerWithClose


class EventRecorder:
    """The pool's listener: each index change becomes a vLLM event on the publisher's queue."""

    def __init__(self, publisher: ZmqEventPublisher, block_size: int) -> None:
        self.publisher, self.block_size = publisher, block_size

    def stored(self, block_hash: int, parent_hash: int | None, tokens: tuple[int, ...]) -> None:
        parent = None if parent_hash is None else wire_hash(parent_hash)
        self.publisher.put(stored([wire_hash(block_hash)], parent, list(tokens), self.block_size))

    def removed(self, block_hash: int) -> None:
        self.publisher.put(removed([wire_hash(block_hash)]))

    def cleared(self) -> None:
        self.publisher.put(AllBlocksCleared())


def coalesce(events: list) -> list:
    """Runs of stored blocks that chain (each the next one's parent) become one BlockStored, as vLLM
    sends a sequence's newly full blocks; everything else stays as it came, in order."""
    out: list = []
    for event in events:
        last = out[-1] if out else None
        if (isinstance(event, BlockStored) and isinstance(last, BlockStored)
                and event.parent_block_hash == last.block_hashes[-1]):
            last.block_hashes += event.block_hashes
            last.token_ids += event.token_ids
            last.extra_keys += event.extra_keys
        else:
            out.append(event)
    return out


def attach_kv_events(engine: LLMEngine, config: KVEventsConfig) -> None:
    """Plug a publisher into the built engine's pool; closing the engine closes it."""
    publisher = ZmqEventPublisher(config, coalesce)
    engine.pool.listeners.append(EventRecorder(publisher, engine.config.block_size))
    engine.runner = RunnerWithClose(engine.runner, publisher.close)
