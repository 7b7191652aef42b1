"""The bf16-weight CPU linear (csrc/cpu_bf16_gemm.c) against its torch reference (bf16_gemm.bf16_linear_ref),
on every SIMD route this machine runs (the `cpu_route` fixture, tests/conftest.py).

Tolerance: both sides round x to bf16 the same way (checked bit-exact below) and every bf16 x bf16
product is exact in fp32, so the kernel differs from the float64 reference only by fp32 summation:
at most k * 2^-24 * sum_j |x_j w_j| per output (the bound for any order of k fp32 additions). One
wrong element, tile edge or packed pair moves an output by O(|x_j w_j|), far above it.
"""
import pytest
import torch

from cute_kernels.cpu import bf16_gemm as bg
from cute_kernels.cpu import quant_amx

# (rows, n, k): decode rows and prefill rows (the packed path from PACK_MIN_ROWS), tails in every dimension
SHAPES = [(1, 576, 576), (3, 37, 70), (4, 4, 32), (15, 65, 33), (16, 33, 64), (17, 37, 71), (40, 100, 576), (9, 64, 1)]


def bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    k = x.shape[1]
    return k * 2.0**-24 * (x.bfloat16().double().abs() @ w.double().abs().T).float() + 1e-30


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("invariant", [False, True])
def test_matches_the_reference(m, n, k, invariant, cpu_route):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w, bias = torch.randn(m, k, generator=g) * 3, torch.randn(n, k, generator=g).bfloat16(), torch.randn(n, generator=g)
    got = bg.bf16_linear(x, w, bias, invariant=invariant)
    want = bg.bf16_linear_ref(x, w, bias)
    assert ((got - want).abs() <= bound(x, w) + 1e-6 * bias.abs()).all()


def test_the_library_builds_for_the_route_and_names_its_instruction(cpu_route):
    assert bg.unavailable_reason() is None
    native = "avx512_bf16" in bg.build.cpu_flags()
    want = {"avx512-vnni": "vdpbf16ps" if native else "avx2-fma", "avx2": "avx2-fma", "portable-c": "portable-c"}
    assert bg.path() == want[cpu_route]


def test_rounding_is_torchs_nearest_even(cpu_route):
    x = torch.cat([torch.randn(4096), torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 3.0e38, 1e-40])])
    x = torch.cat([x, (torch.arange(0, 65536, 97, dtype=torch.int32) << 16 | 0x8000).view(torch.float32)])  # ties
    x = x[torch.isfinite(x) | torch.isinf(x)].contiguous()
    assert torch.equal(bg.round_bf16_c(x).view(torch.int16), x.bfloat16().view(torch.int16))


def test_invariant_gives_a_row_the_same_bits_at_any_row_count():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(40, 96, generator=g), torch.randn(50, 96, generator=g).bfloat16()
    alone = bg.bf16_linear(x[:1], w, invariant=True)
    assert torch.equal(bg.bf16_linear(x, w, invariant=True)[:1], alone)


@pytest.mark.skipif(not quant_amx.available(), reason="no AMX tiles on this CPU")
@pytest.mark.parametrize("m,n,k", [(8, 40, 64), (32, 32, 64), (33, 50, 70), (64, 97, 130), (100, 576, 576), (70, 33, 2)])
def test_the_amx_route_matches_the_reference(m, n, k, monkeypatch):
    """From AMX_MIN_ROWS rows a non-invariant linear runs on the tiles (cpu_bf16_amx.c): panels packed from the
    weight's pair words, zero past n and k; the same bound (fp32 sums of exact products)."""
    calls = []
    real = bg._amx_library

    def counted():
        lib, reason = real()
        calls.append(1)
        return lib, reason

    monkeypatch.setattr(bg, "_amx_library", counted)
    g = torch.Generator().manual_seed(m * 7 + n + k)
    x, w, bias = torch.randn(m, k, generator=g) * 3, torch.randn(n, k, generator=g).bfloat16(), torch.randn(n, generator=g)
    got = bg.bf16_linear(x, w, bias)
    assert calls, "the AMX route did not run"
    want = bg.bf16_linear_ref(x, w, bias)
    assert ((got - want).abs() <= bound(x, w) + 1e-6 * bias.abs()).all()
