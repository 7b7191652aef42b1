"""Caps what the grammar compile workers take of the CPU while the engine has work: a duty cycle of
SIGCONT / SIGSTOP over the worker processes, `share` of every PERIOD_S running.

Why: SCHED_IDLE (compile_worker.py) only hands a core back when an engine thread wakes. On a 2-core
server the engine's OpenMP threads sleep at every one of a step's barriers and between steps, so an
idle-class compile ran in each gap and cost the step a wake-up and a cold cache: while hostile schemas
compiled, the engine's compute threads got 6.4-7.5 core-seconds per 10 s instead of 8.3-8.8, and plain
requests' TPOT p99 rose 1.3-2.0x. Stopped, a worker cannot run in the gaps at all. A cgroup CPU quota
would do the same without signals, but a server in a container can rarely create one.

With no engine work, or no compile, workers run freely. A compile's time limit stays wall time: under
load a compile of c CPU-seconds needs about c / share of it.

A process that dies while its workers are stopped would leave them stopped for good (a killed server's
workers sat in state T under their forkserver). So the governor tells a sentinel process, started with
nothing but a pipe from it, which workers it stops; when the pipe closes, whatever killed the server,
the sentinel continues them (they then find their pool gone and exit).
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

PERIOD_S = 0.04  # short against a compile's seconds, long against a signal's microseconds
# reads lines of pids; at end of input (its parent gone) continues the last ones
SENTINEL = ("import os, signal, sys\n"
            "pids = []\n"
            "for line in sys.stdin:\n"
            "    pids = [int(p) for p in line.split()]\n"
            "for pid in pids:\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGCONT)\n"
            "    except OSError:\n"
            "        pass\n")


class CompileGovernor:
    def __init__(self, pids: Callable[[], list[int]], busy: Callable[[], bool], share: float) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"the compile CPU share must be in (0, 1], not {share}")
        self.pids, self.busy, self.share = pids, busy, share
        self.stopped: set[int] = set()  # workers this governor stopped and has not continued
        self._quit = threading.Event()
        self._thread: threading.Thread | None = None
        self._sentinel: subprocess.Popen | None = None
        self._told: list[int] = []  # the pids the sentinel last heard of

    def start(self) -> None:
        if self.share < 1.0 and self._thread is None:
            self._sentinel = subprocess.Popen([sys.executable, "-c", SENTINEL], stdin=subprocess.PIPE, text=True,
                                              start_new_session=True)  # a terminal's ^C reaches the server only
            self._thread = threading.Thread(target=self._run, name="grammar-compile-governor", daemon=True)
            self._thread.start()
            # a daemon thread dies at exit wherever it is: workers it had stopped would stay stopped for good
            atexit.register(self.close)

    def close(self) -> None:
        """Stop governing; every worker it stopped runs again (so it can be killed or finish)."""
        self._quit.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self._signal(list(self.stopped), signal.SIGCONT)
        if self._sentinel is not None and self._sentinel.stdin is not None:
            self._sentinel.stdin.close()
            self._sentinel.wait(timeout=5)

    def _run(self) -> None:
        on, off = PERIOD_S * self.share, PERIOD_S * (1.0 - self.share)
        while not self._quit.is_set():
            self._signal(list(self.stopped), signal.SIGCONT)
            pids = self.pids()
            if self._quit.wait(on if pids else PERIOD_S):  # no worker (yet): nothing to time
                break
            if pids and self.busy():
                self._tell(sorted(set(pids)))
                self._signal(pids, signal.SIGSTOP)
                self._quit.wait(off)
        self._signal(list(self.stopped), signal.SIGCONT)

    def _tell(self, pids: list[int]) -> None:
        """Let the sentinel know which workers may be stopped, before they are."""
        if pids != self._told and self._sentinel is not None:
            try:
                self._sentinel.stdin.write(" ".join(map(str, pids)) + "\n")
                self._sentinel.stdin.flush()
            except (OSError, ValueError):  # the sentinel is gone (killed) or closed: stopping goes on
                pass
            self._told = pids

    def _signal(self, pids: list[int], sig: signal.Signals) -> None:
        for pid in set(pids):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # the worker was replaced (killed at its time limit, or its client left)
                pass
            if sig == signal.SIGSTOP:
                self.stopped.add(pid)
            else:
                self.stopped.discard(pid)
