"""The fused CPU decode step (cute_kernels/cpu/decode_step.py) behind LlamaModel.forward: a decode-only
step runs every layer in one C call, when every linear holds block-quantized (BlockQuantLinear) or bf16
(Bf16Linear) weights and the KV caches are fp32, bf16, int8 or e4m3 on the CPU, for up to the table's max_rows
rows (many where every linear has the tiles GEMM, else what the GEMV serves). Anything else
(prefill or mixed steps, more rows, Qwen3's qk_norm, float or fp8 weights, tensor-parallel ranks,
whose linears are wrapped in collectives) takes the per-layer path.
"""
from __future__ import annotations

import torch

from cute_kernels.cpu import decode_step
from cute_kernels.cpu.decode_attention import DecodeTables, prepare_tables
from runtime.accel.bf16_linear import Bf16Linear
from runtime.accel.block_linear import BlockQuantLinear
from runtime.model.attention_batch import AttentionBatch
from runtime.model.llama import LlamaModel

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def _layer_tensors(layer, caches: tuple[torch.Tensor, torch.Tensor]) -> decode_step.LayerTensors | None:
    linears = layer.linears()
    if not all(type(linear) in (BlockQuantLinear, Bf16Linear) for linear in linears):
        return None
    weights = tuple((linear.weight, decode_step.BF16) if type(linear) is Bf16Linear
                    else (linear.blocks, linear.type_name) for linear in linears)
    return decode_step.LayerTensors(weights, layer.qkv.bias, layer.input_norm.data, layer.post_norm.data, *caches,
                                    layer.kv_scales, tuple(_may_take_amx(linear) for linear in linears))


def _may_take_amx(linear: Bf16Linear | BlockQuantLinear) -> bool:
    """Whether the step may run this linear on the AMX tiles past the GEMV's rows, as the linear itself does from
    its AMX_MIN_ROWS; not a batch-invariant one (--deterministic: one summation order at every row count)."""
    return not linear.invariant if type(linear) is Bf16Linear else linear.allow_dequant


class CpuDecodeStep:
    """Decides per step whether the fused step runs, and runs it. The pointer table is built on the
    first step over a cache list (the caches are allocated once) and kept."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self._caches: KVCaches | None = None
        self._table: decode_step.DecodeStepTable | None = None

    @staticmethod
    def available(model) -> bool:
        """Whether this model could ever take the step: the library builds and no feature it lacks."""
        return decode_step.unavailable_reason() is None and not model.cfg.qk_norm

    def _table_for(self, kv_caches: KVCaches) -> decode_step.DecodeStepTable | None:
        if kv_caches is not self._caches:
            self._caches, self._table = kv_caches, self._build(kv_caches)
        return self._table

    def _build(self, kv_caches: KVCaches) -> decode_step.DecodeStepTable | None:
        m, cfg = self.model, self.model.cfg
        layers = [_layer_tensors(layer, kv) for layer, kv in zip(m.layers, kv_caches)]
        if len(kv_caches) != len(m.layers) or any(layer is None for layer in layers):
            return None
        shape = decode_step.DecodeShape(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                        cfg.intermediate_size, cfg.rms_norm_eps)
        try:
            return decode_step.DecodeStepTable(shape, layers, m.norm.data, m.rope.cos, m.rope.sin)
        except ValueError:  # a shape or layout the kernel does not read (e.g. a KV cache in float16)
            return None

    def accepts(self, batch: AttentionBatch, rows: int, kv_caches: KVCaches) -> bool:
        if not (rows > 0 and batch.num_decode_tokens == rows and batch.cu_seqlens_q is None):
            return False
        table = self._table_for(kv_caches)
        return table is not None and rows <= table.max_rows

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                 kv_caches: KVCaches) -> torch.Tensor:
        """Final normed hidden states [rows, hidden]; x (the embeddings) is overwritten."""
        tables = batch.decode_plan
        if not isinstance(tables, DecodeTables):  # the backend's plan made none (its C decode did not build)
            tables = prepare_tables(batch.decode_block_tables, batch.decode_context_lens, batch.num_blocks,
                                    batch.block_size)
        return self._table_for(kv_caches).run(x.contiguous(), positions, batch.slot_mapping, tables,
                                              torch.get_num_threads())
