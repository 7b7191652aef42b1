"""A disaggregated pair in this process: a prefill and a decode server over tiny engines of the same weights
(each with its own KV block port), and a colocated one to compare with; the client side of vLLM's proxy
protocol (prefill with do_remote_decode and max_tokens 1, then decode with the answer's kv_transfer_params)."""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Iterator

import httpx

from tests.server_utils import LiveServer, live_server
from tests.tiny_engine import tiny_engine

ENGINE = dict(logit_scale=4.0, num_blocks=64)
# the answer's first frame: its length (8 bytes), block_file's header (56) and the token ids (16 x 8)
FIRST_PAYLOAD = 8 + 56 + 16 * 8
FRAME_OVERHEAD = FIRST_PAYLOAD


@dataclass
class Pair:
    prefill: LiveServer
    decode: LiveServer
    colocated: LiveServer

    def prefill_answer(self, body: dict, path: str = "/v1/completions") -> dict:
        req = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        r = httpx.post(self.prefill.url + path, json=req, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["kv_transfer_params"]

    def decode_answer(self, body: dict, params: dict, path: str = "/v1/completions") -> dict:
        r = httpx.post(self.decode.url + path, json={**body, "kv_transfer_params": params}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def disaggregated(self, body: dict, path: str = "/v1/completions") -> dict:
        return self.decode_answer(body, self.prefill_answer(body, path), path)


@contextlib.contextmanager
def pd_pair(prefill: dict | None = None, decode: dict | None = None) -> Iterator[Pair]:
    """prefill, decode: tiny_engine settings of each (beyond ENGINE)."""
    with live_server(tiny_engine(kv_role="prefill", **{**ENGINE, **(prefill or {})})) as p, \
            live_server(tiny_engine(kv_role="decode", **{**ENGINE, **(decode or {})})) as d, \
            live_server(tiny_engine(**ENGINE)) as c:
        yield Pair(p, d, c)


def metric(server: LiveServer, name: str) -> float:
    """The value of one unlabelled-but-for-model series in the server's /metrics."""
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))
