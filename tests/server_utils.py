"""Real servers for tests: uvicorn in a thread on a free 127.0.0.1 port, or `python -m runtime.serve`."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import httpx
import openai
import uvicorn

from profiling.benchmarks.bench_serving import BenchError, start_server, stop_server
from runtime.engine import LLMEngine
from runtime.server.app import create_app
from runtime.server.async_engine import AsyncEngine
from runtime.server.late_page import PrepareUI
from runtime.server.options import ServerOptions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MODEL = "tiny"


@dataclass
class LiveServer:
    url: str
    async_engine: AsyncEngine | None = None

    @property
    def engine(self) -> LLMEngine:
        return self.async_engine.engine

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no request is left in the engine and every KV block is free again; else fail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.async_engine.snapshot()
            if (s.kv_blocks_used == 0 and s.num_requests_running == 0 and s.num_requests_waiting == 0
                    and self.async_engine.num_seqs_in_flight == 0 and not self.engine.requests):
                return
            time.sleep(0.02)
        raise AssertionError(f"engine not idle after {timeout}s: {self.async_engine.snapshot()}, "
                             f"in flight {self.async_engine.num_seqs_in_flight}")


def openai_client(url: str, api_key: str = "unused", timeout: float = 60) -> openai.OpenAI:
    """The official client for the server at url, without retries (a test sees the first answer)."""
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=timeout)


def bound_socket() -> socket.socket:
    # proto=IPPROTO_TCP, or asyncio skips TCP_NODELAY and every small write waits ~40 ms (Nagle)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serve_app(app, timeout: float = 20.0) -> Iterator[str]:
    """Run app under uvicorn in a thread; yields the base URL; stops the server on exit."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"uvicorn did not stop within {timeout:g} s")


@contextlib.contextmanager
def live_server(engine: LLMEngine, max_queue: int | None = None, model_name: str = TINY_MODEL,
                ui: PrepareUI | None = None, wait_for_page: bool = True, **options) -> Iterator[LiveServer]:
    """An AsyncEngine over engine, its app (options: ServerOptions' fields), and uvicorn; everything
    stopped on exit. With a ui, once its page is mounted unless wait_for_page is False."""
    with AsyncEngine(engine, max_queue=max_queue) as async_engine:
        app = create_app(async_engine, model_name, ServerOptions(**options), ui)
        with serve_app(app) as url:
            if ui is not None and wait_for_page:
                wait_for_chat_page(url)
            yield LiveServer(url, async_engine)
        app.state.server.close()
        app.state.server.compiles.service.close()


def settled_chat_page(url: str, timeout: float = 120.0) -> str:
    """The chat page's status in /health once it is no longer "loading" ("ready" or "failed")."""
    deadline = time.monotonic() + timeout
    while (status := httpx.get(url + "/health").json().get("chat_page")) == "loading":
        if time.monotonic() > deadline:
            raise AssertionError(f"the chat page still loads after {timeout:.0f} s")
        time.sleep(0.05)
    return status


def wait_for_chat_page(url: str) -> None:
    assert (status := settled_chat_page(url)) == "ready", f"chat page: {status}"


def write_tiny_model(folder: str) -> str:
    """A tiny random HF folder with the byte tokenizer and its chat template: `--model` loads it in a second."""
    from tests.model_files import write_tiny_hf
    from tests.tiny_engine import BOS, CHATML, EOS, TINY_VOCAB, byte_tokenizer

    write_tiny_hf(folder, vocab_size=TINY_VOCAB, bos_token_id=BOS, eos_token_ids=[EOS])
    byte_tokenizer().backend.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHATML}, f)
    return folder


@contextlib.contextmanager
def serve_subprocess(*args: str, timeout: float = 300.0) -> Iterator[tuple[str, Callable[[], str]]]:
    """`python -m runtime.serve --port <free> ARGS`; yields (base URL, read the output so far) once
    /health answers; terminates the server on exit."""
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty server never blocks on it

    def output() -> str:  # pread: seeking would move the offset the server writes at (one shared file)
        fd = log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

    try:
        proc, url = start_server(list(args), log, timeout)
    except BenchError as exc:
        text = output()
        log.close()
        raise RuntimeError(f"{exc}:\n{text}") from None
    try:
        yield url, output
    finally:
        stop_server(proc)
        log.close()


def sse_payloads(lines: Iterator[str]) -> Iterator[str]:
    """The data of each SSE event, in order ([DONE] included)."""
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: "):]
