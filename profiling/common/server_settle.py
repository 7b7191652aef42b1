"""Waiting for a freshly started server to finish its start-up work before a load measures it: our server
answers /health while its chat page still builds and its grammar workers start (seconds of imports on a
thread and in child processes), work that would otherwise take CPU from the first requests."""
from __future__ import annotations

import os
import time

import httpx


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (Linux /proc; 0 where absent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        children = [int(c) for task in os.listdir(f"/proc/{pid}/task")
                    for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
    except (OSError, ValueError, IndexError):
        return 0.0
    return own + sum(tree_cpu_seconds(c) for c in children)


def wait_settled(pid: int, url: str, timeout: float, idle_share: float = 0.05, window: float = 1.0) -> float:
    """Until /health no longer says the chat page is loading and the process tree used under idle_share of
    one core over `window` seconds; returns the seconds waited (at most timeout: then it goes on regardless)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout and _page_loading(url):
        time.sleep(0.25)
    while time.monotonic() - start < timeout:
        before = tree_cpu_seconds(pid)
        time.sleep(window)
        if tree_cpu_seconds(pid) - before < idle_share * window:
            break
    return time.monotonic() - start


def _page_loading(url: str) -> bool:
    health = httpx.get(url + "/health", timeout=5)
    return health.headers.get("content-type", "").startswith("application/json") and \
        health.json().get("chat_page") == "loading"  # vLLM's /health has no body
