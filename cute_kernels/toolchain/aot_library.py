"""Open the ahead-of-time kernel library WITHOUT the DSL: ctypes over the .so that
`python -m cute_kernels.aot` linked. Family-neutral: the ABI check, error names, per-variant load and
entry points; each family's launcher (e.g. toolchain/aot_loader.py for prefill) subclasses AotLibrary
with its args struct and launch.

Per process: open the first library of the manifest that loads: the one needing libcudart.so.13
(so the kernels share torch cu13x's CUDA runtime, the one already proven on this driver), else the
one with cudart linked in; load each variant's cubin onto the devices on first use; then each
launch is one ctypes call with raw pointers, sizes, strides and torch's current stream.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from pathlib import Path
from typing import Any, TypeVar

from .aot_manifest import ABI_VERSION, default_aot_dir, read_manifest


class AotUnavailable(RuntimeError):
    """No usable AOT kernels here (none built, stale, or the library does not load); says why."""


def _preload_shared_cudart() -> None:
    """The 'shared' library needs libcudart.so.13: torch cu13x has usually loaded it; else find its wheel's."""
    candidates = ["libcudart.so.13"] + [str(p) for s in sys.path if s
                                          for p in [Path(s) / "nvidia" / "cu13" / "lib" / "libcudart.so.13"] if p.is_file()]
    for candidate in candidates:
        try:
            ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


class AotLibrary:
    """One opened library: per-variant load (once) and entry points."""

    family = "kernel"  # subclasses: the family name, for error messages

    def __init__(self, path: Path, manifest: dict, lib: Any = None):
        """`lib`: an already opened library (tests pass a mock with the same C signatures)."""
        self.path, self.manifest = path, manifest
        self.lib = lib if lib is not None else ctypes.CDLL(str(path))
        for fn, restype in (("cute_aot_abi_version", ctypes.c_int32), ("cute_aot_error_name", ctypes.c_char_p),
                            ("cute_aot_error_string", ctypes.c_char_p)):
            getattr(self.lib, fn).restype = restype
        self.lib.cute_aot_error_name.argtypes = self.lib.cute_aot_error_string.argtypes = [ctypes.c_int32]
        abi = self.lib.cute_aot_abi_version()
        if abi != ABI_VERSION:
            raise AotUnavailable(f"{path}: ABI {abi}, loader expects {ABI_VERSION}")
        self.variants = frozenset(manifest["variants"])
        self._loaded: set[str] = set()
        self._lock = threading.Lock()

    def check_args_size(self, symbol: str, struct: type) -> None:
        """The library's `symbol()` (sizeof its C args struct) must equal the ctypes mirror's size."""
        fn = getattr(self.lib, symbol)
        fn.restype = ctypes.c_int32
        if fn() != ctypes.sizeof(struct):
            raise AotUnavailable(f"{self.path}: {symbol}() = {fn()} B, loader expects {ctypes.sizeof(struct)} B")

    def error(self, code: int) -> str:
        return f"{self.lib.cute_aot_error_name(code).decode()} ({code}): {self.lib.cute_aot_error_string(code).decode()}"

    def entry(self, variant: str, suffix: str, argtypes: list) -> Any:
        if variant not in self.variants:
            raise AotUnavailable(f"{variant} is not among the AOT kernels in {self.path.parent} "
                                 f"(have {sorted(self.variants)})")
        fn = getattr(self.lib, f"cute_aot_{variant}_{suffix}")  # ctypes caches the function object
        fn.restype = ctypes.c_int32
        fn.argtypes = argtypes
        return fn

    def load(self, variant: str) -> None:
        """Load the variant's cubin onto every device (once; thread-safe: ctypes drops the GIL)."""
        if variant in self._loaded:
            return
        with self._lock:
            if variant in self._loaded:
                return
            err = self.entry(variant, "load", [])()
            if err:
                raise RuntimeError(f"{self.family} AOT: loading {variant} failed: {self.error(err)}")
            self._loaded.add(variant)

    def launch_struct(self, variant: str, c_args: ctypes.Structure, stream: int) -> None:
        """Launch `variant` with a pointer to its args struct on `stream` (a cudaStream_t as int)."""
        launch = self.entry(variant, "launch", [ctypes.POINTER(type(c_args)), ctypes.c_void_p])
        self.load(variant)
        err = launch(ctypes.byref(c_args), ctypes.c_void_p(stream))
        if err:
            raise RuntimeError(f"{self.family} AOT: launching {variant} failed: {self.error(err)}")


Library = TypeVar("Library", bound=AotLibrary)


def open_library(cls: type[Library], aot_dir: Path | None = None) -> Library:
    """The first library in the manifest that opens as `cls` here; AotUnavailable lists why none did."""
    aot_dir = Path(aot_dir or default_aot_dir())
    try:
        manifest = read_manifest(aot_dir)
    except (OSError, ValueError) as exc:
        raise AotUnavailable(str(exc)) from None
    reasons = []
    for lib in manifest["libraries"]:
        if lib["cudart"] == "shared":
            _preload_shared_cudart()
        try:
            return cls(aot_dir / lib["file"], manifest)
        except (OSError, AotUnavailable) as exc:
            reasons.append(f"{lib['file']}: {exc}")
    raise AotUnavailable(f"no AOT library in {aot_dir} loads: " + "; ".join(reasons or ["none listed"]))


_opened: dict[type, Any] = {}
_open_lock = threading.Lock()


def get_library(cls: type[Library]) -> Library:
    """open_library(cls) once per process (failures are remembered too: they do not heal)."""
    with _open_lock:
        if cls not in _opened:
            try:
                _opened[cls] = open_library(cls)
            except AotUnavailable as exc:
                _opened[cls] = exc
        result = _opened[cls]
    if isinstance(result, Exception):
        raise result
    return result


def current_stream(device: Any) -> int:
    """torch's current cudaStream_t on `device`, as an int for the launch call."""
    import torch

    return torch.cuda.current_stream(device).cuda_stream
