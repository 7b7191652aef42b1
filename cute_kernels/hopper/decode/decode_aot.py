"""Run the ahead-of-time exported decode kernels from torch WITHOUT the DSL (C ABI:
toolchain/csrc/decode_aot.h): the args structs, their layout checks, and the launch of the decode
kernel and, with several splits, the merge. Opening the library is toolchain/aot_library.py."""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from cute_kernels.toolchain.aot_library import AotLibrary, current_stream, get_library, open_library

_c_int64_2 = ctypes.c_int64 * 2
_POINTERS = ("q", "k_cache", "v_cache", "block_tables", "context_lens", "cu_seqlens_q", "out", "lse",
             "out_partial", "lse_partial", "k_scale", "v_scale")
_SIZES = ("total_q", "heads", "num_blocks", "kv_heads", "batch", "max_blocks", "num_splits", "partial_splits",
          "partial_rows")


class DecodeArgsC(ctypes.Structure):
    """Mirror of cute_aot_decode_args_t."""

    _fields_ = [(name, ctypes.c_void_p) for name in _POINTERS] + [(name, ctypes.c_int32) for name in _SIZES] + [
        ("q_stride", ctypes.c_int64), ("out_stride", ctypes.c_int64), ("k_cache_strides", _c_int64_2),
        ("v_cache_strides", _c_int64_2), ("block_tables_stride", ctypes.c_int64), ("lse_stride", ctypes.c_int64),
        ("out_partial_strides", _c_int64_2), ("lse_partial_strides", _c_int64_2),
        ("softmax_scale_log2", ctypes.c_float),
    ]


class DecodeMergeArgsC(ctypes.Structure):
    """Mirror of cute_aot_decode_merge_args_t."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("out_partial", "lse_partial", "out", "lse")] + [
        (name, ctypes.c_int32) for name in ("splits", "total_q", "heads")] + [
        ("out_partial_strides", _c_int64_2), ("lse_partial_strides", _c_int64_2),
        ("out_stride", ctypes.c_int64), ("lse_stride", ctypes.c_int64),
    ]


def _compact(tensors: dict[str, Any]) -> None:
    """The kernels assume compact row-major tensors on 16-byte (4-byte for int32/fp32 rows) boundaries."""
    for name, t in tensors.items():
        align = 16 if t.element_size() <= 2 or name == "out_partial" else 4
        if not t.is_contiguous() or t.data_ptr() % align:
            raise ValueError(f"decode AOT: {name} {tuple(t.shape)} strides {t.stride()} at {t.data_ptr():#x} "
                             "does not fit the compiled layout (compact, aligned)")


def _int32(value: int, name: str) -> int:
    if not 0 <= value < 2**31:
        raise ValueError(f"decode AOT: {name}={value} does not fit int32")
    return value


def decode_c_args(args: Any) -> DecodeArgsC:
    """DecodeLaunchArgs -> the C struct, after checking the layouts the kernel was compiled for."""
    p = args.plan
    tensors = dict(zip(_POINTERS, args.kernel_tensors()))
    _compact(tensors)
    q, kc, vc, op, lp = args.q, args.k_cache, args.v_cache, args.out_partial, args.lse_partial
    sizes = (q.shape[0], q.shape[1], kc.shape[0], kc.shape[2], p.context_lens.shape[0], p.block_tables.shape[1],
             args.num_splits, op.shape[0], op.shape[1])
    return DecodeArgsC(
        *(t.data_ptr() for t in tensors.values()), *(_int32(v, n) for n, v in zip(_SIZES, sizes)),
        q_stride=q.stride(0), out_stride=args.out.stride(0), k_cache_strides=_c_int64_2(*kc.stride()[:2]),
        v_cache_strides=_c_int64_2(*vc.stride()[:2]), block_tables_stride=p.block_tables.stride(0),
        lse_stride=args.lse.stride(0), out_partial_strides=_c_int64_2(*op.stride()[:2]),
        lse_partial_strides=_c_int64_2(*lp.stride()[:2]), softmax_scale_log2=args.softmax_scale_log2,
    )


def merge_c_args(args: Any) -> DecodeMergeArgsC:
    op, lp = args.out_partial, args.lse_partial
    return DecodeMergeArgsC(
        op.data_ptr(), lp.data_ptr(), args.out.data_ptr(), args.lse.data_ptr(),
        *(_int32(v, "merge size") for v in op.shape[:3]),
        out_partial_strides=_c_int64_2(*op.stride()[:2]), lse_partial_strides=_c_int64_2(*lp.stride()[:2]),
        out_stride=args.out.stride(0), lse_stride=args.lse.stride(0),
    )


class AotDecodeKernels(AotLibrary):
    """The library's decode and merge variants: launch with a DecodeLaunchArgs."""

    family = "decode"

    def __init__(self, path: Path, manifest: dict, lib: Any = None):
        super().__init__(path, manifest, lib)
        self.check_args_size("cute_aot_decode_args_size", DecodeArgsC)
        self.check_args_size("cute_aot_decode_merge_args_size", DecodeMergeArgsC)

    def launch(self, args: Any, stream: int) -> None:
        """Decode (and merge, with several splits) on `stream`; the current device must be the tensors'."""
        self.launch_struct(args.spec.name, decode_c_args(args), stream)
        if args.num_splits > 1:
            self.launch_struct(args.merge_spec.name, merge_c_args(args), stream)


def open_decode_kernels(aot_dir: Path | None = None) -> AotDecodeKernels:
    return open_library(AotDecodeKernels, aot_dir)


def launch_decode_aot(args: Any) -> None:
    """Launch on the tensors' device and torch's current stream there."""
    import torch

    device = args.q.device
    with torch.cuda.device(device):
        get_library(AotDecodeKernels).launch(args, current_stream(device))
