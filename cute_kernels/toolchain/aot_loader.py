"""Run the ahead-of-time exported prefill kernels from torch WITHOUT the DSL (see csrc/prefill_aot.h
for the C ABI): the args struct, its layout checks, and launch; opening the library is aot_library.py.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from cute_kernels.paged_tables import KV_BLOCK_SIZE

from .aot_library import AotLibrary, AotUnavailable, current_stream, get_library, open_library

__all__ = ["AotPrefillKernels", "AotUnavailable", "PrefillArgsC", "open_prefill_kernels", "prefill_c_args"]

_c_int64_2 = ctypes.c_int64 * 2


class PrefillArgsC(ctypes.Structure):
    """Mirror of cute_aot_prefill_args_t (csrc/prefill_aot.h)."""

    _fields_ = [(name, ctypes.c_void_p) for name in (
        "q", "k", "v", "k_cache", "v_cache", "block_tables", "prefix_lens", "cu_seqlens_q", "cu_seqlens_k",
        "out", "lse")] + [(name, ctypes.c_int32) for name in (
            "total_q", "heads", "total_k", "kv_heads", "num_blocks", "batch", "max_blocks", "max_seqlen_q")] + [
        ("q_stride", ctypes.c_int64), ("k_stride", ctypes.c_int64), ("v_stride", ctypes.c_int64),
        ("out_stride", ctypes.c_int64), ("k_cache_strides", _c_int64_2), ("v_cache_strides", _c_int64_2),
        ("block_tables_stride", ctypes.c_int64), ("lse_stride", ctypes.c_int64),
        ("softmax_scale_log2", ctypes.c_float), ("tile_order", ctypes.c_void_p), ("num_tiles", ctypes.c_int32),
        ("num_ctas", ctypes.c_int32), ("k_scale", ctypes.c_void_p), ("v_scale", ctypes.c_void_p),
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
    for name in ("prefix_lens", "cu_seqlens_q", "cu_seqlens_k", "tile_order", "k_scale", "v_scale"):
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
        softmax_scale_log2=args.softmax_scale_log2, tile_order=args.tile_order.data_ptr(),
        num_tiles=_int32(args.tile_order.numel(), "num_tiles"), num_ctas=_int32(args.num_ctas, "num_ctas"),
        k_scale=args.k_scale.data_ptr(), v_scale=args.v_scale.data_ptr(),
    )


class AotPrefillKernels(AotLibrary):
    """The library's prefill variants: launch with a PrefillLaunchArgs."""

    family = "prefill"

    def __init__(self, path: Path, manifest: dict, lib: Any = None):
        super().__init__(path, manifest, lib)
        self.check_args_size("cute_aot_prefill_args_size", PrefillArgsC)

    def launch(self, args: Any, stream: int) -> None:
        """Launch on `stream` (a cudaStream_t as int); the current device must be the tensors'."""
        self.launch_struct(args.spec.name, prefill_c_args(args), stream)


def open_prefill_kernels(aot_dir: Path | None = None) -> AotPrefillKernels:
    return open_library(AotPrefillKernels, aot_dir)


def get_prefill_kernels() -> AotPrefillKernels:
    return get_library(AotPrefillKernels)


def launch_prefill_aot(args: Any) -> None:
    """Launch on the tensors' device and torch's current stream there."""
    import torch

    device = args.q.device
    with torch.cuda.device(device):
        get_prefill_kernels().launch(args, current_stream(device))
