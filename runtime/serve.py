"""python -m runtime.serve: the OpenAI-compatible server (FastAPI under uvicorn) over one engine.

Binds 127.0.0.1 unless --host says otherwise. Start-up shows a progress bar while loading, the KV
memory ledger, and the URLs to open.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import logging
import os
import socket
import sys
import threading
from typing import TYPE_CHECKING, Iterator

from tqdm import tqdm

from runtime.cli import run_main, setup_logging
from runtime.engine_config import add_engine_args, config_from_args, parse_bytes
from runtime.errors import UserError
from runtime.server.options import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TOKENS,
    DETAILED_MODULES,
    LOCAL_HOSTS,
    ServerOptions,
    allowed_hosts,
    check_tracing_flags,
    host_header_name,
)
from structured.limits import SLOW_MASKS, GrammarLimits, MiB

if TYPE_CHECKING:
    from fastapi import FastAPI

    from runtime.server.async_engine import AsyncEngine
    from runtime.server.late_page import MountPage

DEFAULT_MAX_QUEUE = 1024
DEFAULT_SHUTDOWN_GRACE = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runtime.serve", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--api-key", default=os.environ.get("CUTE_SERVE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route but /health; the chat page asks for it "
                        "once (default: $CUTE_SERVE_API_KEY, else none)")
    p.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key")
    p.add_argument("--allowed-hosts", nargs="+", default=[], metavar="HOST",
                   help="Host header names answered besides localhost, 127.0.0.1, [::1] and --host ('*': any); "
                        "others get 400, which stops DNS rebinding")
    p.add_argument("--allowed-origins", nargs="+", default=[], metavar="ORIGIN",
                   help="origins (e.g. http://localhost:3000, or '*') whose web pages may call the API (CORS); "
                        "default: none")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help=f"largest request body; larger ones get HTTP 413 (default: {DEFAULT_MAX_REQUEST_BYTES})")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT,
                   help=f"seconds a client may take to send its request body; then HTTP 408 "
                        f"(default: {DEFAULT_BODY_TIMEOUT:g})")
    p.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"max_tokens of a request that sets none, within what is left of the context; 0: all "
                        f"of it, as vLLM (default: {DEFAULT_MAX_TOKENS})")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the file's name)")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help=f"sequences that may wait beyond a full batch (--max-num-seqs); more get HTTP 429 "
                        f"(default: {DEFAULT_MAX_QUEUE})")
    p.add_argument("--shutdown-grace", type=float, default=DEFAULT_SHUTDOWN_GRACE,
                   help=f"on SIGTERM/SIGINT, seconds requests in flight may finish before they are aborted "
                        f"(default: {DEFAULT_SHUTDOWN_GRACE:g})")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--tool-call-parser", default="hermes", choices=["hermes", "json"],
                   help="how tool_choice auto reads calls from text (default: hermes, <tool_call>{json}</tool_call>)")
    p.add_argument("--reasoning-parser", default=None, choices=["deepseek_r1", "qwen3"],
                   help="split the model's <think>...</think> into reasoning_content (default: none)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file (or the template text itself) in place of the model's")
    p.add_argument("--no-chat-page", action="store_true",
                   help="serve the API only, no browser chat at / (a replica behind a router: no gradio import)")
    p.add_argument("--embedding-pooling", default="mean", choices=["mean", "last"],
                   help="how /v1/embeddings pools a prompt's final hidden states: the mean of its tokens, or its "
                        "last token; either scaled to unit length (default: mean)")
    p.add_argument("--strict-api", action="store_true",
                   help="answer unknown request fields with HTTP 400 (default: ignore them, named in a warning)")
    p.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="access log: uvicorn's text lines (default), or one JSON object per request on stdout "
                        "(request id, route, status, tokens, TTFT, e2e, disconnects)")
    p.add_argument("--log-prompts", action="store_true", help="JSON access lines carry the prompt or messages "
                                                              "(default: never the request's text)")
    p.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                   help='export a span per request over OTLP/HTTP, e.g. http://HOST:4318/v1/traces (needs '
                        'pip install -e ".[otel]")')
    p.add_argument("--collect-detailed-traces", default=None, nargs="+", metavar="{" + ",".join(DETAILED_MODULES) + "}",
                   help="also span each engine step and its phases under the request's span (any of vLLM's "
                        "values turns it on; needs --otlp-traces-endpoint)")
    add_grammar_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    if args.max_queue < 0:
        p.error("--max-queue must be >= 0")
    if args.max_request_bytes < 1:
        p.error("--max-request-bytes must be >= 1")
    if args.default_max_tokens < 0:
        p.error("--default-max-tokens must be >= 0")
    if not args.body_timeout > 0 or not args.shutdown_grace >= 0:
        p.error("--body-timeout must be > 0 and --shutdown-grace >= 0")
    if not 0 <= args.port <= 65535:
        p.error("--port must be in [0, 65535]")
    detailed = [m for value in args.collect_detailed_traces or [] for m in value.split(",") if m]  # as vLLM: either
    if unknown := set(detailed) - set(DETAILED_MODULES):
        p.error(f"--collect-detailed-traces: unknown {', '.join(sorted(unknown))} (choose from "
                f"{', '.join(DETAILED_MODULES)})")
    if args.log_prompts and args.log_format != "json":
        p.error("--log-prompts needs --log-format json")
    args.otlp_traces_endpoint = check_tracing_flags(args.otlp_traces_endpoint, detailed)  # UserError: one line
    check_grammar_args(p, args)
    return args


def add_grammar_args(p: argparse.ArgumentParser) -> None:
    """Structured output's budgets: what one request's grammar may cost the server."""
    g = GrammarLimits()
    p.add_argument("--max-grammar-compile-seconds", type=float, default=g.compile_seconds,
                   help=f"a grammar (JSON schema, regex, EBNF, choices) compiling longer is stopped and the request "
                        f"gets HTTP 400 (default: {g.compile_seconds:g})")
    p.add_argument("--grammar-compile-workers", type=int, default=g.compile_workers,
                   help=f"processes compiling grammars at once, niced, off the engine's step; up to "
                        f"{g.max_queued} more wait, beyond that HTTP 429 (default: {g.compile_workers})")
    p.add_argument("--grammar-compile-cpu-share", type=float, default=g.compile_cpu_share,
                   help=f"the fraction of the CPU the compile workers get while the engine has requests, by "
                        f"stopping and continuing them; 1: no cap (default: {g.compile_cpu_share:g})")
    p.add_argument("--max-grammar-bytes", type=int, default=g.max_bytes,
                   help=f"largest schema, regex, grammar or list of choices, in bytes; larger: HTTP 400 "
                        f"(default: {g.max_bytes})")
    p.add_argument("--grammar-cache-bytes", type=parse_bytes, default=g.cache_bytes,
                   help=f"compiled grammars kept for reuse, by their memory (default: {g.cache_bytes // MiB}MiB)")
    p.add_argument("--max-mask-wait-ms", type=float, default=g.mask_wait_ms,
                   help=f"how long a step waits past its forward pass for a request's grammar mask; a request "
                        f"whose mask is later ends with an error instead of slowing the batch "
                        f"(default: {g.mask_wait_ms:g})")
    p.add_argument("--max-mask-cpu-ms", type=float, default=g.mask_cpu_ms,
                   help=f"the CPU time a request's grammar mask may take while other requests share its steps; a "
                        f"request whose masks take more, {SLOW_MASKS} times in a row, ends with an error "
                        f"(default: {g.mask_cpu_ms:g})")


def check_grammar_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if min(args.max_grammar_compile_seconds, args.max_mask_wait_ms, args.max_mask_cpu_ms) <= 0:
        p.error("--max-grammar-compile-seconds, --max-mask-wait-ms and --max-mask-cpu-ms must be > 0")
    if args.grammar_compile_workers < 1 or args.max_grammar_bytes < 1 or args.grammar_cache_bytes < 0:
        p.error("--grammar-compile-workers and --max-grammar-bytes must be >= 1, --grammar-cache-bytes >= 0")
    if not 0 < args.grammar_compile_cpu_share <= 1:
        p.error(f"--grammar-compile-cpu-share must be in (0, 1], not {args.grammar_compile_cpu_share:g}")


def grammar_limits(args: argparse.Namespace) -> GrammarLimits:
    return GrammarLimits(max_bytes=args.max_grammar_bytes, compile_seconds=args.max_grammar_compile_seconds,
                         compile_workers=args.grammar_compile_workers, cache_bytes=args.grammar_cache_bytes,
                         mask_wait_ms=args.max_mask_wait_ms, mask_cpu_ms=args.max_mask_cpu_ms,
                         compile_cpu_share=args.grammar_compile_cpu_share)


def server_options(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(api_key=args.api_key or None, metrics_public=args.metrics_public,
                         allowed_hosts=allowed_hosts(args.host, args.allowed_hosts),
                         allowed_origins=tuple(args.allowed_origins), max_request_bytes=args.max_request_bytes,
                         body_timeout=args.body_timeout, default_max_tokens=args.default_max_tokens,
                         tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                         strict_api=args.strict_api, log_format=args.log_format, log_prompts=args.log_prompts,
                         otlp_traces_endpoint=args.otlp_traces_endpoint,
                         detailed_traces=bool(args.collect_detailed_traces),
                         grammar=grammar_limits(args), embedding_pooling=args.embedding_pooling)


def model_name(path: str) -> str:
    """'.../SmolLM2-135M-Instruct.Q4_1.gguf' -> 'SmolLM2-135M-Instruct.Q4_1'; a folder -> its name."""
    base = os.path.basename(os.path.normpath(path))
    return base[:-5] if base.endswith(".gguf") else base


def start_engine(args: argparse.Namespace, chat_template: str | None = None) -> tuple["AsyncEngine", str, dict]:
    """Load with a progress bar (one step per stage), warm up, then reset the counters: (the engine,
    the model's path, its sampling defaults). chat_template replaces the model's.

    (Heavy imports live here and in main, so --help and a taken port answer at once.)
    """
    from runtime.build import build_engine, parallel_layout
    from runtime.llm import LLM
    from runtime.load import load_model, model_sampling_defaults
    from runtime.sampling_params import SamplingParams
    from runtime.server.async_engine import AsyncEngine

    config = config_from_args(args)
    config.log_ledger = False  # printed below, after the bar
    parallel_layout(config)  # a launcher's world that the flags disagree with: before the weights load
    # Loading is small torch copies and one warm-up step: one thread does them as fast on an idle
    # machine, while on a busy one each parallel region waits for a second core to be free (the
    # engine build took 0.3-2.3 s on 2 threads at load average ~5, 0.09 s on one). Tensor
    # parallelism sets its ranks' threads itself.
    single = config.tensor_parallel_size * config.pipeline_parallel_size == 1
    with intra_op_threads(1 if single else None), \
            tqdm(total=3, desc="loading", unit="stage", file=sys.stderr) as bar:
        bar.set_postfix_str("weights and tokenizer")
        model_config, tensors, tokenizer, path = load_model(args.model)
        tokenizer = tokenizer.with_chat_template(chat_template) if chat_template else tokenizer
        defaults = model_sampling_defaults(path, config.generation_config, model_config.vocab_size)
        bar.update()
        bar.set_postfix_str("engine and KV cache")
        engine = build_engine(config, model_config, tensors, tokenizer)
        bar.update()
        bar.set_postfix_str("warm-up")
        # one step: a one-token prompt already takes the decode path a second step would repeat
        LLM.from_engine(engine).generate([[tokenizer.bos_token_id or 0]], SamplingParams(max_tokens=1, ignore_eos=True),
                                         use_tqdm=False)
        engine.reset_stats()  # /metrics counts what clients asked for, not the warm-up
        bar.update()
    return AsyncEngine(engine, max_queue=args.max_queue), path, defaults


@contextlib.contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads (and so the C kernels') set to n inside, restored after; None: as they are."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n is not None:
            torch.set_num_threads(before)


def bind(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a taken port fails in a second, not after the load.

    The socket is made with proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets, and
    without it each streamed chunk can wait ~40 ms for a delayed ACK (Nagle).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def import_in_background(*modules: str) -> threading.Thread:
    """Start importing `modules` on a thread. A failed import is left for the code that uses the
    module to report."""
    def run() -> None:
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - re-raised where the module is used
                pass

    thread = threading.Thread(target=run, name="imports", daemon=True)
    thread.start()
    return thread


def prepare_chat_page(app: "FastAPI", async_engine: "AsyncEngine") -> "MountPage":
    """create_app's UI hook, on the page's thread once /health answers: gradio's import (seconds of
    Python that holds the GIL) no longer delays the API."""
    from app.ui import prepare_chat_ui

    mount = prepare_chat_ui(app, async_engine)
    # structured output's, else paid by the first request with a grammar; after gradio's, so no two
    # threads import one package
    import_in_background("xgrammar")
    return mount


def headless_rank(args: argparse.Namespace) -> int | None:
    """A launched rank other than 0 (torchrun): no HTTP, its part of the model and rank 0's steps, until
    rank 0 stops or goes away (exit code 1). None: this process is the engine."""
    if os.environ.get("RANK", "0") == "0" or args.distributed_executor_backend == "mp":
        return None
    from runtime.build import parallel_layout, serve_launched_rank
    from runtime.load import load_model

    config = config_from_args(args)
    _, launch = parallel_layout(config)
    if launch is None:
        return None
    model_config, tensors, _, _ = load_model(args.model)
    try:
        serve_launched_rank(config, model_config, tensors, launch)
    except RuntimeError as exc:  # rank 0 (or a peer) went away mid-run
        print(f"rank {launch.rank}: stopped: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper()))
    if (code := headless_rank(args)) is not None:
        return code
    # Start-up makes ~350k objects the cyclic collector tracks, nearly all living as long as the
    # server (modules, classes, the vocabulary): it would scan them again and again, ~8% of a warm
    # start's CPU time. Off until the app is built, then they are frozen out of its reach.
    gc.disable()
    import uvicorn

    from runtime.load import describe
    from runtime.server.app import create_app
    from runtime.server.shutdown import GracefulServer
    from runtime.tokenizer.template_source import load_chat_template

    template = load_chat_template(args.chat_template) if args.chat_template else None
    sock = bind(args.host, args.port)
    async_engine, path, defaults = start_engine(args, template)

    name = args.served_model_name or model_name(path)
    options = dataclasses.replace(server_options(args), sampling_defaults=defaults)
    app = create_app(async_engine, name, options, None if args.no_chat_page else prepare_chat_page)
    about = async_engine.describe()
    host = "127.0.0.1" if args.host in ("0.0.0.0", "") else f"[{args.host}]" if ":" in args.host else args.host
    base = f"http://{host}:{sock.getsockname()[1]}"
    print(f"model: {name} ({path}), context {async_engine.limits.max_model_len} tokens, {about['device']} "
          f"{about['dtype']}", file=sys.stderr)
    print(about["memory ledger"], file=sys.stderr)
    if defaults:
        print(f"sampling defaults from generation_config.json, for requests that set none: {describe(defaults)} "
              f"(--generation-config vllm: none)", file=sys.stderr)
    page = "" if args.no_chat_page else f"chat page: {base}/ (in a few seconds)   "
    print(f"{page}API: {base}/v1   docs: {base}/docs   metrics: {base}/metrics", file=sys.stderr, flush=True)
    if host_header_name(args.host) is None and not args.allowed_hosts:  # listening everywhere, answering locally
        print(f"note: only the Host names {', '.join(LOCAL_HOSTS)} are answered; name this machine's with "
              f"--allowed-hosts", file=sys.stderr, flush=True)
    compiles = app.state.server.compiles
    config = uvicorn.Config(app, log_level=args.log_level, access_log=args.log_format == "text")
    server = GracefulServer(config, async_engine, args.shutdown_grace, compiles)
    gc.freeze()
    gc.enable()
    try:
        with async_engine:
            server.run(sockets=[sock])
    finally:
        app.state.server.close()  # the last traces go out
        compiles.service.close()  # its worker processes, a compile still running among them
    return 0


if __name__ == "__main__":
    run_main(main, "runtime.serve")
