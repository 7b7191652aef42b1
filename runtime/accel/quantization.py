"""--quantization: how linear weights are held (the mode names are runtime.engine_config's).

Default (no flag): a GGUF's block-quantized weights (Q4_0, Q4_1, Q8_0) stay as shipped on the CPU,
and float checkpoints stay float. QUANTIZATION_MODES quantize float weights at load (a GGUF's are
dequantized first); FLOAT_MODE dequantizes a GGUF to float32, the path before quantized kernels.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.engine_config import CPU_ONLY

if TYPE_CHECKING:
    import torch

    from runtime.model.linear import Linear

# Measured on SmolLM2-135M with profiling/quality/quant_quality.py (perplexity vs the float path): one int8
# scale per output channel +4.4%, one per 32 weights -0.8%: so int8 keeps a scale per 32 (Q8_0). A
# 4-bit LM head alone costs ~+5%, so q4 holds the head in int8 (as llama.cpp's Q4 files keep it in 6-8 bits).
_HEAD_MODE = {"q4": "int8"}
# fp8 keeps per-output-channel weight scales x per-token activation scales (the GEMM's rowwise mode)
# over the 128x128 block mode: profiling/quality/fp8_quality_sweep.py measures both within noise of each other
# (top-1 77.9% vs 78.3%, perplexity +14.4% vs +15.0%); finer or mixed schemes the kernel lacks gain at
# most ~3 points; e4m3's 3-bit mantissa, not the scale granularity, sets the error (fp8 on o_proj alone: 93.8%).
# Rowwise costs least on the GPU: one scale multiply per output in the epilogue and the per-token
# quantizer kernel, where block scales load and multiply at every k-tile's promotion.
def unavailable_reason(mode: str | None, device: "torch.device") -> str | None:
    """Why `mode` cannot run on `device`, or None when it can."""
    if mode in CPU_ONLY and device.type != "cpu":
        return f"--quantization {mode} runs on the CPU only (device {device})"
    return None


def head_mode(mode: str) -> str:
    """The mode the LM head is quantized with under `mode`."""
    return _HEAD_MODE.get(mode, mode)


def quantize_linear(mode: str, weight: "torch.Tensor", bias: "torch.Tensor | None") -> "Linear":
    """The Linear for a float weight [out, in] quantized as `mode` says (a key of QUANTIZATION_MODES)."""
    if mode == "fp8":
        from runtime.accel.fp8_linear import Fp8Linear

        return Fp8Linear.quantize(weight, bias)
    from cute_kernels.cpu.quant_blocks import quantize_q4_1, quantize_q8_0
    from runtime.accel.block_linear import BlockQuantLinear

    if mode == "int8":
        return BlockQuantLinear("Q8_0", quantize_q8_0(weight), bias, label="int8")
    if mode == "q4":
        return BlockQuantLinear("Q4_1", quantize_q4_1(weight), bias, label="q4")
    raise ValueError(f"unknown quantization mode {mode!r}")
