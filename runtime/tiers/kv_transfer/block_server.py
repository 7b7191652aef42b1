"""The prefill side's KV block server: a thread accepting decode instances' fetches (a thread per
connection), each answered from the held blocks with frames in block_file's format. Encoding and
sending run here, never on the engine's step thread; a sweeper frees what nobody fetched in time."""
from __future__ import annotations

import logging
import socket
import socketserver
import threading

from runtime.errors import UserError
from runtime.tiers.block_file import BlockRecord, encode
from runtime.tiers.kv_transfer.held import HeldBlocks
from runtime.tiers.kv_transfer.wire import END, MAX_REQUEST_BYTES, frame, parse_request

log = logging.getLogger("cute_serve")
READ_TIMEOUT_S = 10.0  # a peer that opens a connection and sends no request line within this is dropped
SWEEP_EVERY_S = 0.5


class BlockServer:
    def __init__(self, host: str, port: int, held: HeldBlocks, fingerprint: bytes, count) -> None:
        self.held, self.fingerprint, self.count = held, fingerprint, count
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._handle(self)

        try:
            self.server = socketserver.ThreadingTCPServer((host, port), Handler, bind_and_activate=False)
            self.server.daemon_threads = True
            self.server.allow_reuse_address = True
            self.server.server_bind()
            self.server.server_activate()
        except OSError as exc:
            raise UserError(f"--kv-transfer-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.host, self.port = host, self.server.server_address[1]
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                         name="kv-transfer-serve", daemon=True),
                        threading.Thread(target=self._sweep, name="kv-transfer-sweep", daemon=True)]
        for t in self.threads:
            t.start()

    def _sweep(self) -> None:
        while not self.stopped.wait(SWEEP_EVERY_S):
            self.held.expire()

    def _handle(self, handler: socketserver.BaseRequestHandler) -> None:
        sock: socket.socket = handler.request
        sock.settimeout(READ_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            line = sock.makefile("rb").readline(MAX_REQUEST_BYTES)
            request_id, hashes = parse_request(line)
        except (OSError, ValueError) as exc:
            log.warning("KV transfer: a bad fetch request from %s: %s", handler.client_address, exc)
            return
        held = self.held.take(request_id)
        if not hashes:  # a release: the decode side needs none of them
            return
        if held is None:
            log.warning("KV transfer: a fetch for request %s, which holds no blocks (expired or fetched)", request_id)
            sock.sendall(END)
            return
        sent = 0
        try:
            for h in hashes:
                if h not in held.blocks:
                    break
                tokens, snapshot = held.blocks[h]
                data = frame(encode(BlockRecord(self.fingerprint, h, tokens, snapshot.bytes())))
                sock.sendall(data)
                sent += len(data)
            sock.sendall(END)
        except OSError as exc:
            log.warning("KV transfer: sending request %s's blocks failed: %s", request_id, exc)
        self.count("transfer_sent_bytes", sent)

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()
        for t in self.threads:
            t.join(timeout=2)
