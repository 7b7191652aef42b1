"""Fused elementwise kernels (add+RMSNorm, RoPE, silu-and-mul, paged KV write): CPU tests of the
host-side checks, variant choice and C argument packing, and GPU numerics (marker gpu; skipped
without an sm_90 GPU) against fp32 references with NaN-poisoned outputs."""
from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cute_kernels import reference
from cute_kernels.hopper.fused.fused_aot import AotFusedOps, FusedOpsArgsC, fused_c_args
from cute_kernels.hopper.fused.fused_host import (
    prepare_add_rms_norm,
    prepare_rope,
    prepare_silu_and_mul,
    prepare_write_kv,
)
from cute_kernels.hopper.fused.fused_spec import FusedOpSpec, norm_size_class, runtime_variants
from cute_kernels.toolchain.aot_manifest import ABI_VERSION

BF16 = torch.bfloat16


def qkv_views(tokens=5, heads=8, kv_heads=2, d=128, dtype=BF16, device="cpu"):
    """q+k and v as the model makes them: views of one fused qkv row (token stride > heads * d)."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, dtype=dtype, device=device)
    qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
    return qk.view(tokens, heads + kv_heads, d), v.reshape(tokens, kv_heads, d)


def rope_tables(tokens, d, device="cpu"):
    angles = torch.rand(tokens, 1, d // 2, device=device) * 100
    return angles.cos(), angles.sin()


# ---------------------------------------------------------------------------------------------- CPU
def test_variant_names_are_unique_and_start_with_the_family():
    names = [s.name for s in runtime_variants()]
    assert len(names) == len(set(names)) and all(n.startswith("fused_ops_") for n in names)
    with pytest.raises(ValueError, match="size"):
        FusedOpSpec("add_rms_norm", "bfloat16", 3000)
    with pytest.raises(ValueError, match="residual"):
        FusedOpSpec("rope", "bfloat16", 128, residual=True)


def test_norm_size_class_is_the_smallest_that_holds_the_row():
    assert [norm_size_class(w) for w in (576, 2048, 2056, 4096, 8192, 16384)] == [2048, 2048, 4096, 4096, 8192, 16384]
    assert norm_size_class(16392) is None


def test_norm_picks_the_variant_and_returns_x_as_residual_on_the_first_layer():
    x, w = torch.randn(3, 4096, dtype=BF16), torch.randn(4096, dtype=BF16)
    launch, h, res = prepare_add_rms_norm(x, None, w, 1e-5)
    assert launch.spec == FusedOpSpec("add_rms_norm", "bfloat16", 4096, False)
    assert res is x and h.shape == x.shape and launch.scalar == 1e-5
    launch, h, res = prepare_add_rms_norm(x, torch.randn_like(x), w, 1e-5)
    assert launch.spec.residual and launch.matrices[3] is res and launch.matrices[4] is h
    assert launch.matrices[2].shape == (1, 4096)


@pytest.mark.parametrize("make, match", [
    (lambda: prepare_add_rms_norm(torch.randn(2, 64), None, torch.randn(64), 1e-5), "bf16 or fp16"),
    (lambda: prepare_add_rms_norm(torch.randn(2, 60, dtype=BF16), None, torch.randn(60, dtype=BF16), 1e-5),
     "multiple of 8"),
    (lambda: prepare_add_rms_norm(torch.randn(2, 64, dtype=BF16), None, torch.randn(32, dtype=BF16), 1e-5), "weight"),
    (lambda: prepare_add_rms_norm(torch.randn(2, 20000, dtype=BF16), None, torch.randn(20000, dtype=BF16), 1e-5),
     "wider"),
    (lambda: prepare_add_rms_norm(torch.randn(2, 72, dtype=BF16)[:, 4:68], None, torch.randn(64, dtype=BF16), 1e-5),
     "16-byte aligned"),
    (lambda: prepare_rope(torch.randn(4, 2, 96, dtype=BF16), *rope_tables(4, 96)), "head_dim 96"),
    (lambda: prepare_rope(torch.randn(4, 2, 128, dtype=BF16), *rope_tables(3, 128)), "cos/sin"),
    (lambda: prepare_rope(torch.randn(4, 2, 128, dtype=BF16).transpose(0, 1), *rope_tables(2, 128)),
     "heads contiguous"),
    (lambda: prepare_silu_and_mul(torch.randn(3, 24, dtype=BF16)), "multiple of 8"),
    (lambda: prepare_write_kv(*qkv_views()[::-1], torch.zeros(4, 16, 2, 128, dtype=BF16),
                              torch.zeros(4, 16, 2, 128, dtype=BF16), torch.zeros(5, dtype=torch.int64)), "k/v"),
    (lambda: prepare_write_kv(torch.zeros(5, 2, 128, dtype=BF16), torch.zeros(5, 2, 128, dtype=BF16),
                              torch.zeros(4, 16, 2, 128, dtype=BF16), torch.zeros(4, 16, 2, 128, dtype=BF16),
                              torch.zeros(5, dtype=torch.int32)), "int64"),
])
def test_bad_inputs_are_refused_with_a_reason(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_rope_and_kv_write_take_views_of_the_fused_qkv():
    qk, v = qkv_views()
    launch = prepare_rope(qk, *rope_tables(5, 128))
    assert launch.spec.name == "fused_ops_rope_bfloat16_d128"
    assert launch.matrices[0].shape == (5, 10 * 128) and launch.matrices[0].stride() == (12 * 128, 1)
    assert launch.matrices[0].data_ptr() == qk.data_ptr()  # rotated in place, no copy
    k = qk[:, 8:]
    caches = [torch.zeros(4, 16, 2, 128, dtype=BF16) for _ in range(2)]
    launch = prepare_write_kv(k, v, *caches, torch.tensor([0, 17, -1, 63, 5]))
    assert [m.stride(0) for m in launch.matrices[:4]] == [12 * 128, 12 * 128, 256, 256]
    assert launch.matrices[2].shape == (64, 256) and launch.slots.dtype == torch.int64


def test_c_args_carry_every_operand():
    x, w = torch.randn(3, 576, dtype=BF16), torch.randn(576, dtype=BF16)
    launch, h, res = prepare_add_rms_norm(x, torch.randn_like(x), w, 1e-6)
    c = fused_c_args(launch)
    assert [(c.m[i].data, c.m[i].rows, c.m[i].cols, c.m[i].row_stride) for i in range(5)] == [
        (t.data_ptr(), t.shape[0], t.shape[1], t.stride(0)) for t in launch.matrices]
    assert c.num_slots == 1 and abs(c.scalar - 1e-6) < 1e-12


def _mock_library(launch_fn, variant):
    launch_t = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(FusedOpsArgsC), ctypes.c_void_p)
    load_t = ctypes.CFUNCTYPE(ctypes.c_int32)
    return SimpleNamespace(
        cute_aot_abi_version=lambda: ABI_VERSION, cute_aot_fused_ops_args_size=lambda: ctypes.sizeof(FusedOpsArgsC),
        cute_aot_error_name=lambda code: b"cudaErrorMock", cute_aot_error_string=lambda code: b"mocked",
        **{f"cute_aot_{variant}_launch": launch_t(launch_fn), f"cute_aot_{variant}_load": load_t(lambda: 0)})


def test_launch_through_a_mock_of_the_c_signature():
    launch, out = prepare_silu_and_mul(torch.randn(4, 2 * 1536, dtype=BF16))
    seen = []
    lib = _mock_library(lambda args, stream: seen.append((args.contents.m[4].data, args.contents.m[0].cols, stream)) or 0,
                        launch.spec.name)
    AotFusedOps(Path("mock.so"), {"variants": [launch.spec.name]}, lib=lib).launch(launch, stream=0xBEEF)
    assert seen == [(out.data_ptr(), 2 * 1536, 0xBEEF)]


def test_entry_points_refuse_cpu_tensors():
    from cute_kernels.hopper.fused.fused_ops import silu_and_mul

    with pytest.raises(ValueError, match="CUDA"):
        silu_and_mul(torch.randn(2, 32, dtype=BF16))


# ---------------------------------------------------------------------------------------------- GPU
def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


gpu = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
DTYPES = [torch.bfloat16, torch.float16]
# Tolerances against fp32 references of the same (16-bit) inputs: the kernels compute in fp32 and round
# once, so the error is the output rounding (2^-8 relative in bf16, 2^-11 in fp16) plus fp32 noise.
RTOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def assert_rows_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Per row: no NaN left from the poison, max |error| within RTOL of the row's max |value|."""
    out, ref = out.float().flatten(1), ref.float().flatten(1)
    assert not out.isnan().any(), "unwritten output elements (poison left)"
    err = (out - ref).abs().amax(1) / ref.abs().amax(1).clamp_min(1e-6)
    assert err.max() <= RTOL[dtype], f"worst row {int(err.argmax())}: relative error {float(err.max()):.2e}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 576), (7, 4096), (64, 8192), (3, 16384)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_gpu(rows, width, with_residual, dtype):
    from cute_kernels.hopper.fused.fused_ops import launch_fused

    x = torch.randn(rows, width, device="cuda", dtype=dtype)
    residual = torch.randn_like(x) if with_residual else None
    weight = torch.rand(width, device="cuda", dtype=dtype) + 0.5
    launch, h, new_residual = prepare_add_rms_norm(x, residual, weight, 1e-5)
    h.fill_(float("nan"))
    if with_residual:
        new_residual.fill_(float("nan"))
    launch_fused(launch)
    res_ref = x.float() + (residual.float() if with_residual else 0)
    ref = torch.nn.functional.rms_norm(res_ref.to(dtype).float(), (width,), weight.float(), 1e-5)
    assert_rows_close(h, ref, dtype)
    assert_rows_close(new_residual, res_ref, dtype)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,d", [(1, 9, 3, 64), (37, 32, 8, 128), (300, 8, 1, 128)])
def test_rope_in_place_on_the_fused_qkv_gpu(tokens, heads, kv_heads, d, dtype):
    from cute_kernels.hopper.fused.fused_ops import rope_

    qk, v = qkv_views(tokens, heads, kv_heads, d, dtype, "cuda")
    v_before = v.clone()
    cos, sin = rope_tables(tokens, d, "cuda")
    ref = reference.rope_ref(qk.float(), cos, sin)
    out = rope_(qk, cos, sin)
    assert out.data_ptr() == qk.data_ptr()
    assert_rows_close(out, ref, dtype)
    assert torch.equal(v, v_before), "rope wrote outside q and k"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (33, 14336), (256, 8)])
def test_silu_and_mul_gpu(rows, inter, dtype):
    from cute_kernels.hopper.fused.fused_ops import launch_fused

    gate_up = torch.randn(rows, 2 * inter, device="cuda", dtype=dtype) * 3
    launch, out = prepare_silu_and_mul(gate_up)
    out.fill_(float("nan"))
    launch_fused(launch)
    assert_rows_close(out, reference.silu_and_mul_ref(gate_up.float()), dtype)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_heads,d", [(3, 64), (8, 128)])
def test_write_kv_skips_padding_slots_gpu(kv_heads, d, dtype):
    from cute_kernels.hopper.fused.fused_ops import write_kv

    tokens, num_blocks = 40, 64
    qk, v = qkv_views(tokens, 4 * kv_heads, kv_heads, d, dtype, "cuda")
    k = qk[:, 4 * kv_heads:]
    k_cache = torch.full((num_blocks, 16, kv_heads, d), float("nan"), device="cuda", dtype=dtype)
    v_cache = k_cache.clone()
    slots = torch.randperm(num_blocks * 16, device="cuda")[:tokens]
    slots[::7] = -1  # padded rows: must not write anywhere
    write_kv(k, v, k_cache, v_cache, slots)
    live = slots >= 0
    flat_k, flat_v = k_cache.view(-1, kv_heads, d), v_cache.view(-1, kv_heads, d)
    assert torch.equal(flat_k[slots[live]], k[live]) and torch.equal(flat_v[slots[live]], v[live])
    untouched = torch.ones(num_blocks * 16, dtype=torch.bool, device="cuda")
    untouched[slots[live]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()
