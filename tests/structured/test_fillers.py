"""Mask filler threads: a late fill is moved to the idle scheduling class while it runs on, and no
thread stays there after its fill: it returns to normal priority, or, where it may not, is replaced."""
import os
import threading
import time

import pytest

from structured import fillers
from structured.fillers import FillerPool

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's scheduling classes")


def busy(release: threading.Event) -> int:
    release.wait(10)
    return threading.get_native_id()


def pool_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name + "_")]


def test_a_demoted_fill_runs_idle_class_and_its_thread_returns_to_normal_after():
    pool, release = FillerPool(2, "fill-a"), threading.Event()
    future, where = pool.submit(lambda: busy(release))
    while not where:
        time.sleep(0.001)
    assert pool.demote(where) and os.sched_getscheduler(where[0]) == os.SCHED_IDLE
    tid = where[0]
    release.set()
    assert future.result(10) == tid
    deadline = time.monotonic() + 5
    while pool.is_demoted(tid) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert all(os.sched_getscheduler(t.native_id) == os.SCHED_OTHER for t in pool_threads("fill-a"))
    assert not pool.demote(where)  # its job is over: nothing left to demote
    assert pool.submit(lambda: 7)[0].result(5) == 7


def test_a_thread_not_allowed_back_to_normal_priority_is_replaced(monkeypatch):
    real = os.sched_setscheduler

    def unprivileged(pid, policy, param):
        if policy == os.SCHED_OTHER:
            raise PermissionError("an unprivileged thread may not leave SCHED_IDLE")
        return real(pid, policy, param)

    monkeypatch.setattr(fillers.os, "sched_setscheduler", unprivileged)
    pool, release = FillerPool(1, "fill-b"), threading.Event()
    future, where = pool.submit(lambda: busy(release))
    while not where:
        time.sleep(0.001)
    old = where[0]
    leaving = next(t for t in pool_threads("fill-b") if t.native_id == old)
    assert pool.demote(where)
    release.set()
    future.result(10)
    leaving.join(5)
    assert not leaving.is_alive()
    assert pool.submit(threading.get_native_id)[0].result(5) != old  # a fresh thread ran it
    assert [os.sched_getscheduler(t.native_id) for t in pool_threads("fill-b")] == [os.SCHED_OTHER]
