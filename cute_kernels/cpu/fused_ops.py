"""Fused elementwise ops of a decoder layer: csrc/cpu_fused_ops.c (built by build.py) for fp32 CPU
tensors. Their torch references (cute_kernels.reference) are their oracles and run everywhere else.

Each public op takes the C path when the library is built and the tensors are fp32, on the CPU and
laid out as the kernel reads them; otherwise it runs its reference, so callers need no checks.
"""
from __future__ import annotations

import ctypes

import torch

from cute_kernels.cpu import build
from cute_kernels.cpu.kv_elem import KV_KINDS, kv_kind, scale_pointers
from cute_kernels.kv_quant import KVScales, dequantize
from cute_kernels.reference import add_rms_norm_ref, rope_ref, silu_and_mul_ref
from cute_kernels.reference import write_kv as write_kv_ref

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_fused_ops", {
        "add_rms_norm_f32": ([_P] * 5 + [_I, _I, _F], None),
        "silu_and_mul_f32": ([_P, _P, _I, _I], None),
        "rope_f32": ([_P] * 3 + [_I] * 4, None),
        "write_kv_f32": ([_P, _I, _P, _I, _P, _I, _I, _I, ctypes.c_int, _P], ctypes.c_int),
        "read_kv_f32": ([_P, _I, _P, _I, _I, _I, ctypes.c_int, _P, _P], ctypes.c_int),
    })


def unavailable_reason() -> str | None:
    """None when the C library is built and loaded; otherwise why not."""
    return _library()[1]


def _c_ready(*tensors: torch.Tensor) -> bool:
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and unavailable_reason() is None)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, new residual) for x [rows, dim]; see add_rms_norm_ref."""
    operands = (x, weight) if residual is None else (x, residual, weight)
    if not (_c_ready(*operands) and x.dim() == 2 and all(t.is_contiguous() for t in operands)
            and (residual is None or residual.shape == x.shape) and weight.shape == (x.shape[1],)):
        return add_rms_norm_ref(x, residual, weight, eps)
    h = torch.empty_like(x)
    new_residual = x if residual is None else torch.empty_like(x)
    _library()[0].add_rms_norm_f32(x.data_ptr(), None if residual is None else residual.data_ptr(),
                                   weight.data_ptr(), new_residual.data_ptr(), h.data_ptr(), x.shape[0],
                                   x.shape[1], eps)
    return h, new_residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[rows, 2 * inter] -> [rows, inter]; see silu_and_mul_ref."""
    if not (_c_ready(gate_up) and gate_up.dim() == 2 and gate_up.is_contiguous() and gate_up.shape[1] % 2 == 0):
        return silu_and_mul_ref(gate_up)
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, inter)
    _library()[0].silu_and_mul_f32(gate_up.data_ptr(), out.data_ptr(), rows, inter)
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, d] rotated in place where the C path takes it (heads contiguous, any token
    stride), else rope_ref's new tensor; use the returned tensor either way."""
    tokens, heads, d = x.shape
    if not (_c_ready(x, cos, sin) and d % 2 == 0 and x.stride(2) == 1 and x.stride(1) == d
            and cos.shape == sin.shape == (tokens, 1, d // 2) and cos.is_contiguous() and sin.is_contiguous()):
        return rope_ref(x, cos, sin)
    _library()[0].rope_f32(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), tokens, heads, d, x.stride(0))
    return x


def _kv_ready(caches: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, *rows: torch.Tensor) -> bool:
    """The C KV paths take these: fp32 rows of heads x d contiguous values, contiguous caches of one type the
    C code reads ([blocks, block_size, heads, d]), int64 slots (the C code checks they lie inside)."""
    k_cache, v_cache = caches
    heads_d = tuple(k_cache.shape[2:])
    return (unavailable_reason() is None and k_cache.dtype == v_cache.dtype and k_cache.dtype in KV_KINDS
            and k_cache.shape == v_cache.shape and k_cache.is_contiguous() and v_cache.is_contiguous()
            and k_cache.device.type == "cpu" and slots.dtype == torch.int64 and slots.dim() == 1
            and slots.is_contiguous() and all(
                r.dtype == torch.float32 and tuple(r.shape) == (slots.numel(), *heads_d) and r.stride(2) == 1
                and r.stride(1) == heads_d[1] for r in rows))


def _outside(cache: torch.Tensor) -> str:
    return f"a KV slot outside the cache's {cache.shape[0] * cache.shape[1]} slots"


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
             kv_scales: KVScales | None = None) -> None:
    """reference.write_kv_ref (k/v [tokens, kv_heads, d] into the caches at flat slots), in one C pass each; a
    slot outside the caches is an IndexError, nothing written."""
    if not _kv_ready((k_cache, v_cache), slots, k, v):
        return write_kv_ref(k, v, k_cache, v_cache, slots, kv_scales)
    kind, scales = kv_kind(k_cache, v_cache), scale_pointers(k_cache, kv_scales, k.shape[1])
    for x, cache, scale in ((k, k_cache, scales[0]), (v, v_cache, scales[1])):
        if _library()[0].write_kv_f32(x.data_ptr(), x.stride(0), cache.data_ptr(), cache.shape[0] * cache.shape[1],
                                      slots.data_ptr(), slots.numel(), x.shape[1], x.shape[2], kind, scale):
            raise IndexError(_outside(cache))


def read_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
            kv_scales: KVScales | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows at flat slots of both caches as fp32 [tokens, kv_heads, d]: what write_kv stored, read back."""
    if not _kv_ready((k_cache, v_cache), slots):
        scales = (None, None) if kv_scales is None else (kv_scales.k, kv_scales.v)
        return tuple(dequantize(c.view(-1, *c.shape[2:])[slots], s) for c, s in zip((k_cache, v_cache), scales))
    kind, pointers = kv_kind(k_cache, v_cache), scale_pointers(k_cache, kv_scales, k_cache.shape[2])
    out = []
    for cache, pointer in zip((k_cache, v_cache), pointers):
        rows = torch.empty(slots.numel(), *cache.shape[2:])
        if _library()[0].read_kv_f32(cache.data_ptr(), cache.shape[0] * cache.shape[1], slots.data_ptr(),
                                     slots.numel(), cache.shape[2], cache.shape[3], kind, pointer, rows.data_ptr()):
            raise IndexError(_outside(cache))
        out.append(rows)
    return out[0], out[1]
