"""The quantized CPU linear (csrc/cpu_quant_gemm.c) against its torch reference, and the block
formats against the gguf package's own quantizers and dequantizers, on every SIMD route this machine
runs (the `cpu_route` fixture, tests/conftest.py).

Tolerance: both sides quantize the activations identically (same float ops, ties to even) and every
per-block integer dot product is exact, so they differ only in the order float32 block results are
summed: about 1e-7 relative per term over K/32 <= 48 terms. Outputs here are O(10-100); 2e-4
absolute plus 1e-5 relative leaves room for that and nothing else (one wrong nibble or scale moves
an output by O(0.1) or more).
"""
import gguf
import numpy as np
import pytest
import torch

from cute_kernels.cpu import quant_blocks as qb
from cute_kernels.cpu import quant_gemm as qg
from cute_kernels.cpu.quant_reference import quant_linear_ref, quantize_activations_ref

TOL = dict(rtol=1e-5, atol=2e-4)
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def gguf_blocks(w: torch.Tensor, type_name: str) -> torch.Tensor:
    data = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(data.view(np.uint8).copy()).reshape(w.shape[0], -1)


def random_q5_blocks(type_name: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random bytes, with finite fp16 d (and m; one d zero): every bit of qh and the nibbles is
    exercised, not only the patterns a quantizer happens to write."""
    rng = np.random.default_rng(seed)
    n, bb = rows * cols // qb.QK, qb.BLOCK_BYTES[type_name]
    raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
    for at in (0, 2) if type_name == "Q5_1" else (0,):
        scale = (rng.standard_normal(n) * 0.05).astype(np.float16)
        scale[0] = 0
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(n, 2)
    return torch.from_numpy(raw.reshape(rows, -1))


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1"])
def test_five_bit_blocks_of_random_bytes(type_name, monkeypatch, cpu_route):
    """Torch and C dequantization bit-exact with gguf's; the kernel against the reference."""
    blocks = random_q5_blocks(type_name, 37, 192, seed=11)
    want = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[type_name]).copy())
    assert torch.equal(qb.dequantize(blocks, type_name, 192), want)
    monkeypatch.setattr(qg, "DEQUANT_MIN_ROWS", 1 << 30)
    x = torch.randn(3, 192, generator=torch.Generator().manual_seed(11)) * 3
    assert torch.equal(qg.dequantize_c(blocks, type_name, 192), want)
    torch.testing.assert_close(qg.quant_linear(x, blocks, type_name, None), quant_linear_ref(x, blocks, type_name),
                               **TOL)


def test_the_library_builds_for_the_route(cpu_route):
    assert qg.unavailable_reason() is None and qg.isa() == cpu_route


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_matches_gguf(type_name):
    w = torch.randn(7, 96, generator=torch.Generator().manual_seed(1)) * 2
    blocks = gguf_blocks(w, type_name)
    want = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[type_name]).reshape(7, 96)
    assert torch.equal(qb.dequantize(blocks, type_name, 96), torch.from_numpy(want.copy()))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 5, 64, 133])  # GEMV rows, partial row tiles, several row blocks
def test_kernel_matches_reference(type_name, rows, cpu_route):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(37, 192, generator=g)  # 37: a partial column tile
    blocks, bias = gguf_blocks(w, type_name), torch.randn(37, generator=g)
    x = torch.randn(rows, 192, generator=g) * 3
    x[0, :32] = 0.0  # an all-zero block: scale 0 must not divide by zero
    for b in (bias, None):
        got = qg.quant_linear(x, blocks, type_name, b, path="gemv")  # at every row count
        torch.testing.assert_close(got, quant_linear_ref(x, blocks, type_name, b), **TOL)


def test_dequantized_path_slices_the_weight_and_matches_the_float_product(monkeypatch, cpu_route):
    """From DEQUANT_MIN_ROWS rows on, x (unquantized) times the dequantized weight, slice by slice."""
    monkeypatch.setattr(qg, "DEQUANT_SLICE_ROWS", 16)
    g = torch.Generator().manual_seed(7)
    w, bias = torch.randn(37, 96, generator=g), torch.randn(37, generator=g)
    x = torch.randn(qg.DEQUANT_MIN_ROWS, 96, generator=g)
    for type_name in TYPES:
        blocks = gguf_blocks(w, type_name)
        assert torch.equal(qg.dequantize_c(blocks, type_name, 96), qb.dequantize(blocks, type_name, 96))
        want = x @ qb.dequantize(blocks, type_name, 96).T + bias
        torch.testing.assert_close(qg.quant_linear(x, blocks, type_name, bias, path="dequant"), want, **TOL)


def test_reference_is_close_to_the_float_product():
    """The int8 activation rounding costs at most ~1% relative error here: the reference computes
    the quantized product, not something else."""
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(64, 256, generator=g), torch.randn(9, 256, generator=g)
    blocks = gguf_blocks(w, "Q8_0")
    exact = x @ qb.dequantize(blocks, "Q8_0", 256).T
    err = (quant_linear_ref(x, blocks, "Q8_0") - exact).norm() / exact.norm()
    assert 0 < err < 0.01


def test_activation_blocks():
    x = torch.tensor([[1.0, -2.0, 0.5] + [0.0] * 29 + [0.0] * 32])
    q, d, s = quantize_activations_ref(x)
    assert q[0, :3].tolist() == [64, -127, 32] and d[0, 1] == 0 and torch.allclose(s[0, 0], d[0, 0] * (64 - 127 + 32))


def test_quantizers_match_gguf():
    w = torch.randn(6, 128, generator=torch.Generator().manual_seed(2))
    q8 = [qb.dequantize(b, "Q8_0", 128) for b in (qb.quantize_q8_0(w), gguf_blocks(w, "Q8_0"))]
    assert (q8[0] - q8[1]).abs().max() < 0.03 and (q8[0] - w).abs().max() < 0.015  # one step (amax/127) at most
    ours = qb.dequantize(qb.quantize_q4_1(w), "Q4_1", 128)
    theirs = qb.dequantize(gguf_blocks(w, "Q4_1"), "Q4_1", 128)
    assert (ours - theirs).abs().max() < 0.02 and (ours - w).abs().max() < 0.3  # f16 rounding of d and m differs
