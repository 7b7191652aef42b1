"""A ZMQ PUB socket sending KVEventBatch messages, and vLLM's replay socket, on one thread of their own.

Events arrive from the engine's thread through a queue; the thread sends whatever has gathered as one
batch (one step's worth, or a few), numbered 0, 1, 2, ... as vLLM numbers them. A ROUTER socket on
replay_endpoint answers a request [8-byte big-endian start] with every kept batch from there, each as
[sequence, payload], then [-1, b""] (framed for a REQ peer; a DEALER one reads them all, a REQ one the first).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec
import zmq

from runtime.errors import UserError
from runtime.kv_events.config import FLAG, KVEventsConfig
from runtime.kv_events.wire import KVEventBatch

log = logging.getLogger("cute_serve")
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
_STOP = object()


def _binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard, IPv6 any, ipc:// or inproc:// endpoint is bound, any other connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig, coalesce: Callable[[list], list]) -> None:
        self.config, self.coalesce = config, coalesce
        self.queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self.kept: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self.dropped = 0
        ctx = zmq.Context.instance()
        self.pub, self.replay = ctx.socket(zmq.PUB), None
        self.pub.set_hwm(config.hwm)
        try:
            (self.pub.bind if _binds(config.endpoint) else self.pub.connect)(config.endpoint)
            if config.replay_endpoint:
                self.replay = ctx.socket(zmq.ROUTER)
                self.replay.bind(config.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise UserError(f"{FLAG}: cannot open {config.endpoint} / {config.replay_endpoint}: {exc}") from None
        self.thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self.thread.start()

    def put(self, event: object) -> None:
        """From the engine's thread; never blocks (a full queue drops the event, logged once)."""
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("KV events: the queue of %d is full; dropping events", self.config.max_queue_size)

    def close(self) -> None:
        """Send what is queued, then stop (idempotent)."""
        if self.thread.is_alive():
            self.queue.put(_STOP)
            self.thread.join(5.0)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self.pub, self.replay):
            if sock is not None and not sock.closed:
                sock.close(linger=0)

    def _run(self) -> None:
        encode, topic, seq = msgspec.msgpack.Encoder().encode, self.config.topic.encode(), 0
        while True:
            if self.replay is not None and self.replay.poll(0):
                self._answer_replay()
            try:
                first = self.queue.get(timeout=0.05)
            except queue.Empty:
                continue
            events = [first]
            while len(events) < 4096 and not self.queue.empty():
                events.append(self.queue.get_nowait())
            stop = any(e is _STOP for e in events)
            events = [e for e in events if e is not _STOP]
            if events:
                try:
                    payload = encode(KVEventBatch(time.time(), self.coalesce(events), 0))
                    self.pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))
                except (zmq.ZMQError, msgspec.EncodeError, OverflowError):  # this batch is lost, not the thread
                    log.exception("KV events: a batch of %d could not be sent", len(events))
                else:
                    self.kept.append((seq, payload))
                    seq += 1
            if stop:
                return

    def _answer_replay(self) -> None:
        frames = self.replay.recv_multipart()
        if len(frames) != 3:  # [identity, empty delimiter, start] from a REQ socket
            log.warning("KV events: a replay request of %d frames, not 3; ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self.kept):
            if seq >= first:
                self.replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self.replay.send_multipart((client, b"", END_OF_REPLAY, b""))
