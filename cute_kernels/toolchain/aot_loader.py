"""Run the ahead-of-time exported prefill kernels from torch WITHOUT the DSL: ctypes over the .so
that `python -m cute_kernels.aot` linked (see csrc/prefill_aot.h for the C ABI).

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
from typing import Any

from .aot_manifest import ABI_VERSION, default_aot_dir, read_manifest
from cute_kernels.hopper.prefill_spec import KV_BLOCK_SIZE

_c_int64_2 = ctypes.c_int64 * 2


class AotUnavailable(RuntimeError):
    """No usable AOT kernels here (none built, stale, or the library does not load); says why."""


class PrefillArgsC(ctypes.Structure):
    """Mirror of cute_aot_prefill_args_t (csrc/prefill_aot.h)."""

    _fields_ = [(name, ctypes.c_void_p) for name in (
        "q", "k", "v", "k_cache", "v_cache", "block_tables", "prefix_lens", "cu_seqlens_q", "cu_seqlens_k",
        "out", "lse")] + [(name, ctypes.c_int32) for name in (
            "total_q", "heads", "total_k", "kv_heads", "num_blocks", "batch", "max_blocks", "max_seqlen_q")] + [
        ("q_stride", ctypes.c_int64), ("k_stride", ctypes.c_int64), ("v_stride", ctypes.c_int64),
        ("out_stride", ctypes.c_int64), ("k_cache_strides", _c_int64_2), ("v_cache_strides", _c_int64_2),
        ("block_tables_stride", ctypes.c_int64), ("lse_stride", ctypes.c_int64),
        ("softmax_scale_log2", ctypes.c_float),
    ]


def _check_layout(t: Any, name: str, fixed: dict[int, int], multiple_of: dict[int, int], align: int) -> None:
    """The strides compiled into the kernel (fixed) and the divisibility it assumes of the others."""
    strides = t.stride()
    bad = {m: strides[m] for m, s in fixed.items() if strides[m] != s}
    bad |= {m: strides[m] for m, s in multiple_of.items() if strides[m] % s}
    if bad or t.data_ptr() % align:
        raise ValueError(f"prefill AOT: {name} {tuple(t.shape)} strides {strides} / address "
                         f"{t.data_ptr():#x} do not fit the compiled layout (modes {sorted(bad)})")


def _int32(value: int, name: str) -> int:
    if not 0 <= value < 2**31:
        raise ValueError(f"prefill AOT: {name}={value} does not fit int32")
    return value


def prefill_c_args(args: Any) -> PrefillArgsC:
    """PrefillLaunchArgs -> the C struct, after checking every layout assumption the kernel makes."""
    d = args.spec.head_dim
    for name in ("q", "k", "v", "out"):
        _check_layout(getattr(args, name), name, {2: 1, 1: d}, {0: d}, 16)
    for name in ("k_cache", "v_cache"):
        _check_layout(getattr(args, name), name, {3: 1, 2: d}, {1: d, 0: KV_BLOCK_SIZE * d}, 16)
    _check_layout(args.block_tables, "block_tables", {1: 1}, {}, 4)
    _check_layout(args.lse, "lse", {1: 1}, {}, 4)
    for name in ("prefix_lens", "cu_seqlens_q", "cu_seqlens_k"):
        _check_layout(getattr(args, name), name, {0: 1}, {}, 4)
    q, k, kc, vc = args.q, args.k, args.k_cache, args.v_cache
    sizes = dict(total_q=q.shape[0], heads=q.shape[1], total_k=k.shape[0], kv_heads=k.shape[1],
                 num_blocks=kc.shape[0], batch=args.prefix_lens.shape[0], max_blocks=args.block_tables.shape[1],
                 max_seqlen_q=args.max_seqlen_q)
    return PrefillArgsC(
        **{name: getattr(args, name).data_ptr() for name in (
            "q", "k", "v", "k_cache", "v_cache", "block_tables", "prefix_lens", "cu_seqlens_q", "cu_seqlens_k",
            "out", "lse")},
        **{name: _int32(value, name) for name, value in sizes.items()},
        q_stride=q.stride(0), k_stride=k.stride(0), v_stride=args.v.stride(0), out_stride=args.out.stride(0),
        k_cache_strides=_c_int64_2(kc.stride(0), kc.stride(1)), v_cache_strides=_c_int64_2(vc.stride(0), vc.stride(1)),
        block_tables_stride=args.block_tables.stride(0), lse_stride=args.lse.stride(0),
        softmax_scale_log2=args.softmax_scale_log2,
    )


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


class AotPrefillKernels:
    """One opened library: per-variant load (once) and launch."""

    def __init__(self, path: Path, manifest: dict, lib: Any = None):
        """`lib`: an already opened library (tests pass a mock with the same C signatures)."""
        self.path, self.manifest = path, manifest
        self.lib = lib if lib is not None else ctypes.CDLL(str(path))
        for fn, restype in (("cute_aot_abi_version", ctypes.c_int32), ("cute_aot_prefill_args_size", ctypes.c_int32),
                            ("cute_aot_error_name", ctypes.c_char_p), ("cute_aot_error_string", ctypes.c_char_p)):
            getattr(self.lib, fn).restype = restype
        self.lib.cute_aot_error_name.argtypes = self.lib.cute_aot_error_string.argtypes = [ctypes.c_int32]
        abi, size = self.lib.cute_aot_abi_version(), self.lib.cute_aot_prefill_args_size()
        if abi != ABI_VERSION or size != ctypes.sizeof(PrefillArgsC):
            raise AotUnavailable(f"{path}: ABI {abi} / args struct {size} B, loader expects "
                                 f"{ABI_VERSION} / {ctypes.sizeof(PrefillArgsC)} B")
        self.variants = frozenset(manifest["variants"])
        self._loaded: set[str] = set()
        self._lock = threading.Lock()

    def error(self, code: int) -> str:
        return f"{self.lib.cute_aot_error_name(code).decode()} ({code}): {self.lib.cute_aot_error_string(code).decode()}"

    def _entry(self, variant: str, suffix: str) -> Any:
        if variant not in self.variants:
            raise AotUnavailable(f"{variant} is not among the AOT kernels in {self.path.parent} "
                                 f"(have {sorted(self.variants)})")
        fn = getattr(self.lib, f"cute_aot_{variant}_{suffix}")  # ctypes caches the function object
        fn.restype = ctypes.c_int32
        fn.argtypes = [] if suffix == "load" else [ctypes.POINTER(PrefillArgsC), ctypes.c_void_p]
        return fn

    def load(self, variant: str) -> None:
        """Load the variant's cubin onto every device (once; thread-safe: ctypes drops the GIL)."""
        if variant in self._loaded:
            return
        with self._lock:
            if variant in self._loaded:
                return
            err = self._entry(variant, "load")()
            if err:
                raise RuntimeError(f"prefill AOT: loading {variant} failed: {self.error(err)}")
            self._loaded.add(variant)

    def launch(self, args: Any, stream: int) -> None:
        """Launch on `stream` (a cudaStream_t as int); the current device must be the tensors'."""
        variant = args.spec.name
        launch = self._entry(variant, "launch")
        self.load(variant)
        err = launch(ctypes.byref(prefill_c_args(args)), ctypes.c_void_p(stream))
        if err:
            raise RuntimeError(f"prefill AOT: launching {variant} failed: {self.error(err)}")


def open_prefill_kernels(aot_dir: Path | None = None) -> AotPrefillKernels:
    """The first library in the manifest that loads here; AotUnavailable lists why none did."""
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
            return AotPrefillKernels(aot_dir / lib["file"], manifest)
        except (OSError, AotUnavailable) as exc:
            reasons.append(f"{lib['file']}: {exc}")
    raise AotUnavailable(f"no AOT library in {aot_dir} loads: " + "; ".join(reasons or ["none listed"]))


_opened: dict[str, Any] = {}
_open_lock = threading.Lock()


def get_prefill_kernels() -> AotPrefillKernels:
    """open_prefill_kernels() once per process (failures are remembered too: they do not heal)."""
    with _open_lock:
        if "kernels" not in _opened:
            try:
                _opened["kernels"] = open_prefill_kernels()
            except AotUnavailable as exc:
                _opened["kernels"] = exc
        result = _opened["kernels"]
    if isinstance(result, Exception):
        raise result
    return result


def launch_prefill_aot(args: Any) -> None:
    """Launch on the tensors' device and torch's current stream there."""
    import torch

    device = args.q.device
    with torch.cuda.device(device):
        get_prefill_kernels().launch(args, torch.cuda.current_stream(device).cuda_stream)
