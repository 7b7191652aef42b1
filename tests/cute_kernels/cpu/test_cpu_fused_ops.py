"""The C fused elementwise ops against their torch references on every SIMD route this machine runs
(the `cpu_route` fixture: no intrinsics here, but each route vectorizes the loops its own way), and in
the model.

Tolerance: fp32 on both sides; the C code sums squares in SIMD lanes and computes silu as
x / (1 + exp(-x)) with libmvec's expf, so results agree to a few ulps: 1e-5 relative plus 1e-5
absolute (outputs here are O(1) to O(100)).
"""
import pytest
import torch

from cute_kernels import reference as ref
from cute_kernels.cpu import build
from cute_kernels.cpu import fused_ops as fused
from cute_kernels.kv_quant import KVScales, round_trip
from tests.tiny_engine import tiny_engine

TOL = dict(rtol=1e-5, atol=1e-5)


def test_the_library_builds_here(cpu_route):
    assert fused.unavailable_reason() is None  # CI machines have a C compiler: the fast path must not vanish
    assert build.isa(build.load("cpu_fused_ops")[0]) == cpu_route


@pytest.mark.parametrize("rows,dim", [(1, 576), (7, 64), (300, 33), (4096, 576)])
def test_add_rms_norm(rows, dim, cpu_route):
    g = torch.Generator().manual_seed(rows)
    x, residual, weight = (torch.randn(rows, dim, generator=g) * 3, torch.randn(rows, dim, generator=g),
                           torch.randn(dim, generator=g))
    for res in (residual, None):  # None: the first layer, whose residual is x itself
        got, want = fused.add_rms_norm(x, res, weight, 1e-5), ref.add_rms_norm_ref(x, res, weight, 1e-5)
        torch.testing.assert_close(got, want, **TOL)
    assert fused.add_rms_norm(x, None, weight, 1e-5)[1] is x


@pytest.mark.parametrize("rows,inter", [(1, 1536), (9, 40), (2048, 1536)])
def test_silu_and_mul(rows, inter, cpu_route):
    gate_up = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(rows)) * 30
    gate_up[0, :4] = torch.tensor([-200.0, -88.0, 88.0, 200.0])  # where a plain exp over- or underflows
    got = fused.silu_and_mul(gate_up)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref.silu_and_mul_ref(gate_up), **TOL)


@pytest.mark.parametrize("tokens", [1, 5, 1000])
def test_rope_in_place_on_the_fused_qkv_rows(tokens, cpu_route):
    g = torch.Generator().manual_seed(tokens)
    heads, kv, d = 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv) * d, generator=g)
    v_before = qkv[:, (heads + kv) * d:].clone()
    qk = qkv[:, : (heads + kv) * d].view(tokens, heads + kv, d)  # rows strided by the whole qkv row
    cos, sin = torch.randn(tokens, 1, d // 2, generator=g), torch.randn(tokens, 1, d // 2, generator=g)
    want = ref.rope_ref(qk.clone(), cos, sin)
    got = fused.rope_(qk, cos, sin)
    assert got.data_ptr() == qkv.data_ptr()  # rotated where it lies
    torch.testing.assert_close(got, want, **TOL)
    assert torch.equal(qkv[:, (heads + kv) * d:], v_before)  # v untouched


KV_DTYPES = (torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 700])
def test_write_kv_stores_the_references_bytes_and_read_kv_gives_the_round_trip(dtype, tokens, cpu_route):
    """k and v as the model hands them (rows strided by the whole qkv row, values past fp16's and e4m3's range,
    ties of the bf16 rounding), written at scattered slots: the same cache bytes as the torch reference, other
    slots untouched, and read back exactly as kv_quant.round_trip rounds them."""
    g = torch.Generator().manual_seed(tokens)
    heads, kv, d, blocks, bs = 9, 3, 64, 80, 16
    qkv = torch.randn(tokens, (heads + 2 * kv) * d, generator=g) * 300
    qkv[0, heads * d:heads * d + 4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -7e4, 1e-40])
    k = qkv[:, heads * d:(heads + kv) * d].view(tokens, kv, d)
    v = qkv[:, (heads + kv) * d:].view(tokens, kv, d)
    slots = torch.randperm(blocks * bs, generator=g)[:tokens]
    scales = KVScales(torch.rand(kv, generator=g) + 0.5, torch.rand(kv, generator=g) + 0.5) if dtype in (
        torch.int8, torch.float8_e4m3fn) else None
    fill = torch.randn(blocks, bs, kv, d, generator=g).to(dtype)
    got_k, got_v, want_k, want_v = fill.clone(), fill.clone(), fill.clone(), fill.clone()
    fused.write_kv(k, v, got_k, got_v, slots, scales)
    ref.write_kv(k, v, want_k, want_v, slots, scales)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    back = fused.read_kv(got_k, got_v, slots, scales)
    for rows, x, s in zip(back, (k, v), (None, None) if scales is None else (scales.k, scales.v)):
        assert torch.equal(rows, round_trip(x, dtype, s))


def test_inputs_the_kernels_do_not_take_run_the_references():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    torch.testing.assert_close(fused.add_rms_norm(x, x, w, 1e-6), ref.add_rms_norm_ref(x, x, w, 1e-6))
    strided = torch.randn(64, 4).t()
    torch.testing.assert_close(fused.silu_and_mul(strided), ref.silu_and_mul_ref(strided))
    qk = torch.randn(3, 2, 8).transpose(0, 1)  # heads not contiguous
    cos, sin = torch.randn(2, 1, 4), torch.randn(2, 1, 4)
    torch.testing.assert_close(fused.rope_(qk, cos, sin), ref.rope_ref(qk, cos, sin))
    k, v, slots = torch.randn(3, 8, 2).transpose(1, 2), torch.randn(3, 2, 8), torch.tensor([5, 0, 9])
    got, want = torch.zeros(2, 4, 4, 2, 8, dtype=torch.bfloat16), torch.zeros(2, 4, 4, 2, 8, dtype=torch.bfloat16)
    fused.write_kv(k, v, got[0], got[1], slots)  # k's dims strided: torch's index_copy_
    ref.write_kv(k, v, want[0], want[1], slots)
    assert torch.equal(got, want)
    back = fused.read_kv(got[0], got[1], slots.int())  # int32 slots: torch's gather
    assert all(torch.equal(r, x.bfloat16().float()) for r, x in zip(back, (k, v)))
    for rows in (k, v):  # k's strided dims: the reference; v's contiguous ones: the C code's own check
        before = got.clone()
        with pytest.raises(IndexError):  # a slot past the cache: an error, never a wild write
            fused.write_kv(rows, v, got[0], got[1], torch.tensor([5, 0, 64]))
        assert torch.equal(got, before)
    with pytest.raises(IndexError, match="outside the cache's 16 slots"):
        fused.read_kv(got[0], got[1], torch.tensor([5, -1, 9]))


def test_model_logits_are_the_same_with_the_references(monkeypatch):
    engine = tiny_engine()
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 40)]
    from runtime.sequence import SeqChunk

    def logits():
        chunks = [SeqChunk(p, 0, list(range(i * 4, i * 4 + 4)), num_logits=len(p)) for i, p in enumerate(prompts)]
        return engine.runner.run(chunks)

    fast = logits()
    monkeypatch.setattr(fused, "_library", lambda: (None, "off for this test"))
    torch.testing.assert_close(fast, logits(), **TOL)


def _fused_routes(backend, monkeypatch) -> list[str]:
    """Which implementation each fused op of `backend` calls, on inputs the C code takes."""
    seen = []
    for module, names in ((fused, ("add_rms_norm", "silu_and_mul", "rope_")),
                          (ref, ("add_rms_norm_ref", "silu_and_mul_ref", "rope_ref"))):
        for name in names:
            real = getattr(module, name)
            monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name: seen.append(_name) or _real(*a))
    x, w, gate_up = torch.randn(4, 64), torch.randn(64), torch.randn(4, 128)
    qk, cos, sin = torch.randn(4, 3, 64), torch.randn(4, 1, 32), torch.randn(4, 1, 32)
    backend.add_rms_norm(x, None, w, 1e-6)
    backend.silu_and_mul(gate_up)
    backend.rope(qk, cos, sin)
    monkeypatch.undo()
    return seen


def test_the_backend_seam_picks_the_fused_ops_once(monkeypatch):
    from runtime.accel.select_backend import select_backend
    from runtime.model.torch_backend import TorchBackend

    cpu = torch.device("cpu")
    backend = select_backend("torch", cpu)
    assert _fused_routes(backend, monkeypatch) == ["add_rms_norm", "silu_and_mul", "rope_"]
    assert "fused norm/rope/silu" in backend.describe()
    for off in (TorchBackend(), select_backend("torch", cpu, torch.bfloat16)):
        assert _fused_routes(off, monkeypatch) == ["add_rms_norm_ref", "silu_and_mul_ref", "rope_ref"]
