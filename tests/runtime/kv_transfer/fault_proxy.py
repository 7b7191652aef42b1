"""A TCP proxy in front of a prefill instance's KV block port that breaks the stream on purpose: flips one
byte, stalls, or closes after so many bytes of the answer (the decode side's faults, over real sockets)."""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass


@dataclass
class Fault:
    kind: str = "none"  # none, flip, stall, close
    at: int = 0  # byte offset of the prefill side's answer where it strikes


class FaultProxy:
    def __init__(self, target: tuple[str, int], fault: Fault) -> None:
        self.target, self.fault = target, fault
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.release = threading.Event()  # ends a stall
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.target, timeout=10) as upstream:
            line = client.makefile("rb").readline()
            upstream.sendall(line)
            answer = bytearray()
            while chunk := upstream.recv(1 << 16):
                answer += chunk
            self._answer(client, answer)

    def _answer(self, client: socket.socket, answer: bytearray) -> None:
        f = self.fault
        if f.kind == "flip":
            answer[f.at] ^= 0xFF
        if f.kind in ("stall", "close"):
            client.sendall(answer[:f.at])
            if f.kind == "stall":
                self.release.wait(30)
            return
        client.sendall(answer)

    def close(self) -> None:
        self.release.set()
        self.listener.close()
