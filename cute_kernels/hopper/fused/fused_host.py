"""Host-side argument preparation for the fused elementwise kernels (pure torch; testable on the CPU).

Each prepare_* checks its inputs (dtypes, shapes, 16-byte alignment, widths in whole 128-bit vectors),
picks the variant (FusedOpSpec) and returns a FusedLaunch: the five 2-D operands of the shared kernel
signature (fused_common.py), the slot vector and the scalar, plus the tensors the op returns.
ValueError, saying what is wrong, for inputs no variant takes. Nothing here needs a GPU (fused_ops.py
refuses non-CUDA tensors), so the checks are tested on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .fused_spec import FP8_VEC, ROPE_HEAD_DIMS, VEC, FusedOpSpec, norm_size_class

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_NO_SLOTS: dict[torch.device, torch.Tensor] = {}
_STACKED_SCALES: dict[tuple, torch.Tensor] = {}  # (k, v scale pointers and versions) -> fp32 [2, kv_heads]


@dataclass
class FusedLaunch:
    spec: FusedOpSpec
    matrices: tuple[torch.Tensor, ...]  # mA..mE, each [rows, cols] with unit column stride
    slots: torch.Tensor  # int64 [n]
    scalar: float = 0.0

    @property
    def rows(self) -> int:
        return self.matrices[0].shape[0]


def _dtype_name(op: str, *tensors: torch.Tensor) -> str:
    dtype = tensors[0].dtype
    if dtype not in _DTYPE_NAMES or any(t.dtype != dtype for t in tensors):
        raise ValueError(f"{op}: dtypes {[str(t.dtype) for t in tensors]}; need bf16 or fp16, all equal")
    if any(t.device != tensors[0].device for t in tensors):
        raise ValueError(f"{op}: tensors must be on one device")
    return _DTYPE_NAMES[dtype]


def _matrix(t: torch.Tensor, op: str, name: str, vec: int = VEC) -> torch.Tensor:
    """t as the kernels read it (compiled for it: fused_compile.fake_matrix): 2-D, unit column stride,
    widths and row strides multiples of `vec` elements (8; 16 for an e4m3 write), 16-byte aligned."""
    if (t.dim() != 2 or t.stride(1) != 1 or t.shape[1] % vec or t.stride(0) % vec or t.data_ptr() % 16
            or t.shape[0] >= 2**31 or t.shape[1] >= 2**31):
        raise ValueError(f"{op}: {name} {tuple(t.shape)} strides {t.stride()} at {t.data_ptr():#x}: need rows of "
                         f"a multiple of {vec} contiguous elements, 16-byte aligned")
    return t


def _no_slots(device: torch.device) -> torch.Tensor:
    if device not in _NO_SLOTS:
        _NO_SLOTS[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return _NO_SLOTS[device]


def _launch(spec: FusedOpSpec, used: list[torch.Tensor], slots: torch.Tensor | None = None,
            scalar: float = 0.0) -> FusedLaunch:
    """Pad the operand list to five with the first (never touched) and add the slot placeholder."""
    matrices = tuple(used) + (used[0],) * (5 - len(used))
    return FusedLaunch(spec, matrices, _no_slots(used[0].device) if slots is None else slots, scalar)


def prepare_add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                         eps: float) -> tuple[FusedLaunch, torch.Tensor, torch.Tensor]:
    """(launch, normed, new residual) for x [rows, W]; without a residual the new residual is x."""
    op = "add_rms_norm"
    operands = [x, weight] if residual is None else [x, weight, residual]
    spec_dtype = _dtype_name(op, *operands)
    if x.dim() != 2 or weight.shape != (x.shape[1],) or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"{op}: x {tuple(x.shape)}, weight {tuple(weight.shape)}, residual "
                         f"{None if residual is None else tuple(residual.shape)}: need [rows, W], [W], [rows, W]")
    size = norm_size_class(x.shape[1])
    if size is None:
        raise ValueError(f"{op}: rows of {x.shape[1]} elements are wider than the widest variant")
    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    x2, w2 = _matrix(x, op, "x"), _matrix(weight.view(1, -1), op, "weight")
    if residual is None:
        return _launch(FusedOpSpec(op, spec_dtype, size), [x2, x2, w2, x2, h], scalar=eps), h, x
    new_residual = torch.empty_like(h)
    used = [x2, _matrix(residual, op, "residual"), w2, new_residual, h]
    return _launch(FusedOpSpec(op, spec_dtype, size, True), used, scalar=eps), h, new_residual


def prepare_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> FusedLaunch:
    """x [tokens, heads, d] (heads contiguous, any token stride) rotated in place by cos/sin
    [tokens, 1, d/2] fp32."""
    op = "rope"
    spec_dtype = _dtype_name(op, x)
    if x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        raise ValueError(f"{op}: x {tuple(x.shape)} strides {x.stride()}: need [tokens, heads, d], heads contiguous")
    tokens, _, d = x.shape
    if d not in (64, 128):
        raise ValueError(f"{op}: head_dim {d} has no variant (64, 128)")
    table = (tokens, 1, d // 2)
    if cos.shape != table or sin.shape != table or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"{op}: cos/sin {tuple(cos.shape)}/{tuple(sin.shape)} {cos.dtype}/{sin.dtype}, need {table} fp32")
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(f"{op}: cos/sin must be on x's device")
    used = [_matrix(x.flatten(1), op, "x"), _matrix(cos.view(tokens, -1), op, "cos"),
            _matrix(sin.view(tokens, -1), op, "sin")]
    return _launch(FusedOpSpec(op, spec_dtype, d), used)


def prepare_silu_and_mul(gate_up: torch.Tensor) -> tuple[FusedLaunch, torch.Tensor]:
    """(launch, out [rows, I]) for gate_up [rows, 2 I]."""
    op = "silu_and_mul"
    spec_dtype = _dtype_name(op, gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % (2 * VEC):
        raise ValueError(f"{op}: gate_up {tuple(gate_up.shape)}: need [rows, 2 I] with I a multiple of {VEC}")
    out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
    return _launch(FusedOpSpec(op, spec_dtype), [_matrix(gate_up, op, "gate_up"), out, out, out, out]), out


def prepare_write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> FusedLaunch:
    """k/v [tokens, kv_heads, d] (heads contiguous) into caches [num_blocks, block_size, kv_heads, d] at
    int64 flat slots; slot -1 is skipped. float8_e4m3fn caches take fp32 [kv_heads] scales and quantize."""
    if k_cache.dtype == torch.float8_e4m3fn:
        return _prepare_write_kv_e4m3(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    op = "write_kv"
    spec_dtype = _dtype_name(op, k, v, k_cache, v_cache)
    _check_write_kv(op, k, v, k_cache, v_cache, slot_mapping)
    flat = (-1, k.shape[1] * k.shape[2])
    used = [_matrix(t.flatten(1), op, name) for t, name in ((k, "k"), (v, "v"))]
    used += [_matrix(c.view(flat), op, name) for c, name in ((k_cache, "k_cache"), (v_cache, "v_cache"))]
    return _launch(FusedOpSpec(op, spec_dtype), used, slots=slot_mapping.contiguous())


def _prepare_write_kv_e4m3(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> FusedLaunch:
    op = "write_kv_e4m3"
    spec_dtype = _dtype_name(op, k, v)
    if v_cache.dtype != k_cache.dtype or k_cache.device != k.device or v_cache.device != k.device:
        raise ValueError(f"{op}: caches {k_cache.dtype}/{v_cache.dtype} on {k_cache.device}/{v_cache.device}: "
                         f"need two float8_e4m3fn caches on k's device")
    _check_write_kv(op, k, v, k_cache, v_cache, slot_mapping)
    if k.shape[2] not in ROPE_HEAD_DIMS:
        raise ValueError(f"{op}: head_dim {k.shape[2]} has no variant {ROPE_HEAD_DIMS}")
    flat = (-1, k.shape[1] * k.shape[2])
    used = [_matrix(t.flatten(1), op, name) for t, name in ((k, "k"), (v, "v"))]  # head_dim 64/128: 16 | width
    used += [_matrix(c.view(flat), op, name, FP8_VEC) for c, name in ((k_cache, "k_cache"), (v_cache, "v_cache"))]
    used.append(stacked_scales(k_scale, v_scale, k.shape[1], k.device))
    return _launch(FusedOpSpec(op, spec_dtype, k.shape[2]), used, slots=slot_mapping.contiguous())


def stacked_scales(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None, kv_heads: int,
                   device: torch.device) -> torch.Tensor:
    """fp32 [2, kv_heads]: the K scales, then the V scales (one operand of the fused signature). Made
    once per pair of scale tensors and their versions (an in-place update makes a new one), so a step,
    or a CUDA graph's capture, does not copy them."""
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None or s.dtype != torch.float32 or s.shape != (kv_heads,) or s.device != device:
            got = "None" if s is None else f"{s.dtype} {tuple(s.shape)} on {s.device}"
            raise ValueError(f"write_kv_e4m3: an fp8_e4m3 cache needs {name} fp32 [{kv_heads}] on {device}, got {got}")
    key = (k_scale.data_ptr(), k_scale._version, v_scale.data_ptr(), v_scale._version, kv_heads)
    if key not in _STACKED_SCALES:
        if len(_STACKED_SCALES) > 1024:  # scale tensors that came and went (tests)
            _STACKED_SCALES.clear()
        _STACKED_SCALES[key] = torch.stack((k_scale, v_scale)).contiguous()
    return _STACKED_SCALES[key]


def _check_write_kv(op: str, k, v, k_cache, v_cache, slot_mapping) -> None:
    if (k.dim() != 3 or v.shape != k.shape or k_cache.dim() != 4 or v_cache.shape != k_cache.shape
            or tuple(k_cache.shape[2:]) != tuple(k.shape[1:])):
        raise ValueError(f"{op}: k/v {tuple(k.shape)}/{tuple(v.shape)}, caches {tuple(k_cache.shape)}/"
                         f"{tuple(v_cache.shape)}: need [tokens, kv_heads, d] and [blocks, block_size, kv_heads, d]")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (k.shape[0],) or slot_mapping.device != k.device:
        raise ValueError(f"{op}: slot_mapping {tuple(slot_mapping.shape)} {slot_mapping.dtype}: need int64 "
                         f"[{k.shape[0]}] on k's device")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"{op}: the caches must be contiguous")
