"""Dequantization of GGUF tensor data to float32 (the float path and the tests' oracle)."""
from __future__ import annotations

import numpy as np
import torch

# Torch versions of gguf.quants' numpy code for the common types: same arithmetic (bit-identical
# results, checked by the tests) but several times faster on the 100M+ element tensors of a real model.

def _f16_col(b: torch.Tensor, start: int) -> torch.Tensor:
    return b[:, start:start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    # ggml packs element j in the low nibble of byte j and element j+16 in the high nibble.
    # Written into one preallocated buffer (no cat) and then scaled in place: memory traffic dominates.
    out = torch.empty(qs.shape[0], 32, dtype=torch.float32)
    out[:, :16] = qs & 0x0F
    out[:, 16:] = qs >> 4
    return out


def dequantize_gguf(data: np.ndarray, type_name: str) -> torch.Tensor:
    """Flat float32 values of one tensor's data (copied out of the memory map)."""
    raw = torch.from_numpy(np.array(data, copy=True).reshape(-1).view(np.uint8))
    if type_name == "F32":
        return raw.view(torch.float32)
    if type_name == "F16":
        return raw.view(torch.float16).float()
    if type_name == "BF16":
        return raw.view(torch.bfloat16).float()
    if type_name == "Q8_0":  # 2-byte f16 scale, 32 int8
        b = raw.view(-1, 34)
        return b[:, 2:].contiguous().view(torch.int8).float().mul_(_f16_col(b, 0)).reshape(-1)
    if type_name == "Q4_0":  # 2-byte f16 scale, 16 bytes of nibbles; value = d * (q - 8)
        b = raw.view(-1, 18)
        return _nibbles(b[:, 2:]).sub_(8.0).mul_(_f16_col(b, 0)).reshape(-1)
    if type_name == "Q4_1":  # f16 scale, f16 min, 16 bytes of nibbles; value = d * q + m
        b = raw.view(-1, 20)
        return _nibbles(b[:, 4:]).mul_(_f16_col(b, 0)).add_(_f16_col(b, 2)).reshape(-1)
    if type_name in ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"):  # only for the float path (--quantization
        # none): the quantized path reads these blocks in place, its torch reference is in cute_kernels/cpu
        from gguf import GGMLQuantizationType  # lazily: the GPU image lacks gguf; only GGUF data need it
        from gguf.quants import dequantize as gguf_dequantize

        return torch.from_numpy(gguf_dequantize(raw.numpy(), GGMLQuantizationType[type_name]).reshape(-1))
    raise AssertionError(type_name)  # callers check SUPPORTED_TYPES first


