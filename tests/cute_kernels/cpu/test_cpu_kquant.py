"""K-quant blocks (Q4_K, Q5_K, Q6_K): the torch dequantization against the gguf package's, bit for bit,
and csrc/cpu_kquant_gemm.c against its torch reference on every SIMD route this machine runs.

Blocks are random bytes with finite fp16 scales, so every bit of the packed 6-bit scales, high bits
and nibbles is exercised, not only what a quantizer happens to produce.

Tolerance for the kernel: both sides quantize the activations identically and every per-block
integer dot product is exact, so they differ only in the order float32 block results are summed
(K/32 = 16 terms here, each rounded at 2^-24 relative): 1e-5 of the largest output, plus 1e-5
relative. One wrong nibble, high bit or scale moves an output by a few percent of that largest one.
"""
import gguf
import numpy as np
import pytest
import torch

from cute_kernels.cpu import kquant_blocks as kb
from cute_kernels.cpu import quant_blocks as qb
from cute_kernels.cpu import quant_gemm as qg
from cute_kernels.cpu.quant_reference import quant_linear_ref
from tests.kquant_quantize import quantize_kquant

TYPES = ("Q4_K", "Q5_K", "Q6_K")
SCALE_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # fp16 d (and dmin) in each super-block


def random_blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """uint8 [rows, row bytes]: random bytes, the fp16 scales replaced by finite values (one zero)."""
    rng = np.random.default_rng(seed)
    n = rows * cols // kb.QK_K
    raw = rng.integers(0, 256, (n, kb.BLOCK_BYTES[type_name]), dtype=np.uint8)
    for at in SCALE_AT[type_name]:
        scale = (rng.random(n) * 0.02).astype(np.float16)
        scale[0] = 0
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(n, 2)
    return torch.from_numpy(raw.reshape(rows, -1))


def gguf_dequantize(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    values = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(np.ascontiguousarray(values))


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_matches_gguf_bit_for_bit(type_name, cpu_route):
    blocks = random_blocks(type_name, 24, 512)
    want = gguf_dequantize(blocks, type_name)
    assert torch.equal(qb.dequantize(blocks, type_name, 512), want)
    assert torch.equal(qg.dequantize_c(blocks, type_name, 512), want)  # the prefill path's C dequantizer too


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 5, 133])  # GEMV rows, partial row tiles, several row blocks
def test_kernel_matches_reference(type_name, rows, monkeypatch, cpu_route):
    monkeypatch.setattr(qg, "DEQUANT_MIN_ROWS", 1 << 30)  # the int8 path at every row count
    g = torch.Generator().manual_seed(rows)
    blocks, bias = random_blocks(type_name, 37, 512, seed=rows), torch.randn(37, generator=g)  # 37: a partial tile
    x = torch.randn(rows, 512, generator=g) * 3
    x[0, :32] = 0.0  # an all-zero activation block: scale 0 must not divide by zero
    got = qg.quant_linear(x, blocks, type_name, bias)
    want = quant_linear_ref(x, blocks, type_name, bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantized_path_matches_the_float_product(type_name, monkeypatch):
    """From DEQUANT_MIN_ROWS rows on, x (unquantized) times the weight dequantized slice by slice."""
    monkeypatch.setattr(qg, "DEQUANT_SLICE_ROWS", 16)
    g = torch.Generator().manual_seed(3)
    blocks, bias = random_blocks(type_name, 37, 256, seed=3), torch.randn(37, generator=g)
    x = torch.randn(qg.DEQUANT_MIN_ROWS, 256, generator=g)
    want = x @ qb.dequantize(blocks, type_name, 256).T + bias
    torch.testing.assert_close(qg.quant_linear(x, blocks, type_name, bias), want, rtol=1e-5,
                               atol=1e-5 * want.abs().max().item())


def test_only_whole_super_blocks_run():
    assert qg.supports("Q4_K", 8, 512) and not qg.supports("Q4_K", 8, 576)  # 576 = 2.25 super-blocks
    assert qg.supports("Q4_1", 8, 576) and not qg.supports("Q3_K", 8, 512)
    assert qb.row_bytes("Q6_K", 512) == 420 and qb.row_bytes("Q4_0", 64) == 36


@pytest.mark.parametrize("type_name,step", [("Q4_K", 1 / 15), ("Q5_K", 1 / 31), ("Q6_K", 1 / 31)])
def test_test_quantizer_writes_what_gguf_reads_back(type_name, step):
    """The test files' quantizer (tests/kquant_quantize.py) is sane: gguf reads its bytes back to within
    about half a step (plus the 6-bit rounding of the scales) of the floats."""
    w = torch.randn(6, 512, generator=torch.Generator().manual_seed(4)).numpy()
    back = gguf.quants.dequantize(quantize_kquant(w, type_name), gguf.GGMLQuantizationType[type_name])
    amax = np.abs(w).max()
    assert back.shape == w.shape and np.abs(back - w).max() < 1.3 * amax * step
