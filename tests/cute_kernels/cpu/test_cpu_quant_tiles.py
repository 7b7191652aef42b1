"""The register-blocked int8 GEMM (csrc/tiles/cpu_quant_tiles.c) against the torch oracle on every SIMD route
this machine runs (the `cpu_route` fixture), and quant_linear's choice of path.

Tolerance (as tests/cute_kernels/cpu/test_cpu_quant_gemm.py): the activations are quantized by the same C function
the reference mirrors, every per-block integer dot product is exact, so the kernel and the reference
differ only in the order float32 block results are summed; 2e-4 absolute plus 1e-5 relative covers
that at these O(10-100) outputs and nothing else (a wrong nibble, lane or scale moves an output by
O(0.1) or more).
"""
import pytest
import torch

from cute_kernels.cpu import build, quant_tiles
from cute_kernels.cpu import quant_gemm as qg
from cute_kernels.cpu.quant_blocks import BLOCK_BYTES
from cute_kernels.cpu.quant_reference import quant_linear_ref
from cute_kernels.cpu.quant_tiles import TILE_TYPES as TYPES
from tests.cute_kernels.cpu.test_cpu_quant_gemm import TOL, gguf_blocks


def test_the_route_builds_and_says_its_isa(cpu_route):
    assert quant_tiles.isa() == cpu_route
    assert not quant_tiles.available("Q6_K")


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows, cols", [(1, 37), (3, 8), (5, 45), (17, 77), (129, 37), (300, 40)])
def test_tiles_match_reference(type_name, rows, cols, cpu_route):
    """Partial row tiles (rows not a multiple of 4), partial 8-row groups and 32-row panels (cols),
    two row chunks (300 > 256 rows), an all-zero activation block, with and without bias."""
    g = torch.Generator().manual_seed(rows * cols)
    w = torch.randn(cols, 192, generator=g)
    blocks, bias = gguf_blocks(w, type_name), torch.randn(cols, generator=g)
    x = torch.randn(rows, 192, generator=g) * 3
    x[0, :32] = 0.0
    for b in (bias, None):
        got = qg.quant_linear(x, blocks, type_name, b, path="tiles")
        torch.testing.assert_close(got, quant_linear_ref(x, blocks, type_name, b), **TOL)


def test_long_k_narrows_the_panel_and_still_matches(cpu_route):
    """k = 6144: on AVX2 and portable C a 32-row panel would pass PANEL_BYTES, so panels of 24 rows (not a
    multiple of 32); the VNNI micro-kernel keeps 32 (two groups of 16) and streams them from L2.
    192 block terms per output (std ~80): atol 1e-3 for their float32 summation order."""
    g = torch.Generator().manual_seed(11)
    blocks = gguf_blocks(torch.randn(45, 6144, generator=g), "Q4_1")
    x = torch.randn(6, 6144, generator=g)
    torch.testing.assert_close(qg.quant_linear(x, blocks, "Q4_1", None, path="tiles"),
                               quant_linear_ref(x, blocks, "Q4_1"), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1"])
def test_a_type_without_a_panel_layout_is_refused_not_read(type_name):
    g = torch.Generator().manual_seed(5)
    blocks = gguf_blocks(torch.randn(8, 64, generator=g), type_name)
    assert qg.choose_path(type_name, 64) != "tiles"
    with pytest.raises(ValueError, match="tiles GEMM"):
        qg.quant_linear(torch.randn(4, 64, generator=g), blocks, type_name, path="tiles")


def extreme_blocks(type_name: str, rows: int, cols: int) -> torch.Tensor:
    """Blocks whose every value is the format's largest magnitude (Q4: nibble 15, Q8: -128 and 127
    alternating), scale 1/64 and Q4_1 minimum 0, so integer sums reach their ceiling."""
    nb, bb = cols // 32, BLOCK_BYTES[type_name]
    blocks = torch.zeros(rows, nb, bb, dtype=torch.uint8)
    blocks[..., :2] = torch.tensor([1 / 64], dtype=torch.float16).view(torch.uint8)
    if type_name == "Q8_0":
        blocks[..., 2::2], blocks[..., 3::2] = 0x80, 0x7F
    else:
        blocks[..., bb - 16:] = 0xFF
    return blocks.reshape(rows, nb * bb)


@pytest.mark.parametrize("type_name", TYPES)
def test_integer_sums_at_their_ceiling_do_not_saturate(type_name, cpu_route):
    """Activations of +-127 everywhere against the largest weights: a Q4 block sums eight maddubs
    lanes of 3810 in int16 (30480), a Q8 lane is 128 * 127 + 127 * 127 (32385); a saturating or
    overflowing step would be off by thousands."""
    x = torch.ones(6, 256)
    if type_name == "Q8_0":
        x[:, 0::2] = -1.0  # against -128: every product positive
    x[1::2] *= -1.0  # and rows of the other sign
    blocks = extreme_blocks(type_name, 16, 256)
    want = quant_linear_ref(x, blocks, type_name)
    torch.testing.assert_close(qg.quant_linear(x, blocks, type_name, None, path="tiles"),
                               want, **TOL)


def test_quant_linear_picks_the_tiles_path_from_its_crossover(monkeypatch):
    tiles_from = qg.TILES_ROWS[quant_tiles.isa(), "Q4_1"][0]
    assert [qg.choose_path("Q4_1", r) for r in (tiles_from - 1, tiles_from)] == ["gemv", "tiles"]
    monkeypatch.setattr(qg, "TILES_ROWS", {key: (4, 100) for key in qg.TILES_ROWS})
    assert [qg.choose_path("Q8_0", r) for r in (3, 4, 99, 100)] == ["gemv", "tiles", "tiles", "dequant"]
    assert qg.choose_path("Q6_K", 50) == "gemv"  # no tiles kernel for the type: the old rule
    calls = []
    monkeypatch.setattr(quant_tiles, "tiles_gemm", lambda *a, **k: calls.append(a) or torch.zeros(5, 8))
    qg.quant_linear(torch.randn(5, 64), gguf_blocks(torch.randn(8, 64), "Q4_1"), "Q4_1")
    assert len(calls) == 1


def test_portable_build_keeps_the_dequantized_route_for_many_rows():
    with build.using_route("portable-c"):
        assert qg.choose_path("Q4_1", 4096) == "dequant"
        assert qg.choose_path("Q4_1", 1) == "gemv"


@pytest.mark.parametrize("type_name", TYPES)
def test_gemv_and_tiles_give_a_row_the_same_bits_at_any_row_count(type_name, cpu_route):
    """Batch invariance (--deterministic): both kernels sum each block exactly in integers, then add
    its scaled sum and offset term block after block in one order, so a row's output does not depend
    on the route its row count picks nor on its place in the batch."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(45, 320, generator=g)
    blocks, bias = gguf_blocks(w, type_name), torch.randn(45, generator=g)
    x = torch.randn(40, 320, generator=g) * 3
    alone = qg.quant_linear(x[:1], blocks, type_name, bias, path="gemv")
    for rows in (1, 3, 5, 8, 9, 17, 40):
        for path in ("gemv", "tiles"):
            got = qg.quant_linear(x[:rows].flip(0), blocks, type_name, bias, path=path)
            assert torch.equal(got[-1:], alone), (rows, path)


def test_int8_peak_counts_the_multiply_adds_it_ran(cpu_route):
    """The peak kernel's count (12 instructions a round: 64 multiply-adds each on zmm, 32 for AVX2's
    maddubs), which bench_quant_gemm.py divides by its time; none on the portable route."""
    lib = quant_tiles._library()[0]
    per_op = {"avx512-vnni": 64, "avx2": 32, "portable-c": None}[cpu_route]
    got = lib.int8_peak(1000, 2)
    assert got == (-1 if per_op is None else 1000 * 12 * per_op * 2)
    assert (quant_tiles.int8_peak_gops(1, seconds=0.01) is None) == (per_op is None)
