"""The linear-layer factory the engine hands the model build: which Linear holds each weight."""
from __future__ import annotations

from itertools import accumulate

import torch

from runtime.accel.batch_invariant import batch_invariant
from runtime.accel.bf16_linear import Bf16Linear
from runtime.accel.block_linear import BlockQuantEmbedding, BlockQuantLinear, BlockQuantParts, block_linear_supports
from runtime.accel.cpu_linear import PackedCpuLinear, pack_linear_weight
from runtime.accel.quantization import head_mode, quantize_linear
from runtime.engine_config import QUANTIZATION_MODES
from runtime.model.build import Weight
from runtime.model.embedding import DenseEmbedding, Embedding
from runtime.model.linear import DenseLinear, Linear
from weights.quantized import QuantizedParts, QuantizedTensor, as_float


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, quantization: str | None = None,
                fp8_block: bool = False) -> Linear:
    """The linear for this weight: quantized when asked (fp8_block: 128x128 block scales, as an FP8
    checkpoint stored them), else oneDNN-packed where that applies (fp32 on the CPU), else dense."""
    if quantization == "fp8" and fp8_block:
        from runtime.accel.fp8_linear import Fp8Linear

        return Fp8Linear.quantize(weight, bias, block=True)
    if quantization is not None:
        return quantize_linear(quantization, weight, bias)
    packed = pack_linear_weight(weight)
    return DenseLinear(weight, bias) if packed is None else PackedCpuLinear(weight, bias, packed)


class QuantizedLinears:
    """The Linears the engine builds with (runtime/model/build.py's seam): a GGUF's blocks kept where the
    quantized kernel runs them (no --quantization), float weights quantized at load (a QUANTIZATION_MODES
    mode), else float: bf16 where weight_dtype says so (the CPU's bf16 GEMM), else the compute dtype
    (oneDNN-packed where that applies)."""

    def __init__(self, quantization: str | None, device: torch.device, dtype: torch.dtype,
                 fp8_block: bool = False, deterministic: bool = False,
                 weight_dtype: torch.dtype | None = None) -> None:
        self.quantization, self.device, self.dtype = quantization, device, dtype
        self.bf16 = weight_dtype == torch.bfloat16 and device.type == "cpu"  # float weights held in bf16
        self.fp8_block = fp8_block  # an FP8 checkpoint's 128x128 block scales
        self.deterministic = deterministic  # batch-invariant linears (batch_invariant.py)

    def linear(self, weight: Weight, bias: torch.Tensor | None, head: bool = False) -> Linear:
        linear = self._linear(weight, bias, head)
        return batch_invariant(linear) if self.deterministic else linear

    def keeps(self, w: Weight) -> bool:
        if isinstance(w, QuantizedParts):
            return all(self.keeps(p) for p in w.parts)
        return (isinstance(w, QuantizedTensor) and self.quantization is None
                and block_linear_supports(w.type_name, *w.shape, self.device, self.dtype))

    def float(self, w: Weight | None) -> torch.Tensor | None:
        return None if w is None else as_float(w).to(device=self.device, dtype=self.dtype).contiguous()

    def _linear(self, weight: Weight, bias: torch.Tensor | None, head: bool) -> Linear:
        bias = self.float(bias)
        if self.keeps(weight) and isinstance(weight, QuantizedParts):
            bounds = [0, *accumulate(p.shape[0] for p in weight.parts)]
            return BlockQuantParts([BlockQuantLinear(p.type_name, p.blocks, None if bias is None else bias[a:b])
                                    for p, a, b in zip(weight.parts, bounds, bounds[1:])])
        if self.keeps(weight):
            return BlockQuantLinear(weight.type_name, weight.blocks, bias)
        if self.quantization == "fp8":  # the LM head stays in the compute dtype
            weight = self.float(weight)
            return make_linear(weight, bias) if head else make_linear(weight, bias, "fp8", self.fp8_block)
        if self.quantization in QUANTIZATION_MODES and block_linear_supports("Q8_0", *weight.shape, self.device,
                                                                             self.dtype):
            mode = head_mode(self.quantization) if head else self.quantization
            return quantize_linear(mode, self.float(weight), bias)
        return self._float_linear(weight, bias)

    def _float_linear(self, weight: Weight, bias: torch.Tensor | None) -> Linear:
        if self.bf16:  # as loaded: a bf16 checkpoint's weight is never widened to fp32
            return Bf16Linear(as_float(weight).to(self.device), bias)
        return make_linear(self.float(weight), bias)

    def embedding(self, table: Weight) -> Embedding:
        if self.keeps(table):
            return BlockQuantEmbedding(table.type_name, table.blocks, table.cols)
        return DenseEmbedding(self.float(table))

    def tied_head(self, embedding: Embedding) -> Linear:
        if isinstance(embedding, BlockQuantEmbedding):
            head = embedding.as_linear()
            return batch_invariant(head) if self.deterministic else head
        return self.linear(embedding.table, None, head=True)
