"""The threads that fill grammar masks beside the forward pass, and the demotion of a late one.

A fill cannot be interrupted (xgrammar's C++ runs to the end), and an ambiguous grammar's fill runs
for minutes after its sequence has ended, at normal priority holding a core against the engine's
threads. `demote` moves the thread of a fill that missed its step into Linux's idle scheduling class,
where it runs only on a core the engine leaves free (as the compile workers do,
structured/compile_worker.py). A thread that cannot return to normal priority afterwards (an
unprivileged process may not leave SCHED_IDLE) exits, and the next submit starts a fresh thread in
its place (from the submitting thread: a new thread inherits its creator's class), so a demotion
never outlives its fill.

Measured beside two clients sending the 27-byte ambiguous grammar (bench_structured.py --adversarial
--kinds "ambiguous grammar"): plain requests' TPOT p50 2.39x idle's before, 2.23x after, so most of
that cost lies elsewhere (the masks in time but slow, each waited for)."""
from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

_IDLE = getattr(os, "SCHED_IDLE", None)  # Linux only: elsewhere a late fill keeps its priority


class FillerPool:
    def __init__(self, threads: int, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._name = name
        self._lock = threading.Lock()
        self._demoted: set[int] = set()  # native ids of threads moved to SCHED_IDLE, until their fill ends
        self._started = 0
        self._missing = threads  # threads to start: at first, and in place of those that left

    def submit(self, fn: Callable[[], Any]) -> tuple[Future, list[int]]:
        """Run fn on a filler thread; returns its Future and a list that holds the thread's native id
        once fn has started (for demote)."""
        future: Future = Future()
        where: list[int] = []
        with self._lock:
            missing, self._missing = self._missing, 0
        for _ in range(missing):
            self._spawn()
        self._jobs.put((fn, future, where))
        return future, where

    def demote(self, where: list[int]) -> bool:
        """Move the thread running that job into the idle class; False if it already ended or cannot."""
        with self._lock:
            if not where or _IDLE is None:
                return False
            tid = where[0]
            try:
                os.sched_setscheduler(tid, _IDLE, os.sched_param(0))
            except OSError:  # the thread ended meanwhile
                return False
            self._demoted.add(tid)
            return True

    def is_demoted(self, tid: int) -> bool:
        with self._lock:
            return tid in self._demoted

    def _spawn(self) -> None:
        self._started += 1
        threading.Thread(target=self._work, name=f"{self._name}_{self._started}", daemon=True).start()

    def _work(self) -> None:
        tid = threading.get_native_id()
        while True:
            fn, future, where = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                where.append(tid)
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001  the waiter sees it, the thread lives on
                future.set_exception(exc)
            with self._lock:
                where.clear()
                if tid not in self._demoted:
                    continue
                self._demoted.discard(tid)
                try:
                    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                    continue
                except OSError:  # not allowed back: leave; the next submit starts a thread in its place
                    self._missing += 1
                    return
