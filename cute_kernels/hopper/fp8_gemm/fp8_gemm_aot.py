"""Run the ahead-of-time exported FP8 kernels from torch WITHOUT the DSL (C ABI: csrc/fp8_gemm_aot.h):
the args structs, their layout checks, and launch; opening the library is toolchain/aot_library.py."""
from __future__ import annotations

import ctypes
from typing import Any

from cute_kernels.toolchain.aot_library import AotLibrary, current_stream, get_library

from .fp8_gemm_spec import Fp8QuantRowsSpec


class Fp8GemmArgsC(ctypes.Structure):
    """Mirror of cute_aot_fp8_gemm_args_t."""

    _fields_ = ([(n, ctypes.c_void_p) for n in ("a", "b", "c", "scale_a", "scale_b")]
                + [(n, ctypes.c_int32) for n in ("m", "n", "k", "scale_cols", "scale_b_rows", "splits")]
                + [(n, ctypes.c_int64) for n in ("a_stride", "b_stride", "c_stride", "scale_a_stride",
                                                 "scale_b_stride", "c_split_stride")])


class Fp8QuantArgsC(ctypes.Structure):
    """Mirror of cute_aot_fp8_quant_args_t."""

    _fields_ = ([(n, ctypes.c_void_p) for n in ("x", "q", "scale")] + [(n, ctypes.c_int32) for n in ("m", "k")]
                + [(n, ctypes.c_int64) for n in ("x_stride", "q_stride")])


def _rows(t: Any, name: str) -> None:
    """The layout compiled in: unit column stride, 16-byte aligned rows of matrices."""
    if t.stride(-1) != 1 or (t.shape[1] > 1 and (t.data_ptr() % 16 or t.stride(0) * t.element_size() % 16)):
        raise ValueError(f"fp8 AOT: {name} {tuple(t.shape)} strides {t.stride()} do not fit the compiled layout")


def gemm_c_args(a: Any, b: Any, c: Any, sa: Any, sb: Any) -> Fp8GemmArgsC:
    """Fp8GemmLaunch.kernel_tensors() -> the C struct; c is [M, N], or the split-K workspace
    [splits, M, N] (contiguous)."""
    splits, split_stride = (c.shape[0], c.stride(0)) if c.dim() == 3 else (1, 0)
    c_rows = c[0] if c.dim() == 3 else c
    if c.dim() == 3 and not c.is_contiguous():
        raise ValueError(f"fp8 AOT: workspace {tuple(c.shape)} must be contiguous")
    for name, t in zip(("a", "b", "c"), (a, b, c_rows)):
        _rows(t, name)
    return Fp8GemmArgsC(a.data_ptr(), b.data_ptr(), c.data_ptr(), sa.data_ptr(), sb.data_ptr(),
                        a.shape[0], b.shape[0], a.shape[1], sa.shape[1], sb.shape[0], splits,
                        a.stride(0), b.stride(0), c_rows.stride(0), sa.stride(0), sb.stride(0), split_stride)


def quant_c_args(x: Any, q: Any, scale: Any) -> Fp8QuantArgsC:
    _rows(x, "x")
    _rows(q, "q")
    return Fp8QuantArgsC(x.data_ptr(), q.data_ptr(), scale.data_ptr(), x.shape[0], x.shape[1], x.stride(0), q.stride(0))


class AotFp8Kernels(AotLibrary):
    family = "fp8_gemm"

    def __init__(self, path, manifest: dict, lib: Any = None):
        super().__init__(path, manifest, lib)
        self.check_args_size("cute_aot_fp8_gemm_args_size", Fp8GemmArgsC)
        self.check_args_size("cute_aot_fp8_quant_args_size", Fp8QuantArgsC)


def launch_aot(spec: Any, tensors: tuple) -> None:
    """Launch the variant `spec` on the tensors' device, on torch's current stream there."""
    import torch

    c_args = quant_c_args(*tensors) if isinstance(spec, Fp8QuantRowsSpec) else gemm_c_args(*tensors)
    with torch.cuda.device(tensors[0].device):
        get_library(AotFp8Kernels).launch_struct(spec.name, c_args, current_stream(tensors[0].device))

