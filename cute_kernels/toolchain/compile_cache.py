"""In-memory cache of compiled kernels, keyed on everything a kernel is specialized on.

`cute.compile` regenerates MLIR on every call and does not use its disk cache, so a server must
compile each variant once (ideally at start) and reuse it. The key is the kernel's frozen spec
dataclass plus the target arch; runtime sizes (batch, lengths, blocks) are never part of it.
`cute.compile` is not thread-safe, hence one lock around compiles.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable


@dataclass
class CompiledKernel:
    fn: Any  # the DSL's compiled callable
    compile_seconds: float
    artifacts: dict[str, Any] = field(default_factory=dict)  # "ptx" / "cubin" when kept


class CompileCache:
    def __init__(self, compile_fn: Callable[[Hashable], CompiledKernel]):
        self._compile_fn = compile_fn
        self._entries: dict[Hashable, CompiledKernel] = {}
        self._lock = threading.Lock()
        self.compiles = 0  # how many times compile_fn ran (tests assert reuse)

    def get(self, key: Hashable) -> CompiledKernel:
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._compile_fn(key)
                self._entries[key] = entry
                self.compiles += 1
        return entry

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def compile_sm90(kernel: Any, args: tuple, name: str, keep_artifacts: bool = False) -> CompiledKernel:
    """cute.compile(kernel, *args) for sm_90a (the DSL's default would be sm_100a); with keep_artifacts
    the PTX text and cubin bytes come back too (the compile check reads the SASS)."""
    import tempfile

    import cutlass.cute as cute

    options = "--gpu-arch sm_90a"
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
