"""The AMX quantized linear (csrc/amx/cpu_quant_amx.c) against the float64 product of its bf16 operands, and where
quant_gemm sends rows to it. The kernel tests skip on a CPU without AMX-BF16 (with that reason); the route
tests run everywhere.

Tolerance: the kernel rounds x and each dequantized weight (quant_blocks.dequantize's fp32 value) to bf16,
as the reference does, and every bf16 x bf16 product is exact in fp32; they differ only by fp32 summation,
at most k * 2^-24 * sum_j |x_j w_j| per output. One misplaced nibble, lane, pair or panel edge moves an
output by O(|x_j w_j|), far above it.
"""
import pytest
import torch

from cute_kernels.cpu import build, fused_ops, quant_amx
from cute_kernels.cpu import quant_gemm as qg
from cute_kernels.cpu import row_groups as rg
from cute_kernels.cpu.quant_blocks import dequantize
from tests.cute_kernels.cpu.test_cpu_quant_gemm import gguf_blocks

TYPES = ("Q4_0", "Q4_1", "Q8_0")
# (rows, n, k): panel edges in n (40: one whole and one partial panel), row blocks (33: a tile and a row),
# k from one block up to the default model's down projection; 3072 x 576 (gate_up): 48 panels a thread,
# packed in sets of 21 (the last partial); 24 x 64 with 65 rows: one panel, so the threads split the rows
SHAPES = [(32, 32, 32), (33, 40, 64), (1, 8, 96), (100, 576, 576), (64, 192, 1536), (257, 968, 160),
          (70, 3072, 576), (65, 24, 64)]


@pytest.fixture
def amx():
    if not quant_amx.available():
        pytest.skip("this CPU or process has no AMX-BF16 tiles" if "amx_bf16" not in build.cpu_flags()
                    else f"AMX library: {quant_amx._library()[1] or 'tile state refused'}")


def bf16_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    xd, wd = x.bfloat16().double(), w.bfloat16().double()
    want = xd @ wd.T + (0 if bias is None else bias.double())
    return want.float(), (x.shape[1] * 2.0**-24 * (xd.abs() @ wd.abs().T)).float() + 1e-30


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_the_bf16_product_of_the_dequantized_weight(type_name, m, n, k, amx):
    g = torch.Generator().manual_seed(m * 7 + n + k)
    blocks = gguf_blocks(torch.randn(n, k, generator=g) * 0.1, type_name)
    grouped, x = rg.group(blocks, type_name), torch.randn(m, k, generator=g) * 3
    bias = torch.randn(n, generator=g) if m % 2 else None
    got = quant_amx.amx_linear(x, grouped, rg.GROUPED[type_name], bias, 2)
    want, bound = bf16_reference(x, dequantize(blocks, type_name, k), bias)
    slack = 0 if bias is None else 1e-6 * bias.abs()
    assert ((got - want).abs() <= bound + slack).all()


def test_extreme_scales_and_values_stay_exact(amx):
    """Every nibble / int8 value, the fp16 scales' extremes (and a zero scale) in one weight."""
    k, n = 64, 48
    g = torch.Generator().manual_seed(3)
    for type_name in TYPES:
        blocks = gguf_blocks(torch.randn(n, k, generator=g), type_name)
        values = blocks.view(n, k // 32, -1)
        head = 4 if type_name == "Q4_1" else 2
        values[..., head:] = torch.randint(0, 256, values[..., head:].shape, generator=g, dtype=torch.uint8)
        scales = torch.tensor([6.0e4, 6.1e-5, 0.0, -1.5], dtype=torch.float16).view(torch.uint8).view(-1, 2)
        values[:4, 0, :2] = scales
        x = torch.randn(40, k, generator=g)
        got = quant_amx.amx_linear(x, rg.group(blocks, type_name), rg.GROUPED[type_name], None, 2)
        want, bound = bf16_reference(x, dequantize(blocks, type_name, k), None)
        assert ((got - want).abs() <= bound).all(), type_name


def test_quant_linear_sends_prefill_rows_of_grouped_weights_here(amx, monkeypatch):
    assert [qg.choose_path("Q4_1_R8", r) for r in (qg.AMX_MIN_ROWS - 1, qg.AMX_MIN_ROWS)] == ["tiles", "amx"]
    assert qg.choose_path("Q4_1", 512) != "amx"  # the file's layout: the packer reads groups
    assert qg.choose_path("Q4_1_R8", 512, allow_dequant=False) == "tiles"  # --deterministic: one rounding
    calls = []
    monkeypatch.setattr(quant_amx, "amx_linear", lambda *a: calls.append(a) or torch.zeros(a[0].shape[0], 8))
    blocks = rg.group(gguf_blocks(torch.randn(8, 64), "Q4_1"), "Q4_1")
    qg.quant_linear(torch.randn(40, 64), blocks, "Q4_1_R8")
    assert len(calls) == 1


def test_routes_without_amx_never_choose_it(cpu_route):
    if cpu_route == "avx512-vnni" and "amx_bf16" in build.cpu_flags():
        assert quant_amx.available()  # the native build on an AMX CPU must not silently lose the tiles
        return
    assert not quant_amx.available() and qg.choose_path("Q4_1_R8", 4096) != "amx"
    with pytest.raises(RuntimeError, match="no AMX"):
        quant_amx.amx_linear(torch.randn(32, 32), torch.zeros(8, 20, dtype=torch.uint8), "Q4_1_R8", None, 1)


def test_wrong_shapes_are_refused(amx):
    with pytest.raises(ValueError, match="whole 8-row groups"):
        quant_amx.amx_linear(torch.randn(32, 32), torch.zeros(8, 20, dtype=torch.uint8), "Q4_1", None, 1)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("m,inter,k", [(1, 32, 32), (33, 64, 96), (100, 1536, 576), (65, 96, 1536)])
def test_the_gate_up_pass_is_silu_and_mul_of_the_linear_bit_for_bit(type_name, m, inter, k, amx):
    """amx_glu joins the gate and up products in the kernel: the same bits as the two ops, row edges included."""
    g = torch.Generator().manual_seed(m + inter + k)
    grouped = rg.group(gguf_blocks(torch.randn(2 * inter, k, generator=g) * 0.1, type_name), type_name)
    x, kind = torch.randn(m, k, generator=g) * 3, rg.GROUPED[type_name]
    joined = quant_amx.amx_glu(x, grouped, kind, 2)
    assert joined.shape == (m, inter)
    assert torch.equal(joined, fused_ops.silu_and_mul(quant_amx.amx_linear(x, grouped, kind, None, 2)))
    whole = torch.full((m + 3, inter), 7.0)  # into a row slice of a larger output, the rows before untouched
    assert quant_amx.amx_glu(x, grouped, kind, 2, out=whole[3:]).data_ptr() == whole[3:].data_ptr()
    assert torch.equal(whole[3:], joined) and (whole[:3] == 7).all()
    with pytest.raises(ValueError, match="contiguous float32"):
        quant_amx.amx_linear(x, grouped, kind, None, 2, out=torch.empty(m + 1, 2 * inter))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("m,inter,k", [(33, 64, 96), (100, 1536, 576)])
def test_the_gate_up_pass_hands_down_bf16_rows_with_the_same_bits(type_name, m, inter, k, amx):
    """amx_glu(bf16=True) rounds each joined value as amx_linear rounds its input (torch's nearest even), and
    amx_linear reads such bf16 rows as they are: down's output from them equals its output from the fp32 rows.
    A rounding that truncated, or a bf16 input read as if it were fp32, fails one of the two."""
    g = torch.Generator().manual_seed(m + inter)
    kind = rg.GROUPED[type_name]
    gate_up = rg.group(gguf_blocks(torch.randn(2 * inter, k, generator=g) * 0.1, type_name), type_name)
    down = rg.group(gguf_blocks(torch.randn(k, inter, generator=g) * 0.1, type_name), type_name)
    x = torch.randn(m, k, generator=g) * 3
    rows, wide = quant_amx.amx_glu(x, gate_up, kind, 2, bf16=True), quant_amx.amx_glu(x, gate_up, kind, 2)
    assert rows.dtype == torch.bfloat16 and torch.equal(rows, wide.bfloat16())
    assert torch.equal(quant_amx.amx_linear(rows, down, kind, None, 2), quant_amx.amx_linear(wide, down, kind, None, 2))


def test_a_gate_up_pair_of_part_panels_is_refused(amx):
    grouped = rg.group(gguf_blocks(torch.randn(80, 64), "Q4_1"), "Q4_1")
    with pytest.raises(ValueError, match="whole panels of 32"):
        quant_amx.amx_glu(torch.randn(40, 64), grouped, "Q4_1_R8", 2)
