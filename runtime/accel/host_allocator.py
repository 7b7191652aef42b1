"""Keep glibc malloc from handing step-sized buffers back to the kernel between forward passes.

A CPU forward pass allocates and frees many temporaries of a few MB (a 1024-token chunk's MLP
activations are 6-12 MB). With glibc's defaults freed memory at the top of the heap is trimmed
back to the kernel, and large blocks are mmap'ed afresh, so the next step page-faults all of it in
again. Raising the trim threshold and the top pad keeps that memory mapped. Measured:
profiling/benchmarks/bench_offline.py went from ~120 to ~136 useful tok/s on 2 cores. vLLM's CPU recipe gets
the same effect by preloading tcmalloc. Set CUTE_SERVE_MALLOC_TUNING=0 to keep glibc's defaults.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("cute_serve")

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of freed heap mapped
TOP_PAD = 64 << 20  # grow the heap in 64 MiB steps
MMAP_THRESHOLD = 32 << 20  # glibc's maximum: blocks up to 32 MiB come from the heap

_done = False


def tune_host_allocator() -> bool:
    """Apply the settings once per process (glibc only); True when they are in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("CUTE_SERVE_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    ok = all(mallopt(param, value) == 1 for param, value in
             ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
    if not ok:
        log.warning("mallopt refused the host allocator settings; keeping glibc's defaults")
    _done = ok
    return ok
