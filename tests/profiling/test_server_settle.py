"""profiling/common/server_settle.py: a load waits until a fresh server's start-up work is done, read from the
CPU time of its whole process tree (a real busy child here, as a server's grammar workers are)."""
import subprocess
import sys
import time

import httpx
import pytest

from profiling.common.server_settle import tree_cpu_seconds, wait_settled

BUSY_THEN_IDLE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile time.process_time() < 1.5: pass\\ntime.sleep(60)"])
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_wait_settled_waits_out_a_busy_descendant(monkeypatch):
    monkeypatch.setattr(httpx, "get", lambda *a, **k: httpx.Response(200, json={"status": "ok"}))
    proc = subprocess.Popen([sys.executable, "-c", BUSY_THEN_IDLE])
    try:
        time.sleep(0.3)
        start = time.monotonic()
        waited = wait_settled(proc.pid, "http://127.0.0.1:1", timeout=30, window=1.0)
        assert 1.0 <= time.monotonic() - start < 30 and waited < 30  # the grandchild burned 1.5 s of CPU first
        assert tree_cpu_seconds(proc.pid) >= 1.4  # its CPU counts toward the tree
        before = tree_cpu_seconds(proc.pid)
        time.sleep(0.5)
        assert tree_cpu_seconds(proc.pid) - before < 0.1  # and it is idle now
    finally:
        proc.kill()
        proc.wait()


def test_a_gone_process_counts_no_cpu():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert tree_cpu_seconds(proc.pid) == 0.0
