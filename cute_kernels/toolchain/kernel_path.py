"""Where the cute kernels come from in this process: "jit" or "aot".

- "jit": nvidia-cutlass-dsl is installed; kernels compile on first use (prefill_compile).
- "aot": no DSL (a locked-down GPU box, or a fast server start): the library that
  `python -m cute_kernels.aot` linked ahead of time (aot_loader), from build/aot or $CUTE_AOT_DIR.
$CUTE_KERNELS_PATH=jit|aot forces one; the default "auto" takes jit when the DSL is importable.
"""
from __future__ import annotations

import functools
import importlib.util
import os

KERNEL_PATHS = ("auto", "jit", "aot")


@functools.lru_cache(maxsize=1)
def dsl_installed() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def kernel_path() -> str:
    """'jit' or 'aot': how launch_prefill gets its kernels in this process."""
    choice = os.environ.get("CUTE_KERNELS_PATH", "auto").lower()
    if choice not in KERNEL_PATHS:
        raise ValueError(f"CUTE_KERNELS_PATH={choice!r}: choose one of {KERNEL_PATHS}")
    if choice == "auto":
        return "jit" if dsl_installed() else "aot"
    return choice


def kernels_unavailable_reason() -> str | None:
    """None when kernel_path()'s kernels can be launched here (GPU permitting), else why not."""
    path = kernel_path()
    if path == "jit":
        if not dsl_installed():
            return "nvidia-cutlass-dsl is not installed (pip install 'cute-serve[hopper]')"
        return None
    from .aot_loader import AotUnavailable, get_prefill_kernels

    try:
        get_prefill_kernels()
    except AotUnavailable as exc:
        return f"no usable AOT kernels: {exc}"
    return None
