"""GrammarService: compiles structures off the engine's step, in a bounded pool of worker processes
(pebble), with a time limit per compile, a bounded queue, and a cache bounded in bytes.

A thread cannot be stopped, and xgrammar's compiler cannot be interrupted: a hostile schema once
compiled for minutes and 2 GB in the server, outliving its client and holding up shutdown. In a
process it is killed (and the worker replaced) when its time runs out or its last waiter leaves.
Requests asking for the same structure at once share one compile. Workers fork from a forkserver
that has imported xgrammar once, so a replacement starts in ~50 ms."""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.util  # registers its exit handler now, so that _close_pools (registered later) runs first
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from structured.cache import GrammarCache
from structured.compile import GrammarBusyError, GrammarError
from structured.compile_governor import CompileGovernor
from structured.compile_worker import compile_serialized, start_worker
from structured.limits import GrammarLimits
from structured.tokenizer_info import tokenizer_info

log = logging.getLogger("cute_serve")
Key = tuple[str, str]  # (kind, text)


@dataclass(eq=False)
class _Job:
    key: Key
    work: Future | None = None  # pebble's future for the worker's run
    waiters: list[Future] = field(default_factory=list)  # one per caller, each cancellable on its own


class GrammarService:
    """One per (tokenizer, vocabulary size); thread-safe. submit() gives each caller a Future of the
    CompiledGrammar; cancel() it when the caller no longer waits."""

    def __init__(self, tokenizer: Any, vocab_size: int, limits: GrammarLimits | None = None) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.limits = limits or GrammarLimits()
        self.cache = GrammarCache(self.limits.cache_bytes)
        self._jobs: dict[Key, _Job] = {}
        self._lock = threading.Lock()
        self._pool: Any = None  # started with the first compile: a server without grammars has no workers
        self._closed = False
        self._governor: CompileGovernor | None = None

    def govern(self, busy: Callable[[], bool]) -> None:
        """While busy() (the engine has requests), the workers get limits.compile_cpu_share of the CPU
        (compile_governor.py); call once, before the first compile."""
        self._governor = CompileGovernor(self.worker_pids, busy, self.limits.compile_cpu_share)

    def submit(self, kind: str, text: str) -> Future:
        """A Future of the compiled grammar; raises GrammarError at once for a structure over the size
        limits, one whose compile already failed, or (GrammarBusyError) a full queue."""
        self.limits.check(kind, text)
        key, waiter = (kind, text), Future()
        hit = self.cache.get(key)  # raises a kept failure
        if hit is not None:
            waiter.set_result(hit)
            return waiter
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                if len(self._jobs) >= self.limits.compile_workers + self.limits.max_queued:
                    raise GrammarBusyError(f"{len(self._jobs)} grammars are compiling or queued, the most this server "
                                           f"takes (--grammar-compile-workers {self.limits.compile_workers}); retry later")
                job = self._jobs[key] = _Job(key)
                job.work = self._schedule(kind, text)
                job.work.add_done_callback(lambda work, job=job: self._finish(job, work))
            job.waiters.append(waiter)
            if self._closed:  # close() came while the pool started and could not stop it
                self._stop_pool()
        return waiter

    def warm(self) -> None:
        """Start the workers now, in the background (seconds: the forkserver imports xgrammar), with the
        any-JSON grammar as their first compile, so a server's first grammar request waits for neither."""
        threading.Thread(target=self._warm_up, name="grammar-warm-up", daemon=True).start()

    def _warm_up(self) -> None:
        try:
            self.submit("json", "")
        except Exception:  # a pool stopped while it started (a server closing at once) fails its start
            if not self._closed:
                raise

    def cancel(self, waiter: Future) -> None:
        """This caller no longer waits; the compile is killed when no other caller waits for it."""
        waiter.cancel()
        with self._lock:
            job = next((j for j in self._jobs.values() if waiter in j.waiters), None)
            if job is None:
                return
            job.waiters.remove(waiter)
            if not job.waiters:
                del self._jobs[job.key]
                job.work.cancel()  # pebble stops the worker running it (or drops it from the queue)

    def compile(self, kind: str, text: str) -> Any:
        """Blocking: the compiled grammar, or GrammarError (offline use: LLM.generate)."""
        return self.submit(kind, text).result()

    @property
    def num_compiling(self) -> int:
        return len(self._jobs)

    def worker_pids(self) -> list[int]:
        """The compile workers' process ids (none before the first compile)."""
        pool = self._pool
        return [] if pool is None else list(pool._pool_manager.worker_manager.workers)

    def close(self, wait: float = 0.2) -> None:
        """Kill the workers; whoever waits gets CancelledError. Idempotent. A pool still starting (the
        warm-up holds the lock for seconds while the forkserver imports) is waited for at most `wait`
        seconds: past that it stops itself once started (submit), so a server exits at once."""
        self._closed = True
        if self._lock.acquire(timeout=wait):
            try:
                self._stop_pool()
            finally:
                self._lock.release()

    def _stop_pool(self) -> None:  # under the lock
        jobs, self._jobs = list(self._jobs.values()), {}
        pool, self._pool = self._pool, None
        if self._governor is not None:
            self._governor.close()  # a stopped worker would hold its SIGTERM until continued
        for job in jobs:
            for waiter in job.waiters:
                waiter.cancel()
        if pool is not None:
            pool.stop()
            pool.join(timeout=5)

    def _schedule(self, kind: str, text: str) -> Future:
        if self._closed:
            raise GrammarError("the server is shutting down")
        if self._pool is None:
            import pebble

            info = tokenizer_info(self.tokenizer, self.vocab_size).serialize_json()
            self._pool = pebble.ProcessPool(self.limits.compile_workers, initializer=start_worker, initargs=(info,),
                                            context=_forkserver())
            _with_pools.add(self)
            if self._governor is not None:
                self._governor.start()
        return self._pool.schedule(compile_serialized, args=(kind, text), timeout=self.limits.compile_seconds)

    def _finish(self, job: _Job, work: Future) -> None:
        """On pebble's thread: deserialize, cache, hand the result (or the failure) to each waiter."""
        try:
            serialized = work.result()
        except CancelledError:
            return  # its waiters left (cancel) or the service closed
        except Exception as exc:  # noqa: BLE001 - each failure becomes a GrammarError for the client
            if self._closed:
                return  # the workers were stopped under it: nobody waits
            result = self._failure(job.key, exc)
        else:
            try:
                result = self._deserialize(serialized)
                self.cache.put(job.key, result, result.memory_size_bytes)
            except Exception as exc:  # noqa: BLE001 - the waiters must hear of it, not hang
                result = self._failure(job.key, exc)
        with self._lock:
            if self._jobs.get(job.key) is job:
                del self._jobs[job.key]
            waiters = list(job.waiters)
        for waiter in waiters:
            if waiter.set_running_or_notify_cancel():
                waiter.set_exception(result) if isinstance(result, Exception) else waiter.set_result(result)

    def _deserialize(self, serialized: str) -> Any:
        import xgrammar as xgr

        return xgr.CompiledGrammar.deserialize_json(serialized, tokenizer_info(self.tokenizer, self.vocab_size))

    def _failure(self, key: Key, exc: Exception) -> GrammarError:
        what = key[0].replace("_", " ")
        if isinstance(exc, GrammarError):
            error = exc
        elif isinstance(exc, FutureTimeout):
            error = GrammarError(f"compiling the {what} took longer than {self.limits.compile_seconds:g} s "
                                 f"(--max-grammar-compile-seconds); it was stopped: simplify it")
        else:  # the worker died (out of memory, a crash in xgrammar): pebble's ProcessExpired
            log.warning("a grammar compile worker died: %s", exc)
            error = GrammarError(f"compiling the {what} failed: the compiler process died ({exc})")
        self.cache.fail(key, error)  # sent again, it fails at once
        return error


_with_pools: weakref.WeakSet[GrammarService] = weakref.WeakSet()  # services that started workers


@atexit.register
def _close_pools() -> None:
    """At exit every pool is stopped: multiprocessing's exit handler would join its idle workers forever."""
    for service in list(_with_pools):
        service.close(wait=30)


def _forkserver() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    # __main__ too: else every worker, forked or replaced, imports the main module again (seconds)
    ctx.set_forkserver_preload(["__main__", "structured.compile_worker", "xgrammar"])
    return ctx


_services: dict[tuple[int, int], GrammarService] = {}  # id(tokenizer), vocab size -> its service
MAX_SERVICES = 4


def service_for(tokenizer: Any, vocab_size: int) -> GrammarService:
    """The service compiling over this tokenizer: the server's (use_service), else a default one."""
    key = (id(tokenizer), vocab_size)
    service = _services.get(key)
    if service is None or service.tokenizer is not tokenizer:
        service = use_service(GrammarService(tokenizer, vocab_size))
    return service


def use_service(service: GrammarService) -> GrammarService:
    """Make service the one for its tokenizer (the server's, with its flags); the one it replaces, and
    the oldest beyond MAX_SERVICES, are closed."""
    old = _services.pop((id(service.tokenizer), service.vocab_size), None)
    if old is not None and old is not service:
        old.close()
    _services[(id(service.tokenizer), service.vocab_size)] = service
    while len(_services) > MAX_SERVICES:
        _services.pop(next(iter(_services))).close()
    return service
