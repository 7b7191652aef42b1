"""FP8 GEMM: quantization helpers and the torch reference on the CPU, the kernel's tile algorithm
emulated in torch, host checks; GPU numerics (marker gpu; skipped without an sm_90 GPU)."""
from __future__ import annotations

import math

import pytest
import torch

from cute_kernels.fp8_quant import (
    BLOCK,
    E4M3,
    E4M3_MAX,
    dequantize,
    expand_block_scales,
    quantize_activation_blocks,
    quantize_rowwise,
    quantize_weight_blocks,
)
from cute_kernels.hopper.fp8_gemm.fp8_gemm_host import check_splits, prepare_fp8_gemm
from cute_kernels.hopper.fp8_gemm.fp8_gemm_spec import NUM_SMS, TILE_K, Fp8GemmSpec, num_splits, spec_for
from cute_kernels.reference import fp8_gemm_ref

# e4m3 keeps 3 mantissa bits: round-to-nearest is within 2^-4 relative of the value, and values far
# below the group's amax fall into subnormals (absolute step 2^-9 x scale).
E4M3_REL = 2.0 ** -4


def _inputs(m, n, k, seed=0, device="cpu"):
    """Activations with rows of different magnitudes, and a weight (made on `device`)."""
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device) * torch.rand(m, 1, generator=g, device=device) * 4
    return x, torch.randn(n, k, generator=g, device=device) * 0.05


def _operands(m, n, k, mode, seed=0, device="cpu"):
    x, w = _inputs(m, n, k, seed, device)
    if mode == "rowwise":
        (a, sa), (b, sb) = quantize_rowwise(x), quantize_rowwise(w)
    else:
        (a, sa), (b, sb) = quantize_activation_blocks(x), quantize_weight_blocks(w)
    return [a, b, sa, sb]


@pytest.mark.parametrize("quantize", [quantize_rowwise, quantize_activation_blocks, quantize_weight_blocks])
def test_quantize_round_trip(quantize):
    x = torch.randn(200, 300) * torch.logspace(-3, 2, 300)  # columns of very different magnitudes
    x[7] = 0.0  # an all-zero group must not divide by zero
    q, scale = quantize(x)
    assert q.dtype == E4M3 and scale.dtype == torch.float32 and torch.isfinite(scale).all()
    back = dequantize(q, scale)
    assert (back[7] == 0).all()
    full = scale if scale.shape == (200, 1) else expand_block_scales(
        scale, x.shape, block_rows=1 if scale.shape[0] == 200 else BLOCK)
    assert (back - x).abs().le(E4M3_REL * x.abs() + 2.0 ** -9 * full).all()
    assert q.float().abs().amax() == E4M3_MAX  # each group's amax maps onto e4m3's largest value
    q2, scale2 = quantize(back)  # exact e4m3 values re-quantize to themselves
    assert torch.equal(dequantize(q2, scale2), back)


def test_block_scales_shapes_and_rowwise_equivalence():
    x = torch.randn(130, 260)
    assert quantize_activation_blocks(x)[1].shape == (130, 3)
    assert quantize_weight_blocks(x)[1].shape == (2, 3)
    small = torch.randn(5, 100)  # K within one block: block-per-token scales are rowwise scales
    assert torch.equal(quantize_activation_blocks(small)[1], quantize_rowwise(small)[1])
    with pytest.raises(ValueError, match="scale mode"):
        dequantize(quantize_rowwise(x)[0], torch.ones(7, 7))


@pytest.mark.parametrize("mode", ["rowwise", "block128"])
def test_reference_is_the_scaled_product(mode):
    x, w = _inputs(9, 32, 256)
    a, b, sa, sb = _operands(9, 32, 256, mode)
    out = fp8_gemm_ref(a, b, sa, sb, out_dtype=torch.float32)
    assert torch.allclose(out, dequantize(a, sa) @ dequantize(b, sb).T)
    if mode == "rowwise":  # the scales factor out of the sum
        assert torch.allclose(out, (a.float() @ b.float().T) * sa * sb.T, rtol=1e-5, atol=1e-6)
    rel = (out - x @ w.T).norm() / (x @ w.T).norm()
    assert 0 < rel < 0.1  # quantization error of the inputs, not a wrong product


def emulate_kernel(a, b, sa, sb, spec: Fp8GemmSpec, splits: int = 1) -> torch.Tensor:
    """The kernel's algorithm tile by tile: fp32 partials over each 128 of K promoted into the
    accumulator (block scales applied there, the tile's weight block n0 // 128), rowwise scales in
    the epilogue, scale reads clamped to the last row/column, results past M and N dropped. With
    split-K, split s sums k-tiles [s * per, (s + 1) * per) into its own fp32 partial (scales applied),
    and the partials are added in split order."""
    k_tiles = math.ceil(a.shape[1] / TILE_K)
    per = math.ceil(k_tiles / splits)
    partials = [_emulate_k_range(a, b, sa, sb, spec, range(s * per, min((s + 1) * per, k_tiles)))
                for s in range(splits)]
    return torch.stack(partials).sum(0)


def _emulate_k_range(a, b, sa, sb, spec: Fp8GemmSpec, k_tiles: range) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    out = torch.full((m, n), float("nan"))
    for m0 in range(0, m, spec.tile_m):
        for n0 in range(0, n, spec.tile_n):
            rows = torch.arange(m0, m0 + spec.tile_m).clamp(max=m - 1)
            cols = torch.arange(n0, n0 + spec.tile_n).clamp(max=n - 1)
            acc = torch.zeros(spec.tile_m, spec.tile_n)
            for kt in k_tiles:
                ks = slice(kt * TILE_K, (kt + 1) * TILE_K)
                partial = a[rows, ks].float() @ b[cols, ks].float().T
                if spec.scale_mode == "block128":
                    partial = partial * sa[rows, kt, None] * sb[n0 // BLOCK, kt]
                acc += partial
            if spec.scale_mode == "rowwise":
                acc *= sa[rows] * sb[cols].T
            keep_m, keep_n = min(spec.tile_m, m - m0), min(spec.tile_n, n - n0)
            out[m0:m0 + keep_m, n0:n0 + keep_n] = acc[:keep_m, :keep_n]
    return out


@pytest.mark.parametrize("mode", ["rowwise", "block128"])
@pytest.mark.parametrize("m", [1, 70])
def test_kernel_algorithm_matches_reference(mode, m):
    n, k = 144, 208  # neither a multiple of the tiles nor of 128
    a, b, sa, sb = _operands(m, n, k, mode, seed=m)
    got = emulate_kernel(a, b, sa, sb, spec_for(mode, m))
    assert torch.allclose(got, fp8_gemm_ref(a, b, sa, sb, out_dtype=torch.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["rowwise", "block128"])
def test_split_k_algorithm_matches_reference(mode):
    m, n, k = 3, 80, 1300  # 11 k-tiles, the last one partial: splits of 3, 3, 3, 2
    a, b, sa, sb = _operands(m, n, k, mode, seed=5)
    want = fp8_gemm_ref(a, b, sa, sb, out_dtype=torch.float32)
    for splits in (2, 4, 11):
        got = emulate_kernel(a, b, sa, sb, Fp8GemmSpec(mode, 64, 64, split_k=True), splits)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), splits


@pytest.mark.parametrize("m, n, k, splits", [
    (1, 576, 576, 1),  # 5 k-tiles: too few to split
    (1, 4096, 4096, 2),  # 64 tiles: two CTAs per tile fill the 132 SMs
    (1, 576, 1536, 3),  # 9 tiles, 12 k-tiles: >= 4 k-tiles per split caps it at 3
    (64, 1024, 8192, 8),  # 16 tiles
    (1, 64, 65536, 16),  # one tile: MAX_SPLITS
    (1, 14336, 4096, 1),  # 224 tiles already cover the SMs
    (65, 1024, 8192, 1),  # prefill-sized M takes the 128x128 tiles, never split
])
def test_host_split_choice(m, n, k, splits):
    assert num_splits(m, n, k) == splits


def test_split_choice_never_leaves_a_split_empty_or_sms_oversubscribed():
    for m in (1, 16, 64):
        for n in range(64, 8193, 448):
            for k in range(128, 20000, 1664):
                splits, tiles = num_splits(m, n, k), math.ceil(m / 64) * math.ceil(n / 64)
                check_splits(splits, k)  # raises on an empty split
                assert splits == 1 or splits * tiles <= NUM_SMS


def test_check_splits_refuses_empty_splits():
    check_splits(4, 10 * TILE_K)  # 3 + 3 + 3 + 1
    for bad in (0, 6, 11):  # 6 x 2 k-tiles would cover 12 of 10: the sixth split gets none
        with pytest.raises(ValueError, match="empty"):
            check_splits(bad, 10 * TILE_K)


def test_host_picks_the_split_variant_and_workspace():
    a, b, sa, sb = _operands(2, 1024, 4096, "block128")
    launch = prepare_fp8_gemm(a, b, sa, sb)
    assert launch.spec == Fp8GemmSpec("block128", 64, 64, split_k=True)
    assert launch.workspace.shape == (8, 2, 1024) and launch.workspace.dtype == torch.float32
    assert launch.kernel_tensors()[2] is launch.workspace
    forced = prepare_fp8_gemm(a, b, sa, sb, splits=1)
    assert not forced.spec.split_k and forced.workspace is None and forced.kernel_tensors()[2] is forced.out
    with pytest.raises(ValueError, match="empty"):
        prepare_fp8_gemm(a, b, sa, sb, splits=33)


def test_host_picks_the_variant_from_shapes():
    a, b, sa, sb = _operands(3, 64, 256, "rowwise")
    launch = prepare_fp8_gemm(a, b, sa, sb)
    assert launch.spec == Fp8GemmSpec("rowwise", 64, 64) and launch.out.shape == (3, 64)
    a, b, sa, sb = _operands(200, 256, 256, "block128")
    assert prepare_fp8_gemm(a, b, sa, sb).spec == Fp8GemmSpec("block128", 128, 128)


def test_host_rejects_what_no_variant_takes():
    a, b, sa, sb = _operands(4, 64, 256, "rowwise")
    bad = {
        "2-D": (a[None], b, sa, sb),
        "K differs": (a, b[:, :128].contiguous(), sa, sb),
        "multiples of 16": (a[:, :200].contiguous(), b[:, :200].contiguous(), sa, sb),
        "expected 2-D": (a.float(), b, sa, sb),
        "contiguous": (a, b.t().contiguous().t(), sa, sb),
        "scales": (a, b, sa[:2], sb),
        "float32": (a, b, sa.double(), sb.double()),
    }
    for message, args in bad.items():
        with pytest.raises(ValueError, match=message):
            prepare_fp8_gemm(*args)
    with pytest.raises(ValueError, match="out"):
        prepare_fp8_gemm(a, b, sa, sb, out=torch.empty(4, 32, dtype=torch.bfloat16))


def test_cute_path_refuses_cpu_tensors():
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import fp8_gemm

    with pytest.raises(ValueError, match="CUDA"):
        fp8_gemm(*_operands(2, 64, 128, "rowwise"))


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


SHAPES_NK = [(576, 576), (1536, 576), (4096, 4096), (14336, 4096), (8192, 8192)]


def assert_rows_match(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Every output written (the buffer was poisoned) and each row within 1e-3 relative (norm-wise)
    of the fp32 product rounded to bf16."""
    assert not out.isnan().any(), "rows or columns left unwritten"
    rel = (out.float() - ref.bfloat16().float()).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)
    assert rel.max().item() <= 1e-3, f"worst row {rel.argmax().item()}: {rel.max().item():.2e}"


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("mode", ["rowwise", "block128"])
@pytest.mark.parametrize("n, k", SHAPES_NK)
@pytest.mark.parametrize("m", [1, 16, 128, 4096])
def test_fp8_gemm_numerics_gpu(m, n, k, mode):
    """Per row against the fp32 product rounded to bf16: the inputs are exact e4m3 values, so only
    the order of fp32 accumulation differs, which moves a result by at most one bf16 rounding step
    where it lies next to a rounding boundary: rows agree to 1e-3 relative (norm-wise)."""
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import fp8_gemm

    torch.backends.cuda.matmul.allow_tf32 = False
    a, b, sa, sb = _operands(m, n, k, mode, seed=m + n + k, device="cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")  # poisoned
    fp8_gemm(a, b, sa, sb, out=out)
    torch.cuda.synchronize()
    assert_rows_match(out, fp8_gemm_ref(a, b, sa, sb, out_dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("mode", ["rowwise", "block128"])
@pytest.mark.parametrize("m, n, k, splits", [
    (1, 4096, 4096, None), (16, 1024, 8192, None), (64, 576, 1536, None),  # the host's choice
    (1, 576, 14336, 16), (7, 1536, 1300, 4), (33, 64, 4096, 32),  # forced: ragged last split, one k-tile each
])
def test_fp8_gemm_split_k_numerics_gpu(m, n, k, splits, mode):
    """Split-K: fp32 partials per split reduced into bf16 match the fp32 product as the unsplit
    kernel does (1e-3 per row), every output written (poisoned), and the host took the split path."""
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import fp8_gemm

    a, b, sa, sb = _operands(m, n, k, mode, seed=m + n + k, device="cuda")
    assert prepare_fp8_gemm(a, b, sa, sb, splits=splits).spec.split_k
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8_gemm(a, b, sa, sb, out=out, splits=splits)
    torch.cuda.synchronize()
    assert_rows_match(out, fp8_gemm_ref(a, b, sa, sb, out_dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("m, k", [(1, 576), (16, 4096), (300, 14336)])
def test_quantize_rows_kernel_matches_torch_gpu(m, k):
    """Same amax, same fp32 division, same satfinite rounding: bit-equal to quantize_rowwise."""
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import quantize_rows

    x = (torch.randn(m, k, device="cuda") * torch.rand(m, 1, device="cuda") * 10).bfloat16()
    x[0] = 0.0
    q, scale = quantize_rows(x)
    q_ref, scale_ref = quantize_rowwise(x)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_quantize_rows_rejects_cpu_and_odd_k():
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import quantize_rows

    with pytest.raises(ValueError, match="CUDA"):
        quantize_rows(torch.zeros(2, 32, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("block", [False, True])
def test_fp8_linear_takes_the_kernel_and_matches_its_cpu_path_gpu(block):
    """The model's Fp8Linear on bf16 CUDA rows runs the CuTe path; the same layer's dequantizing path
    (what the CPU runs) computes the same W8A8 product through a bf16 matmul: rows agree to bf16 rounding."""
    from runtime.accel.fp8_linear import Fp8Linear

    x, w = _inputs(7, 1536, 576, device="cuda")
    layer = Fp8Linear.quantize(w, torch.randn(1536, device="cuda").bfloat16(), block=block)
    rows = x.bfloat16()
    assert layer._kernel_takes(rows)
    got = layer(rows).float()
    want = layer._dequantized(rows).float()  # activations quantized from the same bf16 values
    rel = (got - want).norm(dim=1) / want.norm(dim=1)
    assert rel.max().item() < 1e-2
