"""An int8 / e4m3 KV cache's start-up: its scales (their contract: cute_kernels/kv_quant.py), static fp32
per (layer, KV head), for K and for V, set on each DecoderLayer before the first step; and the check that
the backend's kernels read the cache (one line of UserError otherwise, never a silent slower path).

In order: a calibration pass at start when asked (--calculate-kv-scales, vLLM's flag), else the
checkpoint's own (vLLM-style `model.layers.N.self_attn.k_scale` / `v_scale`, one per tensor or one per
KV head), else the calibration pass all the same: no fixed scale fits int8's range, and the pass costs
one prefill. The pass runs the model over a shipped text (CALIBRATION_FILE) with a cache of the compute
dtype and takes each head's absolute maximum, scale = amax / the type's largest value (127, 448), so the
text's values never saturate.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from cute_kernels.cpu import decode_attention, prefill_attention
from cute_kernels.kv_quant import QMAX, KVScales
from runtime.accel.cpu_backend import CpuBackend
from runtime.errors import UserError
from runtime.model.attention_backend import AttentionBackend
from runtime.model.llama import LlamaModel
from runtime.model.runner import ModelRunner
from runtime.sequence import SeqChunk
from weights.checkpoint import kv_scale_names
from weights.config import ModelConfig

# public-domain passages, shipped for runtime/spec/prompts.py; the quality scripts measure on another text
CALIBRATION_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spec", "data",
                                "public_domain.txt")
CALIBRATION_TOKENS = 1024  # tokens of the pass: one prefill
BLOCK = 16
TINY = 1e-8  # a head whose values are all zero keeps a positive scale


def pop_kv_scales(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> list[KVScales] | None:
    """The checkpoint's scales, popped from tensors before the model consumes them (None when it has none);
    UserError for a checkpoint that has some layers' only, or one of a shape that is neither one scale nor
    one per KV head."""
    names = [kv_scale_names(n) for n in range(cfg.num_layers)]
    found = [name in tensors for pair in names for name in pair]
    if not any(found):
        return None
    if not all(found):
        raise UserError("KV cache scales: the checkpoint has k_scale / v_scale for some layers only")
    out = []
    for k_name, v_name in names:
        k, v = (tensors.pop(name).float().reshape(-1) for name in (k_name, v_name))
        for name, t in ((k_name, k), (v_name, v)):
            if t.numel() not in (1, cfg.num_kv_heads) or not bool((t > 0).all()):
                raise UserError(f"KV cache scales: {name}: {t.numel()} values; expected 1 or {cfg.num_kv_heads} "
                                "positive scales")
        out.append(KVScales(k.expand(cfg.num_kv_heads).contiguous(), v.expand(cfg.num_kv_heads).contiguous()))
    return out


def calibration_ids(encode) -> list[int]:
    """The shipped text's first CALIBRATION_TOKENS token ids; encode: text -> ids (the model's tokenizer)."""
    with open(CALIBRATION_FILE, encoding="utf-8") as f:
        text = "".join(line for line in f if not line.startswith("#"))
    return list(encode(text))[:CALIBRATION_TOKENS]


def calibrate(model: LlamaModel, ids: list[int], dtype: torch.dtype, device: torch.device) -> list[KVScales]:
    """Per layer: amax / QMAX[dtype] of each KV head's K and V over one prefill of ids, in a cache of the
    compute dtype (the model's norms'; float32 on the CPU, bf16 / fp16 on a GPU, whose kernels read no other)."""
    cfg = model.cfg
    ids = list(ids)[:cfg.max_position_embeddings]
    blocks = math.ceil(len(ids) / BLOCK)
    shape = (blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    compute = model.norm.dtype
    caches = [(torch.zeros(shape, device=device, dtype=compute), torch.zeros(shape, device=device, dtype=compute))
              for _ in model.layers]
    ModelRunner(model, caches, BLOCK, device).run([SeqChunk(ids, 0, list(range(blocks)))])
    scales = []
    for k, v in caches:  # unwritten slots are zeros: they cannot raise a maximum
        amax_k, amax_v = (c.abs().amax(dim=(0, 1, 3)).float() for c in (k, v))
        scales.append(KVScales((amax_k / QMAX[dtype]).clamp_min(TINY), (amax_v / QMAX[dtype]).clamp_min(TINY)))
    return scales


def set_scales(model: LlamaModel, scales: list[KVScales], device: torch.device) -> None:
    for layer, s in zip(model.layers, scales, strict=True):
        layer.kv_scales = KVScales(s.k.to(device), s.v.to(device))


@dataclass(frozen=True)
class KVScaleSource:
    """The checkpoint's scales unless calculate (--calculate-kv-scales); else a calibration pass over
    these token ids (the engine's: calibration_ids of the shipped text)."""

    calibration: list[int] | None = None
    calculate: bool = False


def check_reader(backend: AttentionBackend, kv_dtype: torch.dtype, device: torch.device) -> None:
    """UserError unless the backend's kernels read an 8-bit cache: on the CPU, its C attention kernels
    (the torch reference reads it as well, at a fraction of their speed); on CUDA, the cute backend's
    e4m3 variants (the decode, paged-prefill and quantizing KV-write kernels)."""
    name = _name(kv_dtype)
    if device.type == "cuda":
        if backend.name == "cute" and kv_dtype == torch.float8_e4m3fn:
            return
        if backend.name == "cute":
            raise UserError(f"the cute backend does not read a {name} KV cache (fp8_e4m3 it does)")
        from runtime.accel.cute_backend import unavailable_reason

        reason = unavailable_reason(device) or f"--backend {backend.name} was asked for"
        raise UserError(f"a {name} KV cache on CUDA is read by the cute backend's kernels only, not by the "
                        f"{backend.name} backend here: {reason}")
    if isinstance(backend, CpuBackend) and backend.c_decode and backend.c_prefill:
        return
    if backend.name in ("cpu", "torch"):
        reason = decode_attention.unavailable_reason() or prefill_attention.unavailable_reason() or "turned off"
        raise UserError(f"a {name} KV cache is read by the CPU C attention kernels, unavailable here: {reason}")
    raise UserError(f"the {backend.name} backend does not read a {name} KV cache yet")


def set_kv_scales(model: LlamaModel, kv_dtype: torch.dtype, source: KVScaleSource,
                  checkpoint: list[KVScales] | None, device: torch.device) -> None:
    """Every layer's scales for a kv_dtype cache, once the backend is known to read it."""
    check_reader(model.backend, kv_dtype, device)
    scales = checkpoint
    if scales is None or source.calculate:
        if not source.calibration:
            raise UserError(f"a {_name(kv_dtype)} KV cache needs scales: the checkpoint has none and no "
                            "calibration text was given")
        scales = calibrate(model, source.calibration, kv_dtype, device)
    set_scales(model, scales, device)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
