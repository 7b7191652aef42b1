"""KV events as a router reads them: a real ZMQ SUB (and REQ for replay) socket, decoded with msgspec
into vLLM's event types as declared here (not ours), checked against the prefix cache's own hashes."""
from __future__ import annotations

import json
import time

import msgspec
import pytest
import zmq

from runtime.errors import UserError
from runtime.kv.block_manager import chain_hash
from runtime.kv_events.config import parse_kv_events_config
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import tiny_engine

BS = 16
ONE = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


# vLLM's types (vllm/distributed/kv_events.py): a positional batch of events tagged by class name
class Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Stored | Removed | Cleared]
    data_parallel_rank: int | None = None


class Event(msgspec.Struct, tag=True):
    pass


class Stored(Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class Removed(Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class Cleared(Event, tag="AllBlocksCleared"):
    pass


DECODE = msgspec.msgpack.Decoder(Batch).decode


def wire(tokens: list[int], n: int) -> list[int]:
    """The 64-bit wire hashes of the first n full blocks of tokens, chained as the prefix cache does."""
    out, parent = [], 0
    for i in range(n):
        parent = chain_hash(parent, tokens[i * BS:(i + 1) * BS])
        out.append(parent & (2**64 - 1))
    return out


@pytest.fixture
def sockets():
    ctx = zmq.Context.instance()
    sub, req = ctx.socket(zmq.SUB), ctx.socket(zmq.DEALER)  # a REQ socket would take the first answer only
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    port = sub.bind_to_random_port("tcp://127.0.0.1")  # an address without * : the publisher connects to it
    yield sub, req, f"tcp://127.0.0.1:{port}"
    sub.close(linger=0)
    req.close(linger=0)


def settle(sub: zmq.Socket) -> None:
    """Let our subscription reach the publisher (connected while the engine was built) before events
    flow: a SUB socket sends it only as its own thread calls into it, and a PUB socket drops what no
    subscriber has asked for yet (vLLM's replay socket is how a late one catches up)."""
    for _ in range(6):
        sub.poll(50)


def received(sub: zmq.Socket, until, timeout: float = 5.0) -> list[tuple[int, Batch]]:
    got, deadline = [], time.monotonic() + timeout
    while not until(got):
        assert time.monotonic() < deadline, f"events so far: {got}"
        if sub.poll(50):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv" and len(seq) == 8
            got.append((int.from_bytes(seq, "big"), DECODE(payload)))
    return got


def events_of(batches) -> list:
    return [e for _, b in batches for e in b.events]


def test_stored_removed_and_cleared_reach_a_subscriber_and_replay(sockets):
    sub, req, endpoint = sockets
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
              "replay_endpoint": "tcp://127.0.0.1:*", "topic": "kv"}  # zmq picks the replay socket's port
    engine = tiny_engine(num_blocks=6, kv_events_config=json.dumps(config))
    llm = LLM.from_engine(engine)
    settle(sub)
    a = list(range(40))  # two full blocks computed (the third holds the last prompt token)
    llm.generate([a], ONE, use_tqdm=False)
    first = received(sub, lambda got: len(events_of(got)) >= 1)
    assert events_of(first) == [Stored(wire(a, 2), None, a[:32], BS, None, "GPU", None, [None, None], 0,
                                       "full_attention")]
    b = a[:32] + [200 + i for i in range(20)]  # shares a's two blocks, adds a third whose parent is a's second
    llm.generate([b], ONE, use_tqdm=False)
    (stored,) = events_of(received(sub, lambda got: len(events_of(got)) >= 1))
    assert (stored.block_hashes, stored.parent_block_hash, stored.token_ids) == (wire(b, 3)[2:], wire(a, 2)[1],
                                                                                  b[32:48])
    c = [100 + (i % 50) for i in range(90)]  # 6 blocks: every cached one is evicted
    llm.generate([c], ONE, use_tqdm=False)
    events = events_of(received(sub, lambda got: sum(isinstance(e, Removed) for e in events_of(got)) >= 3))
    gone = {h for e in events if isinstance(e, Removed) for h in e.block_hashes}
    assert gone == set(wire(a, 2) + wire(b, 3)[2:]) and all(e.medium == "GPU" for e in events)
    engine.pool.reset_prefix_cache()
    tail = events_of(received(sub, lambda got: any(isinstance(e, Cleared) for e in events_of(got))))
    assert isinstance(tail[-1], Cleared)
    req.connect(engine.pool.listeners[0].publisher.replay.getsockopt_string(zmq.LAST_ENDPOINT))  # vLLM's replay: every batch kept from sequence 0, then (-1, b"")
    req.send_multipart((b"", (0).to_bytes(8, "big")))  # as a REQ socket frames it
    replayed = []
    while True:
        assert req.poll(5000), "no replay answer"
        empty, seq, payload = req.recv_multipart()
        assert empty == b""
        if payload == b"":
            assert int.from_bytes(seq, "big", signed=True) == -1
            break
        replayed.append((int.from_bytes(seq, "big"), DECODE(payload)))
    assert [s for s, _ in replayed] == list(range(len(replayed)))
    assert events_of(replayed)[0] == events_of(first)[0] and isinstance(events_of(replayed)[-1], Cleared)
    engine.close()
    assert not engine.pool.listeners[0].publisher.thread.is_alive()


@pytest.mark.parametrize("text, field", [
    ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "publisher"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events"),
    ('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}', "endpont"),
    ('{"enable_kv_cache_events": true, "hwm": 0}', "hwm"),
    ('[true]', "JSON object"),
    ('{enable', "not JSON"),
])
def test_bad_config_is_one_line_naming_the_field(text, field):
    with pytest.raises(UserError, match=field):
        parse_kv_events_config(text)


def test_events_off_unless_enabled_and_a_taken_endpoint_is_a_user_error():
    assert parse_kv_events_config('{"publisher": "zmq"}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events": true}').publisher is None  # zmq, vLLM's default
    with zmq.Context.instance().socket(zmq.PUB) as taken:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        with pytest.raises(UserError, match="cannot open"):
            tiny_engine(kv_events_config=json.dumps({"enable_kv_cache_events": True,
                                                     "endpoint": f"tcp://*:{port}"}))
