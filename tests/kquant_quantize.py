"""A plain K-quant quantizer (Q4_K, Q5_K, Q6_K) for test files: the gguf package reads these formats
but cannot write them. Min/max scales per sub-block, no search for better ones as llama.cpp does:
enough for weights that dequantize close to the floats they came from. Written from ggml-common.h's
block layouts, independently of cute_kernels/cpu/kquant_blocks.py (the tests read these bytes back
with gguf.quants.dequantize)."""
from __future__ import annotations

import numpy as np


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b > 0)


def _bytes(x: np.ndarray, n: int) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(n, -1)


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """6-bit scales and mins [n, 8] -> 12 bytes [n, 12] as ggml's get_scale_min_k4 unpacks them."""
    low = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    mid = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    top = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([low, mid, top], axis=1).astype(np.uint8)


def _quantize_q45k(w: np.ndarray, bits: int) -> np.ndarray:
    n, nmax = w.shape[0], (1 << bits) - 1
    sub = w.reshape(n, 8, 32)
    lo, hi = np.minimum(sub.min(axis=2), 0), sub.max(axis=2)  # the format's minimum is subtracted: lo <= 0
    scale, mins = (hi - lo) / nmax, -lo
    d, dmin = _f16(scale.max(axis=1) / 63), _f16(mins.max(axis=1) / 63)
    sc = np.clip(np.round(_ratio(scale, d[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.round(_ratio(mins, dmin[:, None])), 0, 63).astype(np.uint8)
    step, offset = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.round(_ratio(sub + offset[..., None], np.broadcast_to(step[..., None], sub.shape))), 0, nmax)
    q = q.astype(np.uint8)  # [n, 8, 32]
    qs = (q[:, 0::2] & 0x0F) | ((q[:, 1::2] & 0x0F) << 4)  # chunk c: sub-blocks 2c (low) and 2c + 1 (high)
    parts = [_bytes(d, n), _bytes(dmin, n), _pack_scales(sc, m)]
    if bits == 5:
        parts.append(sum(((q[:, i] >> 4) & 1) << i for i in range(8)).astype(np.uint8))  # qh[l], bit i
    return np.concatenate([*parts, qs.reshape(n, 128)], axis=1)


def _quantize_q6k(w: np.ndarray) -> np.ndarray:
    n = w.shape[0]
    groups = w.reshape(n, 16, 16)
    scale = np.abs(groups).max(axis=2) / 31
    d = _f16(scale.max(axis=1) / 127)
    sc = np.clip(np.round(_ratio(scale, d[:, None])), -128, 127).astype(np.int8)
    step = np.broadcast_to((d[:, None] * sc)[..., None], groups.shape)
    q = (np.clip(np.round(_ratio(groups, step)), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)  # [h, t, l]
    ql = (q[:, :, 0:2] & 0x0F) | ((q[:, :, 2:4] & 0x0F) << 4)  # runs t, t + 2 share a byte: [n, h, 2, 32]
    qh = sum((q[:, :, t] >> 4) << (2 * t) for t in range(4)).astype(np.uint8)  # [n, h, 32]
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _bytes(d, n)], axis=1)


def quantize_kquant(w: np.ndarray, type_name: str) -> np.ndarray:
    """float32 [..., k] with k % 256 == 0 -> uint8 [..., k / 256 * block bytes] in type_name's layout."""
    flat = w.astype(np.float32).reshape(-1, 256)
    blocks = _quantize_q6k(flat) if type_name == "Q6_K" else _quantize_q45k(flat, 4 if type_name == "Q4_K" else 5)
    return blocks.reshape(*w.shape[:-1], -1)
