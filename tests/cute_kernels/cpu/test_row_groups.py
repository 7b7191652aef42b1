"""The 8-row grouped layouts (cute_kernels/cpu/row_groups.py) on every SIMD route this machine runs.

No tolerance: a grouped weight holds the same bytes in another order, and every kernel that reads it
(the GEMV's dot_group8, the tiles GEMM's packing, the C dequantizer, the fused decode step) computes
the same exact integer block sums and scales them in the same order as over the file's layout, so
the outputs must be equal bit for bit.
"""
import pytest
import torch

from cute_kernels.cpu import quant_gemm as qg
from cute_kernels.cpu import row_groups as rg
from cute_kernels.cpu.quant_blocks import BLOCK_BYTES, dequantize, dequantize_rows
from tests.cute_kernels.cpu.test_cpu_quant_gemm import gguf_blocks
from tests.cute_kernels.cpu.test_cpu_quant_tiles import extreme_blocks

TYPES = tuple(rg.GROUPED)


@pytest.mark.parametrize("type_name", TYPES)
def test_group_moves_each_byte_where_the_layout_says(type_name):
    bb = BLOCK_BYTES[type_name]
    blocks = torch.randint(0, 256, (24, 3 * bb), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    grouped = rg.group(blocks, type_name)
    assert grouped.shape == blocks.shape
    head = 4 if type_name == "Q4_1" else 2
    chunk = grouped.reshape(3, 3, 8 * bb)[1, 2]  # group 1 (rows 8-15), block 2
    row, lane = blocks[10, 2 * bb:3 * bb], 2  # row 10 is lane 2 of group 1
    assert torch.equal(chunk[2 * lane:2 * lane + 2], row[:2])  # d
    if type_name == "Q4_1":
        assert torch.equal(chunk[16 + 2 * lane:16 + 2 * lane + 2], row[2:4])  # m
    for t in range((bb - head) // 4):  # step t: the lane's value bytes 4t..4t+3
        at = 8 * head + 32 * t + 4 * lane
        assert torch.equal(chunk[at:at + 4], row[head + 4 * t:head + 4 * t + 4])
    assert torch.equal(rg.ungroup(grouped, rg.GROUPED[type_name]), blocks)
    ids = torch.tensor([5, 17, 0, 23, 9, 9])
    assert torch.equal(rg.rows_of(grouped, rg.GROUPED[type_name], ids), blocks[ids])


def test_only_whole_groups_of_the_three_types_are_grouped():
    assert not rg.groupable("Q4_1", 12) and not rg.groupable("Q5_1", 16) and rg.groupable("Q8_0", 16)
    with pytest.raises(ValueError, match="cannot be grouped"):
        rg.group(torch.zeros(12, 20, dtype=torch.uint8), "Q4_1")
    assert not qg.supports("Q4_1_R8", 12, 64) and qg.supports("Q4_1_R8", 16, 64)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 16, 64, 133])  # the GEMV's row tiles, the tiles GEMM, row blocks
def test_every_path_gives_the_file_layouts_bits(type_name, rows, cpu_route):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(40, 320, generator=g)  # 40: five groups, and column tiles of 16 that end mid-tile
    blocks, bias = gguf_blocks(w, type_name), torch.randn(40, generator=g)
    grouped, grouped_type = rg.group(blocks, type_name), rg.GROUPED[type_name]
    x = torch.randn(rows, 320, generator=g) * 3
    x[0, :32] = 0.0
    for path in ("gemv", "tiles", "dequant"):
        for b in (bias, None):
            want = qg.quant_linear(x, blocks, type_name, b, path=path)
            assert torch.equal(qg.quant_linear(x, grouped, grouped_type, b, path=path), want), (path, b is None)
    assert torch.equal(qg.dequantize_c(grouped, grouped_type, 320), qg.dequantize_c(blocks, type_name, 320))
    assert torch.equal(dequantize(grouped, grouped_type, 320), dequantize(blocks, type_name, 320))
    ids = torch.tensor([39, 0, 8, 8, 17])  # embedding lookups: last row, group edges, a repeat
    assert torch.equal(dequantize_rows(grouped, grouped_type, ids, 320), dequantize_rows(blocks, type_name, ids, 320))


@pytest.mark.parametrize("type_name", TYPES)
def test_grouped_sums_at_their_ceiling_do_not_saturate(type_name, cpu_route):
    """The largest weights against +-127 (test_cpu_quant_tiles.extreme_blocks): on AVX2 a Q4 block's eight
    maddubs steps add in int16 across two chains (30480 in all), a Q8 lane reaches 32385."""
    x = torch.ones(6, 256)
    if type_name == "Q8_0":
        x[:, 0::2] = -1.0
    x[1::2] *= -1.0
    blocks = extreme_blocks(type_name, 16, 256)
    grouped = rg.group(blocks, type_name)
    for rows in (1, 4, 6):
        want = qg.quant_linear(x[:rows], blocks, type_name, None, path="gemv")
        assert torch.equal(qg.quant_linear(x[:rows], grouped, rg.GROUPED[type_name], None, path="gemv"), want)


def test_the_simd_routes_hold_linears_grouped_and_the_portable_one_does_not(cpu_route):
    blocks = gguf_blocks(torch.randn(16, 64), "Q4_1")
    type_name, held = qg.gemv_layout("Q4_1", blocks)
    assert type_name == ("Q4_1" if cpu_route == "portable-c" else "Q4_1_R8")
    assert torch.equal(held, blocks if cpu_route == "portable-c" else rg.group(blocks, "Q4_1"))
    assert qg.gemv_layout("Q4_1", blocks[:12])[0] == "Q4_1"  # not whole groups: the file's layout
    assert qg.gemv_layout("Q5_1", torch.zeros(16, 48, dtype=torch.uint8))[0] == "Q5_1"
