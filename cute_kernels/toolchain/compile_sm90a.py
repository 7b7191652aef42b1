"""Compile one kernel object for sm_90a against fake arguments, optionally keeping its PTX and cubin
(what the compile check reads). Needs the DSL; every kernel's compile module calls it."""
from __future__ import annotations

import tempfile
from typing import Any

import cutlass.cute as cute

from .compile_cache import CompiledKernel, timed

TARGET_ARCH = "sm_90a"


def compile_sm90a(kernel: Any, args: tuple, name: str, keep_artifacts: bool = False) -> CompiledKernel:
    """cute.compile(kernel, *args) for sm_90a; with keep_artifacts the PTX text and cubin bytes too."""
    options = f"--gpu-arch {TARGET_ARCH}"
    if not keep_artifacts:
        fn, seconds = timed(lambda: cute.compile(kernel, *args, options=options))
        return CompiledKernel(fn, seconds)
    with tempfile.TemporaryDirectory(prefix="cute_dump_") as dump_dir:
        options += f" --keep-ptx --keep-cubin --dump-dir {dump_dir}"
        fn, seconds = timed(lambda: cute.compile(kernel, *args, options=options))
        artifacts = {"ptx": fn.artifacts.PTX, "cubin": fn.artifacts.CUBIN}
    if not isinstance(artifacts["cubin"], (bytes, bytearray)):
        raise RuntimeError(f"{name}: the DSL kept no cubin ({artifacts['cubin']!r})")
    return CompiledKernel(fn, seconds, artifacts)
