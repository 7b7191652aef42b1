"""The compile governor: while the engine is busy, compile workers get about their share of a core,
freely otherwise, and none is left stopped when it closes."""
import os
import subprocess
import sys
import time

import psutil
import pytest

from structured.compile_governor import CompileGovernor


def cpu_seconds(pid: int) -> float:
    return sum(psutil.Process(pid).cpu_times()[:2])  # user, system


def state(pid: int) -> str:
    return "T" if psutil.Process(pid).status() == psutil.STATUS_STOPPED else "other"


@pytest.fixture
def spinner():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc.pid
    proc.kill()
    proc.wait()


def share_over(pid: int, busy: bool, seconds: float = 1.5) -> float:
    governor = CompileGovernor(lambda: [pid], lambda: busy, share=0.25)
    governor.start()
    start, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    used = (cpu_seconds(pid) - start) / (time.monotonic() - t0)
    governor.close()
    return used


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux job control")
def test_a_busy_engine_caps_the_workers_and_an_idle_one_does_not(spinner):
    free, capped = share_over(spinner, busy=False), share_over(spinner, busy=True)
    assert capped < 0.4, capped  # 0.25 asked; the ticks are 10 ms
    assert capped < 0.6 * free, (capped, free)  # measured beside its free run: holds on a busy machine
    assert state(spinner) != "T"  # closed: running again


def test_closing_continues_what_it_stopped(spinner):
    governor = CompileGovernor(lambda: [spinner], lambda: True, share=0.01)
    governor.start()
    deadline = time.monotonic() + 5
    while not governor.stopped and time.monotonic() < deadline:
        time.sleep(0.001)
    assert governor.stopped == {spinner}
    governor.close()
    assert not governor.stopped
    time.sleep(0.05)
    assert state(spinner) != "T"


def test_a_gone_worker_and_a_bad_share_are_handled():
    governor = CompileGovernor(lambda: [2**22 + 12345], lambda: True, share=0.5)  # no such process
    governor.start()
    time.sleep(0.1)
    governor.close()
    for share in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="share"):
            CompileGovernor(list, bool, share)


def test_a_process_that_exits_while_governing_leaves_no_worker_stopped(spinner):
    script = ("import sys, time\n"
              "from structured.compile_governor import CompileGovernor\n"
              f"g = CompileGovernor(lambda: [{spinner}], lambda: True, share=0.01)\n"
              "g.start()\n"
              "while not g.stopped: time.sleep(0.001)\n"
              "sys.exit(0)\n")  # exits mid-cycle, its worker stopped, without closing the governor
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30, cwd=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    time.sleep(0.05)
    assert state(spinner) != "T"


def test_a_governing_process_killed_outright_leaves_no_worker_stopped(spinner):
    script = ("import os, signal, time\n"
              "from structured.compile_governor import CompileGovernor\n"
              f"g = CompileGovernor(lambda: [{spinner}], lambda: True, share=0.01)\n"
              "g.start()\n"
              "while not g.stopped: time.sleep(0.001)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")  # no atexit, no close: the sentinel must continue it
    subprocess.run([sys.executable, "-c", script], timeout=30)
    deadline = time.monotonic() + 5
    while state(spinner) == "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state(spinner) != "T"
