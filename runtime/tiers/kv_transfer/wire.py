"""The KV transfer's wire format, one TCP connection per request: the decode side sends one JSON line
({"request_id": ..., "hashes": [hex, ...]}: the blocks it wants, in order; none: release them), the
prefill side answers with frames, each an 8-byte little-endian length and one block in block_file's
format (the disk tier's), and a zero length after the last block it holds."""
from __future__ import annotations

import json
import socket
import struct

MAX_REQUEST_BYTES = 4 << 20  # a request line: ~35 bytes a block hash, so ~100k blocks
MAX_FRAME_BYTES = 1 << 30  # a frame longer than this is not a block: the stream is broken
_LENGTH = struct.Struct("<Q")


class TransferError(Exception):
    """A transfer that cannot go on (why: the message); the blocks already verified stay good."""


def request_line(request_id: str, hashes: list[int]) -> bytes:
    return json.dumps({"request_id": request_id, "hashes": [f"{h:032x}" for h in hashes]}).encode() + b"\n"


def parse_request(line: bytes) -> tuple[str, list[int]]:
    """(request id, block hashes) of a request line; ValueError for anything else."""
    msg = json.loads(line)
    if not isinstance(msg, dict) or not isinstance(msg.get("request_id"), str) or not isinstance(msg.get("hashes"), list):
        raise ValueError("a KV transfer request is {\"request_id\": str, \"hashes\": [hex, ...]}")
    return msg["request_id"], [int(h, 16) for h in msg["hashes"]]


def frame(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


END = _LENGTH.pack(0)


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """n bytes, or TransferError when the peer closes first (a socket timeout propagates)."""
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise TransferError(f"the prefill instance closed the connection after {got} of {n} bytes")
        got += k
    return out


def recv_frame(sock: socket.socket) -> bytearray | None:
    """The next block's bytes, or None after the last."""
    (n,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    if n > MAX_FRAME_BYTES:
        raise TransferError(f"a frame of {n} bytes: not a KV block")
    return recv_exact(sock, n) if n else None
