"""Weight quantization modes (`--quantization`): each turns a float linear weight into a Linear that
holds fewer bytes. One entry per mode; build.make_linear calls quantize_linear at load."""
from __future__ import annotations

import torch

from runtime.model.linear import Linear

QUANTIZATION_MODES: dict[str, str] = {
    "fp8": "e4m3 weights with per-output-channel scales, activations quantized per token (W8A8); "
           "the CuTe FP8 GEMM on sm_90, a dequantizing path elsewhere",
}


def quantize_linear(mode: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    if mode == "fp8":
        from runtime.model.fp8_linear import Fp8Linear

        return Fp8Linear.quantize(weight, bias)
    raise ValueError(f"unknown quantization mode {mode!r} (choose from {', '.join(QUANTIZATION_MODES)})")
