"""--kv-events-config: vLLM's KVEventsConfig, read from the same JSON with the same field names."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

from runtime.errors import UserError

FLAG = "--kv-events-config"


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None  # "zmq" when events are on, else "null" (vLLM's default)
    endpoint: str = "tcp://*:5557"  # a wildcard, ipc:// or inproc:// address is bound, any other connected to
    replay_endpoint: str | None = None  # a ROUTER socket answering "every batch from sequence number N"
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark
    max_queue_size: int = 100_000  # events waiting for the publisher thread; beyond, new ones are dropped
    topic: str = ""


_TYPES = {"enable_kv_cache_events": (bool,), "publisher": (str, type(None)), "endpoint": (str,),
          "replay_endpoint": (str, type(None)), "buffer_steps": (int,), "hwm": (int,), "max_queue_size": (int,),
          "topic": (str,)}


def parse_kv_events_config(text: str | None) -> KVEventsConfig | None:
    """The settings, or None when events are off; UserError naming the field for a bad one."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{FLAG} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{FLAG} must be a JSON object, e.g. '{{\"enable_kv_cache_events\": true}}'")
    known = {f.name for f in fields(KVEventsConfig)}
    for key, value in raw.items():
        if key not in known:
            raise UserError(f"{FLAG}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        kinds = _TYPES[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise UserError(f"{FLAG}: {key} must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}")
    config = KVEventsConfig(**raw)
    if config.publisher not in (None, "null", "zmq"):
        raise UserError(f"{FLAG}: publisher must be 'zmq' or 'null', got {config.publisher!r}")
    if min(config.buffer_steps, config.hwm, config.max_queue_size) < 1:
        raise UserError(f"{FLAG}: buffer_steps, hwm and max_queue_size must be >= 1")
    if not config.enable_kv_cache_events or config.publisher == "null":
        return None
    return config
